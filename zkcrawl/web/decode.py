"""Decoding of HTML bytes to text (pure, no I/O): :func:`decode_html` never raises and always
returns text (undecodable bytes become U+FFFD). The encoding is chosen from, in order: a
BOM (as the WHATWG sniffing algorithm does), the HTTP ``charset``, ``<meta>`` in the first
4 KB, then detection (strict UTF-8, ``charset-normalizer``, windows-1252).

* Only WHATWG Encoding Standard labels are accepted (``webencodings``' table): a page cannot
  name an arbitrary Python codec; every codec in :data:`WEB_CODECS` decodes in linear time,
  and so does everything else here (bounded prefixes, regexes that cannot backtrack).
* Unknown, ``replacement`` and ``x-user-defined`` labels are skipped, not fatal.
* Legacy encodings are widened to their supersets, as browsers do (GB2312/GBK -> GB18030,
  Big5 -> Big5-HKSCS, Latin-1 -> windows-1252, Shift_JIS -> cp932, EUC-KR -> cp949).
"""

from __future__ import annotations

import codecs
import functools
import re

import charset_normalizer
import webencodings

__all__ = [
    "WEB_CODECS",
    "charset_from_content_type",
    "decode_html",
    "html_encoding",
    "normalize_encoding",
]

_META_SCAN_BYTES = 4096
# The longest WHATWG label has 19 characters; room for quotes and spaces.
_MAX_LABEL = 64
# Detection cost grows with size; the first 64 KB say as much about the encoding as the rest.
_DETECT_BYTES = 65536
# Candidates for detection: the encodings that real web pages use.  Letting the detector pick
# among every codec Python has yields exotic answers (cp1006, mac-*) on short Western pages.
_WEB = [
    "cp1252",
    "gb18030",
    "big5hkscs",
    "big5",
    "cp932",
    "euc_jp",
    "cp949",
    "cp1251",
    "koi8_r",
    "cp1250",
    "cp1253",
    "cp1254",
    "cp1255",
    "cp1256",
    "cp1257",
    "cp1258",
    "cp874",
    "iso8859_2",
    "iso8859_15",
]
_BOMS = (
    (codecs.BOM_UTF8, "utf-8", "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "utf-16"),
)
# Python codecs widened to a superset (webencodings already maps WHATWG big5 to big5hkscs,
# shift_jis to cp932 and euc-kr to cp949).  The standard's GBK decoder *is* gb18030's.
_SUPERSETS = {"gbk": "gb18030", "big5": "big5hkscs"}
# WHATWG encodings that are not text to crawl: see the module docstring.
_UNUSABLE = frozenset({"replacement", "x-user-defined"})


def _python_codec(whatwg_name: str) -> str:
    codec: str = webencodings.lookup(whatwg_name).codec_info.name
    return _SUPERSETS.get(codec, codec)


#: Python codec names :func:`normalize_encoding` may return: those of the WHATWG encodings.
WEB_CODECS: frozenset[str] = frozenset(
    _python_codec(name) for name in set(webencodings.LABELS.values()) - _UNUSABLE
)
# Possessive quantifiers: "charset=" followed by a long run of spaces costs linear time.
_CHARSET_PARAM_RE = re.compile(rb"""charset\s*+=\s*+["']?+\s*+([A-Za-z0-9_.:+-]++)""", re.I)
_META_RE = re.compile(rb"<meta\b[^>]*+>", re.I)


def normalize_encoding(label: str | None) -> str | None:
    """Python codec name for a WHATWG encoding label (widened to its superset), or ``None``
    for any other label.  The result is always in :data:`WEB_CODECS`.  Never raises."""
    if not label or len(label) > _MAX_LABEL:  # long labels would only bloat the cache
        return None
    return _normalize(label)


@functools.lru_cache(maxsize=512)  # a crawl meets a handful of labels, on every page
def _normalize(label: str) -> str | None:
    if not label.isascii():  # every WHATWG label is ASCII (and lookup() encodes it as UTF-8)
        return None
    encoding = webencodings.lookup(label.strip().strip("\"'"))
    if encoding is None or encoding.name in _UNUSABLE:
        return None
    return _python_codec(encoding.name)


def _web_codec(python_name: str) -> str | None:
    """The web codec a Python codec name (the detector's answer) stands for, or ``None``."""
    try:
        codec = codecs.lookup(python_name).name
    except (LookupError, ValueError):
        return None
    codec = _SUPERSETS.get(codec, codec)
    return codec if codec in WEB_CODECS else None


def charset_from_content_type(content_type: str | None) -> str | None:
    """The raw ``charset`` label of a ``Content-Type`` value, or ``None``."""
    if not content_type:
        return None
    match = _CHARSET_PARAM_RE.search(content_type.encode("latin-1", "replace"))
    return match.group(1).decode("ascii") if match else None


def _from_meta(head: bytes) -> str | None:
    for tag in _META_RE.finditer(head):
        match = _CHARSET_PARAM_RE.search(tag.group(0))
        if match:
            enc = normalize_encoding(match.group(1).decode("ascii"))
            if enc is None:
                continue
            # A document whose meta could be read as ASCII is not UTF-16 (WHATWG rule).
            return "utf-8" if enc.startswith("utf-16") else enc
    return None


def _is_utf8(body: bytes) -> bool:
    # An incremental decoder with final=False accepts a multi-byte character cut at the end,
    # which happens when the fetcher stopped at --max-bytes.
    try:
        codecs.getincrementaldecoder("utf-8")().decode(body, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _detect(body: bytes) -> str:
    if _is_utf8(body):
        return "utf-8"
    try:
        matches = list(charset_normalizer.from_bytes(body[:_DETECT_BYTES], cp_isolation=_WEB))
    except Exception:  # a detector bug must not lose the page
        matches = []
    if not matches:
        return "cp1252"
    top = matches[0]
    # Short or mostly-ASCII Western text decodes "equally well" in half a dozen code pages and
    # the detector then picks one arbitrarily (cp1250: "crčme"). Among the equally good
    # candidates prefer windows-1252, the web's own default for undeclared pages (WHATWG).
    for match in matches:
        if match.chaos != top.chaos or match.coherence != top.coherence:
            break
        if "cp1252" in match.could_be_from_charset:
            return "cp1252"
    return _web_codec(top.encoding) or "cp1252"


def html_encoding(body: bytes, content_type: str | None = None) -> tuple[str, str]:
    """The encoding :func:`decode_html` uses, without decoding: ``(label, codec)`` where
    ``codec`` decodes the body after its BOM (if any) and ``label`` names the encoding.
    Looks at the whole body only when nothing declares an encoding (detection)."""
    for bom, name, codec in _BOMS:
        if body.startswith(bom):
            return name, codec
    enc = normalize_encoding(charset_from_content_type(content_type))
    if enc is None:
        enc = _from_meta(body[:_META_SCAN_BYTES])
    if enc is None:
        enc = _detect(body)
    return enc, enc


def decode_html(body: bytes, content_type: str | None = None) -> tuple[str, str]:
    """Decode an HTML body; returns ``(text, python_codec_name)``. Never raises."""
    name, enc = html_encoding(body, content_type)
    if name != enc:  # a BOM: its codec consumes it
        return body.decode(enc, errors="replace"), name
    try:
        return body.decode(enc, errors="replace"), enc
    except (LookupError, ValueError, TypeError):  # defensive: a codec refusing "replace"
        return body.decode("utf-8", errors="replace"), "utf-8"
