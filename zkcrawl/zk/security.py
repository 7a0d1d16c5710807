"""ZooKeeper credentials, ACLs and TLS (SPEC §4 "Security flags"), as plain data: no kazoo
import, so settings can be checked without a connection
(:class:`~zkcrawl.zk.client.ZkClient` turns them into kazoo's arguments).

* :class:`ZkAuth`: ``digest:USER:PASSWORD`` or ``sasl:DIGEST-MD5:USER:PASSWORD``; its
  ``repr`` and every message built here name the scheme and user, never the secret.
* :func:`creator_acl`: with ``--zk-acl creator``, ALL for this identity, READ for anyone.
* :class:`ZkTls`: CA bundle, client certificate and key.
* :func:`relied_on`, :func:`open_writers`, :func:`repaired_acl`: which nodes of a root
  matter, whether *others* (no credentials needed) may write them, and the ACL that fixes
  it. Every ACL read is hostile data: it decodes to a verdict, never an exception.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import ipaddress
import os
import stat
import warnings
from typing import Any

from zkcrawl.errors import UsageError

__all__ = ["ACL_MODES", "ALL", "MODIFY_PERMS", "OPEN_ACL", "PERMS", "READ_ACL", "SASL_MECHANISMS",
           "WRITE_PERMS", "Acl", "ZkAuth", "ZkSecurityError", "ZkTls",
           "access_warning", "creator_acl", "describe_acl", "digest_id",
           "grants_everyone", "ip_network", "needs_no_credentials", "open_writers",
           "parse_auth", "read_auth_file", "relied_on", "repaired_acl", "sasl_available",
           "world_readable_warning"]

#: ZooKeeper's permission bits (org.apache.zookeeper.ZooDefs.Perms).
PERMS = {"READ": 1, "WRITE": 2, "CREATE": 4, "DELETE": 8, "ADMIN": 16}
ALL = 31
#: What zkcrawl needs on the nodes of a root to work: write data, create and delete children.
WRITE_PERMS = PERMS["WRITE"] | PERMS["CREATE"] | PERMS["DELETE"]
#: (perms, scheme, id) of world read access.
READ_ACL = (PERMS["READ"], "world", "anyone")
#: ZooKeeper's OPEN_ACL_UNSAFE: anyone may do anything (``--zk-acl open``, no credentials).
OPEN_ACL = (ALL, "world", "anyone")
SASL_MECHANISMS = ("DIGEST-MD5",)
SCHEMES = ("digest", "sasl")
_MAX_AUTH = 4096


class ZkSecurityError(UsageError):
    """Credentials, ACL or TLS do not fit the ensemble: a configuration error, exit 2."""


@dataclasses.dataclass(frozen=True)
class ZkAuth:
    """One identity: ``scheme`` ``digest`` or ``sasl`` (``mechanism`` DIGEST-MD5)."""

    scheme: str
    user: str
    password: str = dataclasses.field(repr=False)
    mechanism: str = ""

    def __repr__(self) -> str:
        return f"ZkAuth({self.redacted()!r})"

    __str__ = __repr__

    def redacted(self) -> str:
        """The flag's value with the password replaced: ``digest:alice:***``."""
        mech = f"{self.mechanism}:" if self.mechanism else ""
        return f"{self.scheme}:{mech}{self.user}:***"

    def describe(self) -> str:
        """``digest user 'alice'`` / ``SASL DIGEST-MD5 user 'alice'``, for messages."""
        if self.scheme == "sasl":
            return f"SASL {self.mechanism} user {self.user!r}"
        return f"digest user {self.user!r}"

    @property
    def acl_id(self) -> tuple[str, str]:
        """(scheme, id) ZooKeeper gives this identity in ACLs: ``digest`` ids are
        ``user:base64(sha1(user:password))``, SASL ones the user name."""
        if self.scheme == "digest":
            return "digest", digest_id(self.user, self.password)
        return "sasl", self.user


def digest_id(user: str, password: str) -> str:
    """ZooKeeper's DigestAuthenticationProvider.generateDigest (UTF-8, like kazoo's
    ``make_digest_acl_credential``)."""
    raw = hashlib.sha1(f"{user}:{password}".encode()).digest()  # the scheme is SHA-1
    return f"{user}:{base64.b64encode(raw).decode()}"


def parse_auth(text: str, source: str = "--zk-auth") -> ZkAuth:
    """``digest:USER:PASSWORD`` or ``sasl:DIGEST-MD5:USER:PASSWORD`` (the password may hold
    colons). A :class:`UsageError` that never quotes the password."""
    text = text.strip()
    if not text:
        raise UsageError(f"{source}: empty credentials (expected digest:USER:PASSWORD)")
    if len(text) > _MAX_AUTH:
        raise UsageError(f"{source}: credentials longer than {_MAX_AUTH} characters")
    scheme, _, rest = text.partition(":")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        shown = scheme[:20] if scheme.isalnum() else "?"
        raise UsageError(f"{source}: unknown scheme {shown!r} (expected digest:USER:PASSWORD "
                         "or sasl:DIGEST-MD5:USER:PASSWORD)")
    mechanism = ""
    if scheme == "sasl":
        mechanism, _, rest = rest.partition(":")
        mechanism = mechanism.upper()
        if mechanism not in SASL_MECHANISMS:
            shown = mechanism[:20] if mechanism.replace("-", "").isalnum() else "?"
            raise UsageError(f"{source}: SASL mechanism {shown!r} is not supported "
                             f"(supported: {', '.join(SASL_MECHANISMS)}; "
                             "e.g. sasl:DIGEST-MD5:USER:PASSWORD)")
    user, colon, password = rest.partition(":")
    form = "sasl:DIGEST-MD5:USER:PASSWORD" if scheme == "sasl" else "digest:USER:PASSWORD"
    if not colon or not user or not password:
        raise UsageError(f"{source}: expected {form} (user and password both non-empty)")
    if any(c in user for c in "\x00\r\n") or any(c in password for c in "\x00\r\n"):
        raise UsageError(f"{source}: control characters (NUL, CR, LF) are not allowed")
    return ZkAuth(scheme, user, password, mechanism)


def read_auth_file(path: str) -> ZkAuth:
    """The credentials on the first line of ``path`` (surrounding whitespace ignored)."""
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline(_MAX_AUTH + 2)
    except FileNotFoundError:
        raise UsageError(f"--zk-auth-file: no such file: {path}") from None
    except (OSError, ValueError) as exc:  # ValueError: NUL in the name, not UTF-8...
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise UsageError(f"--zk-auth-file: cannot read {path}: {why}") from None
    return parse_auth(first, f"--zk-auth-file {path}")


def world_readable_warning(path: str, what: str) -> str | None:
    """A warning when group or others may read ``path`` (a secret), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
        return (f"{what} {path} is readable or writable by group or others "
                f"(mode {stat.S_IMODE(mode):04o}): chmod 600 it")
    return None


def creator_acl(auth: ZkAuth) -> list[tuple[int, str, str]]:
    """``--zk-acl creator``: ALL for ``auth``'s identity, READ for anyone (so ``zkcrawl
    status`` and other readers work without credentials)."""
    scheme, ident = auth.acl_id
    return [(ALL, scheme, ident), READ_ACL]


def describe_acl(acl: list[tuple[int, str, str]]) -> str:
    """``digest:alice=ALL, world:anyone=READ`` (a digest id shown without its hash)."""
    parts = []
    for perms, scheme, ident in acl:
        names = "ALL" if perms == ALL else "+".join(n for n, b in PERMS.items() if perms & b)
        shown = ident.split(":", 1)[0] if scheme == "digest" else ident
        parts.append(f"{scheme}:{shown}={names or 'none'}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class ZkTls:
    """TLS to ZooKeeper. ``ca``: PEM bundle the server certificate must chain to (None: the
    system's); ``cert`` + ``key``: this client's certificate (mutual TLS). The server's
    certificate is always verified, host name included (as ZooKeeper's Java client does)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def check(self) -> list[str]:
        """Load the files as the connection will (UsageError on any problem); returns
        warnings (a key readable by others)."""
        import ssl

        if (self.cert is None) != (self.key is None):
            raise UsageError("--zk-tls-cert and --zk-tls-key go together (a client "
                             "certificate needs its key)")
        for flag, path in (("--zk-tls-ca", self.ca), ("--zk-tls-cert", self.cert),
                           ("--zk-tls-key", self.key)):
            if path is None:
                continue
            try:
                with open(path, "rb"):
                    pass
            except FileNotFoundError:
                raise UsageError(f"{flag}: no such file: {path}") from None
            except (OSError, ValueError) as exc:
                why = getattr(exc, "strerror", None) or type(exc).__name__
                raise UsageError(f"{flag}: cannot read {path}: {why}") from None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.ca is not None:
            try:
                ctx.load_verify_locations(self.ca)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise UsageError(f"--zk-tls-ca: {self.ca} holds no usable PEM CA "
                                 f"certificate ({_ssl_reason(exc)})") from None
        if self.cert is not None and self.key is not None:
            try:
                # A callable password: an encrypted key fails here instead of prompting.
                ctx.load_cert_chain(self.cert, self.key, password=lambda: b"")
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise UsageError(f"--zk-tls-cert/--zk-tls-key: {self.cert} and {self.key} "
                                 f"are not a PEM certificate and its unencrypted key "
                                 f"({_ssl_reason(exc)})") from None
        warning = world_readable_warning(self.key, "--zk-tls-key") if self.key else None
        return [warning] if warning else []


def _ssl_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None)
    return str(reason or type(exc).__name__)


def sasl_available() -> bool:
    """kazoo's SASL needs the ``pure-sasl`` package."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import puresasl  # type: ignore[import-not-found, import-untyped, unused-ignore]  # noqa: F401
        except ImportError:
            return False
    return True


# -- the ACLs of a root's nodes (SPEC §4 "Security flags") --------------------------------
#: What lets a client change a node, its children or its ACL.
MODIFY_PERMS = WRITE_PERMS | PERMS["ADMIN"]
#: ``--zk-acl`` values: ``fix`` is ``creator`` that also repairs, at start, the nodes of the
#: root others may write.
ACL_MODES = ("creator", "open", "fix")
_IP_ID_LIMIT = 64
Acl = list[tuple[int, str, str]]


def ip_network(ident: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The address range of an ``ip`` ACL id (``10.0.0.0/8``, ``127.0.0.1``, ``::1/128``),
    or None for anything ZooKeeper would not match (a hostile ACL may hold any text)."""
    if len(ident) > _IP_ID_LIMIT or not ident.isascii():
        return None
    try:
        return ipaddress.ip_network(ident.strip(), strict=False)
    except ValueError:
        return None


def needs_no_credentials(scheme: str, ident: str) -> bool:
    """An ACL entry every client holds without credentials: ``world:anyone``, or ``ip``
    (every client connecting from that range, authenticated or not, e.g. every local user
    for ``ip:127.0.0.1``)."""
    return (scheme, ident) == ("world", "anyone") or scheme == "ip"


def grants_everyone(scheme: str, ident: str) -> bool:
    """``world:anyone``, or an ``ip`` range of every address (``ip:0.0.0.0/0``, ``ip:::/0``)."""
    if (scheme, ident) == ("world", "anyone"):
        return True
    net = ip_network(ident) if scheme == "ip" else None
    return net is not None and net.prefixlen == 0


def open_writers(acl: Acl) -> str | None:
    """Who may change a node with ``acl`` without credentials, in words, or None: "anyone
    who reaches ZooKeeper" (``world:anyone`` or ``ip:0.0.0.0/0`` with a write permission)
    or "every client connecting from 10.0.0.0/8"."""
    ranges = []
    for perms, scheme, ident in acl:
        if not perms & MODIFY_PERMS or not needs_no_credentials(scheme, ident):
            continue
        if grants_everyone(scheme, ident):
            return "anyone who reaches ZooKeeper"
        net = ip_network(ident)
        ranges.append(str(net) if net is not None else repr(ident[:_IP_ID_LIMIT]))
    return f"every client connecting from {', '.join(ranges)}" if ranges else None


def access_warning(auth: ZkAuth, acl: Acl, path: str) -> str | None:
    """Whether ``auth`` may write a node with ``acl``: None if it may (or an ``ip`` entry
    may let it), a warning if it may not; a digest entry naming the same user with another
    password is a wrong password (:class:`ZkSecurityError`)."""
    scheme, ident = auth.acl_id
    granted = 0
    for perms, s, i in acl:
        if (s, i) == (scheme, ident) or grants_everyone(s, i):
            granted |= perms
    if granted & WRITE_PERMS == WRITE_PERMS:
        return None
    if any(s == "ip" and p & WRITE_PERMS for p, s, _i in acl):
        return None  # it depends on the address this client connects from: no verdict
    if scheme == "digest" and any(
            s == "digest" and i.split(":", 1)[0] == auth.user and i != ident
            for _p, s, i in acl):
        raise ZkSecurityError(f"wrong password for {auth.describe()}: the ACL of "
                              f"{path} grants that user with another password")
    return (f"the ACL of {path} ({describe_acl(acl)}) does not let {auth.describe()} "
            "write: writes will fail (NoAuth); every process of a root must use the same "
            "identity")


def repaired_acl(acl: Acl, ours: Acl) -> Acl:
    """``acl`` without the entries that need no credentials, with ``ours`` (the creator
    ACL: ALL for this identity, READ for anyone) in front; other identities are kept."""
    mine = {(s, i) for _p, s, i in ours}
    return list(ours) + [(p, s, i) for p, s, i in acl
                         if not needs_no_credentials(s, i) and (s, i) not in mine]


def relied_on(layout: Any) -> list[str]:
    """The root and every node directly under it that a ``Layout`` names (each of its
    properties that is such a path: the containers and the control node), so that a node a
    new version of the layout adds is checked too. The root first, then sorted."""
    root: str = layout.root
    found = set()
    for name in dir(type(layout)):
        if isinstance(getattr(type(layout), name), property):
            value = getattr(layout, name)
            if (isinstance(value, str) and value.startswith(root + "/")
                    and "/" not in value[len(root) + 1:]):
                found.add(value)
    return [root or "/", *sorted(found)]
