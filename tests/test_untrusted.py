"""The untrusted-data decoders (SPEC §2): arbitrary bytes and arbitrary JSON in every node
zkcrawl reads give a result or a reason, never an exception."""

from __future__ import annotations

import json
import math
import threading
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.admin import cluster as admin
from zkcrawl.queue import control, untrusted
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.items import Item

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=4),
    max_leaves=30)
STAT = SimpleNamespace(ctime=1_700_000_000_000, mtime=1_700_000_000_000, mzxid=7, version=0)
FAST = settings(max_examples=300, deadline=None)


def nested(depth: int, key: str = "url") -> bytes:
    return (f'{{"{key}":' + "[" * depth + "]" * depth + "}").encode()


def as_bytes(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


def test_deep_nesting_is_a_reason_not_a_recursion_error():
    for depth in (33, 6000, 100_000):
        doc, why = untrusted.load_json(nested(depth), limit=1 << 20)
        assert doc is None and why and "nested" in why
    doc, why = untrusted.load_json(nested(31))
    assert why is None and isinstance(doc["url"], list)


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"url": "[" * 500 + "{" * 500})
    assert untrusted.load_json(text.encode())[0] == json.loads(text)


def test_an_unterminated_string_full_of_escaped_quotes_is_rejected_fast():
    doc, why = untrusted.load_json(b'"' + b'\\"' * 30_000 + b"[" * 40)
    assert doc is None and why


def test_non_json_numbers_and_limits():
    assert untrusted.load_json(b"NaN")[0] is None
    assert untrusted.load_json(b"[1e999]")[0] is None
    assert untrusted.load_json(b"1" * 5000)[0] is None
    assert untrusted.load_json(b"\xff\xfe")[1] == "not UTF-8"
    assert "too large" in (untrusted.load_json(b" " * 70_000)[1] or "")
    assert untrusted.load_json(b"")[1] == "empty"


@FAST
@given(st.binary(max_size=2048))
def test_load_json_never_raises_on_bytes(data):
    doc, why = untrusted.load_json(data)
    assert (why is None) or doc is None


@FAST
@given(json_values)
def test_load_json_round_trips_what_json_accepts(value):
    doc, why = untrusted.load_json(as_bytes(value), limit=1 << 20)
    if why is None:
        assert json.dumps(doc, allow_nan=False) is not None  # finite, JSON again


@FAST
@given(st.binary(max_size=2048) | json_values.map(as_bytes))
def test_item_decode_never_raises_and_never_yields_an_unencodable_item(data):
    dec = item_codec.decode(data)
    assert (dec.item is None) != (dec.error is None)
    if dec.item is not None:
        assert len(dec.item.encode()) > 0  # valid Unicode, encodable again
        assert len(dec.item.url.encode("utf-8")) <= untrusted.URL_LIMIT
    else:
        assert dec.error.startswith("malformed")


@FAST
@given(st.text(), st.integers(), json_values)
def test_item_decode_of_json_items_with_hostile_fields(url, attempt, meta):
    data = as_bytes({"url": url, "attempt": attempt, "meta": meta, "enqueued_at": attempt})
    dec = item_codec.decode(data)
    if dec.item is not None:
        assert 0 <= dec.item.attempt <= item_codec.MAX_ATTEMPT
        assert isinstance(dec.item.meta, dict)


def test_hostile_items_of_the_issue():
    cases = {
        "nested url": nested(6000),
        "nested meta": b'{"url":"http://a.example/","meta":' + b"[" * 6000 + b"]" * 6000 + b"}",
        "url not a string": b'{"url": 42}',
        "invalid utf-8": b'{"url":"http://a.example/\xff"}',
        "empty": b"",
        "lone surrogate": b'{"url":"http://a.example/\\ud800"}',
        "too large": b'{"url":"http://a.example/","meta":{"x":"' + b"a" * 70_000 + b'"}}',
        "long url": b'{"url":"http://a.example/' + b"a" * 9000 + b'"}',
    }
    for what, data in cases.items():
        dec = item_codec.decode(data)
        assert dec.item is None and dec.error.startswith("malformed"), what
    huge = item_codec.decode(b'{"url":"http://a.example/","attempt":' + str(10**25).encode() + b"}")
    assert huge.item is not None and huge.item.attempt == item_codec.MAX_ATTEMPT
    js = item_codec.decode(b'{"url":"javascript:alert(1)"}')
    assert js.item is not None  # decodes; the fetcher refuses the scheme (a record, not a crash)


def test_a_bare_url_item_still_decodes_curator_interop():
    dec = item_codec.decode(b"  https://example.org/a?b=1 \n")
    assert dec.bare and dec.item.url == "https://example.org/a?b=1"


@FAST
@given(st.text(max_size=300), st.text(max_size=300), st.binary(max_size=5000))
def test_dead_letter_is_valid_bounded_json(url, error, data):
    body = item_codec.encode_dead_letter("qn-0000000001", url, error, 3, data)
    doc = json.loads(body.decode("utf-8"))
    assert len(doc["error"]) <= item_codec.ERROR_LIMIT
    assert len(doc["data"]) <= item_codec.DEAD_DATA_LIMIT


@FAST
@given(st.binary(max_size=512) | json_values.map(as_bytes))
def test_control_decoding_never_raises(data):
    state, why = control.decode_state(data)
    assert (state in control.STATES) != (why is not None)


def test_control_watch_keeps_its_last_good_state_on_garbage():
    class Unwatched(control.ControlWatch):  # the watch callback alone, no ZooKeeper
        def __init__(self) -> None:
            self.state, self._on_change, self._path = control.RUNNING, None, "/t/control"
            self._running = threading.Event()
            self._running.set()

    watch = Unwatched()
    watch._changed(b'{"state":"paused"}', SimpleNamespace(mzxid=1))
    assert watch.paused
    watch._changed(nested(6000, "state"), SimpleNamespace(mzxid=2))
    assert watch.paused and watch.state == control.PAUSED  # the last good state
    watch._changed(None, None)  # deleted: running
    assert not watch.paused


def test_malformed_log_warns_once_per_version():
    log = untrusted.MalformedLog()
    assert log.warn("/x", 1, "bad") and not log.warn("/x", 1, "bad")
    assert log.warn("/x", 2, "bad")


@FAST
@given(st.binary(max_size=2048) | json_values.map(as_bytes))
def test_dead_letter_reading_never_raises(data):
    letter = admin._decode_dead("dl-0000000001", data, STAT)
    assert letter.id == "dl-0000000001"
    assert math.isfinite(letter.dead_at)


@FAST
@given(json_values)
def test_status_numbers_are_finite_or_default(value):
    got = admin._num({"k": value}, "k", None)
    assert got is None or math.isfinite(got)
    assert math.isfinite(admin._age(1e9, {"heartbeat_at": value}, STAT))


def test_requeue_refuses_a_dead_letter_whose_url_is_not_an_item():
    ok = admin.DeadLetter("dl-1", "qn-1", "http://a.example/x", "http-503", 3, 0.0, None)
    bad = admin.DeadLetter("dl-2", "qn-2", "http://a.example/\ud800", "x", 3, 0.0, None)
    assert admin._requeue_body(admin.requeue_item(ok))[0] is not None
    body, why = admin._requeue_body(admin.requeue_item(bad))
    assert body is None and "purge" in why


def test_items_too_large_are_refused_by_offers_not_sent(zk, zk_root):
    from zkcrawl.queue.ingress import IngressQueue, ItemRefused

    q = IngressQueue(zk, zk_root)
    big = Item(url="http://a.example/", meta={"pad": "x" * 70_000})
    names = q.offer_many([Item(url="http://a.example/1"), big, Item(url="http://a.example/2")])
    assert len(names) == 2 and q.refused == 1
    try:
        q.offer("http://a.example/", meta={"pad": "x" * 70_000})
    except ItemRefused as exc:
        assert "larger than" in str(exc)
    else:
        raise AssertionError("a 70 KB item was offered")


def _too_deep_by_tokens(text: str, limit: int = untrusted.MAX_DEPTH) -> bool:
    """The nesting scan token by token (the reference :func:`untrusted.too_deep` matches)."""
    import re

    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for match in re.finditer(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]|"', text, re.DOTALL):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return True
        elif token in "]}":
            depth -= 1
        elif token == '"':
            return True
    return False


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet='[]{}"\\ab:,\n', max_size=120), st.integers(0, 6))
def test_the_nesting_scan_agrees_with_the_token_scan(text, limit):
    assert untrusted.too_deep(text, limit) == _too_deep_by_tokens(text, limit)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.text(alphabet='[]{}"\\x', max_size=6),
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.text(alphabet='{"\\]', max_size=3), kids, max_size=3),
                    max_leaves=40), st.integers(0, 8))
def test_the_nesting_scan_agrees_on_json_with_brackets_in_strings(value, limit):
    text = json.dumps(value)
    for cut in (text, text[:-1], text[: len(text) // 2]):
        assert untrusted.too_deep(cut, limit) == _too_deep_by_tokens(cut, limit)
