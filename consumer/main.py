"""``zkcrawl-consumer``: the crawl cluster's consumer daemon (SPEC §3-§4).

``main(argv, env) -> ExitStatus`` runs in-process (tests); :func:`run` is the console entry.
Signal handlers are installed here and nowhere else: SIGTERM/SIGINT (:mod:`zkcrawl.signals`)
ask the worker to stop (finish within ``--grace``), a second one to release everything and
exit at once; SIGHUP asks the sink to reopen ``--out`` between two groups (logrotate without
``copytruncate``; :meth:`consumer.sink.ResultSink.request_reopen`, a flag). SIGHUP is routed
before ZooKeeper is connected, so a rotation during start-up does not kill the process.

With ``--metrics-port`` the server listens before ZooKeeper is connected: ``/livez`` answers
200 while the consumer waits for ZooKeeper (it is alive), ``/readyz`` 503 until it runs.
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
from consumer.pipeline import Pipeline
from consumer.processors import FieldsProcessor, Processors, parse_routes
from consumer.results import ResultChain
from consumer.settings import CRAWL_DELAY_CAP, ConsumerSettings
from consumer.sink import ResultSink, open_sink
from consumer.worker import Worker
from zkcrawl.errors import ExitStatus
from zkcrawl.politeness.cluster import ClusterPoliteness
from zkcrawl.politeness.gate import HostGate
from zkcrawl.politeness.local import LocalPoliteness, Politeness
from zkcrawl.queue.leases import LeaseQueue
from zkcrawl.queue.registry import default_id
from zkcrawl.runner import connect, guarded, setup_logging
from zkcrawl.settings import ArgumentParser, add_options, parse
from zkcrawl.signals import StopSignals
from zkcrawl.web.extract import parse_field_specs
from zkcrawl.web.fetch import Fetcher
from zkcrawl.zk.client import ZkClient

PROG = "zkcrawl-consumer"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Consumer daemon of a zkcrawl cluster: "
                            "claims URLs from ZooKeeper, fetches them politely, writes one "
                            "JSON record per item.")
    add_options(parser, ConsumerSettings)
    return parser


@contextlib.contextmanager
def open_consumer(settings: ConsumerSettings, sink: ResultSink,
                  extensions: Extensions | None = None) -> Iterator[Worker]:
    """Connect and assemble a consumer; closing ends the ZooKeeper session (any lease still
    held vanishes with it) and closes the ``--pipeline`` chain. Tests drive the yielded
    Worker directly. ``extensions``: the processors and pipelines already loaded."""
    fields = parse_field_specs(settings.field)
    processors, results = extensions or load_extensions(settings)
    results.open()  # before ZooKeeper is asked anything; a failure is one line (exit 2)
    metrics = Metrics()
    server: MetricsServer | None = None
    if settings.metrics_port:  # before connecting: alive (/livez) while waiting for ZooKeeper
        server = MetricsServer(metrics, port=settings.metrics_port,
                               host=settings.metrics_host).start()
    try:
        zk = connect(settings)  # kazoo's per-attempt warnings are held back by ZkClient
    except BaseException:
        results.close()
        if server is not None:
            server.stop()
        raise
    queue: LeaseQueue | None = None
    politeness: Politeness | None = None
    try:
        consumer_id = settings.id or default_id()
        queue = LeaseQueue(zk, settings.root, consumer_id, delivery=settings.delivery)
        fetch_settings = settings.fetch_settings()
        inner = politeness = _politeness(settings, zk)
        if isinstance(politeness, ClusterPoliteness):
            metrics.count_politeness(politeness.snapshot)
        gate = HostGate(inner, settings.domain_delay, CRAWL_DELAY_CAP)
        pipeline = Pipeline(Fetcher(fetch_settings, gate, http=settings.http), gate, fields,
                            consumer_id, settings.max_attempts, processors)
        worker = Worker(settings, zk, queue, pipeline, sink, metrics, consumer_id, results)
        if server is not None:
            server.set_probes(worker.liveness, worker.readiness)
        yield worker
    finally:
        results.close()  # the committer has stopped: no process() call is running
        if isinstance(politeness, ClusterPoliteness):
            politeness.stop()
        if server is not None:
            server.stop()
        if queue is not None:
            queue.close()
        zk.close()


Extensions = tuple[Processors, ResultChain]


def load_extensions(settings: ConsumerSettings) -> Extensions:
    """The page processors (--processor, [processors]) and the --pipeline chain, loaded
    (classes instantiated) once; a bad one is a UsageError."""
    processors = Processors(parse_routes(settings.processor, settings.processors),
                            FieldsProcessor(parse_field_specs(settings.field)))
    return processors, ResultChain.load(settings.pipeline)


def _politeness(settings: ConsumerSettings, zk: ZkClient) -> Politeness:
    # --domain-delay 0 asks for no gap: nothing to share, no ZooKeeper round trip per page
    # (Crawl-delay and Retry-After are then honoured per consumer). Crawl-delay is capped
    # once, at CRAWL_DELAY_CAP (zkcrawl.politeness.MAX_CRAWL_DELAY), by every layer.
    if settings.politeness == "cluster" and settings.domain_delay > 0:
        return ClusterPoliteness(zk, settings.root, settings.domain_delay,
                                 max_delay=CRAWL_DELAY_CAP).start_pruning()
    return LocalPoliteness(settings.domain_delay, max_delay=CRAWL_DELAY_CAP)


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    env = os.environ if env is None else env

    def work() -> ExitStatus:
        settings, _ = parse(ConsumerSettings, build_parser(), argv, env)
        # A bad XPath, processor or pipeline: exit 2 before anything starts.
        extensions = load_extensions(settings)
        setup_logging(settings)
        sink = open_sink(settings.out, settings.root)
        try:
            with reopen_on_sighup(sink), open_consumer(settings, sink, extensions) as worker, \
                    StopSignals(worker.request_stop):
                return worker.run()
        finally:
            sink.close()

    return guarded(PROG, work)


@contextlib.contextmanager
def reopen_on_sighup(sink: ResultSink) -> Iterator[None]:
    """SIGHUP -> ``sink.request_reopen()`` (a flag: the committer reopens between groups).
    Only from the main thread (a consumer run in-process by a test installs nothing); the
    previous handler is restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(_signum: int, _frame: object) -> None:
        sink.request_reopen()  # sets a flag: no lock, no I/O in a signal handler

    previous = signal.signal(signal.SIGHUP, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def run() -> None:
    """Console entry. Exits with ``os._exit`` once everything is flushed and closed (see
    the comment at the call)."""
    status = main(sys.argv[1:], os.environ)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    # Why os._exit and not sys.exit: the pool's threads ("fetch_N") are ThreadPoolExecutor
    # workers, which are not daemon threads: at interpreter exit concurrent.futures joins
    # them (its _python_exit, registered with threading._register_atexit) and then
    # threading._shutdown joins every non-daemon thread. A fetch still running past --grace,
    # or after a second signal, sits inside libcurl's perform(), which Fetcher.close() cannot
    # interrupt; it ends only at its own budget (read timeout --timeout, whole fetch twice
    # that: 15-30 s by default). Measured with sys.exit instead: a second SIGINT exits after
    # 14.6 s instead of 0.5 s (tests/test_consumer_signals.py wants < 3 s). Nothing is lost by
    # skipping the interpreter's exit: by now main() has closed the sink (records synced or
    # dropped with their uncompleted items), released or settled every lease and closed the
    # ZooKeeper session (open_consumer), and guarded() has flushed the log writer; the
    # streams and the logging module are flushed just above. Keep it while the pool's
    # threads can be inside a transfer at exit.
    os._exit(int(status))


if __name__ == "__main__":
    run()
