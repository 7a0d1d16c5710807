"""A thin typed adapter around kazoo (which ships no type hints).

It owns the connection policy:

* **connect** waits at most ``zk_timeout`` seconds; an unreachable ensemble is a
  :class:`~zkcrawl.errors.ZkUnavailable` (exit 2), never a hang.
* **reconnect** (kazoo's ``connection_retry``) goes on while the process runs,
  with capped exponential delays, and is interrupted by :meth:`ZkClient.close`.
* **commands** (kazoo's ``command_retry``, used by :meth:`ZkClient.retry`) are
  retried a bounded number of times within a deadline; kazoo's default would
  retry forever with growing delays, and a shutdown would hang in it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import EXCEPTIONS, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import (
    Create,
    Delete,
    GetData,
    MultiHeader,
    SetData,
    Transaction,
    int_struct,
    multiheader_struct,
    stat_struct,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import OPEN_ACL_UNSAFE

from zkcrawl.errors import ZkUnavailable

T = TypeVar("T")
_OPEN_ACL = OPEN_ACL_UNSAFE

__all__ = [
    "KazooException",
    "KazooState",
    "NoNodeError",
    "NodeExistsError",
    "ZkClient",
    "ZnodeStat",
]

StateListener = Callable[[str], Any]


class MultiRead:
    """ZooKeeper 3.6+ ``multiRead`` (opcode 22): many getData in ONE request.

    kazoo has no multiRead, and its pipelined ``get_async`` costs a full trip through
    its connection loop per item (~0.5 ms here), which dominated a 25-item claim.
    Written by hand for that reason; it uses only kazoo's public serialization
    helpers and the documented wire format (MultiHeader + GetDataResponse/ErrorResponse).
    """

    type = 22

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)

    def serialize(self) -> bytes:
        return b"".join([*(_GETDATA_HEAD + _string(p) + b"\x00" for p in self.paths),
                         _MULTI_DONE])

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        return _read_multi(data, offset, _getdata_result)


class CreateMany:
    """One ``multi`` transaction: an ephemeral marker, then many sequential creates
    under one path prefix -- the producer's offer.

    Same wire format as kazoo's Transaction (and the same results, read by
    :meth:`Multi.deserialize`), but the
    bytes shared by every create (path prefix, ACL, flags) are built once: kazoo's
    per-op validation and path normalisation cost more than the item itself.
    """

    type = Transaction.type

    def __init__(self, marker: str, prefix: str, datas: Sequence[bytes], acl: Any) -> None:
        self.marker = Create(marker, b"", acl, 1)  # 1: ephemeral
        one = Create(prefix, b"", acl, 2).serialize()  # 2: sequential
        path_len = 4 + len(prefix.encode("utf-8"))
        self._head = MultiHeader(Create.type, False, -1).serialize() + one[:path_len]
        self._tail = bytes(one[path_len + 4:])  # after the (empty) data: ACL + flags
        self.datas = datas

    def serialize(self) -> bytearray:
        b = bytearray(MultiHeader(Create.type, False, -1).serialize())
        b.extend(self.marker.serialize())
        head, tail, pack = self._head, self._tail, int_struct.pack
        for data in self.datas:
            b.extend(head)
            b.extend(pack(len(data)))
            b.extend(data)
            b.extend(tail)
        b.extend(multiheader_struct.pack(-1, True, -1))
        return b

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        return Multi.deserialize(data, offset)


class Multi:
    """A ``multi`` transaction of creates, deletes and setData, committed in one round trip.

    The same wire format and result deserializer as kazoo's ``TransactionRequest``, minus
    its per-op path normalisation and validation, which cost more client CPU than the
    server spends on the op (~9 µs per delete here, and a completion is two deletes per
    item). Paths are ours and already absolute; the ACL bytes are built once.
    ``commit()`` returns per-op results: the created path, ``True`` for a delete, or the
    exception instance for a failed op (``RolledBackError`` for the ops it undid).
    """

    type = Transaction.type  # kazoo un-chroots the created paths of this type

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        # kazoo's Transaction.deserialize, without a namedtuple per op header.
        return _read_multi(data, offset, _transaction_result)

    def __init__(self, kazoo: Any) -> None:
        self._kazoo = kazoo
        self._chroot = kazoo.chroot or ""
        self._acl = _acl_bytes(kazoo.default_acl or _OPEN_ACL)
        self._ops: list[bytes] = []

    def __len__(self) -> int:
        return len(self._ops)

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False,
               sequence: bool = False) -> None:
        if not isinstance(value, bytes):
            raise TypeError(f"value must be bytes, not {type(value).__name__}")
        flags = (1 if ephemeral else 0) | (2 if sequence else 0)
        self._ops.append(b"".join((_CREATE_HEAD, _string(self._chroot + path),
                                   int_struct.pack(len(value)), value, self._acl,
                                   int_struct.pack(flags))))

    def delete(self, path: str, version: int = -1) -> None:
        self._ops.append(b"".join((_DELETE_HEAD, _string(self._chroot + path),
                                   int_struct.pack(version))))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self._ops.append(b"".join((_SETDATA_HEAD, _string(self._chroot + path),
                                   int_struct.pack(len(value)), value,
                                   int_struct.pack(version))))

    def serialize(self) -> bytes:
        return b"".join((*self._ops, _MULTI_DONE))

    def commit_async(self) -> Any:
        result = self._kazoo.handler.async_result()
        self._kazoo._call(self, result)
        return result

    def commit(self) -> list[Any]:
        return list(self.commit_async().get())


def _read_multi(data: bytes, offset: int,
                op_result: Callable[[int, bytes, int], tuple[Any, int]]) -> list[Any]:
    """The per-op results of a multi response (multi or multiRead): each op's header, then
    ``op_result(kind, data, offset) -> (result, offset)`` for its body; a failed op gives the
    exception instance (kazoo's own mapping of the error code)."""
    results: list[Any] = []
    while True:
        kind, done, _ = multiheader_struct.unpack_from(data, offset)
        offset += _HEADER_SIZE
        if done:
            return results
        if kind == -1:
            (err,) = int_struct.unpack_from(data, offset)
            results.append(EXCEPTIONS[err]())
            offset += 4
        else:
            result, offset = op_result(kind, data, offset)
            results.append(result)


def _transaction_result(kind: int, data: bytes, offset: int) -> tuple[Any, int]:
    if kind == Create.type:  # the created path
        (length,) = int_struct.unpack_from(data, offset)
        return data[offset + 4:offset + 4 + length].decode("utf-8"), offset + 4 + length
    if kind == SetData.type:  # the node's new stat
        return ZnodeStat._make(stat_struct.unpack_from(data, offset)), offset + _STAT_SIZE
    return True, offset  # delete (and check): no body


def _getdata_result(kind: int, data: bytes, offset: int) -> tuple[Any, int]:
    (length,) = int_struct.unpack_from(data, offset)
    offset += 4
    value = bytes(data[offset:offset + length]) if length > 0 else b""
    offset += max(length, 0)
    stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
    return (value, stat), offset + _STAT_SIZE


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return int_struct.pack(len(data)) + data


def _acl_bytes(acls: Sequence[Any]) -> bytes:
    parts = [int_struct.pack(len(acls))]
    for acl in acls:
        parts += [int_struct.pack(acl.perms), _string(acl.id.scheme), _string(acl.id.id)]
    return b"".join(parts)


_HEADER_SIZE = multiheader_struct.size
_STAT_SIZE = stat_struct.size
_GETDATA_HEAD = multiheader_struct.pack(GetData.type, False, -1)
_CREATE_HEAD = multiheader_struct.pack(Create.type, False, -1)
_DELETE_HEAD = multiheader_struct.pack(Delete.type, False, -1)
_SETDATA_HEAD = multiheader_struct.pack(SetData.type, False, -1)
_MULTI_DONE = multiheader_struct.pack(-1, True, -1)


class _QuietUntilConnected(logging.Filter):
    """Drop kazoo's per-attempt connection warnings before the first connect:
    an unreachable ZooKeeper must be exactly one line on stderr (ours)."""

    def __init__(self) -> None:
        super().__init__()
        self.connected = False

    def filter(self, record: logging.LogRecord) -> bool:
        return self.connected or record.levelno >= logging.ERROR


class ZkClient:
    """One ZooKeeper session and the typed calls zkcrawl makes on it."""

    def __init__(self, hosts: str, *, zk_timeout: float = 10.0,
                 session_timeout: float = 10.0, read_only: bool = False) -> None:
        self.hosts = hosts
        self.zk_timeout = zk_timeout
        self._stopped = threading.Event()
        conn_retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0,
                                max_jitter=0.3)
        cmd_retry = KazooRetry(max_tries=5, delay=0.05, backoff=2, max_delay=1.0,
                               deadline=max(zk_timeout, 2.0), ignore_expire=False,
                               interrupt=self._stopped.is_set)
        self._multiread = True
        self._quiet = _QuietUntilConnected()
        logger = logging.getLogger("kazoo.client")
        logger.addFilter(self._quiet)
        self.kazoo: Any = KazooClient(hosts=hosts, timeout=session_timeout,
                                      connection_retry=conn_retry, command_retry=cmd_retry,
                                      read_only=read_only, logger=logger)

    # -- lifecycle -------------------------------------------------------
    def connect(self) -> ZkClient:
        """Connect within ``zk_timeout`` or raise :class:`ZkUnavailable`."""
        try:
            self.kazoo.start(timeout=self.zk_timeout)
            self._quiet.connected = True
        except (KazooTimeoutError, KazooException, OSError, ValueError) as exc:
            self._stop_quietly()
            why = "timed out" if isinstance(exc, KazooTimeoutError) else str(exc) or type(exc)
            raise ZkUnavailable(f"cannot reach ZooKeeper at {self.hosts} within "
                                f"{self.zk_timeout:g}s ({why}); check --zk / ZKCRAWL_ZK "
                                "(start a local one with `zkcrawl local-zk start`)") from None
        return self

    def close(self) -> None:
        """End the session (ephemeral nodes vanish now) and stop all retries."""
        self._stopped.set()
        self._stop_quietly()

    def _stop_quietly(self) -> None:
        try:
            self.kazoo.stop()
            self.kazoo.close()
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
        return bool(self.kazoo.connected)

    @property
    def state(self) -> str:
        return str(self.kazoo.state)

    @property
    def session_id(self) -> int | None:
        cid = self.kazoo.client_id
        return int(cid[0]) if cid else None

    def add_listener(self, listener: StateListener) -> None:
        """``listener(state)`` runs on kazoo's thread: it must not block."""
        self.kazoo.add_listener(listener)

    def remove_listener(self, listener: StateListener) -> None:
        self.kazoo.remove_listener(listener)

    # -- calls -----------------------------------------------------------
    def retry(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``func`` with the bounded command-retry policy."""
        return self.kazoo.retry(func, *args, **kwargs)  # type: ignore[no-any-return]

    def ensure_path(self, path: str) -> None:
        self.retry(self.kazoo.ensure_path, path)

    def exists(self, path: str, watch: Callable[[Any], Any] | None = None) -> ZnodeStat | None:
        return self.kazoo.exists(path, watch=watch)  # type: ignore[no-any-return]

    def get(self, path: str, watch: Callable[[Any], Any] | None = None
            ) -> tuple[bytes, ZnodeStat]:
        data, stat = self.kazoo.get(path, watch=watch)
        return bytes(data or b""), stat

    def get_children(self, path: str, watch: Callable[[Any], Any] | None = None) -> list[str]:
        return list(self.kazoo.get_children(path, watch=watch))

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False) -> str:
        return str(self.kazoo.create(path, value, ephemeral=ephemeral, sequence=sequence,
                                     makepath=makepath))

    def set(self, path: str, value: bytes) -> ZnodeStat:
        return self.kazoo.set(path, value)

    def delete(self, path: str, recursive: bool = False) -> None:
        self.kazoo.delete(path, recursive=recursive)

    def get_async(self, path: str) -> Any:
        return self.kazoo.get_async(path)

    def get_many(self, paths: Sequence[str]) -> list[Any]:
        """Data of many znodes in one round trip: per path ``(bytes, stat)`` or the
        exception (NoNodeError...). Falls back to pipelined gets on servers < 3.6."""
        if not paths:
            return []
        if self._multiread:
            chroot = self.kazoo.chroot or ""
            result = self.kazoo.handler.async_result()
            self.kazoo._call(MultiRead([chroot + p for p in paths]), result)
            try:
                return list(result.get())
            except KazooException as exc:
                if type(exc).__name__ not in ("UnimplementedError", "MarshallingError"):
                    raise
                self._multiread = False  # an old server: pipelined gets from now on
        return gather([self.kazoo.get_async(p) for p in paths])

    def create_many_async(self, marker: str, prefix: str, datas: Sequence[bytes]) -> Any:
        """Commit :class:`CreateMany`; the result is like a transaction's commit()."""
        chroot = self.kazoo.chroot or ""
        result = self.kazoo.handler.async_result()
        acl = self.kazoo.default_acl or _OPEN_ACL
        self.kazoo._call(CreateMany(chroot + marker, chroot + prefix, datas, acl), result)
        return result

    def get_children_async(self, path: str) -> Any:
        return self.kazoo.get_children_async(path)

    def transaction(self) -> Multi:
        """A transaction of creates and deletes (:class:`Multi`); ``commit()`` returns
        per-op results or exceptions, like kazoo's."""
        return Multi(self.kazoo)


def gather(asyncs: Sequence[Any], timeout: float | None = None) -> list[Any]:
    """Wait for pipelined kazoo async results; each slot is a value or the exception."""
    out: list[Any] = []
    for res in asyncs:
        try:
            out.append(res.get(timeout=timeout))
        except Exception as exc:
            out.append(exc)
    return out


def tx_ok(results: Sequence[Any]) -> bool:
    """True when a committed transaction's results hold no exception."""
    return not any(isinstance(r, Exception) for r in results)
