"""A consumer's ``redelivered`` (its status node's field, Worker.redelivered): the items it
settled whose attempts include a holder's death, the rule of the report's ``redelivered``
(a record with ``holder_deaths``). A holder dies with items marked started in its partitions;
their next owner redoes them -- the death charged into the item itself (``attempt + 1``,
``meta.holder_deaths``: the claim's ``deaths`` is 0) -- or, out of attempts, dead-letters them
``abandoned`` (the claim's ``deaths`` is 1). Every one counts; an item that waited unmarked
does not. Before, only the abandoned one counted. Real ZooKeeper, a real HTTP server."""

from __future__ import annotations

from tests.conftest import wait_for
from tests.httpd import TestServer, html
from tests.owned import claim, owned_queue
from tests.test_consumer_support import Running, records, settings_for
from zkcrawl.queue.claims import Claimed
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item


def test_redelivered_counts_every_item_settled_after_a_holder_died(zk, zk_hosts, zk_root,
                                                                     tmp_path):
    with TestServer({"/r/*": html("<title>r</title>")}) as srv:
        redone = [srv.url(f"/r/{i}") for i in range(2)]
        waited = srv.url("/r/waited")
        last = srv.url("/r/last")  # on its last attempt (--max-attempts 3): the death ends it
        IngressQueue(zk, zk_root).offer_many([*(Item(url=u) for u in [*redone, waited]),
                                              Item(url=last, attempt=2)])
        with owned_queue(zk, zk_root, "holder") as q:  # the holder: it starts three, dies
            got = claim(q, 4)
            written: list[Claimed] = []
            q.on_marked = written.extend
            started = [c for c in got if c.url != waited]
            assert not any(q.mark(c) for c in started)
            wait_for(lambda: len(written) >= len(started), 10, "the marks written")
        # Its partitions let go with their items marked started, as a dead holder's are
        # when its session ends; the next owner charges the death.
        out = tmp_path / "o.jsonl"
        run = Running(settings_for(zk_hosts, zk_root, out, "--id", "next",
                                   "--exit-when-idle", "1"))
        run.join(60)
        run.close()
    recs = {r["url"]: r for r in records(out)}
    assert sorted(recs) == sorted([*redone, waited, last])
    for url in redone:
        assert (recs[url]["error"], recs[url]["attempt"], recs[url]["holder_deaths"]) == (
            None, 1, 1), recs[url]
    assert (recs[last]["error"], recs[last]["holder_deaths"]) == ("abandoned", 1)
    assert (recs[waited]["attempt"], recs[waited]["holder_deaths"]) == (0, 0)
    assert run.worker.redelivered == 3  # the two redone and the abandoned one
    assert run.worker.redelivered == sum(1 for r in recs.values() if r["holder_deaths"])
    assert run.error is None
