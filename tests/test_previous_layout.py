"""A root made with the previous layout (SPEC §2: per-item leases under ``<root>/leases``,
claim records under ``<root>/claims``) is migrated, nothing lost: the ingress is moved into
the partitions by the owner of partition 0 whether an older consumer holds a lease on an
item or not (its record may then come twice: upgrade every consumer at once), and nothing of
this release writes a lease or a claim record. Real ZooKeeper, the old nodes written by hand
(tests/old_layout.py)."""

from __future__ import annotations

import json

from tests import old_layout
from tests.conftest import wait_for
from tests.owned import claim, owned_queue
from tests.test_consumer_support import left
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout


def test_the_ingress_of_an_old_root_is_moved_leases_and_all(zk_factory, zk_root) -> None:
    older, zk = zk_factory(), zk_factory()  # a consumer of an older release, still alive
    layout = Layout.of(zk_root)
    urls = [f"http://h{i % 3}.test/{i}" for i in range(10)]
    names = IngressQueue(older, zk_root).offer_many(Item(url=u) for u in urls)
    old_layout.hold(older, zk_root, names[:4], "older")
    zk.create(f"{layout.root}/claims/1.0", json.dumps(names[:4]).encode(), makepath=True)
    with owned_queue(zk, zk_root, "new") as q:
        got = claim(q, 10)
        assert sorted(c.url or "" for c in got) == sorted(urls)  # leased ones too
        assert zk.get_children(layout.queue) == []
        assert q.complete(got).done == got
        wait_for(lambda: left(zk, zk_root) == [], 10, "the settles checkpointed")
    # written by nobody here: the older consumer's leases stay until its session ends
    assert sorted(zk.get_children(layout.leases)) == sorted(names[:4])
    assert zk.get_children(f"{layout.root}/claims") == ["1.0"]
    older.close()
    wait_for(lambda: zk.get_children(layout.leases) == [], 10, "the old leases gone")


def test_a_consumer_says_once_that_the_root_has_nodes_of_the_previous_layout(
        zk_factory, zk_root, zk_hosts, tmp_path, capsys) -> None:
    """SPEC §2 / issue #22 point 7: one clear line at start, with what this release does
    with the old nodes and the way over; none for a root without them."""
    from zkcrawl.consumer.main import main

    older, zk = zk_factory(), zk_factory()
    layout = Layout.of(zk_root)
    # leases of items an older consumer took (their records may come twice: the line says so)
    old_layout.hold(older, zk_root, ["qn-0000000001", "qn-0000000002"], "older")
    for host in ("a.test", "b.test", "c.test"):
        zk.create(f"{layout.hosts}/{host}", b"0", makepath=True)
    args = ["--zk", zk_hosts, "--root", zk_root, "--out", str(tmp_path / "o.jsonl"),
            "--log-format", "json", "--exit-when-idle", "1", "--no-robots"]
    main(args, {})
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()
             if "consumer.previous_layout" in x]
    assert len(lines) == 1 and lines[0]["leases"] == 2 and lines[0]["hosts"] == 3, lines
    assert "nothing queued is lost" in lines[0]["note"]
    older.close()
    for host in ("a.test", "b.test", "c.test"):
        zk.delete(f"{layout.hosts}/{host}")
    wait_for(lambda: zk.get_children(layout.leases) == [], 10, "the old leases gone")
    main(args, {})
    assert "consumer.previous_layout" not in capsys.readouterr().err
