"""``<root>/control``: the cluster-wide run state, ``{"state": "running"|"paused"}``.

Writers (``zkcrawl pause`` / ``resume``) set it; every consumer keeps a data watch
on it (kazoo's DataWatch re-arms itself and also fires on create/delete). A missing
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
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.recipe.watchers import DataWatch

from zkcrawl.queue import untrusted
from zkcrawl.queue.layout import Layout
from zkcrawl.zk.client import ZkClient

RUNNING = "running"
PAUSED = "paused"
STATES = (RUNNING, PAUSED)


def decode_state(data: bytes | None) -> tuple[str | None, str | None]:
    """``(state, None)``, or ``(None, reason)`` for malformed data; never raises."""
    doc, why = untrusted.load_object(data, {"state": str}, limit=4096)
    if doc is None:
        return None, why
    state = doc.get("state")
    if state not in STATES:
        return None, "no 'state' of running|paused"
    return state, None


def parse_state(data: bytes | None) -> str:
    """The state, ``running`` for malformed data (no warning: see :class:`ControlWatch`)."""
    return decode_state(data)[0] or RUNNING


def read_state(zk: ZkClient, root: str) -> str:
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
    """Write the cluster state; returns once ZooKeeper has it."""
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
                 on_change: Callable[[str], Any] | None = None) -> None:
        self.state = RUNNING
        self._running = threading.Event()
        self._running.set()
        self._on_change = on_change
        self._path = Layout.of(root).control
        zk.ensure_path(root)
        DataWatch(zk.kazoo, self._path, self._changed)

    def _changed(self, data: bytes | None, stat: Any, *_: Any) -> None:
        # kazoo thread: set flags, never block
        if stat is None:
            state: str | None = RUNNING  # no node: running
        else:
            state, why = decode_state(data)
            if state is None:  # keep the last good state
                untrusted.MALFORMED.warn(self._path, untrusted.version_of(stat),
                                         why or "malformed")
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
