"""Checks of setting values that more than one command needs.

Each ``*_problem`` function says in a few words why a value cannot be used, or returns
None; it never raises, whatever the string. The commands' ``validate()`` methods turn a
problem into one :class:`~zkcrawl.errors.UsageError` line naming the flag (exit 2).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# Characters ZooKeeper refuses in a znode path (PathUtils.validatePath).
_ZK_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as an HTTP header value (``--user-agent``), or None: a
    CR or LF would end the header (and inject others), other controls are refused by
    servers, and an empty agent matches no robots.txt group by name."""
    if not value.strip():
        return "it is empty"
    if len(value) > 1000:
        return f"{len(value)} characters (at most 1000)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "control character (CR, LF, TAB...)"
    if not value.isascii():
        return "non-ASCII character"
    return None


def zk_hosts_problem(hosts: str) -> str | None:
    """Why ``hosts`` is not a ZooKeeper connect string kazoo can use, or ``None``."""
    servers, slash, chroot = hosts.strip().partition("/")
    if slash and (problem := znode_path_problem("/" + chroot)):
        return f"bad chroot ({problem})"
    if not servers:
        return "no server"
    for server in servers.split(","):
        host, port = _split_port(server.strip())
        if not host or not _HOST.match(host):
            return f"bad host {server.strip()[:60]!r}"
        if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
            return f"bad port {port[:20]!r}"
    return None


def _split_port(server: str) -> tuple[str, str | None]:
    """``host:port`` / ``[v6]:port`` / ``host`` -> (host, port or None)."""
    if server.startswith("["):
        host, _, rest = server.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else (rest or None)
    host, colon, port = server.rpartition(":")
    return (host, port) if colon else (server, None)


def znode_path_problem(path: str) -> str | None:
    """Why ZooKeeper would refuse ``path`` as a znode path, or ``None`` if it would not."""
    if not path.startswith("/"):
        return "it must start with '/'"
    if path == "/":
        return None
    if _ZK_BAD_CHARS.search(path):
        return "control, surrogate or private-use character"
    if any(seg in ("", ".", "..") for seg in path.split("/")[1:]):
        return "empty, '.' or '..' segment"
    return None


def did_you_mean(given: str, known: Iterable[str]) -> str:
    """``; did you mean X?`` with the nearest of ``known`` (difflib's ratio >= 0.6), or ``""``
    (the name is shown through :func:`~zkcrawl.textsafe.printable` by the caller's line)."""
    close = difflib.get_close_matches(given, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
