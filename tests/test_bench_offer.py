"""``zkcrawl bench offer`` smoke runs at small N: the shape of the result, never timings."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from tests.test_producer import forget_cached_loggers
from zkcrawl import logs
from zkcrawl.bench import offer


@pytest.fixture(autouse=True)
def _logging_to_this_tests_stderr() -> Iterator[None]:
    # The bench keeps the logging set up by its caller (here: an earlier test's stream).
    logs.configure("json", "warning", stream=sys.stderr)
    forget_cached_loggers()
    yield
    forget_cached_loggers()


def _check_shape(out: dict, n: int) -> None:
    doc = json.loads(json.dumps(out))  # JSON-serialisable as the CLI prints it
    for case in ("seed_offer", "producer"):
        assert isinstance(doc[case]["urls_per_s"], float) and doc[case]["urls_per_s"] > 0
    assert isinstance(doc["seen_bytes_per_url"], float) and doc["seen_bytes_per_url"] > 0
    prod = doc["producer"]
    assert prod["offered"] == n  # every generated URL survives normalization
    assert prod["exit_status"] == 0 and prod["partitions"] == 256
    assert prod["nodes"] < n / 2  # batches


def test_bench_offer_against_given_zookeeper(zk, zk_hosts, capsys):
    before = set(zk.get_children("/"))
    assert offer.main(["--zk", zk_hosts, "--items", "400", "--seen-n", "5000", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1  # one JSON object, nothing else on stdout
    out = json.loads(lines[0])
    _check_shape(out, 400)
    assert out["seed_offer"]["sample"] == 400
    assert out["seen"]["urls"] == 5000
    assert set(zk.get_children("/")) == before  # its root was removed


def test_bench_offer_with_a_throwaway_local_zookeeper():
    out = offer.run_bench(None, 300, True, seed_sample=100, seen_n=2000)
    _check_shape(out, 300)
    assert out["zk"] == "throwaway local"
    table = offer.render(out)
    assert "seed_offer" in table and "producer" in table and "B/URL" in table


def test_generated_urls_are_distinct_after_normalization(tmp_path):
    from zkcrawl.web.urls import normalize_url

    path = tmp_path / "u.txt"
    offer.write_urls(path, 600)
    lines = path.read_text().splitlines()
    normalized = {normalize_url(u, strip_params=("utm_*",)) for u in lines}
    assert len(lines) == 600 and len(normalized) == 600 and None not in normalized
