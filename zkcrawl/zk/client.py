"""A thin typed adapter around kazoo (which ships no type hints), owning the connection policy:

* **connect** waits at most ``zk_timeout``: an unreachable ensemble is
  :class:`~zkcrawl.errors.ZkUnavailable` (exit 75), never a hang; a TLS, SASL or
  authentication failure is :class:`~zkcrawl.zk.security.ZkSecurityError` (exit 2) at once.
  Asked to (``refused_fails``), a refused loopback port fails at once too.
* **security** (:mod:`zkcrawl.zk.security`): credentials, the ACL of every created znode,
  TLS; a NoAuth on a write is :class:`ZkAccessDenied` naming the path and identity, never
  the secret.
* **reconnect** goes on while the process runs (capped exponential delays) until
  :meth:`ZkClient.close`; **commands** (:meth:`ZkClient.retry`) are retried a bounded
  number of times within a deadline, so a shutdown never hangs.
* Pipelined calls and multi requests (:mod:`zkcrawl.zk.wire`) wait at most ``--zk-timeout``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypeVar

from kazoo.client import KazooClient
from kazoo.hosts import collect_hosts
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL, Id

from zkcrawl.errors import ZkUnavailable
from zkcrawl.zk.errors import (
    AuthFailedError,
    ConnectionLoss,
    KazooException,
    KazooTimeoutError,
    MarshallingError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    UnimplementedError,
)
from zkcrawl.zk.poll import PollHandler
from zkcrawl.zk.security import (
    OPEN_ACL,
    ZkAuth,
    ZkSecurityError,
    ZkTls,
    access_warning,
    creator_acl,
    describe_acl,
    open_writers,
    sasl_available,
)
from zkcrawl.zk.types import (
    ChildrenWatcher,
    DataWatcher,
    Pending,
    ReadResult,
    Stat,
    StateListener,
    WatchedEvent,
    Watcher,
)
from zkcrawl.zk.wire import Multi, Wire, answer

T = TypeVar("T")
P = ParamSpec("P")

__all__ = ["KazooException", "NoNodeError", "NodeExistsError", "ZkAccessDenied", "ZkClient",
           "gather", "tx_ok"]

try:  # kazoo >= 2.9: error -124, the server closed a session that lacks authentication
    from kazoo.exceptions import SessionClosedRequireSaslError as _RequireAuth
except ImportError:  # pragma: no cover -- older kazoo: the code maps to a plain error
    _RequireAuth = AuthFailedError

_AUTH_FAILED = "AUTH_FAILED"  # kazoo's KeeperState.AUTH_FAILED
_TLS_MARKERS = ("[SSL", "SSL:", "certificate verify", "EOF occurred in violation")


class _QuietUntilConnected(logging.Filter):
    """Drop kazoo's per-attempt connection warnings before the first connect:
    an unreachable ZooKeeper must be exactly one line on stderr (ours). Notes the last TLS
    failure among them, so a handshake error ends :meth:`ZkClient.connect` at once. Always
    scrubs the password from a record (kazoo logs requests at its BLATHER level)."""

    def __init__(self, secret: str | None = None) -> None:
        super().__init__()
        self.connected = False
        self.tls_failure: str | None = None
        self.dropped = False  # a TCP connection was made, but no session came of it
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secret or not self.connected:
            message = record.getMessage()
            if self.secret and self.secret in message:
                record.msg, record.args = message.replace(self.secret, "***"), None
                record.exc_info = record.exc_text = None
            if not self.connected and any(m in message for m in _TLS_MARKERS):
                self.tls_failure = message.split("socket connection error: ")[-1]
            elif not self.connected and "socket connection broken" in message:
                self.dropped = True
        return self.connected or record.levelno >= logging.ERROR


class ZkAccessDenied(NoAuthError, ZkSecurityError):
    """ZooKeeper refused an operation for lack of permission (its NoAuth), with the path
    and the identity: still a ``NoAuthError`` (a ``KazooException``) for code that catches
    those, and a usage error (one line, exit 2) when it reaches the command."""


class ZkClient:
    """One ZooKeeper session and the typed calls zkcrawl makes on it.

    The kazoo client is private (``_kazoo``): what callers need of it is a method here,
    typed with :mod:`zkcrawl.zk.types`. Results are kazoo's own objects (a ``ZnodeStat``
    is a :class:`~zkcrawl.zk.types.Stat`, an ``AsyncResult`` a
    :class:`~zkcrawl.zk.types.Pending`), never wrapped: these calls sit on the queue's
    hot path.
    """

    def __init__(self, hosts: str, *, zk_timeout: float = 10.0,
                 session_timeout: float = 10.0, read_only: bool = False,
                 auth: ZkAuth | None = None, acl: str = "creator",
                 tls: ZkTls | None = None) -> None:
        """``auth``: this session's identity; with ``acl`` "creator" every znode created
        through this client gets :func:`~zkcrawl.zk.security.creator_acl` (ALL for the
        identity, READ for anyone), with "open" (or without ``auth``) ZooKeeper's
        OPEN_ACL_UNSAFE. ``tls``: connect over TLS, verifying the server's certificate and
        host name."""
        if acl not in ("creator", "open"):
            raise ValueError(f"acl must be 'creator' or 'open', not {acl!r}")
        self.hosts = hosts
        self.zk_timeout = zk_timeout
        self.auth = auth
        self.tls = tls
        self._stopped = threading.Event()
        conn_retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0,
                                max_jitter=0.3)
        cmd_retry = KazooRetry(max_tries=5, delay=0.05, backoff=2, max_delay=1.0,
                               deadline=max(zk_timeout, 2.0), ignore_expire=False,
                               interrupt=self._stopped.is_set)
        self._multiread = True
        security = self._security_options(auth, acl, tls)
        #: The ACL of every znode created through this client, as (perms, scheme, id).
        self.acl: list[tuple[int, str, str]] = (
            creator_acl(auth) if auth is not None and acl == "creator" else [OPEN_ACL])
        self._quiet = _QuietUntilConnected(auth.password if auth is not None else None)
        logger = logging.getLogger("kazoo.client")
        logger.addFilter(self._quiet)
        self._kazoo = KazooClient(hosts=hosts, timeout=session_timeout,
                                  connection_retry=conn_retry, command_retry=cmd_retry,
                                  read_only=read_only, logger=logger,
                                  handler=PollHandler(),  # one poll(2) per select (poll.py)
                                  **security)
        if auth is not None and auth.scheme == "sasl":
            self._sasl_failure_is_auth_failure()
        self._heard = time.monotonic()  # the last word from the server (silent_for)
        self._pause: PauseWatch | None = None  # started by the first silent_for()
        self._pause_lock = threading.Lock()  # ... once: many threads ask it at first
        self._note_replies()
        self._wire = Wire(self._kazoo, timeout=max(zk_timeout, 1.0))

    def _security_options(self, auth: ZkAuth | None, acl: str, tls: ZkTls | None
                          ) -> dict[str, Any]:
        """kazoo's arguments for ``auth``, ``acl`` and ``tls``."""
        options: dict[str, Any] = {}
        if auth is not None and auth.scheme == "digest":
            options["auth_data"] = [("digest", f"{auth.user}:{auth.password}")]
        elif auth is not None:
            if not sasl_available():
                raise ZkSecurityError("SASL authentication needs the pure-sasl package "
                                      "(pip install pure-sasl, or kazoo[sasl])")
            options["sasl_options"] = {"mechanism": auth.mechanism, "username": auth.user,
                                       "password": auth.password}
        if auth is not None and acl == "creator":
            options["default_acl"] = [ACL(perms, Id(scheme, ident))
                                      for perms, scheme, ident in creator_acl(auth)]
        if tls is not None:
            options.update(use_ssl=True, ca=tls.ca, certfile=tls.cert, keyfile=tls.key,
                           verify_certs=True, check_hostname=True)
        return options

    def _sasl_failure_is_auth_failure(self) -> None:
        """A server that enforces authentication answers a refused SASL exchange with
        error -124 (SessionClosedRequireSasl), which kazoo's connection loop does not
        expect: its thread would die with a traceback and the client hang. Make it the
        AuthFailedError kazoo handles (state AUTH_FAILED, no reconnect). Private API:
        ``KazooClient._connection._authenticate_with_sasl`` (kazoo 2.10, 2.11)."""
        conn = getattr(self._kazoo, "_connection", None)
        original = getattr(conn, "_authenticate_with_sasl", None)
        if original is None:  # pragma: no cover -- another kazoo: its own behaviour
            return

        def authenticate(host: str, timeout: float) -> None:
            try:
                original(host, timeout)
            except _RequireAuth as exc:
                raise AuthFailedError("SASL authentication refused") from exc

        conn._authenticate_with_sasl = authenticate  # type: ignore[union-attr]

    def _note_replies(self) -> None:
        """Keep the time of the server's last word for :meth:`silent_for`: each packet read
        (answers, pings, watch events) and each handshake that kept or made a session.
        kazoo keeps no such time. Private API: ``KazooClient._connection._read_socket`` and
        ``_connect`` (kazoo 2.10, 2.11); without them ``silent_for`` stays near 0."""
        conn = getattr(self._kazoo, "_connection", None)
        read, handshake = (getattr(conn, "_read_socket", None),
                           getattr(conn, "_connect", None))
        if read is None or handshake is None:  # pragma: no cover -- another kazoo
            return

        def read_socket(*args: Any) -> Any:
            result = read(*args)
            self._heard = time.monotonic()
            return result

        def connect(*args: Any) -> Any:
            result = handshake(*args)  # raises SessionExpiredError for a lost session
            self._heard = time.monotonic()
            return result

        conn._read_socket = read_socket  # type: ignore[union-attr]
        conn._connect = connect  # type: ignore[union-attr]

    def silent_for(self) -> float:
        """Seconds since the server last answered this client. Past the session timeout the
        session may be expired on the server before kazoo can tell (a process frozen or
        cut off): a holder must not start work on its leases until it hears again.

        A pause of this process (SIGSTOP, a VM frozen) counts as silence -- ``inf`` -- until a
        request sent after it is answered: a frozen process hears nothing, but on waking
        kazoo may first read what the server sent before it expired the session, and that
        is no word about the session now (:class:`PauseWatch`)."""
        pause = self._pause
        if pause is None:
            with self._pause_lock:  # a pool's threads ask at once: one watch, not one each
                if self._pause is None and not self._stopped.is_set():
                    self._pause = PauseWatch(self._probe).start()
                pause = self._pause
        now = time.monotonic()
        if pause is not None and pause.in_doubt(now):
            return math.inf
        return now - self._heard

    def _probe(self, timeout: float) -> bool:
        """One round trip sent now: True when it was answered in this session."""
        try:
            self._kazoo.exists_async("/").get(timeout=timeout)
        except Exception:
            return False
        return True

    # -- lifecycle -------------------------------------------------------
    def connect(self, notice: Callable[[], object] | None = None,
                refused_fails: bool = False) -> ZkClient:
        """Connect within ``zk_timeout`` or raise :class:`ZkUnavailable` -- with
        ``refused_fails`` at once when every server is on loopback and refuses the
        connection; a TLS or authentication failure raises :class:`ZkSecurityError` (at
        once). ``notice`` is called once when the connection takes longer than
        :data:`NOTICE_AFTER` seconds (a TTY's "connecting to ..." line)."""
        start = time.monotonic()
        deadline = start + self.zk_timeout
        refused = probed = noticed = False
        try:
            live = self._kazoo.start_async()
            while not live.wait(0.05):  # kazoo sets no event for a failed handshake
                if self._quiet.tls_failure or self._kazoo.client_state == _AUTH_FAILED:
                    break
                waited = time.monotonic() - start
                if refused_fails and not probed and waited >= PROBE_AFTER:
                    probed = True
                    if refused_on_loopback(self.hosts):
                        refused = True
                        break
                if notice is not None and not noticed and waited >= NOTICE_AFTER:
                    noticed = True
                    notice()
                if time.monotonic() >= deadline:
                    break
            if not self._kazoo.connected:
                raise KazooTimeoutError("connection refused: nothing listens there" if refused
                                        else "Connection time-out")
            # The first request runs after the SASL and digest handshakes: it tells whether
            # the server accepts this session (enforce.auth.enabled, refused SASL).
            self._kazoo.exists_async("/").get(
                timeout=max(0.5, deadline - time.monotonic()))
            self._quiet.connected = True
        except (AuthFailedError, _RequireAuth) as exc:
            self._stop_quietly()
            raise self._auth_error(exc) from None
        except (KazooTimeoutError, KazooException, OSError, ValueError) as exc:
            self._stop_quietly()
            if self._quiet.tls_failure:
                raise ZkSecurityError(
                    f"TLS handshake with ZooKeeper at {self.hosts} failed: "
                    f"{self._quiet.tls_failure[:300]}; check --zk-tls-ca (the CA that "
                    "signed the server's certificate, which must name the host), "
                    "--zk-tls-cert/--zk-tls-key, and that the port is its "
                    "secureClientPort") from None
            if self._kazoo.client_state == _AUTH_FAILED:
                raise self._auth_error(exc) from None
            why = ("timed out" if isinstance(exc, KazooTimeoutError) and not refused
                   else str(exc) or type(exc))
            within = "" if refused else f" within {self.zk_timeout:g}s"
            tls = " over TLS" if self.tls is not None else ""
            hint = ("; the server closed every connection: if it is a TLS port "
                    "(secureClientPort), add --zk-tls" if self.tls is None and self._quiet.dropped
                    else "")
            raise ZkUnavailable(f"cannot reach ZooKeeper at {self.hosts}{tls}{within} "
                                f"({why}); check --zk / ZKCRAWL_ZK "
                                f"(start a local one with `zkcrawl local-zk start`){hint}"
                                ) from None
        return self

    def _auth_error(self, exc: BaseException) -> ZkSecurityError:
        if self.auth is None:
            return ZkSecurityError(f"ZooKeeper at {self.hosts} requires authentication: "
                                   "give --zk-auth or --zk-auth-file")
        if isinstance(exc, _RequireAuth) and exc.__class__ is not AuthFailedError:
            return ZkSecurityError(f"ZooKeeper at {self.hosts} closed the session of "
                                   f"{self.auth.describe()}: it requires authentication "
                                   "with another scheme (its enforce.auth.schemes)")
        return ZkSecurityError(f"ZooKeeper at {self.hosts} refused the credentials of "
                               f"{self.auth.describe()} (wrong user or password?)")

    def close(self) -> None:
        """End the session (ephemeral nodes vanish now) and stop all retries."""
        self._stopped.set()
        with self._pause_lock:
            if self._pause is not None:
                self._pause.stop()
        self._stop_quietly()

    def _stop_quietly(self) -> None:
        try:
            self._kazoo.stop()
            self._kazoo.close()
        except Exception:  # closing must never raise to the operator
            pass
        # Removed only now: stopping a never-connected client logs its last attempts too.
        logging.getLogger("kazoo.client").removeFilter(self._quiet)

    def __enter__(self) -> ZkClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -----------------------------------------------------------
    @property
    def connected(self) -> bool:
        return bool(self._kazoo.connected)

    @property
    def state(self) -> str:
        """One of :class:`~zkcrawl.zk.types.ZkState`'s values."""
        return str(self._kazoo.state)

    @property
    def session_id(self) -> int | None:
        cid = self._kazoo.client_id
        return int(cid[0]) if cid else None

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """``(session id, session password)`` of the current session, None before one."""
        cid = self._kazoo.client_id
        return (int(cid[0]), bytes(cid[1])) if cid else None

    def add_listener(self, listener: StateListener) -> None:
        """``listener(state)`` runs on kazoo's thread: it must not block."""
        self._kazoo.add_listener(listener)

    def remove_listener(self, listener: StateListener) -> None:
        self._kazoo.remove_listener(listener)

    # -- calls -----------------------------------------------------------
    def retry(self, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``func`` with the bounded command-retry policy."""
        result: T = self._kazoo.retry(func, *args, **kwargs)
        return result

    def ensure_path(self, path: str) -> None:
        """Create ``path`` and its parents where missing. Each try waits at most
        ``--zk-timeout`` (kazoo's own ``ensure_path`` waits for a reconnect however long it
        takes), tried again by the bounded command-retry policy."""
        def once() -> None:
            self.answer(self._kazoo.ensure_path_async(path))

        try:
            self._kazoo.retry(once)
        except RetryFailedError:
            raise ConnectionLoss(f"no answer from ZooKeeper within the retries of "
                                 f"{max(self.zk_timeout, 2.0):g} s") from None
        except NoAuthError:
            raise self._denied("create", path) from None

    # -- access ------------------------------------------------------------
    def get_acl(self, path: str) -> list[tuple[int, str, str]]:
        """The node's ACL as ``(perms, scheme, id)`` (perms: ZooKeeper's bits, 31 = ALL)."""
        acls, _stat = self._kazoo.get_acls(path)
        return [(int(a.perms), str(a.id.scheme), str(a.id.id)) for a in acls]

    def get_acl_async(self, path: str) -> Pending[tuple[list[tuple[int, str, str]], Stat]]:
        """Pipelined :meth:`get_acl`: ``(acl, stat)``."""
        pending: Any = self._kazoo.handler.async_result()
        inner = self._kazoo.get_acls_async(path)

        def done(res: Any) -> None:
            try:
                acls, stat = res.get_nowait()
            except Exception as exc:  # the request's own error, handed on
                pending.set_exception(exc)
                return
            pending.set(([(int(a.perms), str(a.id.scheme), str(a.id.id)) for a in acls], stat))

        inner.rawlink(done)
        result: Pending[tuple[list[tuple[int, str, str]], Stat]] = pending
        return result

    def set_acl_async(self, path: str, acl: Sequence[tuple[int, str, str]]) -> Pending[Stat]:
        """Pipelined :meth:`set_acl` (a NoAuth is the request's NoAuthError)."""
        pending: Pending[Stat] = self._kazoo.set_acls_async(
            path, [ACL(perms, Id(scheme, ident)) for perms, scheme, ident in acl])
        return pending

    def set_acl(self, path: str, acl: Sequence[tuple[int, str, str]]) -> None:
        """Replace ``path``'s ACL (ZooKeeper's setACL: needs ADMIN on the node); a NoAuth is
        a :class:`ZkAccessDenied`."""
        try:
            self.answer(self._kazoo.set_acls_async(
                path, [ACL(perms, Id(scheme, ident)) for perms, scheme, ident in acl]))
        except NoAuthError:
            raise self._denied("setACL", path) from None

    def check_access(self, path: str) -> list[str]:
        """With credentials, compare ``path``'s ACL (when the node exists and may be read)
        with this identity: a digest ACL naming the same user with another password is a
        wrong password (:class:`ZkSecurityError`). Returns warnings: the node is writable
        by others (:func:`~zkcrawl.zk.security.open_writers`) although ``--zk-acl
        creator``; or this identity may not write it."""
        if self.auth is None:
            return []
        try:
            acl = self.get_acl(path)
        except KazooException:  # no node (yet), no READ on it, a lost connection: no verdict
            return []
        writers = open_writers(acl)
        if writers and self.acl != [OPEN_ACL]:
            return [f"{path} was created without --zk-acl creator (its ACL: "
                    f"{describe_acl(acl)}): {writers} may write it; only znodes created "
                    "from now on get the creator ACL"]
        warning = access_warning(self.auth, acl, path)
        return [warning] if warning else []

    def _denied(self, op: str, path: str) -> ZkAccessDenied:
        who = (self.auth.describe() if self.auth is not None
               else "a session without credentials (give --zk-auth or --zk-auth-file)")
        # ZooKeeper checks a create's and a delete's permission on the parent node.
        checked = (path.rsplit("/", 1)[0] or "/") if op in ("create", "delete") else path
        try:
            acl = f" (ACL of {checked}: {describe_acl(self.get_acl(checked))})"
        except KazooException:
            acl = ""
        return ZkAccessDenied(f"ZooKeeper denied {op} of {path} to {who}{acl}: NoAuth; "
                              "every process of a root must use the same --zk-auth")

    # Synchronous calls wait at most ``--zk-timeout`` (wire.answer): while ZooKeeper is away
    # they raise ConnectionLoss instead of hanging until it returns -- a shutdown, a status
    # command or a producer waiting at back-pressure always ends in bounded time.
    def answer(self, pending: Pending[T]) -> T:
        """``pending``'s result within ``--zk-timeout``, else ConnectionLoss."""
        return answer(pending, self._wire.timeout)


    def exists(self, path: str, watch: Watcher | None = None) -> Stat | None:
        return self.answer(self.exists_async(path, watch))

    def exists_async(self, path: str, watch: Watcher | None = None) -> Pending[Stat | None]:
        pending: Pending[Stat | None] = self._kazoo.exists_async(path, watch=watch)
        return pending

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, Stat]:
        """The node's data (``b""`` when it has none) and stat; NoNodeError if missing."""
        data, stat = self.answer(self.get_async(path, watch))
        return bytes(data or b""), stat

    def get_async(self, path: str, watch: Watcher | None = None
                  ) -> Pending[tuple[bytes | None, Stat]]:
        """Pipelined :meth:`get`; the data is None for a node created with null data."""
        pending: Pending[tuple[bytes | None, Stat]] = self._kazoo.get_async(path, watch=watch)
        return pending

    def get_children(self, path: str, watch: Watcher | None = None) -> list[str]:
        return list(self.answer(self.get_children_async(path, watch)))

    def get_children_async(self, path: str, watch: Watcher | None = None
                           ) -> Pending[list[str]]:
        pending: Pending[list[str]] = self._kazoo.get_children_async(path, watch=watch)
        return pending

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False) -> str:
        """Create the node; returns its path (with the sequence number, if sequential)."""
        try:
            pending: Pending[str] = self._kazoo.create_async(
                path, value, ephemeral=ephemeral, sequence=sequence, makepath=makepath)
            return str(self.answer(pending))
        except NoAuthError:
            raise self._denied("create", path) from None

    def set(self, path: str, value: bytes, version: int = -1) -> Stat:
        """Set the data (only at ``version``, unless -1: else BadVersionError)."""
        try:
            stat: Stat = self.answer(self._kazoo.set_async(path, value, version=version))
        except NoAuthError:
            raise self._denied("set", path) from None
        return stat

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        try:
            if recursive:
                self._kazoo.delete(path, version=version, recursive=True)
            else:
                self.answer(self.delete_async(path, version))
        except NoAuthError:
            raise self._denied("delete", path) from None

    def delete_async(self, path: str, version: int = -1) -> Pending[bool]:
        """Pipelined delete (True, or NoNodeError/BadVersionError/NotEmptyError...)."""
        pending: Pending[bool] = self._kazoo.delete_async(path, version=version)
        return pending

    def get_many(self, paths: Sequence[str], per_request: int | None = None
                 ) -> list[ReadResult]:
        """Data of many znodes in one round trip (:class:`~zkcrawl.zk.wire.MultiRead`; of
        at most ``per_request`` paths each, pipelined, for large nodes): per path ``(bytes,
        stat)`` or the error (NoNodeError...). Falls back to pipelined gets on servers
        < 3.6."""
        if not paths:
            return []
        if self._multiread:
            step = per_request or len(paths)
            try:
                pending = [self._wire.multi_read(paths[i:i + step])
                           for i in range(0, len(paths), step)]
                return [r for one in pending for r in self.answer(one)]
            except (UnimplementedError, MarshallingError):
                self._multiread = False  # an old server: pipelined gets from now on
        return [r if isinstance(r, Exception) else (r[0] or b"", r[1])
                for r in gather([self.get_async(p) for p in paths], self.zk_timeout)]

    def create_many_async(self, marker: str, prefix: str, datas: Sequence[bytes]
                          ) -> Pending[list[str | Exception]]:
        """Commit :class:`~zkcrawl.zk.wire.CreateMany`: an ephemeral ``marker``, then a
        sequential create under ``prefix`` per data; results like a transaction's."""
        return self._wire.create_many(marker, prefix, datas)

    def transaction(self) -> Multi:
        """A transaction of creates, deletes and setData (:class:`~zkcrawl.zk.wire.Multi`);
        ``commit()`` returns per-op results or errors, like kazoo's."""
        return Multi(self._wire)

    # -- watches ---------------------------------------------------------
    def watch_data(self, path: str, func: DataWatcher) -> None:
        """Call ``func(data, stat)`` now and on every change of ``path``, creation and
        deletion included (``stat`` None: no node); re-armed by itself (kazoo's
        ``DataWatch``) until ``func`` returns False. Runs on kazoo's thread: never block."""
        def call(data: bytes | None, stat: Stat | None,
                 _event: WatchedEvent | None = None) -> bool | None:
            return func(data, stat)

        DataWatch(self._kazoo, path, call)

    def watch_children(self, path: str, func: ChildrenWatcher) -> None:
        """Call ``func(children)`` now and on every change of ``path``'s children; re-armed
        by itself (kazoo's ``ChildrenWatch``) until ``func`` returns False. kazoo's thread."""
        ChildrenWatch(self._kazoo, path, func)


class PauseWatch:
    """Tells that this process was paused (SIGSTOP, a frozen VM, a long stall): a thread
    ticks every :data:`PAUSE_TICK` s; a gap of more than :data:`PAUSE_S` between two ticks
    -- seen by the ticking thread, or by anyone who asks while the last tick is that old --
    is a pause, and the pause lasts until a request sent after it is answered (``probe``).

    Why by hand: nothing in kazoo or the standard library tells a process it was stopped;
    a monotonic clock jumps over the pause, and that is what is measured."""

    def __init__(self, probe: Callable[[float], bool]) -> None:
        self._probe = probe
        self._tick = time.monotonic()
        self._paused_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zk-pause-watch", daemon=True)

    def start(self) -> PauseWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def in_doubt(self, now: float) -> bool:
        return self._paused_at is not None or now - self._tick > PAUSE_S

    def _run(self) -> None:
        while not self._stop.wait(PAUSE_TICK):
            now = time.monotonic()
            if now - self._tick > PAUSE_S:
                self._paused_at = now  # before the tick moves: no reader sees neither
            self._tick = now
            since = self._paused_at
            if since is not None and self._probe(1.0) and self._paused_at == since:
                self._paused_at = None


PAUSE_TICK = 0.1
PAUSE_S = 1.0  # a thread that ticks every 0.1 s and missed 1 s: the process was stopped

#: Seconds of a connection attempt before :func:`refused_on_loopback` is asked (a live
#: local server has answered long before), and before the caller's ``notice``.
PROBE_AFTER = 0.3
NOTICE_AFTER = 0.5


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: its addresses are not ours to guess
        return False


def refused_on_loopback(hosts: str, timeout: float = 1.0) -> bool:
    """True when every server of the connection string ``hosts`` is on this machine
    (127.0.0.0/8, ::1, ``localhost``) and refuses a TCP connection: nothing listens there,
    so waiting ``--zk-timeout`` cannot help. False for anything else (a remote server, one
    that accepts, a timeout, a string kazoo cannot parse); never raises."""
    try:
        servers, _chroot = collect_hosts(hosts)
    except ValueError:
        return False
    if not servers or not all(_is_loopback(host) for host, _ in servers):
        return False
    for host, port in servers:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except ConnectionRefusedError:
            continue
        except (OSError, OverflowError, ValueError):
            return False
        return False  # something listens: kazoo's handshake will tell
    return True


def gather(asyncs: Iterable[Pending[T]], timeout: float | None = None) -> list[T | Exception]:
    """Wait for pipelined requests; each slot is a value or the request's exception.
    ``timeout`` bounds the whole wait (not each slot): past it this raises ConnectionLoss,
    as :meth:`ZkClient.answer` does -- kazoo keeps a request made while disconnected until it
    reconnects. None: wait as long as kazoo does (callers that handle the connection's
    state themselves)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    out: list[T | Exception] = []
    for res in asyncs:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            out.append(res.get(timeout=left))
        except KazooTimeoutError:  # only with a timeout: the wait, not the request, failed
            raise ConnectionLoss(f"no answer from ZooKeeper within {timeout:g} s") from None
        except Exception as exc:
            out.append(exc)
    return out


def tx_ok(results: Sequence[object]) -> bool:
    """True when a committed transaction's results hold no exception."""
    return not any(isinstance(r, Exception) for r in results)
