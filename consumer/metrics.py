"""Prometheus metrics and a health endpoint for one consumer (``--metrics-port``).

prometheus-client's own ``start_http_server`` answers 200 with the metrics on *every* path,
so a ``/healthz`` probe against it would always pass. This module serves the registry with a
small ``http.server`` handler instead:

* ``GET /metrics`` -- the text exposition format (``generate_latest``);
* ``GET /healthz`` -- 200 ``ok`` while connected to ZooKeeper and in the run loop (running or
  deliberately paused by the operator), 503 with the reason otherwise (ZooKeeper suspended or
  lost, starting, draining after SIGTERM, stopped after a sink failure). A paused consumer is
  healthy on purpose: a liveness probe must not restart a cluster the operator paused.
* anything else -- 404.

The registry is per consumer instance (not the process-global default), so tests can run
several consumers in one process.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from zkcrawl.errors import UsageError

# Seconds; fetches of a latency-bound site sit around 0.05-2 s, dispatch well under 10 ms.
FETCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DISPATCH_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
ZK_STATES = ("CONNECTED", "SUSPENDED", "LOST")

Health = Callable[[], tuple[bool, dict[str, Any]]]


class Metrics:
    """The consumer's instruments in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.items = Counter("zkcrawl_consumer_items", "Items by outcome (ok, retry, dead, or "
                             "the error of a permanent failure)", ["outcome"], registry=r)
        self.fetch = Histogram("zkcrawl_consumer_fetch_seconds", "Fetch + parse + write time "
                               "of one item", buckets=FETCH_BUCKETS, registry=r)
        self.dispatch = Histogram("zkcrawl_consumer_dispatch_seconds", "From the take from "
                                  "ZooKeeper until handed to the pool",
                                  buckets=DISPATCH_BUCKETS, registry=r)
        self.wait = Histogram("zkcrawl_consumer_wait_seconds", "Time in the capped queue "
                              "(and politeness cool-down)", buckets=FETCH_BUCKETS, registry=r)
        self.in_flight = Gauge("zkcrawl_consumer_in_flight", "Items being processed by a "
                               "worker thread", registry=r)
        self.backlog = Gauge("zkcrawl_consumer_backlog", "Items waiting for a worker thread "
                             "or for their host's turn", registry=r)
        self.leases = Gauge("zkcrawl_consumer_leases", "Leases held (at most threads + "
                            "backlog)", registry=r)
        self.zk_state = Gauge("zkcrawl_consumer_zookeeper_state", "1 for the current "
                              "ZooKeeper connection state", ["state"], registry=r)
        self.paused = Gauge("zkcrawl_consumer_paused", "1 while the cluster is paused",
                            registry=r)
        self._by_outcome: dict[str, Any] = {}
        self.set_zk_state("CONNECTED")

    def set_zk_state(self, state: str) -> None:
        for s in ZK_STATES:
            self.zk_state.labels(state=s).set(1 if s == state else 0)

    def observe(self, outcome: str, dispatch_ms: float, wait_ms: float,
                process_ms: float) -> None:
        child = self._by_outcome.get(outcome)
        if child is None:  # labels() takes a lock and builds a key: once per outcome
            child = self._by_outcome[outcome] = self.items.labels(outcome=outcome)
        child.inc()
        self.dispatch.observe(dispatch_ms / 1000.0)
        self.wait.observe(wait_ms / 1000.0)
        self.fetch.observe(process_ms / 1000.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, self.server.metrics.exposition())
        elif path == "/healthz":
            ok, detail = self.server.health()
            body = json.dumps({"status": "ok" if ok else "unavailable", **detail}).encode()
            self._send(200 if ok else 503, "application/json", body + b"\n")
        else:
            self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    metrics: Metrics
    health: Health


class MetricsServer:
    """``/metrics`` + ``/healthz`` on a background thread."""

    def __init__(self, metrics: Metrics, health: Health, port: int,
                 host: str = "0.0.0.0") -> None:
        try:
            self._httpd = _Server((host, port), _Handler)
        except OSError as exc:
            raise UsageError(f"--metrics-port {port}: cannot listen: "
                             f"{exc.strerror or exc}") from None
        self._httpd.metrics = metrics
        self._httpd.health = health
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.2}, name="metrics",
                                        daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(2)
