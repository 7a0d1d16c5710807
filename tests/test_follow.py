"""Discovered links through the frontier (issue #17): a consumer whose page processor returns
links and a producer run with ``--follow`` crawl the bundled sample site from one seed URL --
real processes, a real ZooKeeper, the sample site on 127.0.0.1 -- and the books balance:
every page reachable on the site recorded exactly once, nothing left queued (ingress or
partitions), held or in ``discovered/``. The sample site is one host: one consumer owns it
at a time (SPEC §2), so a killed owner's pages go to the consumer that takes its partition."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.faults.books import held_leases
from tests.httpd import TestServer, html
from tests.queue_view import held, queued_urls
from tests.test_consumer_support import ROOT, Running, offer, records, settings_for, spawn
from zkcrawl.admin.samplesite import PAGES, SampleSite, expected_articles
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.discovered import DiscoveredReader, DiscoveredWriter, Link
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS, assign, partition_of
from zkcrawl.web.urls import host_key
from zkcrawl.zk import NoNodeError
from zkcrawl.zk.client import ZkClient


def producer(zk_hosts: str, zk_root: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "zkcrawl.producer.main", "--zk", zk_hosts, "--root", zk_root,
         "--allow-private-addresses", "--log-format", "json", *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def books_empty(zk: ZkClient, zk_root: str) -> None:
    """Nothing queued (ingress or partitions), nothing held, every discovered node drained."""
    assert queued_urls(zk, zk_root) == [], "queued"
    assert held(zk, zk_root) == [], "held"
    assert zk.get_children(f"{zk_root}/discovered") == [], "discovered"


def queued_items(zk: ZkClient, zk_root: str) -> list[dict[str, object]]:
    """``{"url", "meta"}`` of every item in the partitions' batches (none is taken: no
    consumer runs), in partition then batch order."""
    layout = Layout.of(zk_root)
    out: list[dict[str, object]] = []
    for p in sorted(zk.get_children(layout.partitions), key=int):
        path = f"{layout.partitions}/{p}"
        for name in sorted(n for n in zk.get_children(path) if n.startswith("qn-")):
            batch, why = pb.decode(zk.get(f"{path}/{name}")[0])
            assert batch is not None, why
            out.extend({"url": it.url, "meta": it.meta} for it in batch.items if it is not None)
    return out


def owner_node(zk: ZkClient, zk_root: str, p: int) -> str | None:
    """The consumer named by partition ``p``'s owner node (None: not owned)."""
    try:
        return str(json.loads(zk.get(Layout.of(zk_root).partition_owner(p))[0])["consumer"])
    except NoNodeError:  # not taken yet, or between two owners
        return None


def summary(stderr: str) -> dict[str, object]:
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    (done,) = [e for e in events if e.get("event") == "producer.summary"]
    return done


@pytest.mark.slow
def test_a_deep_crawl_through_follow_records_every_page_exactly_once(
        zk: ZkClient, zk_hosts: str, zk_root: str, tmp_path: Path):
    with SampleSite(slow_s=0.1) as site:
        base = site.base_url.rstrip("/")
        seed = tmp_path / "seed.txt"
        seed.write_text(f"{base}/\n")
        out = tmp_path / "out.jsonl"
        consumer = spawn(["--zk", zk_hosts, "--root", zk_root, "--out", str(out),
                          "--domain-delay", "0", "--threads", "4", "--log-format", "json",
                          "--allow-private-addresses", "--exit-when-idle", "3",
                          "--processor", "tests.plugins.procs:links"], tmp_path / "c.log")
        prod = producer(zk_hosts, zk_root, "--from-file", str(seed), "--follow", "--same-host")
        try:
            _, err = prod.communicate(timeout=120)
            assert prod.returncode == 0, err[-2000:]
            assert consumer.wait(timeout=60) == 0
        finally:
            for proc in (prod, consumer):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    recs = records(out)
    urls = Counter(r["url"] for r in recs)
    assert [u for u, n in urls.items() if n > 1] == []  # exactly once: no duplicate
    expected = {f"{base}/", *(f"{base}/blog/page/{p}" for p in range(1, PAGES + 1)),
                f"{base}/about.html", *expected_articles(base)}
    assert set(urls) == expected
    by_url = {r["url"]: r for r in recs}
    assert by_url[f"{base}/blog/posts/41.html"]["error"] == "http-404"
    assert by_url[f"{base}/blog/private/draft.html"]["error"] == "robots"
    assert by_url[f"{base}/blog/posts/1.html"]["error"] is None
    # The books: nothing left anywhere, every discovered node drained, no dead letter.
    books_empty(zk, zk_root)
    assert zk.get_children(f"{zk_root}/dead") == []
    done = summary(err)
    assert done["offered"] == len(expected)
    assert done["dropped"]["other-host"] >= 1  # --same-host: external.invalid  # type: ignore[index]
    assert done["discovered_nodes"] >= 1


def test_max_link_depth_drops_deeper_links_and_drained_nodes_go(
        zk: ZkClient, zk_hosts: str, zk_root: str):
    writer = DiscoveredWriter(zk, zk_root, "c-test")
    writer.write([Link("http://127.0.0.1:9/d1", "http://127.0.0.1:9/", 1),
                  Link("http://127.0.0.1:9/d2", "http://127.0.0.1:9/d1", 2),
                  Link("http://127.0.0.1:9/d1#again", "http://127.0.0.1:9/x", 1)])
    zk.create(f"{zk_root}/discovered/dn-", b'{"links": 5}', sequence=True)  # malformed
    prod = producer(zk_hosts, zk_root, "--follow", "--max-link-depth", "1")
    try:
        # No consumer: the producer drains, offers (into the partitions), then waits for
        # the queue to empty.
        wait_for(lambda: zk.get_children(f"{zk_root}/discovered") == []
                 and queued_urls(zk, zk_root), 60, "discovered/ drained")
        prod.send_signal(signal.SIGTERM)
        _, err = prod.communicate(timeout=60)
    finally:
        if prod.poll() is None:
            prod.kill()
            prod.wait()
    assert prod.returncode == 0, err[-2000:]
    queued = queued_items(zk, zk_root)
    assert zk.get_children(f"{zk_root}/queue") == []  # a producer offers into partitions
    assert [(q["url"], q["meta"]) for q in queued] == [
        ("http://127.0.0.1:9/d1", {"source": "http://127.0.0.1:9/", "depth": 1})]
    done = summary(err)
    assert done["dropped"] == {"depth": 1} and done["duplicates"] == 1
    assert zk.get_children(f"{zk_root}/discovered") == []  # the malformed one too
    assert "discovered.malformed" in err


def test_an_item_is_never_completed_before_its_links_are_in_zookeeper(
        zk: ZkClient, zk_hosts: str, zk_root: str, tmp_path: Path):
    # <root>/discovered made unwritable: an ephemeral node cannot have children.
    zk.ensure_path(zk_root)
    zk.create(f"{zk_root}/discovered", b"", ephemeral=True)
    page = ('<title>L</title><a href="/a">a</a><a href="https://other.example/b">b</a>')
    with TestServer({"/list": html(page)}) as srv:
        offer(zk, zk_root, [srv.url("/list")])
        out = tmp_path / "o.jsonl"
        # Attempts to spare: each refusal is one (tests/test_discovered_refused.py: the
        # dead letters once they run out).
        run = Running(settings_for(zk_hosts, zk_root, out, "--threads", "2",
                                   "--max-attempts", "1000",
                                   "--processor", "tests.plugins.procs:links"))
        try:
            # Recorded (durable first), refused links: retried, crawled again, not completed.
            wait_for(lambda: len(records(out)) >= 2, 30, "the page crawled twice")
            assert queued_urls(zk, zk_root) == [srv.url("/list")]  # not completed
            zk.delete(f"{zk_root}/discovered")  # writable again: the next try completes it
            wait_for(lambda: not queued_urls(zk, zk_root), 30, "completed")
        finally:
            run.stop()
    nodes = DiscoveredReader(zk, zk_root)
    links = [link for n in nodes.read(nodes.names()) for link in n.decoded.links]
    assert {(link.url, link.source, link.depth) for link in links} == {
        (srv.url("/a"), srv.url("/list"), 1), ("https://other.example/b", srv.url("/list"), 1)}
    # The books: one item, recorded once per crawl (the repeats are the retries), no lease.
    assert {r["url"] for r in records(out)} == {srv.url("/list")}
    assert held(zk, zk_root) == []
    assert zk.get_children(f"{zk_root}/dead") == []


@pytest.mark.slow
def test_a_consumer_killed_mid_crawl_loses_no_page_of_a_deep_crawl(
        zk: ZkClient, zk_hosts: str, zk_root: str, tmp_path: Path):
    """SIGKILL the owner of the site's one host while the crawl follows links: when its
    session expires the other consumer takes its partition and the items it held again;
    every page is recorded, the other recorded nothing while the victim owned the host, and
    the only duplicates are pages the victim held when it died (recorded, not settled)."""
    def consumer(name: str) -> subprocess.Popen[bytes]:
        return spawn(["--zk", zk_hosts, "--root", zk_root, "--out", str(tmp_path / name),
                      "--id", name, "--threads", "2", "--backlog", "2", "--domain-delay",
                      "0.05", "--session-timeout", "3",
                      "--log-format", "json", "--allow-private-addresses",
                      "--exit-when-idle", "4", "--processor", "tests.plugins.procs:links"],
                     tmp_path / f"{name}.log")

    with SampleSite(slow_s=0.1) as site:
        base = site.base_url.rstrip("/")
        seed = tmp_path / "seed.txt"
        seed.write_text(f"{base}/\n")
        p = partition_of(host_key(f"{base}/"), DEFAULT_PARTITIONS)
        names = ["c1", "c2"]
        (victim_id,) = [c for c, ps in assign(DEFAULT_PARTITIONS, names).items() if p in ps]
        (survivor_id,) = set(names) - {victim_id}
        procs = {c: consumer(c) for c in names}
        victim, survivor = procs[victim_id], procs[survivor_id]
        # The host's partition settled on its owner before anything is offered.
        wait_for(lambda: owner_node(zk, zk_root, p) == victim_id, 60, "the host owned")
        prod = producer(zk_hosts, zk_root, "--from-file", str(seed), "--follow", "--same-host")
        try:
            wait_for(lambda: len(records(tmp_path / victim_id, strict=False)) >= 5, 60,
                     "the owner recorded pages")
            victim.kill()  # SIGKILL: no release, no settle of what it holds
            victim.wait()
            # Read after the death, before its session expires: what it held when it died.
            in_hand = set(held_leases(zk, zk_root, victim_id).values())
            assert records(tmp_path / survivor_id) == []  # one host, one owner
            _, err = prod.communicate(timeout=120)
            assert prod.returncode == 0, err[-2000:]
            assert survivor.wait(timeout=60) == 0
        finally:
            for proc in (prod, victim, survivor):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    killed = Counter(r["url"] for r in records(tmp_path / victim_id, strict=False))
    kept = Counter(r["url"] for r in records(tmp_path / survivor_id))
    expected = {f"{base}/", *(f"{base}/blog/page/{p}" for p in range(1, PAGES + 1)),
                f"{base}/about.html", *expected_articles(base)}
    assert set(killed) | set(kept) == expected  # no page lost
    duplicates = {u for u in expected if killed[u] + kept[u] > 1}
    assert duplicates <= set(killed) & in_hand, (duplicates, in_hand)  # explained
    assert len(duplicates) <= 2 + 2  # bounded: at most its threads + backlog
    assert all(n == 1 for n in kept.values())
    assert {r["consumer"] for r in records(tmp_path / survivor_id)} == {survivor_id}
    books_empty(zk, zk_root)
