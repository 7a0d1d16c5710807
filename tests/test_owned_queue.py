"""consumer/owned_queue.py on a real ZooKeeper, without HTTP: claims handed out unmarked, marked
started only when admitted (one checkpoint for the marks waiting), settles written with the
next, items given back after their mark unmarked, a holder's death charged only for the
items it had started, a partition taken by
another session fenced (its items lost here, nothing written), a clean close handing every
partition over at once."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.conftest import expire_session, wait_for
from zkcrawl.consumer.owned_queue import OwnedQueue
from zkcrawl.consumer.ownership import Ownership
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_queue import PartitionQueue
from zkcrawl.queue.partitions import assign
from zkcrawl.zk import ConnectionLoss
from zkcrawl.zk.client import ZkClient

P = 4


def _member(zk: ZkClient, root: str, me: str) -> Ownership:
    zk.ensure_path(Layout.of(root).consumers)
    zk.create(Layout.of(root).consumer(me), b"{}", ephemeral=True)
    return Ownership(zk, root, me, 1.0, partitions=P).start()


def _batches(zk: ZkClient, root: str) -> list[pb.Batch]:
    layout = Layout.of(root)
    out = []
    for p in zk.get_children(layout.partitions):
        for n in zk.get_children(f"{layout.partitions}/{p}"):
            if n.startswith("qn-"):
                batch, _ = pb.decode(zk.get(f"{layout.partitions}/{p}/{n}")[0])
                assert batch is not None
                out.append(batch)
    return out


def _holder(zk: ZkClient, root: str, p: int) -> int | None:
    """The session holding partition ``p``'s owner node, or None."""
    stat = zk.exists(Layout.of(root).partition_owner(p))
    return None if stat is None else stat.ephemeralOwner


def _claim_all(q: OwnedQueue, n: int) -> list:
    got: list = []
    wait_for(lambda: got.extend(q.claim(100, timeout=0.5)) or len(got) >= n, 30,
             f"{n} claimed")
    return got


def _mark_all(q: OwnedQueue, claimed: list) -> list:
    """Mark ``claimed`` started as the worker does when it admits them; returns them once
    the queue says their marks are written (its on_marked)."""
    written: list = []
    q.on_marked = written.extend
    assert not any(q.mark(c) for c in claimed)  # none marked before: each waits for its write
    wait_for(lambda: len(written) >= len(claimed), 10, "the marks written")
    assert sorted(c.name for c in written) == sorted(c.name for c in claimed)
    assert all(q.mark(c) for c in claimed)  # marked now: nothing more to write
    return written


def test_claims_are_unmarked_until_started_and_settles_checkpointed(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    zk = zk_factory()
    IngressQueue(zk, zk_root).offer_many(
        [Item(url=f"http://h{i % 5}.test/{i}") for i in range(30)])  # the ingress
    q = OwnedQueue(zk, zk_root, "a", _member(zk, zk_root, "a"))
    try:
        got = _claim_all(q, 30)
        assert zk.get_children(Layout.of(zk_root).queue) == []  # all moved
        assert len(_batches(zk, zk_root)) >= 1
        assert sum(len(b.started) for b in _batches(zk, zk_root)) == 0  # a claim writes none
        _mark_all(q, got[:20])  # admitted to start: marked, durable before their requests
        started = {b.items[i].url for b in _batches(zk, zk_root) for i in b.started}
        assert started == {c.url for c in got[:20]}
        q.release(got[20:])  # given back before their start: nothing to undo
        q.release(got[:5])  # given back after it (a forced stop): unmarked
        assert q.complete(got[5:20]).done == got[5:20]
        wait_for(lambda: sum(len(b.pending) for b in _batches(zk, zk_root)) == 15, 10,
                 "the settles checkpointed")
        assert sum(len(b.started) for b in _batches(zk, zk_root)) == 0  # unmarked too
        again = _claim_all(q, 15)
        assert sorted(c.url for c in again) == sorted(c.url for c in got[:5] + got[20:])
        q.complete(again)
        wait_for(lambda: _batches(zk, zk_root) == [], 10, "every batch settled and deleted")
    finally:
        q.close()


def test_a_partition_taken_over_is_fenced_and_a_clean_close_hands_over(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a_zk = zk_factory(session_timeout=4.0)
    IngressQueue(a_zk, zk_root).offer_many(
        [Item(url=f"http://h{i % 3}.test/{i}") for i in range(12)])
    a = OwnedQueue(a_zk, zk_root, "a", _member(a_zk, zk_root, "a"))
    got = _claim_all(a, 12)
    _mark_all(a, got[:8])  # started; the other 4 still wait in the backlog
    expire_session(a_zk)  # its owner nodes go; the others take over
    b_zk = zk_factory()
    b = OwnedQueue(b_zk, zk_root, "b", _member(b_zk, zk_root, "b"))
    try:
        redone = _claim_all(b, 12)  # the started ones charged a death each, only they
        deaths = {c.url: c.item.meta.get("holder_deaths") for c in redone}
        assert deaths == {**{c.url: 1 for c in got[:8]}, **{c.url: None for c in got[8:]}}
        assert all(c.attempt == (1 if c.url in {g.url for g in got[:8]} else 0)
                   for c in redone)
        _mark_all(b, redone)
        wait_for(lambda: a_zk.connected, 20, "a reconnected (a zombie now)")
        a.complete(got)  # its settles: fenced, nothing written
        wait_for(lambda: len(a.drain_lost()) > 0 or a.held == 0, 10, "a's items given up")
        assert sum(len(x.started) for x in _batches(b_zk, zk_root)) == 12  # b's marks stand
        b.complete(redone)
    finally:
        b.close()
        a.close()
    layout = Layout.of(zk_root)
    owners = [p for p in b_zk.get_children(layout.partitions)
              if b_zk.exists(layout.partition_owner(int(p)))]
    assert owners == []  # a clean close deletes its owner nodes: handed over at once
    assert _batches(b_zk, zk_root) == []


def test_a_claim_takes_the_oldest_batch_first_so_few_batches_are_in_flight(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    """One host's items over several batch nodes, all stamped alike (one offer): a claim
    takes them batch by batch, not a few of each -- every checkpoint rewrites the batch
    nodes it touches whole, so items in flight spread over many batches cost ZooKeeper
    many times the bytes (the soak: 9 batches of 60 KB per checkpoint)."""
    zk = zk_factory()
    pad = "x" * 3000
    IngressQueue(zk, zk_root).offer_many(
        [Item(url=f"http://one.test/{i}", meta={"pad": pad}) for i in range(60)])
    q = OwnedQueue(zk, zk_root, "a", _member(zk, zk_root, "a"))
    try:
        first: list = []  # a claim takes the partitions; their owner moves the ingress
        wait_for(lambda: first.extend(q.claim(15, timeout=0.5)) or first, 30, "a claim")
        assert len(first) == 15
        by_url = {b.items[i].url: k for k, b in enumerate(_batches(zk, zk_root))
                  for i in range(len(b.items))}
        assert len({by_url[c.url] for c in first}) == 1  # one batch, not a few of each
        rest = _claim_all(q, 45)
        order = [by_url[c.url] for c in first + rest]
        assert order == sorted(order, key=order.index)  # batch after batch, none revisited
        assert len(set(order)) >= 3
        q.complete(first + rest)
    finally:
        q.close()


def test_marks_of_a_batch_that_could_not_be_read_again_are_written_at_a_later_checkpoint(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    """A batch whose last checkpoint answer was lost is read before its next write; when
    that read fails too (the ensemble electing a leader), the marks waiting in it go with
    a later checkpoint, with nothing else asking for one -- they once waited for ever, and
    their consumer with them (--exit-when-idle never came)."""
    zk = zk_factory()
    IngressQueue(zk, zk_root).offer_many([Item(url=f"http://h.test/{i}") for i in range(5)])
    q = OwnedQueue(zk, zk_root, "a", _member(zk, zk_root, "a"))
    try:
        got = _claim_all(q, 5)
        reread, failures = q.pq.reread, []

        def flaky(owned, name):  # the read after a lost answer: lost too, the first time
            if not failures:
                failures.append(name)
                raise ConnectionLoss("injected: no answer")
            return reread(owned, name)

        q.pq.reread = flaky  # type: ignore[method-assign]
        with q._lock:  # as a checkpoint whose answer was lost leaves them
            for part in q._parts.values():
                for b in part.batches.values():
                    b.unsure = True
        _mark_all(q, got)  # written all the same, without another settle or mark
        assert failures
        assert sum(len(b.started) for b in _batches(zk, zk_root)) == 5
        q.complete(got)
    finally:
        q.close()


def test_a_start_reads_every_partition_with_batches_in_its_first_round(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    """A consumer starting on 32 partitions that all hold batches reads them in one
    pipelined read: its first claim already hands out items of every partition (read 8 a
    round, one after another, a start on 128 took ~3 s before every host had its first
    page: bench hosts)."""
    n = 32
    zk = zk_factory()
    PartitionQueue(zk, zk_root, n).offer(
        [Item(url=f"http://h{i}.test/{j}") for j in range(3) for i in range(200)])
    zk.ensure_path(Layout.of(zk_root).consumers)
    zk.create(Layout.of(zk_root).consumer("a"), b"{}", ephemeral=True)
    q = OwnedQueue(zk, zk_root, "a", Ownership(zk, zk_root, "a", 1.0, partitions=n).start())
    try:
        first: list = []
        wait_for(lambda: bool(first.extend(q.claim(1000, timeout=0.5)) or first), 30,
                 "a first claim")
        assert len({c.name.split("/")[0] for c in first}) == n
    finally:
        q.close()


def test_a_mark_asked_with_its_start_is_written_by_then(
        zk_factory: Callable[..., ZkClient], zk_root: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mark asked with the time its item is to start (admitted ahead of its host's turn)
    goes in a checkpoint MARK_WRITE_S before it, not at the end of the coalescing window
    (MARK_S, stretched here to 3 s): its request starts on time. A mark asked without one
    rides in the same checkpoint."""
    from zkcrawl.consumer import owned_queue

    monkeypatch.setattr(owned_queue, "MARK_S", 3.0)
    zk = zk_factory()
    IngressQueue(zk, zk_root).offer_many([Item(url=f"http://h{i}.test/") for i in range(3)])
    q = OwnedQueue(zk, zk_root, "a", _member(zk, zk_root, "a"))
    try:
        got = _claim_all(q, 3)
        _mark_all(q, got[:1])  # a checkpoint now: the window counts from it
        written: list[tuple[str, float]] = []
        q.on_marked = lambda cs: written.extend((c.name, time.monotonic()) for c in cs)
        by = time.monotonic() + 0.8
        assert not q.mark(got[1])  # no start given: the window's end, 3 s away
        assert not q.mark(got[2], by=by)
        wait_for(lambda: len(written) == 2, 10, "both marks written")
        assert max(t for _, t in written) <= by
        assert {name for name, _ in written} == {got[1].name, got[2].name}
    finally:
        q.close()


def test_a_consumer_gaining_many_partitions_lists_the_empty_ones_in_one_round(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    """A start (or a gain) of twice PER_ROUND empty partitions: one pipelined listing sets
    every watch (at PER_ROUND a round, a producer's first items landing in a partition not
    yet listed waited for its round), and an item offered afterwards to any of them is
    claimed."""
    from zkcrawl.consumer import owned_queue

    n = 2 * owned_queue.PER_ROUND
    zk = zk_factory()
    zk.ensure_path(Layout.of(zk_root).consumers)
    zk.create(Layout.of(zk_root).consumer("a"), b"{}", ephemeral=True)
    ownership = Ownership(zk, zk_root, "a", 1.0, partitions=n).start()
    q = OwnedQueue(zk, zk_root, "a", ownership)
    try:
        wait_for(lambda: q.claim(1, timeout=0.05) == [] and len(q._parts) == n, 30,
                 f"{n} partitions taken")
        listed = sum(1 for part in q._parts.values() if part.listed and not part.dirty)
        assert listed == n
        IngressQueue(zk, zk_root).offer_many([Item(url=f"http://h{i}.test/") for i in range(40)])
        assert len(_claim_all(q, 40)) == 40
    finally:
        q.close()


def test_a_release_whose_answer_is_lost_is_tried_again(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    """A consumer loses a partition to a newcomer and its release (the owner node's delete)
    gets no answer -- a leader's death cuts it off. It tries again at its next round, so the
    newcomer takes the partition; once such a release was forgotten, the owner node stayed with
    the live session, and the partition's items waited for ever (the fault suite's leader
    killed during a rebalance). The ConnectionLoss is injected once: the real one needs an
    election at the exact moment."""
    a_zk = zk_factory()
    a = OwnedQueue(a_zk, zk_root, "a", _member(a_zk, zk_root, "a"))
    real, lost = a.pq.release_many, []

    def cut_off(owned):  # type: ignore[no-untyped-def]
        if not lost:
            lost.append([o.partition for o in owned])
            raise ConnectionLoss()
        return real(owned)

    a.pq.release_many = cut_off  # type: ignore[method-assign]
    b = None
    try:
        wait_for(lambda: a.claim(1, timeout=0.05) == [] and len(a._parts) == P, 30,
                 "a owns every partition")
        b_zk = zk_factory()
        b = OwnedQueue(b_zk, zk_root, "b", _member(b_zk, zk_root, "b"))
        ours = assign(P, ["a", "b"])["b"]

        def rounds() -> bool:  # as the claim loop's tick: members, then a round (a claim)
            for q in (a, b):
                q.ownership.refresh()
                q.claim(1, timeout=0.05)
            return all(_holder(b_zk, zk_root, p) == b_zk.session_id for p in ours)

        wait_for(rounds, 30, "the newcomer took its partitions")
        assert lost and set(ours) <= set(lost[0])  # given up by a release that got no answer
        assert all(_holder(b_zk, zk_root, p) == a_zk.session_id
                   for p in assign(P, ["a", "b"])["a"])
    finally:
        if b is not None:
            b.close()
        a.close()


def test_an_owner_node_a_consumer_forgot_is_swept_so_its_owner_takes_the_partition(
        zk_factory: Callable[..., ZkClient], zk_root: str, monkeypatch) -> None:
    """Defence in depth against any other way to forget an owner node: a consumer whose
    session holds the owner node of a partition it neither owns nor holds in memory deletes it
    at its next sweep, and the partition's owner (refused until then) takes it on its watch."""
    from zkcrawl.consumer import owned_queue

    monkeypatch.setattr(owned_queue, "SWEEP_S", 0.2)
    layout = Layout.of(zk_root)
    a_zk, b_zk = zk_factory(), zk_factory()
    a_zk.ensure_path(layout.consumers)
    for zk, me in ((a_zk, "a"), (b_zk, "b")):  # both members before either looks
        zk.create(layout.consumer(me), b"{}", ephemeral=True)
    a_own = Ownership(a_zk, zk_root, "a", 1.0, partitions=P).start()
    b_own = Ownership(b_zk, zk_root, "b", 1.0, partitions=P).start()
    theirs = assign(P, ["a", "b"])["b"][0]
    a_zk.ensure_path(layout.partition(theirs))
    a_zk.create(layout.partition_owner(theirs), b"{}", ephemeral=True)  # forgotten by a
    a = OwnedQueue(a_zk, zk_root, "a", a_own)
    b = OwnedQueue(b_zk, zk_root, "b", b_own)

    try:
        wait_for(lambda: b.claim(1, timeout=0.05) == [] and theirs in b._asked, 30,
                 "b refused the partition a's session holds")
        wait_for(lambda: a.claim(1, timeout=0.05) == [] and b.claim(1, timeout=0.05) == []
                 and _holder(b_zk, zk_root, theirs) == b_zk.session_id, 30,
                 "a swept it and b took it")
        assert theirs in b._parts and theirs not in a._parts
    finally:
        b.close()
        a.close()


def test_a_forged_owner_node_is_one_warning_and_its_partition_taken_once_deleted(
        zk_factory: Callable[..., ZkClient], zk_root: str, monkeypatch) -> None:
    """An owner node no consumer wrote (persistent, a hostile name) on a partition this
    consumer owns: its take is refused, once past HELD_WARN_S that is one warning naming the
    holder (cleaned) and the fix -- not one a round -- and once the node is deleted the
    partition is taken and its items claimed."""
    import structlog

    from tests.test_consumer_faults import forget_cached_loggers
    from zkcrawl.consumer import owned_queue

    monkeypatch.setattr(owned_queue, "HELD_WARN_S", 0.3)
    monkeypatch.setattr(owned_queue, "RETAKE_S", 0.1)
    layout, zk = Layout.of(zk_root), zk_factory()
    urls = [f"http://h{i}.test/" for i in range(40)]
    IngressQueue(zk, zk_root).offer_many(Item(url=u) for u in urls)
    own = _member(zk, zk_root, "a")
    forged = next(p for p in range(P) if p != 0)  # partition 0's owner moves the ingress
    zk.create(layout.partition_owner(forged), b'{"consumer": "evil\\u001b[31m\\n"}',
              makepath=True)
    q = OwnedQueue(zk, zk_root, "a", own)
    forget_cached_loggers()
    try:
        with structlog.testing.capture_logs() as logs:
            got = _claim_all(q, len(urls) - sum(
                1 for u in urls if own.partition(u.split("/")[2]) == forged))
            wait_for(lambda: q.claim(100, timeout=0.05) == [] and any(
                e["event"] == "partition.owner_held" for e in logs), 10, "the warning")
            for _ in range(5):  # more refused rounds: still one warning
                q.claim(100, timeout=0.1)
        held = [e for e in logs if e["event"] == "partition.owner_held"]
        assert len(held) == 1 and held[0]["partition"] == forged, held
        assert held[0]["owner"] == "evil\\x1b[31m\\n" and "persistent" in held[0]["session"]
        zk.delete(layout.partition_owner(forged))
        got += _claim_all(q, len(urls) - len(got))
        assert sorted(c.url for c in got) == sorted(urls)
        assert _holder(zk, zk_root, forged) == zk.session_id
    finally:
        forget_cached_loggers()
        q.close()
