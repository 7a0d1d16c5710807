"""``<root>/discovered/`` (SPEC §2): the codec (property-based: hostile data never raises, what
is written reads back) and the writer/reader against a real ZooKeeper."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.admin.cluster import cluster_status
from zkcrawl.queue.discovered import (
    NODE_BYTES,
    DiscoveredReader,
    DiscoveredWriter,
    Link,
    decode,
    encode,
)
from zkcrawl.queue.untrusted import URL_LIMIT
from zkcrawl.zk.client import ZkClient

FAST = settings(max_examples=150, deadline=None)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=4),
    max_leaves=30)
entries = st.fixed_dictionaries({"url": st.text(max_size=40) | json_values,
                                 "from": st.text(max_size=40) | json_values,
                                 "depth": st.integers(-5, 10**7) | json_values}) | json_values
links = st.builds(Link, url=st.text(min_size=1, max_size=300), source=st.text(max_size=300),
                  depth=st.integers(0, 10**6))


@FAST
@given(st.binary(max_size=2048) | st.builds(lambda v: json.dumps(v).encode(), json_values))
def test_decode_never_raises_on_anything(data: bytes):
    got = decode(data)
    assert (got.error is None) or got.links == ()


@FAST
@given(st.lists(entries, max_size=12), json_values)
def test_bad_entries_are_dropped_and_counted_the_rest_kept(raw: list[Any], consumer: Any):
    data = json.dumps({"links": raw, "consumer": consumer}).encode()
    got = decode(data)
    assert got.error is None
    assert len(got.links) + got.dropped == len(raw)
    for link in got.links:
        assert isinstance(link.url, str) and link.url and 0 <= link.depth <= 10**6
        assert len(link.url.encode()) <= URL_LIMIT


@FAST
@given(st.lists(links, max_size=400), st.text(min_size=1, max_size=50))
def test_what_is_encoded_decodes_back_in_nodes_within_the_limit(ls: list[Link], consumer: str):
    nodes = encode(ls, consumer)
    back: list[Link] = []
    for data in nodes:
        assert len(data) <= NODE_BYTES
        got = decode(data)
        assert got.error is None and got.dropped == 0 and got.consumer == consumer
        back.extend(got.links)
    assert back == [link for link in ls if _encodable(link)]


def _encodable(link: Link) -> bool:
    try:
        link.url.encode("utf-8")
        link.source.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return len(link.url.encode()) <= URL_LIMIT


def test_malformed_nodes_have_a_reason():
    assert decode(b"\xff").error == "not UTF-8"
    assert decode(b"[1]").error == "not a JSON object (list)"
    assert decode(b'{"consumer": "c"}').error == "no 'links' list"
    assert decode(b'{"links": {}}').error == "no 'links' list"  # wrong type: dropped key
    assert decode(b"[" * 40 + b"]" * 40).error == "nested deeper than 32"
    assert decode(b" " * (NODE_BYTES + 1)).error is not None


def test_written_links_are_read_back_in_order_then_deleted(zk: ZkClient, zk_root: str):
    writer = DiscoveredWriter(zk, zk_root, "c1")
    big = [Link(f"http://h/p/{i}/" + "x" * 200, "http://h/", 1) for i in range(700)]
    assert writer.write(big) >= 3  # > 64 KiB: several nodes
    assert writer.write([Link("http://h/last", "http://h/a", 2)]) == 1
    zk.create(f"{zk_root}/discovered/dn-", b"\xff junk", sequence=True)  # hostile
    reader = DiscoveredReader(zk, zk_root)
    names = reader.names()
    assert cluster_status(zk, zk_root)["discovered"] == {"batches": len(names)}
    nodes = reader.read(names)
    good = [link for n in nodes for link in n.decoded.links]
    assert good == [*big, Link("http://h/last", "http://h/a", 2)]
    assert [n.decoded.error for n in nodes][-1] == "not UTF-8"
    assert all(n.decoded.consumer == "c1" for n in nodes[:-1])
    reader.delete(names)
    reader.delete(names)  # already gone: fine
    assert reader.names() == []
    assert cluster_status(zk, zk_root)["discovered"] == {"batches": 0}
    assert zk.get_children(f"{zk_root}/offers") == []  # no marker left
