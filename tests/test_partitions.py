"""zkcrawl.queue.partitions: the host hash is stable, rendezvous assignment is sticky and
balanced, the root's data is decoded as untrusted input."""

from __future__ import annotations

import json
from statistics import mean

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.queue.partitions import (
    MAX_PARTITIONS,
    assign,
    decode_root,
    moved,
    owner_of,
    partition_of,
)

members_st = st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=12, unique=True)


def test_the_host_hash_is_the_documented_one_and_does_not_change():
    # BLAKE2b-64 of the host key, big-endian, mod P: pinned so that a change is a decision
    assert partition_of("example.com", 256) == 102
    assert partition_of("www.cnblogs.com", 256) == partition_of("www.cnblogs.com", 256)
    assert partition_of("example.com:8080", 4096) != partition_of("example.com", 4096)
    assert {partition_of(f"h{i}.example", 1) for i in range(50)} == {0}


@given(st.text(max_size=300), st.integers(1, MAX_PARTITIONS))
def test_every_host_lands_in_range(host, p):
    assert 0 <= partition_of(host, p) < p


@pytest.mark.parametrize("bad", [0, -1, MAX_PARTITIONS + 1])
def test_a_partition_count_out_of_range_is_refused(bad):
    with pytest.raises(ValueError):
        partition_of("h", bad)


@settings(max_examples=60, deadline=None)
@given(members_st, st.integers(1, 128))
def test_every_partition_has_exactly_one_owner_and_all_agree(members, p):
    a = assign(p, members)
    owned = sorted(x for ps in a.values() for x in ps)
    assert owned == list(range(p))
    assert assign(p, list(reversed(members))) == a  # order of the list does not matter
    assert all(owner_of(x, members) == m for m, ps in a.items() for x in ps)


@settings(max_examples=60, deadline=None)
@given(members_st, st.text(min_size=1, max_size=20), st.integers(1, 128))
def test_a_joining_member_takes_only_what_it_wins_and_leaving_gives_only_its_own(
        members, newcomer, p):
    if newcomer in members:
        return
    before = assign(p, members)
    after = assign(p, [*members, newcomer])
    assert moved(before, after) == len(after[newcomer])  # nothing else moved
    for m in members:
        assert set(after[m]) <= set(before[m])
    assert moved(after, before) == len(after[newcomer])  # and back when it leaves


def test_load_spreads_evenly_with_many_partitions_per_member():
    members = [f"host-{i}-{1000 + i}" for i in range(8)]
    a = assign(256, members)
    sizes = [len(ps) for ps in a.values()]
    assert min(sizes) >= 0.5 * mean(sizes) and max(sizes) <= 1.6 * mean(sizes)
    # a third consumer joining two moves about a third of the partitions
    two = assign(256, members[:2])
    three = assign(256, members[:3])
    assert 256 / 3 * 0.6 <= moved(two, three) <= 256 / 3 * 1.4


def test_no_members_own_nothing():
    assert assign(16, []) == {} and owner_of(3, []) is None


@pytest.mark.parametrize(("data", "want"), [
    (None, (None, None)), (b"", (None, None)), (b"{}", (None, None)),
    (b'{"partitions": 64}', (64, None)),
    (json.dumps({"partitions": MAX_PARTITIONS}).encode(), (MAX_PARTITIONS, None)),
])
def test_root_data_that_records_p_or_nothing(data, want):
    assert decode_root(data) == want


@pytest.mark.parametrize("data", [
    b'{"partitions": 0}', b'{"partitions": -5}', b'{"partitions": 1e3}',
    b'{"partitions": true}', b'{"partitions": "64"}', b'[64]', b"\xff\xfe",
    b'{"partitions": 99999999999999999999}', b'{"partitions": NaN}', b"x" * 100_000,
])
def test_root_data_not_to_be_trusted_is_a_reason(data):
    p, reason = decode_root(data)
    assert p is None and reason


@given(st.binary(max_size=2000))
def test_any_bytes_as_root_data_never_raise(data):
    p, reason = decode_root(data)
    assert p is None or (1 <= p <= MAX_PARTITIONS and reason is None)
