"""URL normalization and link filtering (pure functions, no I/O).

Guarantees of :func:`normalize_url`:

* it never raises, whatever text it is given (it returns ``None`` instead);
* it only ever returns absolute ``http``/``https`` URLs with a non-empty host, in ASCII
  (lone surrogates and other non-ASCII text are percent-encoded or rejected);
* neither what it is given nor what it returns is longer than :data:`MAX_URL_BYTES` (8 KiB of
  UTF-8, the project's limit for a URL): :func:`drop_reason` says ``"too-long"``;
* it is idempotent: ``normalize_url(normalize_url(x)) == normalize_url(x)`` whenever the inner
  call is not ``None`` (property-tested with hypothesis on arbitrary text).

Two URLs that normalize to the same string are treated as the same item by the producer's
de-duplication, so every rule here trades a little fidelity for fewer duplicates, and none of
them changes what a server will answer (query parameter order, for instance, is kept).
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus, urljoin, urlsplit

import idna

from zkcrawl.errors import UsageError

__all__ = [
    "MAX_URL_BYTES",
    "LinkFilter",
    "compile_patterns",
    "drop_reason",
    "host_key",
    "host_of",
    "normalize_url",
]

#: The longest URL (in bytes of UTF-8) the crawl takes or passes on.
MAX_URL_BYTES = 8192
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_SUB_DELIMS = "!$&'()*+,;="
# Characters kept literally (besides unreserved ones) in each component; everything else is
# percent-encoded.  RFC 3986 §3.2.1, §3.3, §3.4.
_SAFE_USERINFO = frozenset(_SUB_DELIMS + ":")
_SAFE_PATH = frozenset(_SUB_DELIMS + ":@/")
_SAFE_QUERY = frozenset(_SUB_DELIMS + ":@/?")
_HEX = frozenset("0123456789abcdefABCDEF")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_RE = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_PORT_RE = re.compile(r"[0-9]{1,5}")
# WHATWG URL parsing strips leading/trailing C0 controls and spaces and removes every ASCII tab
# or newline inside the URL; links copied out of HTML attributes often carry them.
_STRIP_CHARS = "".join(chr(c) for c in range(0x21))
_TAB_NL_RE = re.compile(r"[\t\n\r]")


def _norm_pct(text: str, safe: frozenset[str]) -> str:
    """Canonical percent-encoding of one URL component.

    ``%XX`` of an unreserved character is decoded, other escapes get upper-case hex, a ``%``
    that starts no valid escape becomes ``%25``, and characters outside unreserved+``safe`` are
    UTF-8 percent-encoded.  The output contains only unreserved chars, ``safe`` chars and
    ``%XX`` escapes of non-unreserved bytes, hence a second pass changes nothing (idempotent).
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "%":
            if i + 2 < n and text[i + 1] in _HEX and text[i + 2] in _HEX:
                byte = int(text[i + 1 : i + 3], 16)
                out.append(chr(byte) if byte in _UNRESERVED else "%" + text[i + 1 : i + 3].upper())
                i += 3
                continue
            out.append("%25")
        elif ord(ch) < 128 and (ord(ch) in _UNRESERVED or ch in safe):
            out.append(ch)
        else:
            # surrogatepass: hypothesis (and broken pages) produce lone surrogates; any
            # deterministic byte form is fine as long as it is percent-encoded.
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        i += 1
    return "".join(out)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4, applied after percent-decoding so ``%2E%2E`` is a dot segment too."""
    if "." not in path:
        return path
    segments = path.split("/")
    out: list[str] = []
    for seg in segments[1:]:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    # A trailing "." or ".." means the result names a directory.
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _norm_host(host: str) -> str | None:
    """Lower-case, IDN -> punycode, validate; ``None`` for anything that is not a host."""
    if host.startswith("["):
        inner = host[1:-1] if host.endswith("]") else ""
        if not inner or "%" in inner:
            return None
        try:
            return "[" + ipaddress.IPv6Address(inner).compressed + "]"
        except ValueError:
            return None
    if "%" in host:
        host = unquote(host, errors="replace")
    if host.endswith("."):
        host = host[:-1]  # "example.com." and "example.com" are the same host
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError):
            try:  # IDNA 2003 is laxer (e.g. some symbols) and is what older browsers used
                host = host.encode("idna").decode("ascii")
            except (UnicodeError, ValueError):
                return None
    host = host.lower()
    return host if _HOST_RE.fullmatch(host) else None


def _split(url: str, base: str | None) -> tuple[str, str, str, str] | None:
    """Resolve and split; returns (scheme, netloc, path, query) or None. Never raises."""
    try:
        url = _TAB_NL_RE.sub("", url.strip(_STRIP_CHARS))
        scheme = urlsplit(url).scheme
        # urljoin resolves "http://" or "http:///x" against a same-scheme base (RFC 1808
        # leniency); a URL that spells out "scheme://" is absolute and stands on its own.
        absolute = bool(scheme) and url[len(scheme) + 1 : len(scheme) + 3] == "//"
        if base and not absolute:
            base = _TAB_NL_RE.sub("", base.strip(_STRIP_CHARS))
            url = urljoin(base, url)
        parts = urlsplit(url)
        return parts.scheme.lower(), parts.netloc, parts.path, parts.query
    except (ValueError, TypeError, AttributeError):
        return None


def _scheme_of(url: str, base: str | None) -> str | None:
    split = _split(url, base)
    return split[0] if split else None


def normalize_url(
    url: str, base: str | None = None, strip_params: Sequence[str] = ()
) -> str | None:
    """Return the canonical absolute http(s) form of ``url`` (resolved against ``base``).

    Lower-cases scheme and host; drops the default port, the fragment, an empty query and an
    empty userinfo; IDN hosts become punycode; percent-encoding is made canonical (unreserved
    characters decoded, hex upper-cased, spaces and unsafe characters encoded); dot segments
    are removed; an empty path becomes ``/``; query parameters whose decoded name matches any
    ``fnmatch`` glob in ``strip_params`` (e.g. ``"utm_*"``) are removed, the others keep their
    order.  Returns ``None`` for other schemes or anything unparseable.  Never raises;
    idempotent.
    """
    if _too_long(url):
        return None
    norm = _normalize_any(url, base, strip_params)
    return None if norm is None or len(norm) > MAX_URL_BYTES else norm


def _too_long(url: str) -> bool:
    """More than :data:`MAX_URL_BYTES` of UTF-8 (a lone surrogate counts as 3 bytes)."""
    if len(url) * 4 <= MAX_URL_BYTES:  # cheap: no character takes more than 4 bytes
        return False
    return len(url) > MAX_URL_BYTES or len(url.encode("utf-8", "surrogatepass")) > MAX_URL_BYTES


def _normalize_any(url: str, base: str | None, strip_params: Sequence[str]) -> str | None:
    """:func:`normalize_url` without the length limits (the result is ASCII)."""
    try:
        return _normalize(url, base, strip_params)
    except Exception:  # the contract is "never raises"; None means unusable
        return None


def _normalize(url: str, base: str | None, strip_params: Sequence[str]) -> str | None:
    split = _split(url, base)
    if split is None:
        return None
    scheme, netloc, path, query = split
    if scheme not in _DEFAULT_PORTS or not netloc:
        return None
    userinfo, _, hostport = netloc.rpartition("@")
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return None
        host, port = hostport[: end + 1], hostport[end + 1 :]
        if port and not port.startswith(":"):
            return None
        port = port[1:]
    else:
        host, _, port = hostport.partition(":")
        if ":" in port:
            return None
    norm_host = _norm_host(host)
    if norm_host is None:
        return None
    if port:
        if not _PORT_RE.fullmatch(port) or not 0 < int(port) < 65536:
            return None
        port_num = int(port)
        port = "" if port_num == _DEFAULT_PORTS[scheme] else str(port_num)
    out = [scheme, "://"]
    if userinfo:  # an empty one ("http://@host/") is dropped
        out += [_norm_pct(userinfo, _SAFE_USERINFO), "@"]
    out.append(norm_host)
    if port:
        out += [":", port]
    out.append(_remove_dot_segments(_norm_pct(path, _SAFE_PATH)) or "/")
    if query:
        pieces = query.split("&")
        if strip_params:
            pieces = [
                p
                for p in pieces
                if p and not _matches_any(unquote_plus(p.partition("=")[0]), strip_params)
            ]
        query = _norm_pct("&".join(pieces), _SAFE_QUERY)
        if query:
            out += ["?", query]
    return "".join(out)


def _matches_any(name: str, globs: Sequence[str]) -> bool:
    # fnmatchcase: parameter names are case-sensitive, and fnmatch() would follow the OS rule.
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def drop_reason(url: str, base: str | None = None) -> str | None:
    """Why ``url`` cannot be crawled: ``"too-long"`` (it, or its normalized form, is over
    :data:`MAX_URL_BYTES`), ``"javascript"``, ``"mailto"``, ``"data"`` (those schemes),
    ``"scheme"`` (any other non-http(s) scheme), ``"invalid"`` (unparseable, relative without a
    base, bad host or port), or ``None`` when it normalizes to an http(s) URL.  Never raises."""
    if _too_long(url):
        return "too-long"
    norm = _normalize_any(url, base, ())
    if norm is not None:
        return "too-long" if len(norm) > MAX_URL_BYTES else None
    scheme = _scheme_of(url, base)
    if scheme in ("javascript", "mailto", "data"):
        return scheme
    if scheme and scheme not in _DEFAULT_PORTS:
        return "scheme"
    return "invalid"


def host_of(url: str) -> str:
    """``host[:port]`` of ``url``, lower-case, default port omitted: the politeness key.

    Hosts are compared literally (``www.example.com`` and ``example.com`` are two hosts).
    Returns ``""`` when ``url`` has no usable host.  Never raises.
    """
    norm = normalize_url(url)
    if norm is None:
        return ""
    netloc = urlsplit(norm).netloc
    return netloc.rpartition("@")[2]


def compile_patterns(patterns: Iterable[str], flag: str) -> tuple[re.Pattern[str], ...]:
    """Compile ``--allow``/``--deny`` regexes; raises :class:`UsageError` naming the flag."""
    compiled: list[re.Pattern[str]] = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        # OverflowError: a{4294967296}; RecursionError: thousands of nested groups.
        except (re.error, OverflowError, RecursionError) as exc:
            raise UsageError(f"{flag}: invalid regex {pattern!r}: {exc}") from None
    return tuple(compiled)


@dataclass(frozen=True)
class LinkFilter:
    """Decides which extracted links become queue items.

    Checks, in order: normalizes against the source page (reason ``"scheme"``, ``"invalid"`` or
    ``"too-long"``),
    ``deny`` regexes (``re.search`` on the normalized URL, reason ``"deny"``), ``allow`` regexes
    (when any is given, one must match, else ``"not-allowed"``), then ``same_host`` (the link's
    ``host[:port]`` must equal the source's, else ``"other-host"``).
    """

    allow: tuple[re.Pattern[str], ...] = ()
    deny: tuple[re.Pattern[str], ...] = ()
    same_host: bool = False
    strip_params: tuple[str, ...] = ()

    def check(self, url: str, source: str) -> tuple[str | None, str | None]:
        """Return ``(normalized_url, None)`` to keep, or ``(None, reason)`` to drop."""
        norm = normalize_url(url, source, self.strip_params)
        if norm is None:
            reason = drop_reason(url, source)
            if reason in (None, "invalid", "too-long"):
                return None, reason or "invalid"
            return None, "scheme"
        if any(p.search(norm) for p in self.deny):
            return None, "deny"
        if self.allow and not any(p.search(norm) for p in self.allow):
            return None, "not-allowed"
        if self.same_host and host_of(norm) != host_of(source):
            return None, "other-host"
        return norm, None


@functools.lru_cache(maxsize=4096)
def _host_of_origin(origin: str) -> str:
    return host_of(origin)


def host_key(url: str | None) -> str:
    """``host_of(url)`` (the politeness key), computed once per origin:
    it depends only on the scheme and authority, and normalizing is not free."""
    if not url:
        return ""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return host_of(url)
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return _host_of_origin(f"{scheme}://{authority}/")
