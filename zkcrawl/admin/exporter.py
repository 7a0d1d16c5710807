"""Cluster metrics for Prometheus (``zkcrawl exporter``): what ``zkcrawl status`` shows, as
gauges. The metrics and their meaning: docs/operations/monitoring.md.

* **Scrapes cost ZooKeeper nothing**: the cluster is read with the function behind
  ``zkcrawl status --json`` (:func:`zkcrawl.admin.cluster.cluster_status`) and a scrape only
  formats the last read.
* **Reads are bounded**: one-shot watches on ``queue``, ``leases``, ``consumers``,
  ``producers``, ``dead`` and ``control`` mark the view stale; a stale view is re-read at
  most once per ``--min-interval``, and at least every ``--refresh`` (ages, published
  status, the partitions of :mod:`zkcrawl.admin.partition_status`).
* **ZooKeeper away**: the last figures stay, with ``zkcrawl_cluster_up 0``.
* **Untrusted labels** (SPEC §2): consumer ids -- those of owner nodes too -- are cleaned
  by :func:`label` (at most :data:`LABEL_LIMIT` characters) and per-consumer series capped at
  :data:`MAX_CONSUMER_SERIES` (the rest summed as ``consumer="_other"``). Per-partition
  series exist only for partitions that hold batches (or, the host figures, have some): at
  most P of each, P < :data:`~zkcrawl.queue.partitions.MAX_PARTITIONS` (partition labels are
  parsed numbers); an owner's label is one series per such partition, not per consumer.
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

from zkcrawl import logs
from zkcrawl.admin.cluster import cluster_status
from zkcrawl.consumer.metrics import standard_collectors
from zkcrawl.queue.layout import Layout
from zkcrawl.textsafe import printable
from zkcrawl.zk import ConnectionLoss, NoNodeError, WatchedEvent, ZkClient, gather

__all__ = ["LABEL_LIMIT", "MAX_CONSUMER_SERIES", "ClusterCollector", "ClusterView", "label"]

log = logs.get_logger("zkcrawl.exporter")

MIN_INTERVAL = 1.0  # seconds: a stale view is re-read at most this often
REFRESH = 15.0  # seconds: re-read at least this often (ages, published counters, partitions)
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
        self._partitions_read = 0.0  # monotonic time of the last read of the partitions
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
            due = self._partitions_due(trigger)
            doc = cluster_status(self.zk, self.root, partitions=due)
            if due:
                self._partitions_read = time.monotonic()
            else:  # the last partitions section, at most --refresh old
                doc["partitions"] = (self._doc or {}).get("partitions")
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

    def _partitions_due(self, trigger: str) -> bool:
        """The partitions are read on start, on the refresh, after a failed read and at
        least every ``refresh`` -- not on every watch (a busy ingress fires them every
        second; a partition read lists every partition and reads its batches)."""
        return (trigger != "watch" or self._doc is None or not self._up
                or time.monotonic() - self._partitions_read >= self.refresh)

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
    yield from _watch_families(doc["producers"], root)
    yield _gauge("zkcrawl_cluster_paused", "1 while the cluster is paused (zkcrawl pause)",
                 [([root], 1.0 if doc["control"] == "paused" else 0.0)])
    yield _gauge("zkcrawl_cluster_control_pending", "Live consumers that have not yet "
                 "acknowledged the control state", [([root], len(doc["control_pending"]))])
    yield from partition_families(doc.get("partitions"), root)


def partition_families(s: dict[str, Any] | None, root: str) -> Iterator[Metric]:
    """The partition gauges (hosts have owners): the families always, their samples
    only when ``<root>/partitions`` exists; per-partition series only for partitions that
    hold batches (no P idle series). Partition labels are decimal integers (parsed)."""
    def one(value: Any) -> list[tuple[list[str], float]]:
        return [] if s is None or value is None else [([root], float(value))]

    full = [] if s is None else [x for x in s["list"] if x["batches"]]
    yield _gauge("zkcrawl_partitions", "Partitions of the root (P, from the root's data)",
                 one(s and s["count"]))
    yield _gauge("zkcrawl_partitions_owned", "Partitions with an owner node",
                 one(s and s["owned"]))
    yield _gauge("zkcrawl_partitions_owner_unverified", "Owner nodes not held by the session "
                 "of the live consumer they name (forged, or a consumer coming or going)",
                 one(s and len(s["unverified"])))
    yield _gauge("zkcrawl_partitions_unowned_with_items", "Partitions that hold items and "
                 "have no owner node: nobody crawls them", one(s and s["unowned_with_items"]))
    yield _gauge("zkcrawl_partitions_unverified_with_items", "Partitions that hold items and "
                 "whose owner node is not held by the session of the live consumer it names "
                 "(forged, or a consumer coming or going): while it stays, nobody crawls them",
                 one(s and sum(1 for x in full if x["owner"] is not None
                               and not x["verified"])))
    yield _gauge("zkcrawl_partition_oldest_age_seconds", "Age of the oldest batch of any "
                 "partition (0 when none holds one)",
                 one(s and (s["oldest_age_s"] or 0.0)))
    yield _gauge("zkcrawl_partition_batches", "Batch nodes queued in a partition (partitions "
                 "that hold some)", [([root, str(x["partition"])], float(x["batches"]))
                                     for x in full], labels=("root", "partition"))
    yield _gauge("zkcrawl_partition_items", "Items not done in a partition's batches "
                 "(partitions that hold some; absent while items are not counted: over "
                 "the status's read cap)",
                 [([root, str(x["partition"])], float(x["depth"])) for x in full
                  if x["depth"] is not None], labels=("root", "partition"))
    yield _gauge("zkcrawl_partition_oldest_batch_age_seconds", "Age of a partition's "
                 "oldest batch: how long its oldest items have waited (partitions that hold "
                 "batches)", [([root, str(x["partition"])], float(x["oldest_age_s"]))
                              for x in full if x["oldest_age_s"] is not None],
                 labels=("root", "partition"))
    yield _gauge("zkcrawl_partition_owner", "1 per partition that holds batches, labelled "
                 "with the consumer its owner node names (\"\": no owner node, \"?\": a node "
                 f"that names none; cleaned, at most {LABEL_LIMIT} characters) and "
                 "verified=\"true\" when "
                 "the node is held by the session of that live consumer",
                 [([root, str(x["partition"]), "" if x["owner"] is None else label(x["owner"]),
                   "true" if x["owner"] is not None and x["verified"] else "false"], 1.0)
                  for x in full], labels=("root", "partition", "owner", "verified"))
    yield _gauge("zkcrawl_partitions_hosts_active", "Hosts with items not done in their "
                 "owners' memory, in all (as the verified owners publish them)",
                 one(s and s.get("hosts_active")))
    yield _gauge("zkcrawl_partitions_hosts_backed_off", "Hosts under a Retry-After or "
                 "down-host back-off that their partition's checkpoint keeps for a hand-over, "
                 "in all", one(s and s.get("hosts_backed_off")))
    for key, name, what in (
            ("hosts_active", "zkcrawl_partition_hosts_active", "Hosts with items not done in "
             "a partition's owner (partitions that have some)"),
            ("hosts_backed_off", "zkcrawl_partition_hosts_backed_off", "Hosts of a partition "
             "under a Retry-After or down-host back-off (partitions that have some)")):
        yield _gauge(name, what, [([root, str(x["partition"])], float(x[key]))
                                  for x in ([] if s is None else s["list"])
                                  if x.get(key)], labels=("root", "partition"))


def _watch_families(producers: list[dict[str, Any]], root: str) -> Iterator[Metric]:
    """The last pass of each watching producer (``--watch``), decoded from its untrusted
    status node by :func:`zkcrawl.producer.watch.last_pass`; at most MAX_CONSUMER_SERIES of them."""
    from zkcrawl.producer.watch import last_pass

    passes: dict[str, dict[str, Any]] = {}
    for p in producers:
        lp = last_pass(p)
        key = label(p.get("id"))
        if lp is not None and key not in passes and len(passes) < MAX_CONSUMER_SERIES:
            passes[key] = lp
    rows = sorted(passes.items())
    for suffix, field, doc in (
            ("timestamp_seconds", "started_at", "Unix time a watching producer's last pass "
             "started"),
            ("pages", "pages", "Listing pages a watching producer's last pass read"),
            ("new_urls", "new", "New URLs a watching producer's last pass offered")):
        yield _gauge(f"zkcrawl_cluster_producer_last_pass_{suffix}", doc,
                     [([root, name], float(lp[field])) for name, lp in rows],
                     labels=("root", "producer"))
    yield _gauge("zkcrawl_cluster_producer_watch_interval_seconds", "A watching producer's "
                 "--watch INTERVAL", [([root, name], lp["interval_s"]) for name, lp in rows],
                 labels=("root", "producer"))
    yield _held_back_family(producers, root)


def _held_back_family(producers: list[dict[str, Any]], root: str) -> Metric:
    """Items a producer offering into partitions holds back for full ones (its untrusted
    status node, decoded by :func:`zkcrawl.producer.summary.held_back_of`)."""
    from zkcrawl.producer.summary import held_back_of

    held: dict[str, float] = {}
    for p in producers:
        doc = held_back_of(p)
        key = label(p.get("id"))
        if doc is not None and key not in held and len(held) < MAX_CONSUMER_SERIES:
            held[key] = float(doc["items"])
    return _gauge("zkcrawl_cluster_producer_held_back_items", "Items a producer holds back "
                  "in memory for partitions without room (--max-partition-depth)",
                  [([root, name], n) for name, n in sorted(held.items())],
                  labels=("root", "producer"))


class ExporterMetrics:
    """The exporter's registry: the cluster collector and the standard collectors."""

    def __init__(self, view: ClusterView) -> None:
        self.registry = CollectorRegistry()
        standard_collectors(self.registry, "exporter")
        self.registry.register(ClusterCollector(view))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
