"""A partition's batch node as stored (SPEC §2): many items and their progress in one znode,
written by producers, consumers (retries) and the ingress mover, read by every consumer.
Pure functions (:mod:`zkcrawl.queue.partition_queue` calls them)::

    {"v": 1, "items": [<item>, ...], "started": [i, ...], "done": [i, ...], "token": "..."}

* :func:`encode` never writes more than :data:`BATCH_LIMIT` bytes; :func:`pack` splits a
  group into batches that fit (an item that alone would not fit is refused).
* :func:`decode` never raises: data that is no batch is one reason (a dead letter), an entry
  that is no item a reason for that entry only.
* Bad indices are dropped: hostile progress can only make an item be done again, never skip
  one (*done* only when in ``done``; *started* only when in ``started`` and not done).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from zkcrawl.queue import items as item_codec
from zkcrawl.queue import untrusted
from zkcrawl.queue.items import Item

# Bytes of one batch node (SPEC §2: 64 KiB of items): an item may itself be 64 KiB
# (item_codec.ITEM_LIMIT), so a batch has room for the envelope and progress of one such item
# beyond it -- else an item at the limit, or a retry grown to it, could not be queued.
BATCH_LIMIT = 64 * 1024 + 1024
# What pack() fills a batch of several items to, progress included (SPEC §2: 64 KiB): a node
# within ITEM_LIMIT holds no entry over it, so decode() reads its entries as parsed.
PACK_LIMIT = item_codec.ITEM_LIMIT
MAX_ITEMS = 1000  # items a batch made here holds at most, whatever their size
# A batch another client wrote may hold more tiny items: anything within BATCH_LIMIT decodes
# (a bare URL takes at least 10 bytes, so at most ~6,500 fit); more is refused whole.
DECODE_MAX_ITEMS = BATCH_LIMIT // 10
VERSION = 1
_HEAD = 64  # bytes of the envelope around the items, generously
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass
class _Shared:
    items_json: bytes | None = None
    good: int | None = None


@dataclass(frozen=True)
class Batch:
    """The decoded batch: its items (None where an entry was not an item), and progress."""

    items: tuple[Item | None, ...]
    started: frozenset[int] = frozenset()
    done: frozenset[int] = frozenset()
    token: str | None = None
    errors: dict[int, str] = field(default_factory=dict)  # entry index -> why it is no item
    raws: dict[int, bytes] = field(default_factory=dict)  # entry index -> its data
    # What depends on the items only, made when first needed and shared by every progressed
    # copy (same items): the encoded items (a checkpoint joins them with the index lists
    # instead of serialising every item again) and the count of good items. Not an init
    # field, so dataclasses.replace (new items) starts afresh.
    _shared: _Shared = field(default_factory=lambda: _Shared(), init=False, repr=False,
                             compare=False)

    @property
    def pending(self) -> list[int]:
        """Indices of items still to do (not done), in order; bad entries excluded."""
        return [i for i, it in enumerate(self.items) if it is not None and i not in self.done]

    @property
    def in_flight(self) -> list[int]:
        """Indices started and not done: what a holder's death is charged for."""
        return sorted(i for i in self.started if i not in self.done)

    @property
    def finished(self) -> bool:
        """Every good item done (the bad ones are dead letters by then)."""
        shared = self._shared
        if shared.good is None:
            shared.good = sum(1 for it in self.items if it is not None)
        if len(self.done) < shared.good:  # the usual answer, without a walk of the items
            return False
        return not self.pending

    def progressed(self, *, started: Iterable[int] = (), done: Iterable[int] = (),
                   unstarted: Iterable[int] = ()) -> Batch:
        """The same batch with more items started and/or done (and ``unstarted`` ones no
        longer marked: given back before their fetch)."""
        d = self.done | frozenset(done)
        s = (self.started - frozenset(unstarted)) | frozenset(started)
        out = Batch(self.items, s - d, d, self.token, self.errors, self.raws)
        object.__setattr__(out, "_shared", self._shared)  # same items, same JSON
        return out


def _item_doc(item: Item) -> dict[str, Any]:
    return {"url": item.url, "attempt": item.attempt,
            "enqueued_at": None if item.enqueued_at is None else round(item.enqueued_at, 3),
            "producer": item.producer, "meta": item.meta}


def encode(batch: Batch) -> bytes:
    """The node's data; raises ValueError if it would exceed :data:`BATCH_LIMIT` (a batch
    made by :func:`pack` never does; progress only shrinks it: indices are short).

    Byte for byte what :func:`encode_whole` writes; the items' JSON is made once per
    batch (kept in ``batch``, shared with its progressed copies)."""
    shared = batch._shared
    if shared.items_json is None:
        shared.items_json = _items_part(batch)
    tail = f'],"started":[{",".join(map(str, sorted(batch.started)))}],' \
           f'"done":[{",".join(map(str, sorted(batch.done)))}]'
    if batch.token:
        tail += ',"token":' + _ENCODER.encode(batch.token)
    data = b"".join((b'{"v":%d,"items":[' % VERSION, shared.items_json,
                     (tail + "}").encode("utf-8")))
    if len(data) > BATCH_LIMIT:
        raise ValueError(f"batch of {len(data)} bytes over {BATCH_LIMIT}")
    return data


def _items_part(batch: Batch) -> bytes:
    """The JSON of ``batch.items``, comma-separated (no brackets)."""
    return ",".join(_ENCODER.encode(d) for d in _docs(batch)).encode("utf-8")


def _docs(batch: Batch) -> list[Any]:
    docs: list[Any] = []
    for i, item in enumerate(batch.items):
        if item is not None:
            docs.append(_item_doc(item))
        else:  # a bad entry is kept as it came until its dead letter is written
            docs.append(batch.raws.get(i, b"").decode("utf-8", "replace"))
    return docs


def encode_whole(batch: Batch) -> bytes:
    """:func:`encode` from scratch, one document (the reference its fragments must match:
    the tests compare them)."""
    doc: dict[str, Any] = {"v": VERSION, "items": _docs(batch), "started": sorted(batch.started),
                           "done": sorted(batch.done)}
    if batch.token:
        doc["token"] = batch.token
    data = _ENCODER.encode(doc).encode("utf-8")
    if len(data) > BATCH_LIMIT:
        raise ValueError(f"batch of {len(data)} bytes over {BATCH_LIMIT}")
    return data


def item_size(item: Item) -> int:
    """Bytes ``item`` takes inside a batch (its JSON and a comma); an item that cannot be
    written (a lone surrogate in hostile text) counts as too large: it is refused."""
    try:
        return len(_ENCODER.encode(_item_doc(item)).encode("utf-8")) + 1
    except (UnicodeEncodeError, TypeError, ValueError):
        return BATCH_LIMIT + 1


def pack(items: Sequence[Item], *, max_items: int = MAX_ITEMS, token: str | None = None
         ) -> Iterator[tuple[list[Item], list[Item]]]:
    """Split ``items`` into batches that fit: yields ``(batch_items, refused)`` -- refused
    are items larger than an item may be (SPEC §2: 64 KiB), reported with the next batch."""
    chunk: list[Item] = []
    refused: list[Item] = []
    size = _HEAD + len(token or "")
    limit = max(1, min(max_items, MAX_ITEMS))
    for item in items:
        n = item_size(item)
        if n + _HEAD > BATCH_LIMIT or n - 1 > item_codec.ITEM_LIMIT:  # n counts its comma
            refused.append(item)
            continue
        # room for the progress lists too: at most ~8 bytes an index, twice
        if chunk and (len(chunk) >= limit or size + n + 16 * (len(chunk) + 1) > PACK_LIMIT):
            yield chunk, refused
            chunk, refused, size = [], [], _HEAD + len(token or "")
        chunk.append(item)
        size += n
    if chunk or refused:
        yield chunk, refused


def decode(data: bytes) -> tuple[Batch | None, str | None]:
    """``(batch, None)`` or ``(None, reason)``; never raises (hostile data welcome)."""
    if len(data) > BATCH_LIMIT:
        return None, f"malformed: batch larger than {BATCH_LIMIT} bytes"
    doc, why = untrusted.load_json(data, limit=BATCH_LIMIT)
    if why is not None:
        return None, f"malformed: {why}"
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        return None, "malformed: batch without an 'items' list"
    entries: list[Any] = doc["items"]
    if len(entries) > DECODE_MAX_ITEMS:
        return None, f"malformed: batch of more than {DECODE_MAX_ITEMS} items"
    # Within ITEM_LIMIT and without a \u escape (no lone surrogate), an object entry is
    # decoded as parsed; else through its JSON text, one rule for both (items.decode).
    # Measured (decode of a 64 KiB batch, per item): 25 us through the text, 8 as parsed --
    # the claim loop holds the GIL for a whole batch, every fetch thread waiting meanwhile.
    parsed = len(data) <= item_codec.ITEM_LIMIT and b"\\u" not in data
    items: list[Item | None] = []
    errors: dict[int, str] = {}
    raws: dict[int, bytes] = {}
    for i, entry in enumerate(entries):
        item, error, raw = _entry(entry, parsed)
        items.append(item)
        if error is not None:
            errors[i], raws[i] = error, raw
    n = len(items)
    done = _indices(doc.get("done"), n)
    started = _indices(doc.get("started"), n) - done
    token = doc.get("token")
    return Batch(tuple(items), started, done, token if isinstance(token, str) else None,
                 errors, raws), None


def _entry(entry: Any, parsed: bool = False) -> tuple[Item | None, str | None, bytes]:
    """One entry through the item decoding rule of SPEC §2 (an object, or a bare URL);
    ``parsed``: an object entry is decoded as it is (:func:`items.decode_object`)."""
    if parsed and isinstance(entry, dict):
        decoded = item_codec.decode_object(entry)
        if decoded.item is not None:
            return decoded.item, None, b""
    if isinstance(entry, str):
        raw = entry.encode("utf-8", "surrogatepass")
    else:
        try:
            raw = _ENCODER.encode(entry).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):
            return None, "malformed: not JSON", b""
    decoded = item_codec.decode(raw)
    if decoded.item is None:
        return None, decoded.error or "malformed", raw
    return decoded.item, None, raw


def _indices(value: Any, n: int) -> frozenset[int]:
    if not isinstance(value, list):
        return frozenset()
    return frozenset(i for i in value
                     if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n)
