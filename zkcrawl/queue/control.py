"""``<root>/control``: the cluster-wide run state, ``{"state": "running"|"paused"}``.

Writers (``zkcrawl pause`` / ``resume``) set it; every consumer keeps a data watch
on it (:meth:`ZkClient.watch_data`, kazoo's DataWatch: it re-arms itself and also fires on
create/delete). A missing
node means ``running``. A malformed one (untrusted data, SPEC §2: not JSON, nested too
deep, an unknown state...) is a warning, once per node version, and leaves the watcher
in its last good state (``running`` at start): a broken control node neither stops nor
resumes a crawl.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from enum import StrEnum

from zkcrawl.queue import untrusted
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import NodeExistsError, NoNodeError, Stat, ZkClient


class RunState(StrEnum):
    """The cluster-wide run state (a ``str``: equal to its value, JSON-serializable)."""

    RUNNING = "running"
    PAUSED = "paused"

    def __repr__(self) -> str:  # the plain string it replaced, e.g. in argparse's messages
        return repr(self.value)


RUNNING = RunState.RUNNING  # the names callers have always used
PAUSED = RunState.PAUSED
STATES = tuple(RunState)


def decode_state(data: bytes | None) -> tuple[RunState | None, str | None]:
    """``(state, None)``, or ``(None, reason)`` for malformed data; never raises."""
    doc, why = untrusted.load_object(data, {"state": str}, limit=4096)
    if doc is None:
        return None, why
    state = doc.get("state")
    if state not in STATES:
        return None, "no 'state' of running|paused"
    return RunState(state), None


def parse_state(data: bytes | None) -> RunState:
    """The state, ``running`` for malformed data (no warning: see :class:`ControlWatch`)."""
    return decode_state(data)[0] or RUNNING


def read_state(zk: ZkClient, root: str) -> RunState:
    """The state now; a missing or malformed node reads as ``running`` (and warns)."""
    path = Layout.of(root).control
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return RUNNING
    state, why = decode_state(data)
    if state is None:
        untrusted.MALFORMED.warn(path, untrusted.version_of(stat), why or "malformed")
        return RUNNING
    return state


def set_state(zk: ZkClient, root: str, state: str, by: str = "zkcrawl") -> None:
    """Write the cluster state (a :class:`RunState` or its value); returns once ZooKeeper
    has it."""
    if state not in STATES:
        raise ValueError(state)
    body = json.dumps({"state": state, "updated_at": round(time.time(), 3), "by": by}).encode()
    path = Layout.of(root).control
    try:
        zk.create(path, body, makepath=True)
    except NodeExistsError:
        zk.set(path, body)


class ControlWatch:
    """Tracks the control state; ``wait_running`` blocks while paused."""

    def __init__(self, zk: ZkClient, root: str,
                 on_change: Callable[[RunState], object] | None = None) -> None:
        self.state = RUNNING
        self._running = threading.Event()
        self._running.set()
        self._on_change = on_change
        self._path = Layout.of(root).control
        zk.ensure_path(root)
        zk.watch_data(self._path, self._changed)

    def _changed(self, data: bytes | None, stat: Stat | None, *_: object) -> None:
        # kazoo thread: set flags, never block
        state, why = (RUNNING, None) if stat is None else decode_state(data)  # no node: running
        if state is None:  # malformed: keep the last good state
            untrusted.MALFORMED.warn(self._path, untrusted.version_of(stat), why or "malformed")
            return
        self.state = state
        if self.state == PAUSED:
            self._running.clear()
        else:
            self._running.set()
        if self._on_change is not None:
            self._on_change(self.state)

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def wait_running(self, timeout: float | None) -> bool:
        return self._running.wait(timeout)
