"""Attempts mean fetches (issue #26, item 4): a dead letter, ``zkcrawl dead list`` and the
report keep the tries apart from the redeliveries after a holder died. Real ZooKeeper; the
dead letter is written by the queue itself."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from tests.owned import claim, owned_queue
from zkcrawl.admin.cluster import _decode_dead, list_dead
from zkcrawl.admin.report import render_text, summarize
from zkcrawl.cli import main
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.claims import attempts_text
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item


def test_a_dead_letter_says_how_many_of_its_attempts_were_holders_that_died(
        zk, zk_root, capsys):
    # the item's second failed fetch after one holder died: attempt 2, one death so far
    IngressQueue(zk, zk_root).offer_many([Item(url="http://shop.example/a", attempt=2,
                                               meta={"holder_deaths": 1})])
    with owned_queue(zk, zk_root, "c") as q:
        (c,) = claim(q, 1)
        assert c.holder_deaths == 1
        assert q.dead_letter(c, "http-503").done == [c]
    (d,) = list_dead(zk, zk_root)  # written by the queue's last checkpoint at the latest
    assert (d.attempts, d.holder_deaths) == (3, 1)
    assert d.to_json()["fetches"] == 2
    assert main(["dead", "list", "--zk", zk.hosts, "--root", zk_root], {}) == 0
    out = capsys.readouterr().out
    assert "attempts=3 (2 fetched, 1 holder died)" in out


def _stat() -> SimpleNamespace:
    return SimpleNamespace(ctime=1_000_000)


def test_a_forged_count_of_deaths_never_exceeds_the_attempts():
    for raw, want in ((5, 3), (-2, 0), ("x", 0), (True, 0), (1e300, 0), (None, 0)):
        doc = {"item": "qn-1", "url": "http://h/", "error": "e", "attempts": 3,
               "holder_deaths": raw}
        d = _decode_dead("dl-1", json.dumps(doc).encode(), _stat())  # type: ignore[arg-type]
        assert 0 <= d.holder_deaths <= d.attempts and d.holder_deaths == want, raw


@given(st.integers(-5, 50), st.integers(-5, 50))
def test_attempts_text_counts_fetches_and_deaths_that_add_up(attempts, deaths):
    text = attempts_text(attempts, deaths)
    assert text.startswith(str(attempts))
    if "(" in text:
        m = re.fullmatch(r"(\d+) \((\d+) fetched, (\d+) holders? died\)", text)
        assert m is not None, text
        fetched, died = int(m[2]), int(m[3])
        assert fetched + died == attempts and died > 0


def test_the_queue_writes_the_deaths_into_the_dead_letter():
    body = json.loads(item_codec.encode_dead_letter("qn-1", "http://h/", "abandoned", 3, b"x", 9))
    assert body["holder_deaths"] == 3 and body["attempts"] == 3  # clamped to the attempts


def test_the_report_counts_retries_apart_from_redeliveries():
    recs = [{"url": "http://h/a", "status": 200, "attempt": 0, "error": None},
            {"url": "http://h/b", "status": 200, "attempt": 1, "holder_deaths": 1,
             "error": None},  # only its holder died: redelivered, not retried
            {"url": "http://h/c", "status": 200, "attempt": 2, "holder_deaths": 1,
             "error": None},  # one more fetch and one death
            {"url": "http://h/d", "status": 200, "attempt": 1, "holder_deaths": -7,
             "error": None}]  # forged: a plain retry
    s = summarize(recs)
    assert (s["retried"], s["redelivered"]) == (2, 2)
    assert "retried 2, redelivered 2 (a holder died)" in render_text(s)


def test_a_consumer_status_carries_its_redeliveries_decoded_as_untrusted():
    from zkcrawl.admin.cluster import _consumer

    stat = SimpleNamespace(ctime=1_000_000, mtime=1_000_000)
    for raw, want in ((4, 4), ("4", 0), (True, 0), (float("nan"), 0), (None, 0)):
        c = _consumer(1_000.0, "c", {"redelivered": raw}, stat, 0, "running")  # type: ignore[arg-type]
        assert c["redelivered"] == want, raw
