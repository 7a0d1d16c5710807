"""``zkcrawl-consumer``: the crawl cluster's consumer daemon (SPEC §3-§4).

``main(argv, env) -> ExitStatus`` runs in-process (tests); :func:`run` is the console entry.
Signal handlers are installed here and nowhere else: SIGTERM/SIGINT (:mod:`zkcrawl.signals`)
ask the worker to stop (finish within ``--grace``), a second one to release everything and
exit at once; SIGHUP asks the sink to reopen ``--out`` between two groups (logrotate without
``copytruncate``; :meth:`zkcrawl.consumer.sinks.ResultSink.request_reopen`, a flag).
SIGHUP is routed before ZooKeeper is connected, so a rotation during start-up does not kill
the process. SIGUSR1 writes every thread's stack to stderr and the consumer goes on
(:func:`zkcrawl.signals.thread_dump_on_sigusr1`).

With ``--metrics-port`` the server listens before ZooKeeper is connected: ``/livez`` answers
200 while the consumer waits for ZooKeeper (it is alive), ``/readyz`` 503 until it runs.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence

from zkcrawl.consumer.extract_pool import extraction
from zkcrawl.consumer.metrics import Metrics, MetricsServer
from zkcrawl.consumer.owned_queue import HostCap, OwnedQueue
from zkcrawl.consumer.ownership import Ownership, recorded_partitions
from zkcrawl.consumer.pipeline import ItemHandler
from zkcrawl.consumer.processors import ArticleProcessor, FieldsProcessor, Processors, parse_routes
from zkcrawl.consumer.queue_seam import WorkerQueue
from zkcrawl.consumer.results import ResultChain
from zkcrawl.consumer.settings import CRAWL_DELAY_CAP, ConsumerSettings
from zkcrawl.consumer.sinks import ResultSink, open_sink
from zkcrawl.consumer.worker import Worker
from zkcrawl.errors import ExitStatus
from zkcrawl.logs import get_logger
from zkcrawl.politeness.gate import HostGate
from zkcrawl.politeness.local import LocalPoliteness
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.registry import default_id
from zkcrawl.runner import connect, guarded, setup_logging
from zkcrawl.settings import ArgumentParser, add_options, parse
from zkcrawl.signals import StopSignals, thread_dump_on_sigusr1
from zkcrawl.web.extract import parse_field_specs
from zkcrawl.web.fetch import Fetcher
from zkcrawl.zk import KazooException, KazooTimeoutError
from zkcrawl.zk.client import ZkClient

PROG = "zkcrawl-consumer"
log = get_logger(__name__)


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
    Worker directly. ``extensions``: the processors and pipelines already loaded.

    The process's parts start in the order below and close in the reverse one (an
    :class:`~contextlib.ExitStack`): the ``--pipeline`` chain, the metrics server, the
    ZooKeeper session, the queue, the politeness; the Worker's own parts start and stop
    inside (:mod:`zkcrawl.consumer.components`)."""
    fields = parse_field_specs(settings.field)
    processors, results = extensions or load_extensions(settings)
    metrics = Metrics()
    with contextlib.ExitStack() as parts:
        results.open()  # before ZooKeeper is asked anything; a failure is one line (exit 2)
        parts.callback(results.close)  # the committer has stopped: no process() call runs
        server: MetricsServer | None = None
        if settings.metrics_port:  # before connecting: alive (/livez) while waiting for ZK
            server = MetricsServer(metrics, port=settings.metrics_port,
                                   host=settings.metrics_host).start()
            parts.callback(server.stop)
        zk = connect(settings, writes=True)  # ZkClient holds kazoo's warnings back
        parts.callback(zk.close)
        consumer_id = settings.id or default_id()
        ownership = _ownership(settings, zk, consumer_id)
        queue = _queue(settings, zk, consumer_id, ownership)
        parts.callback(queue.close)
        fetch_settings = settings.fetch_settings()
        gate = HostGate(_politeness(settings), settings.domain_delay, CRAWL_DELAY_CAP)
        ownership.keep_holds(gate)  # a back-off in force survives a hand-over (SPEC §3)
        item_handler = ItemHandler(Fetcher(fetch_settings, gate, http=settings.http), gate, fields,
                            consumer_id, settings.max_attempts, processors,
                            settings.link_bounds(zk))
        metrics.count_ownership(ownership.snapshot)
        worker = Worker(settings, zk, queue, item_handler, sink, metrics, consumer_id, results,
                        ownership=ownership)
        _cap_hosts(queue, worker)
        if server is not None:
            server.set_probes(worker.liveness, worker.readiness)
        yield worker


Extensions = tuple[Processors, ResultChain]


def load_extensions(settings: ConsumerSettings) -> Extensions:
    """The page processors (--processor, [processors]) and the --pipeline chain, loaded
    (classes instantiated) once; a bad one is a UsageError."""
    fields = parse_field_specs(settings.field)
    default = ArticleProcessor(fields) if settings.extract == "article" else FieldsProcessor(
        fields)
    processors = Processors(parse_routes(settings.processor, settings.processors), default)
    return processors, ResultChain.load(settings.pipeline)


def _ownership(settings: ConsumerSettings, zk: ZkClient, consumer_id: str) -> Ownership:
    """Hosts have owners (SPEC §3, zkcrawl.consumer.ownership): this consumer's share of the
    partitions. ``--politeness cluster`` and ``local`` name the modes before owners: they
    mean owner now, said once."""
    if settings.politeness != "owner":
        log.warning("consumer.politeness_replaced", given=settings.politeness, now="owner",
                    note="every host has one owner, which keeps its gap in memory: "
                         "--politeness cluster and local are accepted and mean owner")
    previous_layout(zk, settings.root)
    return Ownership(zk, settings.root, consumer_id, settings.domain_delay,
                     partitions=recorded_partitions(zk, settings.root, settings.partitions),
                     recorded=True)


def previous_layout(zk: ZkClient, root: str) -> None:
    """One line at start for a root used by a release before hosts had owners (per-item
    leases under ``<root>/leases``, per-host slots under ``<root>/hosts``): what this release
    does with it and the way over (docs/concepts/zookeeper-layout.md). Counted from the
    nodes' stats, no listing."""
    layout = Layout.of(root)
    found: dict[str, int] = {}
    for name, path in (("leases", layout.leases), ("hosts", layout.hosts)):
        try:
            stat = zk.exists(path)
        except (KazooException, KazooTimeoutError):
            return  # no answer: nothing to tell (the start goes on, or fails, on its own)
        if stat is not None and stat.numChildren:
            found[name] = int(stat.numChildren)
    if found:
        log.warning("consumer.previous_layout", root=root, **found,
                    note="this root was used by a release before hosts had owners: its "
                         "ingress is moved into the partitions (nothing queued is lost); "
                         "<root>/hosts is ignored; items leased by a consumer of that "
                         "release may be recorded twice -- stop every older consumer. Once "
                         "no lease is left, 'deleteall <root>/leases', '<root>/claims' and "
                         "'<root>/hosts' in zkCli tidy the root")


def _queue(settings: ConsumerSettings, zk: ZkClient, consumer_id: str,
           ownership: Ownership) -> WorkerQueue:
    """The partitions this consumer owns (zkcrawl.consumer.owned_queue), the worker's queue seam
    (zkcrawl.consumer.queue_seam)."""
    return OwnedQueue(zk, settings.root, consumer_id, ownership, settings.max_attempts,
                      delivery=settings.delivery)


OWNER_HORIZON_S = 0.5  # seconds of a host's gap an owner holds in its table


def _cap_hosts(queue: object, worker: Worker) -> None:
    """The owned queue hands out no more of a host than half a second of its gap (at least
    one item, at most a quarter of the worker's table, zkcrawl.consumer.parking's bound): the rest
    stay in ZooKeeper, unmarked -- with ``--delivery at-most-once`` too, whose items cannot
    be given back once taken. An owner's hosts are its own, so a short horizon is enough to
    keep each at its pace, and the table holds as many hosts as it can. A host's items stay
    there, too, until its next request could start (READY_AHEAD_S: its gap, Crawl-delay or
    back-off nearly over), so the table holds only hosts whose turn is near. No gap
    (--domain-delay 0), no cap -- the worker's capacity bounds what it takes -- but the same
    wait for a host's turn: a host under a Retry-After or a down back-off (or with a
    Crawl-delay) keeps its items in ZooKeeper until then, so they never fill the table in
    front of hosts that are ready."""
    if not isinstance(queue, OwnedQueue):
        return
    gap = worker.s.domain_delay
    cap = (max(1, min(math.ceil(OWNER_HORIZON_S / gap), worker.s.capacity // 4)) if gap > 0
           else worker.s.capacity)
    queue.host_cap = HostCap(cap, worker.backlog.per_host, worker.backlog.take_freed,
                             worker.item_handler.gate.ready_at)


def _politeness(settings: ConsumerSettings) -> LocalPoliteness:
    """The owner's per-host table, in memory: the gap, Crawl-delay (capped once, at
    CRAWL_DELAY_CAP, zkcrawl.politeness.MAX_CRAWL_DELAY), Retry-After, the back-off. Only
    this consumer fetches its hosts, so no ZooKeeper write per request."""
    return LocalPoliteness(settings.domain_delay, max_delay=CRAWL_DELAY_CAP)


# The cycle collector's young generation, in tracked allocations. Python's 700 ran a
# collection every few pages at 2,000 pages/s (bench hosts, 2,500 hosts: about 4 % of a
# consumer's wall time in the collector, 430 collections a run). 3 pairs in one sitting:
# 20,000 alone 0.580 vs 0.599 ms CPU per page; with the freeze, against the tree before it,
# 0.567 vs 0.573 -- small, within the VM's noise. Most of a page's objects die by reference
# counting anyway; cycles wait longer to be collected.
GC_YOUNG = 20_000


def tune_gc() -> None:
    """For the crawl: what start-up allocated (modules, settings, pools) is frozen out of
    every collection, and the young generation is :data:`GC_YOUNG`. Called by the command
    only: a library user's process keeps its own settings."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 20, 20)


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    env = os.environ if env is None else env

    def work() -> ExitStatus:
        settings, _ = parse(ConsumerSettings, build_parser(), argv, env)
        # A bad XPath, processor or pipeline: exit 2 before anything starts.
        extensions = load_extensions(settings)
        setup_logging(settings)
        sink = open_sink(settings.out, settings.root)
        lingering: list[StopSignals] = []  # past the run: the teardown absorbs late signals
        try:
            with thread_dump_on_sigusr1(), reopen_on_sighup(sink), \
                    extraction(settings.extract, settings.extract_workers), \
                    open_consumer(settings, sink, extensions) as worker, \
                    _stop_signals(worker, lingering):
                tune_gc()
                return worker.run()
        finally:
            for signals in lingering:
                signals.restore()
            sink.close()

    return guarded(PROG, work)


def _stop_signals(worker: Worker, lingering: list[StopSignals]) -> StopSignals:
    """First signal drains, second stops now (zkcrawl.signals); after the run, a signal that
    comes during the teardown (closing the queue and the session, bounded by --zk-timeout)
    is counted, not acted on: a second SIGTERM that arrives as the drain ends still exits 0
    (CI: it came after the run, met the default action, and the process died with -15)."""
    signals = StopSignals(worker.request_stop, linger=True)
    lingering.append(signals)
    return signals


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
