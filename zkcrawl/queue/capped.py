"""A cap on what one ZooKeeper directory may hold, its nodes and their bytes (ZooKeeper keeps
every znode in memory): :class:`CappedDir`, the writers' side, for ``<root>/discovered/``
and ``<root>/fetched/``.

* **Limits** (:class:`DirLimits`): at most :attr:`DirLimits.node_cap` nodes of at most
  ``node_bytes`` each, hence at most ``max_bytes`` bytes.
* **Wait, bounded**: :meth:`CappedDir.room` answers at once while there is room; a full
  directory is waited on with a children watch, at most ``wait`` seconds, then refused
  (the caller records :data:`DIRECTORY_FULL`).
* **Slack**: writers may overshoot by what they let through but have not written yet.
* **The reader reports it**: :class:`DirBacklog`, one warning at most every
  :data:`BACKLOG_EVERY` seconds while the directory holds half its default cap.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from zkcrawl.logs import get_logger
from zkcrawl.zk import NoNodeError, WatchedEvent, ZkClient

__all__ = ["BACKLOG_EVERY", "DIRECTORY_FULL", "RECHECK", "CappedDir", "DirBacklog", "DirLimits"]

log = get_logger(__name__)

DIRECTORY_FULL = "directory-full"  # the reason a write did not happen
RECHECK = 1.0  # seconds a count far from the cap is trusted (plus what this writer added)
_FAR = 0.9  # "far from the cap": below this fraction of it
_STOP_S = 0.1  # how soon a waiting writer sees its stop event
BACKLOG_EVERY = 30.0  # seconds between two backlog reports of one reader


@dataclass(frozen=True)
class DirLimits:
    """At most ``max_nodes`` nodes and ``max_bytes`` bytes; ``node_bytes``: the most one
    node holds (the writer's own limit)."""

    max_nodes: int
    max_bytes: int
    node_bytes: int

    @property
    def node_cap(self) -> int:
        """The nodes allowed: both limits hold whatever each node holds."""
        return max(1, min(self.max_nodes, self.max_bytes // max(1, self.node_bytes)))


class CappedDir:
    """The writers' side of one capped directory (module docstring). Thread-safe."""

    def __init__(self, zk: ZkClient, path: str, limits: DirLimits, wait: float) -> None:
        self.zk = zk
        self.path = path
        self.limits = limits
        self.wait = wait
        self._lock = threading.Lock()
        self._count = 0
        self._read_at = -RECHECK  # never read yet
        self.full_waits = 0  # times a writer found it full (stats, tests)

    def held(self) -> tuple[int, int]:
        """(nodes now, the most bytes they may hold) -- read from ZooKeeper."""
        nodes = self._read()
        return nodes, nodes * self.limits.node_bytes

    def filling(self, fraction: float = 0.5) -> bool:
        """Whether the directory held ``fraction`` of its cap or more when last read (no
        ZooKeeper call: a writer that packs its nodes fuller then asks this)."""
        with self._lock:
            return self._count >= self.limits.node_cap * fraction

    def room(self, nodes: int, wait: float | None = None,
             stop: threading.Event | None = None) -> bool:
        """True when ``nodes`` more fit (counted as written: the next checks include them);
        False after waiting ``wait`` seconds (default: this directory's) for the reader to
        make room, or as soon as ``stop`` is set (a shutdown: within :data:`_STOP_S`)."""
        wait = self.wait if wait is None else wait
        cap = self.limits.node_cap
        with self._lock:
            fresh = time.monotonic() - self._read_at < RECHECK
            if fresh and self._count + nodes <= cap * _FAR:
                self._count += nodes
                return True
        deadline = time.monotonic() + wait
        count = self._read()
        if count + nodes > cap:
            self.full_waits += 1
            log.info("capped.full", path=self.path, nodes=count, cap=cap, waiting_s=wait)
        while count + nodes > cap and count > 0:  # an empty directory takes one write
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return False
            changed = threading.Event()

            def wake(_event: WatchedEvent, changed: threading.Event = changed) -> None:
                changed.set()  # kazoo's thread: set a flag, nothing else

            try:
                self.zk.get_children(self.path, watch=wake)
            except NoNodeError:
                return True  # removed meanwhile: the writer re-creates it, empty
            _wait(changed, min(left, 5.0), stop)
            count = self._read()
        with self._lock:
            self._count += nodes
        return True

    def _read(self) -> int:
        stat = self.zk.exists(self.path)
        count = int(stat.numChildren) if stat is not None else 0
        with self._lock:
            self._count, self._read_at = count, time.monotonic()
        return count


def _wait(changed: threading.Event, seconds: float, stop: threading.Event | None) -> None:
    """Until the watch fired, ``seconds`` passed, or ``stop`` was set (looked at every
    :data:`_STOP_S`: a watch has one waiter)."""
    if stop is None:
        changed.wait(seconds)
        return
    end = time.monotonic() + seconds
    while not changed.is_set() and not stop.is_set() and (left := end - time.monotonic()) > 0:
        changed.wait(min(left, _STOP_S))


class DirBacklog:
    """The reader's side of a capped directory: :meth:`seen` logs ``event`` (a warning,
    at most every ``every`` seconds) when the directory holds half of ``cap`` or more,
    with the node count, the most bytes they hold and ``note`` (what the writers do)."""

    def __init__(self, event: str, path: str, limits: DirLimits, note: str,
                 every: float = BACKLOG_EVERY) -> None:
        self.event, self.path, self.limits, self.note, self.every = (event, path, limits,
                                                                     note, every)
        self.cap = limits.node_cap
        self._reported = -every

    def seen(self, nodes: int) -> bool:
        """Report ``nodes`` if it is a backlog and none was reported lately; True if so."""
        now = time.monotonic()
        if nodes * 2 < self.cap or now - self._reported < self.every:
            return False
        self._reported = now
        log.warning(self.event, path=self.path, nodes=nodes,
                    bytes_at_most=nodes * self.limits.node_bytes, default_cap=self.cap,
                    note=self.note)
        return True
