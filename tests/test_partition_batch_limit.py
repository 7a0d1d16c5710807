"""An item at the item limit (SPEC §2: 64 KiB) fits in a batch of its own: the mover, a
producer and a retry can queue it (it is never refused as "too large"). A batch of several
items is filled to 64 KiB, so its entries decode as parsed, exactly as through their text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.items import Item


def _at_the_limit() -> Item:
    probe = Item(url="http://a.example/", meta={"pad": ""}, enqueued_at=1.0)
    pad = "x" * (item_codec.ITEM_LIMIT - len(probe.encode()))
    item = Item(url="http://a.example/", meta={"pad": pad}, enqueued_at=1.0)
    assert len(item.encode()) == item_codec.ITEM_LIMIT
    return item


def test_an_item_at_the_limit_is_packed_alone_and_decodes_with_its_progress():
    item = _at_the_limit()
    small = Item(url="http://a.example/s", enqueued_at=1.0)
    packed = list(pb.pack([small, item, small], token="t" * 32))
    assert all(not refused for _, refused in packed)  # nothing refused
    assert [it for chunk, _ in packed for it in chunk] == [small, item, small]
    for chunk, _ in packed:  # each fits, with every item marked started and done
        whole = pb.Batch(tuple(chunk), token="t" * 32)
        assert len(pb.encode(whole.progressed(started=range(len(chunk)),
                                              done=range(len(chunk))))) <= pb.BATCH_LIMIT
    batch = pb.Batch((item,), token="t" * 32)
    data = pb.encode(batch.progressed(started=[0]))
    decoded, why = pb.decode(data)
    assert why is None and decoded is not None
    assert decoded.items == (item,) and decoded.started == frozenset({0})


def test_an_item_over_the_limit_is_still_refused():
    item = _at_the_limit()
    over = Item(url=item.url, meta={"pad": item.meta["pad"] + "x"}, enqueued_at=1.0)
    [(chunk, refused)] = list(pb.pack([over]))
    assert chunk == [] and refused == [over]


# -- decoding entries as parsed (partition_batch.decode's fast path) -------------------------

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
_JSON = st.recursive(_SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)
_ENTRY = st.one_of(
    st.fixed_dictionaries({"url": st.one_of(st.text(max_size=30), st.integers(),
                                            st.just("http://a.example/" + "p" * 9000))},
                          optional={"attempt": _JSON, "meta": _JSON, "producer": _JSON,
                                    "enqueued_at": _JSON, "batch": _JSON}),
    _JSON)


@settings(max_examples=300, deadline=None)
@given(_ENTRY)
def test_an_entry_decodes_as_parsed_as_through_its_text(entry: Any) -> None:
    """The fast path (an object entry as parsed) gives what the rule gives for its JSON text:
    the same item, or the same error and the same raw data for its dead letter."""
    fast, slow = pb._entry(entry, True), pb._entry(entry, False)
    assert fast[:2] == slow[:2]
    if fast[1] is not None:  # a bad entry's data, for its dead letter (a good one keeps none)
        assert fast[2] == slow[2]


def test_packed_batches_stay_within_the_item_limit_so_they_decode_as_parsed() -> None:
    """pack() fills a batch of several items to 64 KiB with its progress (SPEC §2), so every
    batch this process writes takes the fast path; the result is the text path's."""
    items = [Item(url=f"http://h{i % 7}.example/a/{i}", producer="p", enqueued_at=1.5 + i,
                  meta={"recrawl": {"etag": f'"{i:x}"', "n": i * 0.25}, "depth": i % 3})
             for i in range(3000)]
    packed = [chunk for chunk, _ in pb.pack(items, token="t" * 32)]
    assert len(packed) > 3 and sum(map(len, packed)) == len(items)
    for chunk in packed:
        batch = pb.Batch(tuple(chunk), token="t" * 32)
        data = pb.encode(batch.progressed(started=range(len(chunk)), done=range(len(chunk))))
        assert len(data) <= item_codec.ITEM_LIMIT
        fast, _ = pb.decode(data)
        assert fast is not None and fast.items == tuple(chunk)
        slow = tuple(pb._entry(e, False)[0] for e in json.loads(data)["items"])
        assert slow == fast.items


def test_a_batch_with_an_escape_or_over_the_item_limit_reads_entries_through_their_text(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    real = pb._entry
    monkeypatch.setattr(pb, "_entry",
                        lambda e, parsed=False: seen.append(parsed) or real(e, parsed))
    small = Item(url="http://a.example/\u00e9", enqueued_at=1.0)
    pb.decode(pb.encode(pb.Batch((small,))))
    escaped = pb.encode(pb.Batch((small,))).replace("\u00e9".encode(), b"\\u00e9")
    pb.decode(escaped)
    pb.decode(pb.encode(pb.Batch((_at_the_limit(),))))
    assert seen == [True, False, False]
