"""``<root>/control``: the cluster-wide run state, ``{"state": "running"|"paused"}``.

Writers (``zkcrawl pause`` / ``resume``) set it; every consumer keeps a data watch
on it (kazoo's DataWatch re-arms itself and also fires on create/delete). A missing
or unreadable node means ``running``: a broken control node must not stop a crawl.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NodeExistsError
from kazoo.recipe.watchers import DataWatch

from zkcrawl.zk import ZkClient

RUNNING = "running"
PAUSED = "paused"
STATES = (RUNNING, PAUSED)


def parse_state(data: bytes | None) -> str:
    try:
        state = json.loads(data or b"{}").get("state")
    except (ValueError, AttributeError):
        return RUNNING
    return state if state in STATES else RUNNING


def read_state(zk: ZkClient, root: str) -> str:
    stat = zk.exists(f"{root}/control")
    return parse_state(zk.get(f"{root}/control")[0]) if stat else RUNNING


def set_state(zk: ZkClient, root: str, state: str, by: str = "zkcrawl") -> None:
    """Write the cluster state; returns once ZooKeeper has it."""
    if state not in STATES:
        raise ValueError(state)
    body = json.dumps({"state": state, "updated_at": round(time.time(), 3), "by": by}).encode()
    path = f"{root}/control"
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
        zk.ensure_path(root)
        DataWatch(zk.kazoo, f"{root}/control", self._changed)

    def _changed(self, data: bytes | None, _stat: Any, *_: Any) -> None:
        self.state = parse_state(data)  # kazoo thread: set flags, never block
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
