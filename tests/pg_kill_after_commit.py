"""``python -m tests.pg_kill_after_commit N CONSUMER-ARGS...``: a real consumer process that
SIGKILLs itself right after its Nth database commit, before that group is completed in
ZooKeeper -- the window the PostgreSQL sink's unique key is for, hit every time rather than
by the luck of an outside kill's timing."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from zkcrawl.consumer.main import run
from zkcrawl.consumer.sinks import Entry
from zkcrawl.consumer.sinks import postgres as sink_postgres

AFTER = int(sys.argv.pop(1))
_write_batch = sink_postgres.PostgresSink.write_batch
_commits = 0


def write_batch(self: sink_postgres.PostgresSink, entries: Sequence[Entry]) -> list[str | None]:
    global _commits
    result = _write_batch(self, entries)  # committed when it returns
    _commits += 1
    if _commits >= AFTER:
        os.kill(os.getpid(), signal.SIGKILL)
    return result


sink_postgres.PostgresSink.write_batch = write_batch  # type: ignore[method-assign]
run()
