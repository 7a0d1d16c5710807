"""Queue items as stored in ZooKeeper (SPEC §2): encoding, the decoding rule, dead letters.

Pure functions, no ZooKeeper: the queue recipe calls them (imported as ``item_codec``),
tests call them directly.

Decoding rule: a JSON object with a string ``url`` is an item; otherwise data that
decodes as UTF-8 to one absolute http(s) URL (surrounding whitespace ignored) is
a bare-URL item (what Curator's ``SimpleDistributedQueue.offer(url.getBytes())``
writes); anything else is malformed and becomes a dead letter at once.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from zkcrawl.queue import untrusted
from zkcrawl.queue.layout import DEAD_PREFIX, ITEM_PREFIX
from zkcrawl.queue.untrusted import ITEM_LIMIT, URL_LIMIT
from zkcrawl.textsafe import redact_userinfo

__all__ = ["DEAD_DATA_LIMIT", "DEAD_PREFIX", "ERROR_LIMIT", "ITEM_LIMIT", "MAX_ATTEMPT", "PREFIX",
           "URL_LIMIT", "Decoded", "Item", "decode", "decode_object", "encode_dead_letter",
           "parse_seq", "sort_names"]

PREFIX = ITEM_PREFIX
DEAD_DATA_LIMIT = 4096
ERROR_LIMIT = 200  # a stored error (``meta.last_error``, a dead letter's ``error``)
MAX_ATTEMPT = 1_000_000  # a hostile ``attempt`` is clamped: it only makes the item fail fast
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_BARE_URL = re.compile(r"^https?://[^\s/?#]+[^\s]*$", re.IGNORECASE)


@dataclass(frozen=True)
class Item:
    """What a producer offers; ``attempt`` counts failed tries so far."""

    url: str
    attempt: int = 0
    producer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    enqueued_at: float | None = None

    def encode(self, *, batch: str | None = None) -> bytes:
        doc: dict[str, Any] = {
            "url": self.url,
            "attempt": self.attempt,
            "enqueued_at": round(self.enqueued_at if self.enqueued_at is not None
                                 else time.time(), 3),
            "producer": self.producer,
            "meta": self.meta,
        }
        if batch:
            # The protected-create token: lets an offer retried after ConnectionLoss
            # find out whether its first try committed (see queue.ingress.IngressQueue).
            doc["batch"] = batch
        return _ENCODER.encode(doc).encode("utf-8")


@dataclass(frozen=True)
class Decoded:
    """Result of decoding item data: an item, or the reason it is malformed."""

    item: Item | None
    error: str | None
    bare: bool = False
    batch: str | None = None


def decode(data: bytes) -> Decoded:
    """Apply SPEC §2's decoding rule with its limits; never raises (hostile data welcome)."""
    if len(data) > ITEM_LIMIT:
        return Decoded(None, f"malformed: item larger than {ITEM_LIMIT} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Decoded(None, "malformed: not UTF-8")
    stripped = text.strip()
    if stripped.startswith("{"):
        doc, why = untrusted.loads_text(stripped)
        if why is not None:
            return Decoded(None, f"malformed: {why}")
        return _from_json(doc, escaped="\\u" in stripped)
    if not stripped:
        return Decoded(None, "malformed: empty")
    if _BARE_URL.match(stripped):
        return _checked(Decoded(Item(url=stripped), None, bare=True))
    return Decoded(None, "malformed: neither a JSON item nor an http(s) URL")


def decode_object(doc: Any) -> Decoded:
    """The decoding rule for a JSON value already parsed by :mod:`zkcrawl.queue.untrusted`
    (an entry of a batch), when its data is known to be within ``ITEM_LIMIT`` and free of
    ``\\u`` escapes (so of lone surrogates): what :func:`decode` gives for its JSON text,
    without making that text. A string or any other value: use :func:`decode`."""
    return _from_json(doc, escaped=False)


def _from_json(doc: Any, *, escaped: bool) -> Decoded:
    if not isinstance(doc, dict) or not isinstance(doc.get("url"), str):
        return Decoded(None, "malformed: JSON without a string 'url'")
    attempt = doc.get("attempt", 0)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        attempt = 0
    raw_meta = doc.get("meta")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    enq = untrusted.number(doc.get("enqueued_at"), -1.0, lo=0.0)
    producer = doc.get("producer")
    batch = doc.get("batch")
    item = Item(url=doc["url"], attempt=min(attempt, MAX_ATTEMPT),
                producer=producer if isinstance(producer, str) else None,
                meta=meta, enqueued_at=enq if enq >= 0 else None)
    decoded = Decoded(item, None, batch=batch if isinstance(batch, str) else None)
    if escaped:  # only a \u escape can smuggle a lone surrogate into the text
        try:
            item.encode()
        except UnicodeEncodeError:
            return Decoded(None, "malformed: lone surrogate (not valid Unicode)")
    return _checked(decoded)


def _checked(decoded: Decoded) -> Decoded:
    """The URL limit (SPEC §2), in UTF-8 bytes."""
    assert decoded.item is not None
    url = decoded.item.url
    if untrusted.url_too_long(url):
        return Decoded(None, f"malformed: url longer than {URL_LIMIT} bytes")
    return decoded


def encode_dead_letter(name: str, url: str | None, error: str, attempts: int, data: bytes,
                holder_deaths: int = 0) -> bytes:
    """The dead letter's data (SPEC §2), never larger than ~4 KB of original data. URL
    credentials are masked in the URL, the error and the data (``***@host``): a dead letter
    is readable by anyone who may read the root."""
    snippet = data[:DEAD_DATA_LIMIT].decode("utf-8", errors="backslashreplace")
    url, error, snippet = (None if url is None else redact_userinfo(url),
                           redact_userinfo(error), redact_userinfo(snippet))
    # backslashreplace can grow the text; keep the promise of "at most 4 KB".
    snippet = snippet[:DEAD_DATA_LIMIT]
    if url is not None and len(url) > URL_LIMIT:
        url = url[:URL_LIMIT]
    doc = {"item": name, "url": url, "error": error[:ERROR_LIMIT], "attempts": attempts,
           "holder_deaths": max(0, min(attempts, holder_deaths)),
           "data": snippet, "dead_at": round(time.time(), 3)}
    # ASCII-escaped: a lone surrogate in a hostile URL stays valid UTF-8 in the stored JSON.
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def parse_seq(name: str) -> int | None:
    """Sequence number of ``qn-0000000042`` (or ``qn--2147483648`` after a wrap)."""
    for prefix in (PREFIX, DEAD_PREFIX):
        if name.startswith(prefix):
            try:
                return int(name[len(prefix):])
            except ValueError:
                return None
    return None


def sort_names(names: list[str]) -> list[tuple[int, str]]:
    """Sort znode names by sequence, wrap-safe.

    ZooKeeper's counter is a signed 32-bit int that wraps to -2147483648 (kazoo
    issue #606): when the list spans the wrap, negative numbers are the newest.
    """
    pairs = [(seq, n) for n in names if (seq := parse_seq(n)) is not None]
    if not pairs:
        return []
    lo = min(s for s, _ in pairs)
    hi = max(s for s, _ in pairs)
    if lo < 0 <= hi and hi - lo > 2**31:
        return sorted(pairs, key=lambda p: p[0] + 2**32 if p[0] < 0 else p[0])
    return sorted(pairs)
