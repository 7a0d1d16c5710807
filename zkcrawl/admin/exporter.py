"""Cluster metrics for Prometheus: what ``zkcrawl status`` shows, as gauges (``zkcrawl exporter``).

One exporter per cluster root. It reads the cluster with the very function behind
``zkcrawl status --json`` (:func:`zkcrawl.admin.cluster.cluster_status`) and keeps the last
document; a scrape only formats that document, so any number of Prometheus servers scraping
as often as they like cost ZooKeeper nothing.

**When it re-reads** -- watches, not a polling storm:

* a one-shot watch on the children of ``queue``, ``leases``, ``consumers``, ``producers``
  and ``dead``, and on the ``control`` node (re-armed before each read, so no change between
  two reads goes unseen): any offer, claim, completion, dead letter, consumer coming or
  going, pause or resume marks the view stale;
* a stale view is re-read at most once per ``--min-interval`` (default 1 s): a crawl
  completing hundreds of items a second fires watches all the time, and costs one read a
  second;
* and at least every ``--refresh`` (default 15 s) with no watch firing: the ages (oldest
  item, heartbeats), what consumers publish in their status nodes (refreshed by them every
  5 s) and the hosts' politeness slots change without a child being added or removed.

One read is what ``zkcrawl status`` costs: five child listings, the control node, one
pipelined read of the lease and status nodes, the head of the queue and the hosts' slots
(plus the five listings that arm the watches). While ZooKeeper is away the exporter keeps
serving the last figures with ``zkcrawl_cluster_up 0`` and the time of the last good read
(``zkcrawl_exporter_last_read_timestamp_seconds``), and re-reads when the session is back.

**Untrusted input** (SPEC §2): consumer ids become label values. prometheus-client escapes
them; :func:`label` drops control characters and cuts them at :data:`LABEL_LIMIT` characters,
and per-consumer series are capped at :data:`MAX_CONSUMER_SERIES` (the rest are summed under
``consumer="_other"``), so a client writing thousands of status nodes cannot blow up the
scrape.

The metrics (every cluster metric has a ``root`` label):

=============================================  ====================================================
``zkcrawl_cluster_up``                         1 when the last read succeeded
``zkcrawl_cluster_queue_depth``                items in the queue (leased or not)
``zkcrawl_cluster_queue_claimable``            items no consumer holds
``zkcrawl_cluster_queue_oldest_age_seconds``   age of the head of the queue (0 when empty)
``zkcrawl_cluster_leases{consumer}``           leases by holder (the lease node's ``consumer``)
``zkcrawl_cluster_dead_letters``               items in ``<root>/dead``
``zkcrawl_cluster_consumers``                  live consumers (their status nodes)
``zkcrawl_cluster_consumers_by_state{state}``  live consumers by published state
``zkcrawl_cluster_consumer_heartbeat_age_seconds{consumer}``  since each one's status write
``zkcrawl_cluster_consumer_items_per_second{consumer}``  as each one publishes it
``zkcrawl_cluster_producers``                  live producers
``zkcrawl_cluster_paused``                     1 while the control node says ``paused``
``zkcrawl_cluster_control_pending``            consumers not yet acknowledging the control state
``zkcrawl_cluster_hosts_tracked``              hosts with a politeness slot (cluster politeness)
``zkcrawl_cluster_hosts_held_back``            hosts whose next slot is > 5 s away (Retry-After)
``zkcrawl_exporter_reads_total``               re-reads of the cluster, by ``trigger``
``zkcrawl_exporter_read_errors_total``         re-reads that failed (ZooKeeper away)
``zkcrawl_exporter_read_seconds``              duration of the last read
``zkcrawl_exporter_last_read_timestamp_seconds``  time of the last good read
=============================================  ====================================================

plus ``process_*``, ``python_*`` and ``zkcrawl_build_info{component="exporter"}``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from consumer.metrics import standard_collectors
from zkcrawl import logs
from zkcrawl.admin.cluster import cluster_status
from zkcrawl.queue.layout import Layout
from zkcrawl.textsafe import printable
from zkcrawl.zk import ConnectionLoss, NoNodeError, WatchedEvent, ZkClient, gather

__all__ = ["LABEL_LIMIT", "MAX_CONSUMER_SERIES", "ClusterCollector", "ClusterView", "label"]

log = logs.get_logger("zkcrawl.exporter")

MIN_INTERVAL = 1.0  # seconds: a stale view is re-read at most this often
REFRESH = 15.0  # seconds: re-read at least this often (ages, published counters, hosts)
LABEL_LIMIT = 128  # characters of an untrusted label value
MAX_CONSUMER_SERIES = 500  # per-consumer series; the rest are summed under "_other"
OTHER = "_other"
_WATCHED = ("queue", "leases", "consumers", "producers", "dead")  # children watched


def label(value: Any) -> str:
    """A label value from an untrusted string: printable (control, format and bidi
    characters escaped or replaced), at most :data:`LABEL_LIMIT` characters."""
    text = printable(str(value)[:4 * LABEL_LIMIT])  # escapes lengthen it: cut after
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in text)[:LABEL_LIMIT]


def _number(value: Any) -> float:
    """A float from an untrusted status value (cluster.py passes on what consumers wrote)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)


class ClusterView:
    """The latest ``cluster_status`` document, re-read on watches (module docstring).

    :meth:`start` runs the reader thread; :meth:`snapshot` hands the last document (None
    before the first good read) with the read statistics. Thread-safe.
    """

    def __init__(self, zk: ZkClient, root: str, min_interval: float = MIN_INTERVAL,
                 refresh: float = REFRESH) -> None:
        self.zk = zk
        self.root = root
        self.min_interval = min_interval
        self.refresh = refresh
        self._layout = Layout.of(root)
        self._stale = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._doc: dict[str, Any] | None = None
        self._up = False
        self.reads: Counter[str] = Counter()  # by trigger: start, watch, refresh
        self.errors = 0
        self.read_seconds = 0.0
        self.last_read = 0.0  # wall clock of the last good read
        self._ticked = time.monotonic()  # the reader loop's last turn (liveness)
        self._thread = threading.Thread(target=self._run, name="exporter-reader", daemon=True)

    # -- the reader thread ----------------------------------------------------------------
    def start(self) -> ClusterView:
        self.zk.add_listener(self._state)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._stale.set()
        self.zk.remove_listener(self._state)
        if self._thread.is_alive():
            self._thread.join(self.zk.zk_timeout + 5)

    def _wake(self, _event: WatchedEvent) -> None:
        self._stale.set()  # kazoo's thread: set a flag, never block

    def _state(self, state: str) -> None:
        """kazoo's thread: any change of the connection makes the view stale (a reconnect
        is read at once; a disconnect shows as ``zkcrawl_cluster_up 0`` at once)."""
        self._stale.set()

    def _arm(self) -> None:
        """One-shot watches on the children that change with the crawl, and on control.
        A parent that does not exist yet gets an exists-watch (its creation wakes us)."""
        paths = [getattr(self._layout, name) for name in _WATCHED]
        # Bounded: a request queued while disconnected would wait for the reconnect.
        results = gather([self.zk.get_children_async(p, watch=self._wake) for p in paths],
                         timeout=self.zk.zk_timeout)
        for path, res in zip(paths, results, strict=True):
            if isinstance(res, NoNodeError):
                self.zk.exists(path, watch=self._wake)
            elif isinstance(res, Exception):
                raise res
        self.zk.exists(self._layout.control, watch=self._wake)  # data, creation, deletion

    def read_now(self, trigger: str) -> bool:
        """Arm the watches and read the cluster once; False (and the old document kept)
        when ZooKeeper fails us."""
        started = time.monotonic()
        try:
            if not self.zk.connected:  # a read now would only wait for the reconnect
                raise ConnectionLoss("not connected")
            self._arm()
            doc = cluster_status(self.zk, self.root)
        except Exception as exc:  # ZooKeeper errors, a timed-out wait
            # (not a KazooException), or a bug: the reader thread must outlive any of them,
            # or the metrics would freeze with nothing to say so but their age.
            with self._lock:
                self.errors += 1
                was_up, self._up = self._up, False
            if was_up or self.errors == 1:  # once per outage, not once per retry
                log.warning("exporter.read_failed", root=self.root, error=type(exc).__name__,
                            note="serving the last figures with zkcrawl_cluster_up 0")
            return False
        with self._lock:
            self._doc = doc
            if not self._up and self.errors:
                log.info("exporter.read_ok", root=self.root, errors=self.errors)
            self._up = True
            self.reads[trigger] += 1
            self.read_seconds = time.monotonic() - started
            self.last_read = float(doc["time"])
        return True

    def _run(self) -> None:
        trigger = "start"
        while not self._stop.is_set():
            self._ticked = time.monotonic()
            self._stale.clear()  # before the read: a change during it marks it stale again
            ok = self.read_now(trigger)
            # At most one read per min_interval (a busy crawl fires watches all the time)...
            if self._stop.wait(self.min_interval):
                return
            # ...then wait for a watch, at most `refresh` (or a retry after a failed read).
            woke = self._stale.wait(max(0.0, (self.refresh if ok else self.min_interval * 4)
                                        - self.min_interval))
            trigger = "watch" if woke else "refresh"

    # -- for the collector and the probes --------------------------------------------------
    def snapshot(self) -> tuple[dict[str, Any] | None, bool]:
        """(the last good document or None, whether the last read succeeded and the
        session is connected now)."""
        with self._lock:
            return self._doc, self._up and self.zk.connected

    def alive(self) -> tuple[bool, dict[str, Any]]:
        """``/livez``: the reader thread turns (at least every refresh, or a read's time)."""
        idle = time.monotonic() - self._ticked
        bound = self.refresh + self.min_interval + 2 * self.zk.zk_timeout + 10
        return self._thread.is_alive() and idle < bound, {"reader_idle_s": round(idle, 1)}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: connected to ZooKeeper and the last read succeeded."""
        doc, up = self.snapshot()
        ok = up and doc is not None and self.zk.connected
        return ok, {"zookeeper": self.zk.state, "reads": sum(self.reads.values()),
                    "root": self.root}


class ClusterCollector(Collector):
    """Formats the view's last document as metric families at scrape time."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterable[Metric]:
        doc, up = self.view.snapshot()
        root = self.view.root
        yield _gauge("zkcrawl_cluster_up", "1 when the last read of the cluster succeeded",
                     [([root], 1.0 if up else 0.0)])
        if doc is not None:
            yield from cluster_families(doc, root)
        view = self.view
        with view._lock:
            reads = dict(view.reads)
            errors, seconds, last = view.errors, view.read_seconds, view.last_read
        total = CounterMetricFamily("zkcrawl_exporter_reads", "Reads of the cluster by what "
                                    "triggered them (start, watch, refresh)",
                                    labels=["root", "trigger"])
        for trigger in ("start", "watch", "refresh"):
            total.add_metric([root, trigger], reads.get(trigger, 0))
        yield total
        failed = CounterMetricFamily("zkcrawl_exporter_read_errors", "Reads of the cluster "
                                     "that failed (ZooKeeper away)", labels=["root"])
        failed.add_metric([root], errors)
        yield failed
        yield _gauge("zkcrawl_exporter_read_seconds", "Duration of the last read",
                     [([root], seconds)])
        yield _gauge("zkcrawl_exporter_last_read_timestamp_seconds", "Unix time of the last "
                     "good read (its figures are what the cluster metrics show)",
                     [([root], last)])


def _gauge(name: str, doc: str, samples: Iterable[tuple[list[str], float]],
           labels: Iterable[str] = ("root",)) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _capped(pairs: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """Per-consumer samples with labels made safe, at most MAX_CONSUMER_SERIES of them
    (the rest summed under ``_other``); equal labels after cleaning are summed."""
    out: dict[str, float] = {}
    for name, value in pairs:
        key = label(name)
        if key not in out and len(out) >= MAX_CONSUMER_SERIES:
            key = OTHER
        out[key] = out.get(key, 0.0) + value
    return sorted(out.items())


def cluster_families(doc: dict[str, Any], root: str) -> Iterator[Metric]:
    """The cluster gauges of one ``cluster_status`` document (the module docstring's table)."""
    q = doc["queue"]
    yield _gauge("zkcrawl_cluster_queue_depth", "Items in the queue, leased or not",
                 [([root], q["depth"])])
    yield _gauge("zkcrawl_cluster_queue_claimable", "Items in the queue that no consumer "
                 "holds", [([root], q["claimable"])])
    yield _gauge("zkcrawl_cluster_queue_oldest_age_seconds", "Age of the oldest item in the "
                 "queue (0 when it is empty)", [([root], q["oldest_age_s"] or 0.0)])
    yield _gauge("zkcrawl_cluster_leases", "Leases (items in flight) by holder",
                 [([root, c], n) for c, n in _capped(
                     (c, float(n)) for c, n in doc["leases"]["by_consumer"].items())],
                 labels=("root", "consumer"))
    yield _gauge("zkcrawl_cluster_dead_letters", "Items in the dead letters",
                 [([root], doc["dead"]["count"])])
    consumers = doc["consumers"]
    yield _gauge("zkcrawl_cluster_consumers", "Live consumers (status nodes)",
                 [([root], len(consumers))])
    states = Counter(label(c["state"]) for c in consumers)
    yield _gauge("zkcrawl_cluster_consumers_by_state", "Live consumers by the state they "
                 "publish (running, idle, paused, draining...)",
                 [([root, s], n) for s, n in sorted(states.items())[:MAX_CONSUMER_SERIES]],
                 labels=("root", "state"))
    yield _gauge("zkcrawl_cluster_consumer_heartbeat_age_seconds", "Seconds since each "
                 "consumer last wrote its status node",
                 [([root, c], v) for c, v in _capped(
                     (c["id"], _number(c["heartbeat_age_s"])) for c in consumers)],
                 labels=("root", "consumer"))
    yield _gauge("zkcrawl_cluster_consumer_items_per_second", "Throughput each consumer "
                 "publishes in its status node",
                 [([root, c], v) for c, v in _capped(
                     (c["id"], _number(c["items_per_s"])) for c in consumers)],
                 labels=("root", "consumer"))
    yield _gauge("zkcrawl_cluster_producers", "Live producers (status nodes)",
                 [([root], len(doc["producers"]))])
    yield _gauge("zkcrawl_cluster_paused", "1 while the cluster is paused (zkcrawl pause)",
                 [([root], 1.0 if doc["control"] == "paused" else 0.0)])
    yield _gauge("zkcrawl_cluster_control_pending", "Live consumers that have not yet "
                 "acknowledged the control state", [([root], len(doc["control_pending"]))])
    hosts = doc["hosts"]
    yield _gauge("zkcrawl_cluster_hosts_tracked", "Hosts with a cluster politeness slot",
                 [([root], hosts["tracked"])])
    yield _gauge("zkcrawl_cluster_hosts_held_back", "Hosts whose next request slot is more "
                 "than 5 s away (Retry-After, a retry's cool-down, a large Crawl-delay)",
                 [([root], hosts["held_back"])])


class ExporterMetrics:
    """The exporter's registry: the cluster collector and the standard collectors."""

    def __init__(self, view: ClusterView) -> None:
        self.registry = CollectorRegistry()
        standard_collectors(self.registry, "exporter")
        self.registry.register(ClusterCollector(view))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
