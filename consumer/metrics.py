"""Prometheus metrics and health endpoints for one consumer (``--metrics-port``); the metrics:
docs/operations/monitoring.md.

* ``GET /metrics``: the registry (per consumer instance, with the standard collectors);
  items counted by ``outcome`` and a bounded ``reason`` (:func:`reason_label`).
* ``GET /livez``: 200 while the claim loop ticks and the committer runs -- **never depends on
  ZooKeeper** (this is the probe that may restart the process).
* ``GET /readyz`` (``/healthz`` an alias): 200 while connected and running *or paused*, 503
  with the reason otherwise; anything else 404 (prometheus-client's own server would answer
  200 on every path).
* Served by :mod:`zkcrawl.httpserve` on one thread: a deadline per connection and at most
  ``MAX_OPEN`` connections, so trickling clients cannot starve a probe.
"""

from __future__ import annotations

import json
import platform
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from zkcrawl.errors import UsageError
from zkcrawl.httpserve import Answer, EventServer
from zkcrawl.settings import version

# Seconds; fetches of a latency-bound site sit around 0.05-2 s, dispatch well under 10 ms.
FETCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DISPATCH_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
# Time in the ZooKeeper queue: seconds on a drained cluster, hours on a backed-up one.
QUEUE_BUCKETS = (0.1, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
ZK_STATES = ("CONNECTED", "SUSPENDED", "LOST")
OUTCOMES = ("ok", "skipped", "failed", "retry", "dead")  # the ``outcome`` label's values
MAX_REASONS = 64  # distinct ``reason`` values per consumer; later new ones count as "other"
OTHER = "other"
_REASON = re.compile(r"[a-z][a-z0-9.-]{0,39}")  # http-404, timeout, too-large, blocked-address


def reason_label(error: str | None, known: set[str]) -> str:
    """The ``reason`` label for an item's error: ``""`` for none, the error itself when it
    has the shape of our short reasons (lower-case words and digits joined by ``-``, at
    most 40 characters) and fewer than :data:`MAX_REASONS` are known, else ``other``.
    ``known`` is the caller's set of reasons seen so far (updated here)."""
    if error is None or error == "":
        return ""
    if not _REASON.fullmatch(error):
        return OTHER
    if error not in known:
        if len(known) >= MAX_REASONS:
            return OTHER
        known.add(error)
    return error


def outcome_label(kind: str, error: str | None, skipped: bool = False) -> str:
    """One of :data:`OUTCOMES` from an outcome kind (complete, retry, dead), its error and
    whether its processor skipped the record: a completed item with an error is a permanent
    failure, recorded."""
    if kind in ("retry", "dead"):
        return kind
    if error:
        return "failed"
    return "skipped" if skipped else "ok"


def standard_collectors(registry: CollectorRegistry, component: str) -> None:
    """The collectors every zkcrawl metrics endpoint serves: the process (CPU, memory, open
    files, start time), the platform (``python_info``), the garbage collector, and
    ``zkcrawl_build_info{version, python, component}`` (always 1)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = Gauge("zkcrawl_build_info", "zkcrawl version, Python version and component "
                 "(always 1)", ["version", "python", "component"], registry=registry)
    info.labels(version=version(), python=platform.python_version(),
                component=component).set(1)


class Exposition(Protocol):
    """What :class:`MetricsServer` serves on ``/metrics``."""

    def exposition(self) -> bytes: ...

#: A probe: ``(ok, detail)``; ``detail`` goes into the JSON body.
Health = Callable[[], tuple[bool, dict[str, Any]]]



def alive_starting() -> tuple[bool, dict[str, Any]]:
    """``/livez`` before the consumer exists (connecting to ZooKeeper): alive."""
    return True, {"state": "starting"}


def unready_starting() -> tuple[bool, dict[str, Any]]:
    """``/readyz`` before the consumer exists (connecting to ZooKeeper): not ready."""
    return False, {"state": "starting"}


class _OwnershipFigures:
    """``zkcrawl_consumer_partitions_owned``, ``zkcrawl_consumer_members_seen``,
    ``zkcrawl_consumer_handovers_total``, ``_rebalances_total``, ``_partitions_taken_total``,
    ``_holds_inherited_total``, ``_states_ignored_total``, ``zkcrawl_consumer_hosts_active``
    and ``_hosts_backed_off`` (hosts have owners, :mod:`zkcrawl.consumer.ownership`), read at
    scrape time; nothing before :meth:`Metrics.count_ownership`."""

    def __init__(self) -> None:
        self.snapshot: Callable[[], Mapping[str, int]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self.snapshot is None:
            return
        snap = self.snapshot()
        yield GaugeMetricFamily("zkcrawl_consumer_partitions_owned", "Partitions (and so "
                                "hosts) this consumer owns now", value=snap.get("partitions", 0))
        yield GaugeMetricFamily("zkcrawl_consumer_members_seen", "Live consumers in the "
                                "member list the ownership was computed from",
                                value=snap.get("members", 0))
        yield CounterMetricFamily("zkcrawl_consumer_handovers", "Partitions gained or lost "
                                  "after the first assignment (a consumer joined or left)",
                                  value=snap.get("handovers", 0))
        for name, key, what in (
                ("rebalances", "rebalances", "Changes of the owned partitions after the "
                 "first assignment"),
                ("partitions_taken", "partitions_taken", "Owner nodes taken (a hand-over "
                 "done here)"),
                ("holds_inherited", "holds_inherited", "Hosts held on a take by the back-off "
                 "their previous owner checkpointed"),
                ("states_ignored", "states_ignored", "Takes whose partition host state did "
                 "not decode (ignored, with a warning)")):
            yield CounterMetricFamily(f"zkcrawl_consumer_{name}", what,
                                      value=snap.get(key, 0))
        yield GaugeMetricFamily("zkcrawl_consumer_hosts_active", "Hosts with items not done "
                                "in this consumer's partitions", value=snap.get("hosts_active", 0))
        yield GaugeMetricFamily("zkcrawl_consumer_hosts_backed_off", "Hosts of this "
                                "consumer's partitions under a Retry-After or down-host "
                                "back-off (kept for a hand-over)",
                                value=snap.get("hosts_backed_off", 0))


class _Observer:
    """``Histogram.observe`` of one unlabelled histogram, per item at a fraction of its cost:
    a bisect into the histogram's own bucket values (so ``/metrics`` shows the same) instead
    of its checks and Python loop over every bucket. Falls back to ``observe`` for a NaN and
    when the client library keeps its buckets differently."""

    __slots__ = ("_bounds", "_buckets", "_hist", "_sum")

    def __init__(self, hist: Histogram) -> None:
        self._hist = hist
        bounds = getattr(hist, "_upper_bounds", None)
        buckets = getattr(hist, "_buckets", None)
        total = getattr(hist, "_sum", None)
        usable = (isinstance(bounds, list | tuple) and isinstance(buckets, list)
                  and len(bounds) == len(buckets) and hasattr(total, "inc")
                  and all(hasattr(b, "inc") for b in buckets))
        self._bounds: tuple[float, ...] = tuple(bounds) if usable else ()  # type: ignore[arg-type]
        self._buckets: list[Any] | None = buckets if usable else None
        self._sum: Any = total

    def __call__(self, amount: float) -> None:
        buckets = self._buckets
        if buckets is None or amount != amount:  # NaN: the library's own way
            self._hist.observe(amount)
            return
        self._sum.inc(amount)
        i = bisect_left(self._bounds, amount)  # the first bound >= amount: its bucket
        if i < len(buckets):
            buckets[i].inc(1)


class Metrics:
    """The consumer's instruments in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        standard_collectors(r, "consumer")
        self.items = Counter("zkcrawl_consumer_items", "Items by outcome (ok, skipped, failed: "
                             "permanent and recorded, retry, dead) and reason (the error, "
                             "empty for ok)", ["outcome", "reason"], registry=r)
        self.queue = Histogram("zkcrawl_consumer_queue_seconds", "From the offer (the item "
                               "znode's creation) to the claim", buckets=QUEUE_BUCKETS,
                               registry=r)
        self.process = Histogram("zkcrawl_consumer_process_seconds", "Fetch + parse + write "
                                 "time of one item", buckets=FETCH_BUCKETS, registry=r)
        self.dispatch = Histogram("zkcrawl_consumer_dispatch_seconds", "From the take from "
                                  "ZooKeeper until handed to the pool",
                                  buckets=DISPATCH_BUCKETS, registry=r)
        self.wait = Histogram("zkcrawl_consumer_wait_seconds", "Time in the capped queue "
                              "(and politeness cool-down)", buckets=FETCH_BUCKETS, registry=r)
        self.in_flight = Gauge("zkcrawl_consumer_in_flight", "Items being processed by a "
                               "worker thread", registry=r)
        self.backlog = Gauge("zkcrawl_consumer_backlog", "Items waiting for a worker thread "
                             "or for their host's turn", registry=r)
        self.leases = Gauge("zkcrawl_consumer_leases", "Items held: taken from the "
                            "owned partitions and not settled (at most threads + backlog)",
                            registry=r)
        self.zk_state = Gauge("zkcrawl_consumer_zookeeper_state", "1 for the current "
                              "ZooKeeper connection state", ["state"], registry=r)
        self.paused = Gauge("zkcrawl_consumer_paused", "1 while the cluster is paused",
                            registry=r)
        self.zk_transitions = Counter("zkcrawl_consumer_zookeeper_transitions", "Changes of "
                                      "the ZooKeeper connection state, by the state entered "
                                      "(LOST: the session expired, its partitions went with it)",
                                      ["state"], registry=r)
        self.ready = Gauge("zkcrawl_consumer_ready", "1 while /readyz would answer 200 "
                           "(connected to ZooKeeper and claiming, or paused)", registry=r)
        self._ready_probe: Health = unready_starting
        self.ready.set_function(self._is_ready)
        self._ownership = _OwnershipFigures()
        r.register(self._ownership)
        self._observe = (_Observer(self.queue), _Observer(self.dispatch),
                         _Observer(self.wait), _Observer(self.process))
        self._by_outcome: dict[tuple[str, str, bool], Any] = {}
        self._reasons: set[str] = set()
        self._lock = threading.Lock()  # workers observe concurrently: one reason set
        self.set_zk_state("CONNECTED")

    def set_zk_state(self, state: str) -> None:
        for s in ZK_STATES:
            self.zk_state.labels(state=s).set(1 if s == state else 0)
        if state in ZK_STATES:
            self.zk_transitions.labels(state=state).inc()

    def count_ownership(self, snapshot: Callable[[], Mapping[str, int]]) -> None:
        """From now on the ownership figures read ``snapshot()`` at scrape time
        (:meth:`zkcrawl.consumer.ownership.Ownership.snapshot`)."""
        self._ownership.snapshot = snapshot

    def set_ready_probe(self, probe: Health) -> None:
        """What ``zkcrawl_consumer_ready`` asks at scrape time (the ``/readyz`` probe)."""
        self._ready_probe = probe

    def _is_ready(self) -> float:
        try:
            return 1.0 if self._ready_probe()[0] else 0.0
        except Exception:  # a probe that breaks says "not ready", as /readyz does
            return 0.0

    def observe(self, kind: str, error: str | None, queue_ms: float, dispatch_ms: float,
                wait_ms: float, process_ms: float, skipped: bool = False) -> None:
        """One item settled: ``kind`` is its OutcomeKind (complete, retry, dead), ``error``
        its reason (None when it went well), then its four timing stages; ``skipped``: its
        processor asked for no record."""
        key = (kind, error or "", skipped)
        child = self._by_outcome.get(key)
        if child is None:  # labels() takes a lock and builds a key: once per pair
            with self._lock:
                reason = reason_label(error, self._reasons)
                child = self.items.labels(outcome=outcome_label(kind, error, skipped),
                                          reason=reason)
                if len(self._by_outcome) < 4 * MAX_REASONS:  # the cache stays bounded too
                    self._by_outcome[key] = child
        child.inc()
        queue, dispatch, wait, process = self._observe
        queue(max(0.0, queue_ms) / 1000.0)
        dispatch(dispatch_ms / 1000.0)
        wait(wait_ms / 1000.0)
        process(process_ms / 1000.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """``/metrics``, ``/livez``, ``/readyz`` (``/healthz``) on a background thread: the
    one-thread event loop of :mod:`zkcrawl.httpserve` (module docstring). Until
    :meth:`set_probes`, the probes say alive and not ready (:func:`alive_starting`,
    :func:`unready_starting`).

    prometheus-client's own ``start_http_server`` answers 200 with the metrics on *every*
    path, so a probe against it would always pass; this server answers:

    * ``GET /metrics`` -- the text exposition format (``generate_latest``);
    * ``GET /livez`` -- liveness: 200 while the process works (its claim loop ticks, its
      committer runs), 503 when it is wedged. **Never depends on ZooKeeper**: a consumer
      waiting for ZooKeeper (at start-up, or riding out an outage) is alive, and restarting it
      would only drop its partitions and its session sooner. This is the probe that may restart it.
    * ``GET /readyz`` (and ``/healthz``, an alias) -- readiness: 200 while
      connected to ZooKeeper and in the run loop, running *or paused*; 503 with the reason
      otherwise (ZooKeeper suspended or lost, starting, draining after SIGTERM, stopped). Paused
      is ready on purpose: the operator asked for it, the consumer does what it was told and goes
      on within a second of ``resume``; an unready cluster would block rollouts and node drains
      (a PodDisruptionBudget counts unready pods as unavailable) for no fault of the pods.
    * anything else -- 404.
    """

    def __init__(self, metrics: Exposition, ready: Health = unready_starting, port: int = 0,
                 host: str = "127.0.0.1", live: Health = alive_starting,
                 flag: str = "--metrics-port") -> None:
        self.metrics = metrics
        self.live, self.ready = live, ready
        try:
            self._server = EventServer(host, port, self._respond, name="metrics")
        except (OSError, OverflowError) as exc:  # taken, not an address, port past 65535
            detail = getattr(exc, "strerror", None) or exc
            raise UsageError(f"{flag} {port}: cannot listen on {host}: {detail}") from None
        self.set_probes(live, ready)
        self.port = self._server.port

    def set_metrics(self, metrics: Exposition) -> None:
        """What ``/metrics`` serves from now on."""
        self.metrics = metrics
        self.set_probes(self.live, self.ready)

    def set_probes(self, live: Health, ready: Health) -> None:
        """What ``/livez`` and ``/readyz`` ask from now on (and the consumer's
        ``zkcrawl_consumer_ready`` gauge, so alerts see what the kubelet sees)."""
        self.live, self.ready = live, ready
        if isinstance(self.metrics, Metrics):
            self.metrics.set_ready_probe(ready)

    def start(self) -> MetricsServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def _respond(self, path: str) -> Answer:
        """The server thread: probes read flags, the exposition formats counters."""
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self.metrics.exposition()
        if path == "/livez":
            return _probe(self.live)
        if path in ("/readyz", "/healthz"):
            return _probe(self.ready)
        return 404, "text/plain", b"not found: try /metrics, /livez, /readyz or /healthz\n"


def _probe(probe: Health) -> Answer:
    try:
        ok, detail = probe()
    except Exception as exc:  # a probe that breaks says "no", it does not hang up
        ok, detail = False, {"error": type(exc).__name__}
    body = json.dumps({"status": "ok" if ok else "unavailable", **detail}).encode()
    return (200 if ok else 503), "application/json", body + b"\n"
