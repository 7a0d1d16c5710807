"""zkcrawl.queue.batches.pack: every node within the limit, order kept, valid JSON whatever
the text (lone surrogates included), an entry too large alone reported and left out."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.queue.batches import pack

HOSTILE = st.text(st.one_of(st.characters(), st.characters(min_codepoint=0xD800,
                                                          max_codepoint=0xDFFF)), max_size=400)


@settings(max_examples=80, deadline=None)
@given(st.lists(HOSTILE, max_size=60), HOSTILE.map(lambda t: t[:40]),
       st.integers(300, 4000))
def test_nodes_hold_every_entry_in_order_within_the_limit(texts, consumer, limit):
    big: list[int] = []
    docs = [{"url": t, "i": i} for i, t in enumerate(texts)]
    nodes = pack(docs, "links", consumer, too_large=lambda d, n: big.append(d["i"]),
                 limit=limit)
    got = []
    for node in nodes:
        assert len(node) <= limit
        doc = json.loads(node.decode("utf-8"))  # valid UTF-8 JSON, surrogates escaped
        assert set(doc) == {"links", "consumer"} and doc["links"]
        got += [e["i"] for e in doc["links"]]
    assert got == [i for i in range(len(texts)) if i not in big]  # order kept, none lost


def test_an_entry_too_large_alone_is_reported_not_sent():
    seen: list[int] = []
    nodes = pack([{"url": "x" * 5000}, {"url": "ok"}], "fetched", "c",
                 too_large=lambda d, n: seen.append(n), limit=1000)
    assert len(seen) == 1 and seen[0] > 1000
    assert [json.loads(n)["fetched"] for n in nodes] == [[{"url": "ok"}]]


JSONABLE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | HOSTILE,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(HOSTILE, inner, max_size=4),
    max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(HOSTILE, JSONABLE, max_size=8))
def test_the_fast_entry_encoder_writes_what_jsonencoder_writes(doc):
    # the C encoder built once (issue #23's CPU work) must be byte for byte the same
    from zkcrawl.queue.batches import _ENCODER, _encode
    assert _encode(doc) == _ENCODER.encode(doc)
