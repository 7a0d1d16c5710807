"""Untrusted text made safe to show -- on a terminal, in a log line, in a UTF-8 file -- since
anything shown may come from a hostile page or znode. Cheap when there is nothing to do.

* :func:`printable` escapes visibly every C0/C1 control character, DEL, lone surrogate, bidi
  control and invisible character (zero-width, BOM, tag characters...), so no ANSI
  sequence, "Trojan Source" reordering or smuggled text gets through; everything else is
  untouched. It never raises for a ``str`` and always encodes as UTF-8.
* :func:`redact_userinfo` masks the whole userinfo of every URL in a text (``***@host``),
  and ``?password=``.
* :func:`shown_url`: userinfo masked, a non-ASCII host as its punycode A-label (no
  homograph), then :func:`printable`.
* :func:`scrub` makes text encodable as UTF-8 (lone surrogates become U+FFFD), nothing else.
"""

from __future__ import annotations

import re

__all__ = ["ELLIPSIS", "printable", "redact_userinfo", "scrub", "shown_host", "shown_url"]

ELLIPSIS = "\u2026"

# C0 controls, DEL and C1 controls; Arabic letter mark; LRM/RLM; line/paragraph separators;
# bidi embeddings/overrides (LRE RLE PDF LRO RLO) and isolates (LRI RLI FSI PDI); surrogates.
# Invisible ones: soft hyphen, combining grapheme joiner, Hangul fillers, Khmer inherent vowels,
# Mongolian vowel separator and free variation selectors, zero-width space/joiners, word
# joiner and invisible operators, deprecated format characters, variation selectors, BOM,
# interlinear annotations, Hangul half-width filler, tag characters and variation selectors
# supplement (Unicode's Default_Ignorable_Code_Point, in effect).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u17b4\u17b5"
                     "\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164"
                     "\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\ud800-\udfff"
                     "\U000e0000-\U000e0fff\U0001bca0-\U0001bca3]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every unsafe character escaped (see the module docstring).

    ``limit`` keeps at most that many characters of ``text`` (counted before escaping);
    a cut is marked with ``…``.
    """
    if limit is not None and len(text) > limit:
        text = text[:max(0, limit - 1)] + ELLIPSIS
    return _UNSAFE.sub(_escape, text)


def scrub(text: str) -> str:
    """``text`` made UTF-8-encodable: each lone surrogate becomes U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 joins a valid surrogate pair back into its character; what cannot be
        # joined is a lone surrogate, which "replace" turns into U+FFFD.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


# The authority of a URL ends at the first / ? # (or whitespace, in a text); its userinfo
# ends at the LAST @ before that: ``user:p@ss@host`` is all userinfo. Masking too much (a
# text with no / after a host) is harmless; too little would leak.
_USERINFO = re.compile(r"(?<=://)[^/?#\s]*@")


_PASSWORD_PARAM = re.compile(r"(?i)([?&;](?:ssl)?pass(?:word|wd)?=)[^&#\s]*")


def redact_userinfo(text: str) -> str:
    """``https://user:pass@host/x`` -> ``https://***@host/x``: credentials in URLs are never
    logged, shown or recorded; the whole userinfo is masked (``user:p@ss@host`` ->
    ``***@host``), and so is the value of a ``password=``/``sslpassword=``/``passwd=``
    query parameter (libpq takes one). Cheap when there is nothing to redact (substring
    tests)."""
    if "://" not in text:
        return text
    if "@" in text:
        text = _USERINFO.sub("***@", text)
    if "pass" in text.lower():
        text = _PASSWORD_PARAM.sub(r"\1***", text)
    return text


_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,30}://)([^/?#]*)")
_HOST_LIMIT = 1024  # characters of a host IDNA is asked about (it is not cheap)


def shown_host(host: str) -> str:
    """``host`` for display: ASCII as is; otherwise its punycode A-label (``xn--...``), or,
    when it has none, every non-ASCII character escaped (``\\u0430``). Never raises."""
    if host.isascii():
        return printable(host)
    if len(host) <= _HOST_LIMIT:
        import idna  # a dependency of zkcrawl.web.urls; imported late: textsafe stays light

        try:
            return printable(idna.encode(host, uts46=True).decode("ascii"))
        except (idna.IDNAError, UnicodeError, ValueError):
            pass
    return printable(host).encode("ascii", "backslashreplace").decode("ascii")


def shown_url(url: str, limit: int | None = None) -> str:
    """A URL (or any text holding URLs) for an operator: userinfo masked, a non-ASCII host
    of a leading ``scheme://`` shown by :func:`shown_host`, unsafe characters escaped."""
    text = redact_userinfo(url)
    match = _AUTHORITY.match(text)
    if match and not match.group(2).isascii():
        userinfo, at, hostport = match.group(2).rpartition("@")
        host, colon, port = hostport.rpartition(":") if not hostport.endswith("]") else (
            hostport, "", "")
        if not colon or not port.isdigit():
            host, colon, port = hostport, "", ""
        shown = f"{'***' if userinfo else ''}{at}{shown_host(host)}{colon}{port}"
        text = match.group(1) + shown + text[match.end():]
    return printable(text, limit)
