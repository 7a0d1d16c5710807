"""The producer on a listing of one's own machine (issue #26 review, gap 4), through the real
``zkcrawl-producer`` and a real HTTP server on 127.0.0.1, without
``--allow-private-addresses``: the ``listing.failed error=blocked-address`` line names the
flag, as the consumer's ``address.blocked`` warning does -- once per host, not per page."""

from __future__ import annotations

import json

from tests.httpd import TestServer, html
from tests.test_diag_producer import producer


def test_a_blocked_listing_names_the_flag_once_per_host(zk_hosts, zk_root):
    routes = {f"/list/{n}": html(f'<a href="/post/{n}">post</a>') for n in range(1, 4)}
    with TestServer(routes) as srv:
        template = srv.url("/list/{page}")
        rc, _, err = producer("--pages", template, "--page-range", "1-3", "--delay", "0",
                              "--no-robots", "--zk", zk_hosts, "--root", zk_root,
                              "--log-format", "console")
        assert not srv.requests, srv.requests  # nothing was sent to the refused address
        _, _, as_json = producer("--pages", template, "--page-range", "1-3", "--delay", "0",
                                 "--no-robots", "--dry-run", "--log-format", "json")
    assert rc == 1, err
    failed = [x for x in err.splitlines() if "listing.failed" in x]
    assert len(failed) == 3 and all("error=blocked-address" in x for x in failed), err
    assert "run the producer with --allow-private-addresses" in failed[0], failed[0]
    assert "--allow-private-addresses" not in "".join(failed[1:]), failed  # once per host
    events = [json.loads(x) for x in as_json.splitlines() if x.startswith("{")]
    notes = [e.get("note") for e in events if e["event"] == "listing.failed"]
    assert len(notes) == 3 and notes[1:] == [None, None], notes
    assert notes[0].startswith("the address guard refused this host's address (loopback,")
