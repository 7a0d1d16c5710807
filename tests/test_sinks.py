"""The sink seam (consumer/sinks/): ``--out`` picks the implementation, and the JSON Lines
sink's one-owner rule holds at shutdown: a group written after ``close`` (a committer that
outlived its bounded join) is a SinkError, never an exception of another kind."""

from __future__ import annotations

import pytest

from zkcrawl.consumer.sinks import Entry, JsonLinesSink, open_sink
from zkcrawl.errors import SinkError


def test_out_picks_the_sink(tmp_path):
    sink = open_sink(str(tmp_path / "o.jsonl"), "/r")
    try:
        assert isinstance(sink, JsonLinesSink) and sink.describe.endswith("o.jsonl")
    finally:
        sink.close()


@pytest.mark.parametrize("out", ["file", "-"])
def test_a_group_after_close_is_a_sink_error_and_writes_nothing(tmp_path, capfdbinary, out):
    path = tmp_path / "o.jsonl"
    sink = JsonLinesSink(str(path) if out == "file" else "-")
    assert sink.write_batch([Entry("qn-1", 1, {"url": "u1"})]) == [None]
    sink.close()
    with pytest.raises(SinkError, match="closed"):
        sink.write_batch([Entry("qn-2", 2, {"url": "u2"})])
    written = path.read_bytes() if out == "file" else capfdbinary.readouterr().out
    assert written == b'{"url":"u1"}\n'
