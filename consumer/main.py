"""``zkcrawl-consumer``: the crawl cluster's consumer daemon (SPEC §3-§4).

``main(argv, env) -> ExitStatus`` runs in-process (tests); :func:`run` is the console entry.
Signal handlers are installed here and nowhere else: SIGTERM/SIGINT ask the worker to stop
(finish within ``--grace``), a second one to release everything and exit at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence

from consumer.metrics import Metrics, MetricsServer
from consumer.pipeline import HostGate, Pipeline
from consumer.settings import CRAWL_DELAY_CAP, ConsumerSettings
from consumer.sink import Sink
from consumer.worker import Worker
from zkcrawl.errors import ExitStatus
from zkcrawl.politeness.cluster import ClusterPoliteness
from zkcrawl.politeness.local import LocalPoliteness, Politeness
from zkcrawl.queue.leases import LeaseQueue
from zkcrawl.queue.registry import default_id
from zkcrawl.runner import connect, guarded, setup_logging
from zkcrawl.settings import ArgumentParser, add_options, parse
from zkcrawl.web.extract import parse_field_specs
from zkcrawl.web.fetch import Fetcher
from zkcrawl.zk.client import ZkClient

PROG = "zkcrawl-consumer"
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Consumer daemon of a zkcrawl cluster: "
                            "claims URLs from ZooKeeper, fetches them politely, writes one "
                            "JSON record per item.")
    add_options(parser, ConsumerSettings)
    return parser


@contextlib.contextmanager
def stop_signals(worker: Worker) -> Iterator[None]:
    """Route SIGTERM/SIGINT to ``worker.request_stop`` (main thread only), then restore."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}

    def handler(signum: int, _frame: object) -> None:
        worker.request_stop(signum)  # sets flags only: safe inside a handler

    for sig in _STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def open_consumer(settings: ConsumerSettings, sink: Sink) -> Iterator[Worker]:
    """Connect and assemble a consumer; closing ends the ZooKeeper session (any lease still
    held vanishes with it). Tests drive the yielded Worker directly."""
    fields = parse_field_specs(settings.field)
    zk = connect(settings)  # kazoo's per-attempt warnings are held back by ZkClient
    server: MetricsServer | None = None
    queue: LeaseQueue | None = None
    politeness: Politeness | None = None
    try:
        consumer_id = settings.id or default_id()
        queue = LeaseQueue(zk, settings.root, consumer_id, delivery=settings.delivery)
        fetch_settings = settings.fetch_settings()
        inner = politeness = _politeness(settings, zk, fetch_settings.retry_after_cap)
        gate = HostGate(inner, settings.domain_delay, CRAWL_DELAY_CAP)
        pipeline = Pipeline(Fetcher(fetch_settings, gate, http=settings.http), gate, fields,
                            consumer_id, settings.max_attempts)
        metrics = Metrics()
        worker = Worker(settings, zk, queue, pipeline, sink, metrics, consumer_id)
        if settings.metrics_port:
            server = MetricsServer(metrics, worker.health, settings.metrics_port,
                                   settings.metrics_host).start()
        yield worker
    finally:
        if isinstance(politeness, ClusterPoliteness):
            politeness.stop()
        if server is not None:
            server.stop()
        if queue is not None:
            queue.close()
        zk.close()


def _politeness(settings: ConsumerSettings, zk: ZkClient, max_delay: float) -> Politeness:
    # --domain-delay 0 asks for no gap: nothing to share, no ZooKeeper round trip per page
    # (Crawl-delay and Retry-After are then honoured per consumer).
    if settings.politeness == "cluster" and settings.domain_delay > 0:
        return ClusterPoliteness(zk, settings.root, settings.domain_delay,
                                 max_delay=max_delay).start_pruning()
    return LocalPoliteness(settings.domain_delay, max_delay=max_delay)


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    env = os.environ if env is None else env

    def work() -> ExitStatus:
        settings, _ = parse(ConsumerSettings, build_parser(), argv, env)
        parse_field_specs(settings.field)  # bad XPath: exit 2 before anything starts
        setup_logging(settings)
        sink = Sink(settings.out)
        try:
            with open_consumer(settings, sink) as worker, stop_signals(worker):
                return worker.run()
        finally:
            sink.close()

    return guarded(PROG, work)


def run() -> None:
    """Console entry. Exits with ``os._exit`` once everything is flushed and closed: a fetch
    still running past the grace period must not hold the process (the pool's threads are
    joined at interpreter exit otherwise)."""
    status = main(sys.argv[1:], os.environ)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(int(status))


if __name__ == "__main__":
    run()
