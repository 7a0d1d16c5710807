"""The ingress ``<root>/queue`` (zkcrawl.queue.ingress) against a real ZooKeeper: offers in
order, batched and protected (a lost answer asked again, never doubled), items over the
limit refused. Consumers move the ingress into partitions: that is
tests/test_partition_queue.py's and tests/test_owned_queue.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zkcrawl.queue import items as item_codec
from zkcrawl.queue.claims import AT_MOST_ONCE
from zkcrawl.queue.ingress import IngressQueue, ItemRefused
from zkcrawl.queue.items import Item


def urls(n: int, prefix: str = "http://127.0.0.1/a/") -> list[Item]:
    return [Item(url=f"{prefix}{i}", producer="t") for i in range(n)]


def test_offers_are_queued_in_offer_order(zk, zk_root):
    q = IngressQueue(zk, zk_root, batch=50)  # three transactions, two in flight
    names = q.offer_many(urls(120))
    queued = [n for _, n in item_codec.sort_names(zk.get_children(f"{zk_root}/queue"))]
    assert names == queued
    docs = [item_codec.decode(zk.get(f"{zk_root}/queue/{n}")[0]).item for n in names]
    assert [d.url for d in docs if d] == [f"http://127.0.0.1/a/{i}" for i in range(120)]
    assert zk.get_children(f"{zk_root}/offers") == []  # every marker deleted


def test_an_item_over_the_limit_is_refused_and_the_others_go_on(zk, zk_root):
    q = IngressQueue(zk, zk_root)
    big = Item(url="http://127.0.0.1/big", meta={"pad": "x" * item_codec.ITEM_LIMIT})
    assert len(q.offer_many([*urls(2), big, *urls(1, "http://127.0.0.1/b/")])) == 3
    assert q.refused == 1
    with pytest.raises(ItemRefused):
        q.offer("http://127.0.0.1/huge", meta={"pad": "x" * item_codec.ITEM_LIMIT})


def test_a_reaped_queue_path_is_made_again_on_offer(zk, zk_root):
    q = IngressQueue(zk, zk_root)
    zk.delete(f"{zk_root}/queue")  # what the server does to an empty CONTAINER node
    name = q.offer("http://127.0.0.1/after-reap")
    assert zk.get_children(f"{zk_root}/queue") == [name]


def test_offer_batches_and_protected_retry_finds_committed_batch(zk, zk_root):
    q = IngressQueue(zk, zk_root, batch=7)
    names = q.offer_many(urls(50))
    assert len(names) == 50 and len(set(names)) == 50
    assert item_codec.sort_names(names) == sorted(item_codec.sort_names(names))
    # The retry path: a batch that did commit is found by its marker, not re-sent.
    token = "t" * 32
    marker = f"{zk_root}/offers/{token}"
    tx = zk.transaction()
    tx.create(marker, b"", ephemeral=True)
    tx.create(f"{zk_root}/queue/qn-", Item(url="http://127.0.0.1/m").encode(batch=token),
              sequence=True)
    tx.commit()
    found = q.find_committed(marker, token, 1)
    assert found is not None and len(found) == 1
    assert q.find_committed(f"{zk_root}/offers/{'u' * 32}", "u" * 32, 1) is None
    assert len(zk.get_children(f"{zk_root}/queue")) == 51


def test_a_lost_offer_is_checked_again_when_the_connection_goes_while_checking(
        zk, zk_root, monkeypatch):
    """An offer's answer lost (the leader killed), and the connection lost again while asking
    whether it committed (CI: the fault test's second kill point): asked again once
    connected -- a batch that committed is found by its marker, not sent twice; one that did
    not is sent again. (The losses are injected; the server and the transactions are real.)"""
    from zkcrawl.zk import ConnectionLoss

    offers = IngressQueue(zk, zk_root, batch=10)
    real = offers.find_committed
    drops = iter([True, False, True, False])

    def flaky(marker: str, token: str, n: int) -> list[str] | None:
        if next(drops):
            raise ConnectionLoss("the connection went again")
        return real(marker, token, n)

    monkeypatch.setattr(offers, "find_committed", flaky)

    def lost() -> Any:
        pending = zk._kazoo.handler.async_result()
        pending.set_exception(ConnectionLoss("answer lost"))
        return pending

    # committed before the answer was lost: found, not re-sent
    token = "c" * 32
    chunk = [Item(url=f"http://127.0.0.1/lost/{i}").encode(batch=token) for i in range(3)]
    committed = offers._offer_async(token, chunk)
    assert len(zk.answer(committed)) == 4  # marker + 3 items
    assert len(offers._offer_result(token, chunk, lost())) == 3
    # not committed: sent again, once
    token = "n" * 32
    chunk = [Item(url=f"http://127.0.0.1/again/{i}").encode(batch=token) for i in range(2)]
    assert len(offers._offer_result(token, chunk, lost())) == 2
    assert len(zk.get_children(f"{zk_root}/queue")) == 5


def test_delivery_and_run_state_are_str_enums():
    from zkcrawl.queue import control
    from zkcrawl.queue.claims import AT_LEAST_ONCE, Delivery

    assert AT_LEAST_ONCE is Delivery.AT_LEAST_ONCE and AT_LEAST_ONCE == "at-least-once"
    assert Delivery("at-most-once") is AT_MOST_ONCE and f"{AT_MOST_ONCE}" == "at-most-once"
    with pytest.raises(ValueError, match="'twice' is not a valid Delivery"):
        Delivery("twice")
    assert control.PAUSED is control.RunState.PAUSED and control.PAUSED == "paused"
    assert control.STATES == ("running", "paused")
    assert control.parse_state(b'{"state": "paused"}') is control.PAUSED
    assert json.dumps({"state": control.RUNNING}) == '{"state": "running"}'


def test_sequence_sort_is_wrap_safe():
    names = ["qn-2147483646", "qn--2147483648", "qn-2147483647", "qn--2147483647"]
    assert [n for _, n in item_codec.sort_names(names)] == [
        "qn-2147483646", "qn-2147483647", "qn--2147483648", "qn--2147483647"]
    assert [n for _, n in item_codec.sort_names(["qn-0000000010", "qn-0000000002"])] == [
        "qn-0000000002", "qn-0000000010"]
