"""Decoding of HTML bytes to text (pure, no I/O).

:func:`decode_html` never raises and always returns text: undecodable bytes become U+FFFD.
The encoding is chosen from, in order:

1. a byte-order mark (BOM) — first, as in the WHATWG "encoding sniffing" algorithm that browsers
   and html5lib follow: a BOM cannot be there by accident, while HTTP headers are often wrong;
2. the ``charset`` parameter of the HTTP ``Content-Type``;
3. ``<meta charset>`` / ``<meta http-equiv="Content-Type" content="...charset=...">`` in the
   first 4 KB;
4. detection: strict UTF-8 first (SPEC §4), then ``charset-normalizer``, then windows-1252.

Unknown labels at any step are skipped, not fatal.  Legacy labels are widened to their
supersets, as browsers do: GB2312/GBK -> GB18030, Big5 -> Big5-HKSCS, Latin-1/ASCII ->
windows-1252; so text in the wild that uses the superset's extra characters still decodes.
"""

from __future__ import annotations

import codecs
import functools
import re

import charset_normalizer

__all__ = ["charset_from_content_type", "decode_html", "html_encoding", "normalize_encoding"]

_META_SCAN_BYTES = 4096
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
_SUPERSETS = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "big5": "big5hkscs",
    "latin-1": "cp1252",
    "iso8859-1": "cp1252",
    "ascii": "cp1252",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
}
# WHATWG labels that Python's codec registry does not know.
_ALIASES = {
    "x-gbk": "gbk",
    "windows-874": "cp874",
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "x-mac-roman": "mac-roman",
    "x-cp1252": "cp1252",
}
_CHARSET_PARAM_RE = re.compile(rb"""charset\s*=\s*["']?\s*([A-Za-z0-9_.:+-]+)""", re.I)
_META_RE = re.compile(rb"<meta\b[^>]*?>", re.I)


def normalize_encoding(label: str | None) -> str | None:
    """Python codec name for an encoding label (widened to its superset), or ``None``."""
    if not label:
        return None
    return _normalize(label)


@functools.lru_cache(maxsize=512)  # a crawl meets a handful of labels, on every page
def _normalize(label: str) -> str | None:
    label = label.strip().strip("\"'").lower()
    try:
        info = codecs.lookup(_ALIASES.get(label, label))
    except (LookupError, ValueError):
        return None
    if not getattr(info, "_is_text_encoding", True):  # base64, rot13...: not a charset
        return None
    name = info.name
    # cp936 / cp950 are Python's names for the Windows variants of GBK and Big5.
    name = {"cp936": "gbk", "cp950": "big5"}.get(name, name)
    return _SUPERSETS.get(name, name)


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
    return normalize_encoding(top.encoding) or "cp1252"


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
