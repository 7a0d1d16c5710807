"""``<root>/discovered`` that ZooKeeper refuses to write to (an ACL these credentials may not
create under: NoAuth) -- a real ZooKeeper, a real ACL, a real HTTP site:

* a refusal is a **failed attempt** of the items whose links were refused, never a release:
  a consumer process crawls each of them exactly ``--max-attempts`` times, then they are dead
  letters with ``discovered links not writable: NoAuthError`` and the consumer ends by itself
  (``--exit-when-idle``: bounded, no loop); items without links complete as usual;
* the committer logs the refusal **once per group** (one ``consumer.links_refused`` for a
  group of items, whatever the number refused), and completes the group's other items.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from tests.conftest import wait_for
from tests.httpd import TestServer, html
from tests.owned import claim, owned_queue
from tests.test_consumer_support import left, offer, records, spawn
from tests.test_producer import forget_cached_loggers
from zkcrawl.admin.cluster import list_dead
from zkcrawl.consumer.committer import GroupCommit, Settle
from zkcrawl.consumer.owned_queue import OwnedQueue
from zkcrawl.consumer.pipeline import COMPLETE, DEAD, RETRY
from zkcrawl.consumer.sinks import Sink
from zkcrawl.queue.claims import Claimed
from zkcrawl.queue.discovered import DiscoveredWriter, Link
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.zk import NoAuthError
from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.security import parse_auth

REASON = "discovered links not writable: NoAuthError"
LINKED, PLAIN = 4, 4  # pages whose processor returns links, pages without any


@pytest.fixture
def locked_root(zk: ZkClient, zk_hosts: str, zk_root: str) -> Iterator[str]:
    """``zk_root`` open to anyone, but ``<root>/discovered`` made by another identity with
    zkcrawl's creator ACL (ALL for it, READ for anyone): a session without those
    credentials -- the consumer's -- may read it but not create under it (NoAuth)."""
    zk.ensure_path(zk_root)
    owner = ZkClient(zk_hosts, zk_timeout=8, auth=parse_auth("digest:owner:owner-secret"))
    with owner.connect():
        owner.ensure_path(f"{zk_root}/discovered")
    with pytest.raises(NoAuthError):  # the refusal is real, for this test's own client too
        zk.create(f"{zk_root}/discovered/dn-", b"{}", sequence=True)
    yield zk_root


def test_refused_links_end_in_dead_letters_after_max_attempts(
        zk: ZkClient, zk_hosts: str, locked_root: str, tmp_path: Path):
    routes = {f"/l/{i}": html(f'<title>l{i}</title><a href="/next/{i}">next</a>')
              for i in range(LINKED)}
    routes |= {f"/p/{i}": html(f"<title>p{i}</title>no link here") for i in range(PLAIN)}
    out, log = tmp_path / "o.jsonl", tmp_path / "c.log"
    with TestServer(routes) as srv:
        linked = [srv.url(f"/l/{i}") for i in range(LINKED)]
        plain = [srv.url(f"/p/{i}") for i in range(PLAIN)]
        offer(zk, locked_root, [u for pair in zip(linked, plain, strict=True) for u in pair])
        consumer = spawn(["--zk", zk_hosts, "--root", locked_root, "--out", str(out),
                          "--threads", "4", "--max-attempts", "3", "--domain-delay", "0",
                          "--no-robots", "--allow-private-addresses", "--log-format", "json",
                          "--exit-when-idle", "1",
                          "--processor", "tests.plugins.procs:links"], log)
        try:
            # Bounded: it ends by itself once the queue is empty -- it never loops.
            assert consumer.wait(timeout=60) == 0, log.read_text()[-3000:]
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
        fetches = Counter(r.path for r in srv.requests)
    # The books: the linked items are dead letters with the reason, tried 3 times each ...
    dead = list_dead(zk, locked_root)
    assert sorted(d.url or "" for d in dead) == sorted(linked)
    assert {(d.error, d.attempts) for d in dead} == {(REASON, 3)}
    assert all(fetches[f"/l/{i}"] == 3 for i in range(LINKED)), fetches
    # ... the others completed at the first try; nothing left in the queue or leased.
    assert all(fetches[f"/p/{i}"] == 1 for i in range(PLAIN)), fetches
    assert left(zk, locked_root) == []
    assert zk.get_children(f"{locked_root}/discovered") == []
    # Each try stored its record (records before links): 3 per linked page, bounded.
    stored = Counter(r["url"] for r in records(out))
    assert stored == Counter({**{u: 3 for u in linked}, **{u: 1 for u in plain}})
    # Every refusal logged, in group warnings (never one line per item and try more).
    refusals = events(log, "consumer.links_refused")
    assert sum(e["items"] for e in refusals) == 3 * LINKED
    assert {e["reason"] for e in refusals} == {REASON}
    assert sum(e["dead"] for e in refusals) == LINKED
    assert all("NoAuth" in e["error"] for e in refusals)
    assert events(log, "consumer.commit_failed") == []


def test_one_warning_per_group_and_the_rest_of_the_group_completes(
        zk: ZkClient, locked_root: str, tmp_path: Path):
    """The committer alone, with what the consumer gives it: a real queue (the partitions
    one consumer owns), a real JSON Lines sink, links written by a real DiscoveredWriter.
    One group of 6: 3 with links (one of them on its last try), 3 without."""
    urls = [f"http://127.0.0.1:9/{i}" for i in range(6)]
    IngressQueue(zk, locked_root).offer_many(
        Item(url=u, attempt=2 if i == 2 else 0) for i, u in enumerate(urls))
    with owned_queue(zk, locked_root, "c-test") as queue:
        _one_group(zk, locked_root, queue, urls, tmp_path)


def _one_group(zk: ZkClient, locked_root: str, queue: OwnedQueue, urls: list[str],
               tmp_path: Path) -> None:
    claimed = sorted(claim(queue, 6), key=lambda c: c.url or "")
    assert [c.url for c in claimed] == urls
    writer = DiscoveredWriter(zk, locked_root, "c-test")
    links = {c.name: [Link(f"{c.url}/next", c.url or "", 1)] if i < 3 else []
             for i, c in enumerate(claimed)}
    calls: list[list[str]] = []

    def before_settle(tokens: list[Claimed]) -> None:
        calls.append([t.name for t in tokens])
        writer.write([link for t in tokens for link in links[t.name]])

    announced: list[tuple[str, str, str | None]] = []
    commit: GroupCommit[Claimed] = GroupCommit(
        Sink(str(tmp_path / "o.jsonl")), queue, live=lambda _t: True, settled=lambda _t: None,
        failed=lambda _e, ts: pytest.fail(f"released {ts}"), before_settle=before_settle,
        durable=lambda ss: announced.extend((s.claimed.name, s.kind, s.error) for s in ss),
        max_attempts=3)
    settles = [Settle(c, COMPLETE, None, {"url": c.url}, c) for c in claimed]
    forget_cached_loggers()
    with structlog.testing.capture_logs() as logs:
        for s in settles:  # all put before the thread starts: one group
            commit.put(s)
        commit.start().close(timeout=20)
    forget_cached_loggers()
    kinds = [RETRY, RETRY, DEAD, COMPLETE, COMPLETE, COMPLETE]
    assert [(s.kind, s.error) for s in settles] == [
        (k, REASON if k != COMPLETE else None) for k in kinds]
    # Told durable once per item, with the outcome it is settled with (item.failed lines).
    assert announced == [(s.claimed.name, s.kind, s.error) for s in settles]
    (warning,) = [e for e in logs if e["event"] == "consumer.links_refused"]
    assert (warning["items"], warning["group"], warning["retried"], warning["dead"]) == (
        3, 6, 2, 1)
    assert warning["reason"] == REASON and "NoAuth" in warning["error"]
    assert calls[0] == [c.name for c in claimed]  # the group at once, then item by item
    assert calls[1:] == [[c.name] for c in claimed]
    assert len(records(tmp_path / "o.jsonl")) == 6  # records before links: all stored
    # The queue's books: 2 back at the tail with attempt 1 and the reason, 1 dead letter
    # (3 tries), 3 completed; no link got in.
    again = claim(queue, 2)
    assert sorted(c.url or "" for c in again) == urls[:2]
    assert {(c.attempt, c.item.meta["last_error"]) for c in again if c.item} == {(1, REASON)}
    wait_for(lambda: list_dead(zk, locked_root), 10, "the dead letter checkpointed")
    assert [(d.url, d.error, d.attempts) for d in list_dead(zk, locked_root)] == [
        (urls[2], REASON, 3)]
    assert zk.get_children(f"{locked_root}/discovered") == []


def events(path: Path, name: str) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [e for e in map(_json, lines) if e is not None and e.get("event") == name]


def _json(line: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
