"""Untrusted text made safe to show: on a terminal, in a log line, in a UTF-8 file.

Anything a crawl shows an operator may come from a hostile page or znode: a title, a URL,
an error text, a consumer id. Guarantees:

* :func:`printable` returns text with no C0/C1 control character (so no ESC: an ANSI or
  OSC sequence cannot recolour, retitle or clear a terminal), no DEL, no lone surrogate and
  no bidi embedding/override/isolate/mark or line/paragraph separator (no "Trojan Source"
  reordering). Each such character becomes a visible escape (``\\x1b``, ``\\u202e``,
  ``\\t``, ``\\n``); every other character, printable ASCII included, is left untouched.
  It never raises for a ``str``, and its result always encodes as UTF-8.
* :func:`scrub` returns text that always encodes as UTF-8: lone surrogates become U+FFFD
  (a surrogate *pair* is joined into its character); nothing else changes.

Both are cheap when there is nothing to do (one regex scan, one encode attempt).
"""

from __future__ import annotations

import re

__all__ = ["ELLIPSIS", "printable", "scrub"]

ELLIPSIS = "\u2026"

# C0 controls, DEL and C1 controls; Arabic letter mark; LRM/RLM; line/paragraph separators;
# bidi embeddings/overrides (LRE RLE PDF LRO RLO) and isolates (LRI RLI FSI PDI); surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


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


_USERINFO = re.compile(r"(?<=://)[^/?#@\s]*@")


def redact_userinfo(text: str) -> str:
    """``https://user:pass@host/x`` -> ``https://***@host/x``: credentials in URLs are never
    logged or recorded. Cheap when there is nothing to redact (two substring tests)."""
    if "@" not in text or "://" not in text:
        return text
    return _USERINFO.sub("***@", text)
