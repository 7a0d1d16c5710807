"""A batch's encoding made from cached item fragments (what every checkpoint writes) is byte
for byte the whole-document encoding, and decodes back to the same batch, through any
sequence of progress -- including hostile batches as decoded (bad entries, odd indices)."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.items import Item

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # no lone surrogate
_META = st.dictionaries(_TEXT, st.none() | st.booleans() | st.integers() | _TEXT, max_size=3)
_ITEMS = st.builds(Item, url=st.builds(lambda p: f"http://h.test/{p}", _TEXT),
                   attempt=st.integers(0, 5), producer=st.none() | _TEXT, meta=_META,
                   enqueued_at=st.none() | st.floats(0, 2e9, allow_nan=False))
_ENTRIES = st.lists(_ITEMS | st.none(), max_size=12)
_STEPS = st.lists(st.tuples(st.sampled_from(["started", "done", "unstarted"]),
                            st.lists(st.integers(0, 11), max_size=4)), max_size=6)


def _batch(entries: list[Item | None], token: str | None) -> pb.Batch:
    raws = {i: f"bad {i}".encode() for i, it in enumerate(entries) if it is None}
    return pb.Batch(tuple(entries), token=token, raws=raws,
                    errors={i: "malformed" for i in raws})


def _fields(item: Item | None) -> tuple[object, ...] | None:
    if item is None:
        return None
    at = None if item.enqueued_at is None else round(item.enqueued_at, 3)
    return item.url, item.attempt, item.producer, item.meta, at


@settings(max_examples=200, deadline=None)
@given(_ENTRIES, st.none() | _TEXT, _STEPS)
def test_cached_encoding_is_the_whole_encoding_through_progress(
        entries: list[Item | None], token: str | None,
        steps: list[tuple[str, list[int]]]) -> None:
    n = len(entries)
    batch = _batch(entries, token)
    seen = [batch]
    for kind, idx in steps:
        batch = batch.progressed(**{kind: [i for i in idx if i < n]})
        seen.append(batch)
    for b in seen + seen[::-1]:  # the first encode fills the cache; the others reuse it
        data = pb.encode(b)
        assert data == pb.encode_whole(b)
        back, why = pb.decode(data)
        assert back is not None, why
        assert (back.started, back.done, back.token) == (b.started, b.done, b.token or None)
        assert [_fields(it) for it in back.items if it is not None] == [
            _fields(it) for it in b.items if it is not None]
        assert pb.encode(back) == data  # decoded and written again: the same bytes


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600))
def test_a_hostile_node_decoded_encodes_as_from_scratch(data: bytes) -> None:
    batch, _ = pb.decode(data)
    if batch is None:
        return
    more = batch.progressed(done=list(range(0, len(batch.items), 2)))
    for b in (batch, more, batch):
        assert pb.encode(b) == pb.encode_whole(b)


def test_new_items_are_never_written_with_the_old_ones_json() -> None:
    """replace() with other items (what adopt does to charge an attempt) starts afresh."""
    b = pb.Batch((Item(url="http://a.test/1"), Item(url="http://a.test/2")))
    pb.encode(b)
    charged = replace(b, items=(Item(url="http://a.test/1", attempt=1), b.items[1]))
    doc = json.loads(pb.encode(charged))
    assert doc["items"][0]["attempt"] == 1
    assert pb.encode(charged) == pb.encode_whole(charged)
