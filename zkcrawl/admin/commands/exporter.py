"""``zkcrawl exporter``: serve the cluster's state as Prometheus metrics (one per root).

``/metrics`` (the cluster gauges of :mod:`zkcrawl.admin.exporter`, process collectors,
``zkcrawl_build_info``), ``/livez`` (the reader thread turns; never depends on ZooKeeper) and
``/readyz`` (connected, and the last read succeeded), on ``--metrics-host`` (default
127.0.0.1: safe by default; 0.0.0.0 in a container, where a NetworkPolicy limits who may
connect) and ``--metrics-port`` (default 9101; the consumers' examples use 9100).

Runs until SIGTERM or SIGINT (exit 0). ZooKeeper unreachable at start: one line, exit 75;
away later: it keeps serving the last figures with ``zkcrawl_cluster_up 0``.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
from collections.abc import Mapping

from zkcrawl import logs
from zkcrawl.admin.exporter import MIN_INTERVAL, REFRESH, ClusterView, ExporterMetrics
from zkcrawl.consumer.metrics import MetricsServer
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.runner import connect, setup_logging
from zkcrawl.settings import CommonSettings, opt
from zkcrawl.signals import StopSignals

NAME = "exporter"
HELP = "serve the cluster's queue, leases, consumers and dead letters as Prometheus metrics"
EXAMPLES = """
    zkcrawl exporter --zk zk1:2181,zk2:2181,zk3:2181   # http://127.0.0.1:9101/metrics
    zkcrawl exporter --metrics-host 0.0.0.0            # in a container (NetworkPolicy!)
    zkcrawl exporter --root /crawl-b --metrics-port 9102   # one exporter per root
"""

log = logs.get_logger("zkcrawl.exporter")


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    metrics_port: int = opt(9101, "serve /metrics, /livez and /readyz on this port",
                            metavar="P")
    metrics_host: str = opt("127.0.0.1", "address to bind (0.0.0.0: every interface; "
                            "/metrics has no authentication)", metavar="ADDR")
    min_interval: float = opt(MIN_INTERVAL, "re-read the cluster at most once per S seconds "
                              "when watches fire", metavar="S")
    refresh: float = opt(REFRESH, "re-read the cluster at least every S seconds (ages, "
                         "published counters, politeness slots)", metavar="S")

    def validate(self) -> None:
        super().validate()
        if not 1 <= self.metrics_port <= 65535:
            raise UsageError(f"--metrics-port must be 1..65535, got {self.metrics_port}")
        if not 0.1 <= self.min_interval <= 3600:
            raise UsageError(f"--min-interval must be 0.1..3600 seconds, got "
                             f"{self.min_interval:g}")
        if not self.min_interval <= self.refresh <= 86400:
            raise UsageError(f"--refresh must be between --min-interval and 86400 seconds, "
                             f"got {self.refresh:g}")


def configure(parser: argparse.ArgumentParser) -> None:
    """No positionals."""


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    setup_logging(settings)
    stopped = threading.Event()
    # Listen first: a port in use is a usage error before any ZooKeeper wait.
    server = MetricsServer(_NotYet(), port=settings.metrics_port, host=settings.metrics_host,
                           flag="--metrics-port")
    try:
        zk = connect(settings)  # unreachable: one line, exit 75
        try:
            view = ClusterView(zk, settings.root, settings.min_interval, settings.refresh)
            server.set_metrics(ExporterMetrics(view))
            server.set_probes(view.alive, view.ready)
            view.start()
            server.start()
            log.info("exporter.started", root=settings.root, host=settings.metrics_host,
                     port=server.port, min_interval=settings.min_interval,
                     refresh=settings.refresh)
            with StopSignals(lambda _force: stopped.set()) as signals:
                while not stopped.wait(0.2) and not signals.stopping:
                    pass
            log.info("exporter.stopped", root=settings.root,
                     reads=sum(view.reads.values()), errors=view.errors)
            view.stop()
        finally:
            zk.close()
    finally:
        server.stop()
    return ExitStatus.OK


class _NotYet:
    """``/metrics`` before the first connection: nothing to say yet."""

    def exposition(self) -> bytes:
        return b""
