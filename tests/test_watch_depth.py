"""``zkcrawl-producer --watch --watch-depth N``: a pass in which every listing page brings new
articles still reads N pages at most, and offers exactly the articles of those N pages. A real
producer process, a real HTTP site on 127.0.0.1 and a real ZooKeeper."""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import wait_for
from tests.httpd import TestServer
from tests.test_producer import queue_items
from tests.test_watch import PER_PAGE, Blog, events, passes, start_producer

DEPTH = 2
BURST = 4 * PER_PAGE  # published at once: listing pages 1..4 all new, page 5 the old ones


@pytest.mark.slow
def test_watch_depth_caps_a_walk_in_which_every_page_is_new(zk, zk_hosts, zk_root,
                                                            procs) -> None:
    with TestServer() as srv:
        blog = Blog(srv, articles=2)  # one listing page, no "next" link
        proc = start_producer(procs, zk_hosts, zk_root, srv.base_url,
                              "--watch", "1s", "--watch-depth", str(DEPTH))
        wait_for(lambda: passes(zk, zk_root, "w1") >= 2, 60, "the first pass and a quiet one")
        assert blog.reads(2) == 0 and len(queue_items(zk, zk_root)) == 2

        with blog.lock:  # all at once: a pass sees either none of them or all of them
            blog.articles[:0] = range(2 + BURST, 2, -1)
        newest = blog.articles[:DEPTH * PER_PAGE]
        wait_for(lambda: len(queue_items(zk, zk_root)) > 2, 30, "the new articles")
        found = passes(zk, zk_root, "w1")
        # two more passes: a walk that went on past the cap later would show by now
        wait_for(lambda: passes(zk, zk_root, "w1") >= found + 2, 30, "two passes after it")
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]

        # the site's own counts: pages 1..DEPTH read once by the pass, nothing beyond
        assert [blog.reads(p) for p in range(2, BURST // PER_PAGE + 2)] == \
            [1] * (DEPTH - 1) + [0] * (BURST // PER_PAGE + 1 - DEPTH)
    offered = {i["url"] for i in queue_items(zk, zk_root)}
    assert offered == {f"{srv.base_url}/post/{n}" for n in [*newest, 2, 1]}
    done = events(err, "watch.pass")
    assert done[0]["pages"] == 1 and done[0]["new"] == 2
    [burst] = [e for e in done[1:] if e["new"]]
    assert burst["pages"] == DEPTH and burst["new"] == DEPTH * PER_PAGE
    assert all(e["pages"] == 1 for e in done[1:] if e is not burst)
