"""Conditional re-crawls: what a previous fetch returned, checked before reuse.

A re-crawled item carries ``meta.recrawl = {"etag", "last_modified", "signature"}`` (any of
them absent or null); the consumer sends ``If-None-Match`` / ``If-Modified-Since`` from it
and compares the new body's signature with the old one (SPEC §4 ``changed``).

Every value here came from a server and went through ZooKeeper: hostile. Guarantees:

* :func:`clean_etag` keeps an ETag only when it is 1..:data:`ETAG_LIMIT` characters of
  visible ASCII (``!`` .. ``~``): no CR, LF, space, control or non-ASCII character can ever
  reach a request header from it; anything else is ``None`` (no ``If-None-Match``).
* :func:`clean_last_modified` parses an HTTP-date (or a Unix time) and gives it back in our
  own IMF-fixdate formatting, clamped to [:data:`EARLIEST`, now]: a date in the year 9999 is
  sent as "now", one before 1995 as 1995; unparseable is ``None``. What is sent is never the
  server's text.
* :func:`clean_signature` accepts only :func:`content_signature`'s own form (32 hex digits).
* Nothing in this module raises on any input.
"""

from __future__ import annotations

import email.utils
import hashlib
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["EARLIEST", "ETAG_LIMIT", "LAST_MODIFIED_LIMIT", "Validators", "clean_etag",
           "clean_last_modified", "clean_signature", "content_signature"]

ETAG_LIMIT = 256  # characters; real ones are a quoted hash, well below
LAST_MODIFIED_LIMIT = 64  # characters of a date string looked at
EARLIEST = 788_918_400.0  # 1995-01-01T00:00:00Z: HTTP/1.0's dates, nothing earlier
_ETAG = re.compile(rf"[!-~]{{1,{ETAG_LIMIT}}}")
_SIGNATURE = re.compile(r"[0-9a-f]{32}")


def clean_etag(value: Any) -> str | None:
    """``value`` if it is an ETag safe to send back (see the module docstring), else None."""
    if not isinstance(value, str) or len(value) > ETAG_LIMIT:
        return None
    return value if _ETAG.fullmatch(value) else None


def _timestamp(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str) or not value or len(value) > LAST_MODIFIED_LIMIT:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.timestamp()
    except (OverflowError, ValueError, OSError):
        return None


def clean_last_modified(value: Any, now: float | None = None) -> str | None:
    """An HTTP-date (IMF-fixdate, GMT) for ``value`` -- an HTTP-date string or a Unix
    time -- clamped to [:data:`EARLIEST`, ``now``]; None when it is neither."""
    ts = _timestamp(value)
    if ts is None:
        return None
    now = time.time() if now is None else now
    ts = min(max(ts, EARLIEST), now)
    return email.utils.format_datetime(datetime.fromtimestamp(int(ts), UTC), usegmt=True)


def clean_signature(value: Any) -> str | None:
    """``value`` if it is a :func:`content_signature`, else None."""
    if isinstance(value, str) and len(value) == 32 and _SIGNATURE.fullmatch(value):
        return value
    return None


_WHITESPACE = b" \t\n\r\x0b\x0c"


def content_signature(body: bytes) -> str:
    """BLAKE2b-128 of ``body`` without its ASCII whitespace: the same page re-indented or
    re-wrapped by a server keeps its signature (one C pass: ~10 us for 10 KB, where
    splitting on whitespace cost ten times that)."""
    return hashlib.blake2b(body.translate(None, _WHITESPACE), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class Validators:
    """What a previous fetch of a URL returned, cleaned."""

    etag: str | None = None
    last_modified: str | None = None
    signature: str | None = None

    @classmethod
    def from_meta(cls, doc: Any, now: float | None = None) -> Validators | None:
        """From an item's ``meta.recrawl`` (untrusted): None when it is not an object (not a
        re-crawl); its fields cleaned, a bad one dropped."""
        if not isinstance(doc, Mapping):
            return None
        return cls(clean_etag(doc.get("etag")),
                   clean_last_modified(doc.get("last_modified"), now),
                   clean_signature(doc.get("signature")))

    @property
    def previous(self) -> bool:
        """Whether a previous fetch is known at all (else ``changed`` stays absent)."""
        return any((self.etag, self.last_modified, self.signature))

    def headers(self) -> tuple[str, ...]:
        """The request header lines to send (possibly none)."""
        lines: list[str] = []
        if self.etag:
            lines.append(f"If-None-Match: {self.etag}")
        if self.last_modified:
            lines.append(f"If-Modified-Since: {self.last_modified}")
        return tuple(lines)

    def doc(self) -> dict[str, str]:
        """The ``meta.recrawl`` object (only the fields that are set)."""
        return {k: v for k, v in (("etag", self.etag), ("last_modified", self.last_modified),
                                  ("signature", self.signature)) if v}
