"""Ephemeral status nodes: ``<root>/consumers/<id>`` and ``<root>/producers/<id>``.

A :class:`Registration` creates the node, refreshes its JSON every ``interval``
seconds from a callback, and re-creates it after a session loss. The node dies
with the session, so the registry lists exactly the live processes -- every
consumer reads ``<root>/consumers`` to share out the partitions (rendezvous
hashing over its members: :mod:`zkcrawl.consumer.ownership`), ``zkcrawl status``
shows the cluster from both lists.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from zkcrawl.errors import UsageError
from zkcrawl.logs import get_logger
from zkcrawl.zk import KazooException, NodeExistsError, NoNodeError, ZkClient

log = get_logger(__name__)


def default_id() -> str:
    import os

    return f"{socket.gethostname()}-{os.getpid()}"


class Registration:
    """Keep ``path`` (ephemeral) alive with the JSON ``status()`` returns."""

    def __init__(self, zk: ZkClient, path: str, status: Callable[[], dict[str, Any]],
                 interval: float = 2.0) -> None:
        self.zk = zk
        self.path = path
        self.status = status
        self.interval = interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        doc = {"host": socket.gethostname(), **self.status(), "heartbeat_at": time.time(),
               "heartbeat_interval_s": self.interval}  # `zkcrawl status` judges staleness
        return json.dumps(doc, separators=(",", ":"), default=str).encode()

    def start(self, wait_free: float = 0.0) -> Registration:
        """Create the node; an id held by another live session is a usage error."""
        self.zk.ensure_path(self.path.rsplit("/", 1)[0])
        deadline = time.monotonic() + wait_free
        while True:
            try:
                self.zk.create(self.path, self._body(), ephemeral=True)
                break
            except NodeExistsError:
                stat = self.zk.exists(self.path)
                if stat is not None and stat.ephemeralOwner == self.zk.session_id:
                    break
                if time.monotonic() >= deadline:
                    raise UsageError(f"{self.path} is held by another live process: "
                                     "choose another --id") from None
                time.sleep(0.2)  # its old session is expiring; bounded by wait_free
        self._thread = threading.Thread(target=self._loop, name="registry", daemon=True)
        self._thread.start()
        return self

    def refresh(self) -> None:
        """Publish now (state changes should be visible at once)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._publish()

    def _publish(self) -> None:
        if not self.zk.connected:
            # It could only wait in kazoo's queue for --zk-timeout (and hold up a stop); the
            # next tick after reconnecting publishes the state of then.
            log.debug("registry.skipped", path=self.path, error="disconnected")
            return
        try:
            self.zk.set(self.path, self._body())
        except NoNodeError:  # session was lost: the ephemeral died with it
            try:
                self.zk.create(self.path, self._body(), ephemeral=True)
                log.info("registry.re_registered", path=self.path)
            except KazooException as exc:
                log.warning("registry.failed", path=self.path, error=repr(exc))
        except KazooException as exc:
            log.debug("registry.skipped", path=self.path, error=repr(exc))

    def stop(self, delete: bool = True, wait: float = 5.0) -> None:
        """Stop publishing; ``wait``: how long to let a publish under way finish (it may sit
        in a ZooKeeper call for --zk-timeout; a forced stop does not wait for it)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            # Disconnected, a publish under way cannot finish: the node goes with the session.
            self._thread.join(wait if self.zk.connected else min(wait, 0.1))
        # The node is ephemeral: unreachable now, it goes with the session. Reachable, the
        # delete waits at most --zk-timeout (ZkClient's synchronous calls are bounded).
        if delete and self.zk.connected:
            try:
                self.zk.delete(self.path)
            except KazooException:
                pass
