"""``<root>/fetched/`` (SPEC §2, issue #23): the codec (property-based: hostile data never
raises, what is written reads back), the writer/reader against a real ZooKeeper, and the
consumer pipeline's re-crawl outcome (``changed``, the report) against a real HTTP server."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.httpd import TestServer
from tests.test_consumer_pipeline import claimed, make, run
from zkcrawl.consumer.pipeline import COMPLETE
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.fetched import (
    NODE_BYTES,
    Fetched,
    FetchedReader,
    FetchedWriter,
    decode,
    encode,
)
from zkcrawl.queue.untrusted import URL_LIMIT
from zkcrawl.web.validators import EARLIEST, content_signature
from zkcrawl.zk.client import ZkClient

FAST = settings(max_examples=80, deadline=None)
NOW = 1_796_000_000.0

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=4),
    max_leaves=30)
raw_entries = st.fixed_dictionaries({
    "url": st.text(max_size=40) | json_values, "status": st.integers(-5, 1000) | json_values,
    "changed": json_values, "etag": st.text(max_size=30) | json_values,
    "last_modified": st.text(max_size=40) | json_values,
    "signature": st.text(max_size=40) | json_values,
    "at": st.floats(allow_nan=False, allow_infinity=False) | json_values}) | json_values
outcomes = st.builds(
    Fetched, url=st.text(min_size=1, max_size=300).filter(lambda u: u.isprintable()),
    status=st.none() | st.integers(100, 599), changed=st.none() | st.booleans(),
    etag=st.none() | st.just('"abc"'), last_modified=st.none(),
    signature=st.none() | st.just("0" * 32), at=st.floats(EARLIEST, NOW))


@FAST
@given(st.binary(max_size=2048) | st.builds(lambda v: json.dumps(v).encode(), json_values))
def test_decode_never_raises_on_anything(data: bytes) -> None:
    got = decode(data, now=NOW)
    assert got.error is None or got.entries == ()


@FAST
@given(st.lists(raw_entries, max_size=12), json_values)
def test_bad_entries_dropped_and_counted_fields_cleaned(raw: list[Any], consumer: Any) -> None:
    got = decode(json.dumps({"fetched": raw, "consumer": consumer}).encode(), now=NOW)
    assert got.error is None and len(got.entries) + got.dropped == len(raw)
    for e in got.entries:
        assert e.url and len(e.url.encode()) <= URL_LIMIT
        assert e.status is None or 100 <= e.status <= 599
        assert e.changed in (None, True, False)
        assert EARLIEST <= e.at <= NOW + 86_400
        assert e.etag is None or all("!" <= ch <= "~" for ch in e.etag)


@FAST
@given(st.lists(outcomes, max_size=300), st.text(min_size=1, max_size=40))
def test_encoded_decodes_back_within_the_node_limit(es: list[Fetched], consumer: str) -> None:
    nodes = encode(es, consumer)
    back = []
    for data in nodes:
        assert len(data) <= NODE_BYTES
        got = decode(data, now=NOW)
        assert got.error is None and got.dropped == 0 and got.consumer == consumer
        back.extend(got.entries)
    assert [e.url for e in back] == [e.url for e in es]
    assert [(e.status, e.changed, e.etag, e.signature) for e in back] == [
        (e.status, e.changed, e.etag, e.signature) for e in es]


def test_oversized_and_forged_nodes_are_refused_with_a_reason() -> None:
    assert decode(b"x" * (NODE_BYTES + 1)).error
    assert decode(b'{"links": []}').error == "no 'fetched' list"
    forged = {"fetched": [{"url": "https://a/", "status": 200, "etag": '"a"\r\nSet-Cookie: x',
                           "last_modified": "Fri, 31 Dec 9999 23:59:59 GMT", "at": 1e300},
                          {"url": "https://b/", "status": True}], "consumer": 5}
    got = decode(json.dumps(forged).encode(), now=NOW)
    (e,) = got.entries
    assert got.dropped == 1 and got.consumer is None
    assert e.etag is None and e.at == NOW + 86_400
    assert e.last_modified == "Mon, 30 Nov 2026 00:53:20 GMT"  # clamped to now


def test_writer_and_reader_round_trip_in_zookeeper(zk: ZkClient, zk_root: str) -> None:
    writer = FetchedWriter(zk, zk_root, "c1")
    entries = [Fetched(f"https://h/{i}" + "x" * 200, 200, i % 2 == 0, None, None, None,
                       time.time()) for i in range(700)]  # ~170 KB: several nodes
    assert writer.report(entries) >= 3
    reader = FetchedReader(zk, zk_root)
    zk.create(f"{reader.path}/junk", b"ignored: not fn-")
    zk.create(f"{reader.path}/fn-", b"\xff\xfe not json", sequence=True)
    names = reader.names()
    nodes = reader.read(names)
    got = [e.url for n in nodes for e in n.decoded.entries]
    assert got == [e.url for e in entries]
    assert [n.decoded.error is not None for n in nodes][-1]  # the forged one, last
    reader.delete(names)
    assert reader.names() == []


BODY = b"<html><head><title>T</title></head><body>" + b"y" * 5000 + b"</body></html>"


def _etag_site(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
    if h.headers.get("If-None-Match") == '"e1"':
        return 304, {"ETag": '"e1"'}, b""
    return 200, {"ETag": '"e1"', "Content-Type": "text/html"}, BODY


def _item(url: str, recrawl: dict[str, Any] | None) -> Any:
    meta = {} if recrawl is None else {"recrawl": recrawl}
    return claimed(data=item_codec.Item(url=url, meta=meta).encode())


def test_pipeline_first_fetch_then_304_then_same_signature() -> None:
    routes = {"/e": _etag_site, "/n": (200, {"Content-Type": "text/html"}, BODY)}
    with TestServer(routes) as srv:
        p = make()
        plain = run(p, _item(srv.url("/e"), None))
        assert plain.fetched is None and "changed" not in plain.record
        first = run(p, _item(srv.url("/e"), {}))
        assert first.kind == COMPLETE and "changed" not in first.record  # SPEC §4: absent
        assert first.fetched is not None and first.fetched.etag == '"e1"'
        assert first.fetched.signature == content_signature(BODY) and first.fetched.changed is None
        again = run(p, _item(srv.url("/e"), {"etag": '"e1"', "signature": first.fetched.signature}))
        assert again.record["changed"] is False and again.record["bytes"] == 0
        assert again.record["status"] == 304 and again.error is None
        assert again.fetched is not None and again.fetched.changed is False
        assert again.fetched.signature == first.fetched.signature
        # A server that never answers 304: the signature tells.
        same = run(p, _item(srv.url("/n"), {"signature": content_signature(BODY)}))
        assert same.record["changed"] is False and same.record["bytes"] == len(BODY)
        other = run(p, _item(srv.url("/n"), {"signature": "0" * 32}))
        assert other.record["changed"] is True and other.fetched.changed is True
        gone = run(p, _item(srv.url("/missing"), {"signature": "0" * 32}))
        assert gone.fetched is not None and gone.fetched.status == 404
        assert gone.fetched.changed is None


def test_a_refused_report_is_a_warning_not_a_failure(zk: ZkClient, zk_hosts: str,
                                                     zk_root: str) -> None:
    """<root>/fetched made by another identity (READ for anyone): NoAuth for us."""
    from zkcrawl.zk.security import parse_auth

    zk.ensure_path(zk_root)
    owner = ZkClient(zk_hosts, zk_timeout=8, auth=parse_auth("digest:owner:owner-secret"))
    with owner.connect():
        owner.ensure_path(f"{zk_root}/fetched")
    writer = FetchedWriter(zk, zk_root, "c1")
    entry = Fetched("https://h/a", 200, None, None, None, None, time.time())
    assert writer.report([entry]) == 0  # no raise: the items complete all the same
    assert writer.refused == 1


def test_buffer_gathers_groups_into_few_nodes(zk: ZkClient, zk_root: str) -> None:
    from tests.conftest import wait_for
    from zkcrawl.queue.fetched import FLUSH_ENTRIES, FetchedBuffer

    buffer = FetchedBuffer(FetchedWriter(zk, zk_root, "c1"))
    reader = FetchedReader(zk, zk_root)
    groups = [[Fetched(f"https://h/{g}/{i}", 304, False, None, None, None, time.time())
               for i in range(30)] for g in range(20)]  # 600 reports in 20 groups
    for group in groups:
        buffer.add(group)
    wait_for(lambda: sum(len(n.decoded.entries) for n in reader.read(reader.names())) == 600,
             timeout=10, what="every report written")
    assert len(reader.names()) <= 600 // FLUSH_ENTRIES + 1  # not one node per group
    buffer.add(groups[0][:1])
    buffer.close()  # the shutdown flush: the last one goes out at once
    assert sum(len(n.decoded.entries) for n in reader.read(reader.names())) == 601
