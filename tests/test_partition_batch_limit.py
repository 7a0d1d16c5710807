"""An item at the item limit (SPEC §2: 64 KiB) fits in a batch of its own: the mover, a
producer and a retry can queue it (it is never refused as "too large")."""

from __future__ import annotations

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
