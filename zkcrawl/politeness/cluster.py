"""Politeness that holds for the whole cluster (SPEC §4): each host's next free slot in ZooKeeper.

One znode per host, ``<root>/hosts/<host>``, holds the wall-clock time (Unix seconds) before
which no consumer may start a request to that host. Reserving a slot is a compare-and-set on
it: read the time and the node's version, write ``max(now, time) + gap`` with that version; a
consumer that lost the race to another reads again. So the slots handed out for one host, by
every consumer sharing ``<root>``, are at least a gap apart -- the same guarantee as
:class:`~zkcrawl.politeness.local.LocalPoliteness`, cluster-wide.

Why not a kazoo recipe: a lock per host would cost a lock znode and a watch per request, and a
lock holder that dies would stall the host for a session timeout; a slot is one read and one
conditional write, and nothing is held while the request runs.

How the consumer uses it (:class:`~zkcrawl.politeness.gate.HostGate`): **a turn taken
now**, never a slot booked ahead. When this process's own table lets a request start (the gap
since its last request here, back-offs), :meth:`ClusterPoliteness.take_turn` reads the node
(or goes by the version it wrote last), and if the time there has come writes
``start + gap + took + slack`` conditionally and starts: ``took`` is the host's response time
here (reported through :meth:`ClusterPoliteness.request_done`; the mean over all hosts for a
host not measured yet), because this consumer's next request to the host waits a gap from
the *end* of this one, and another consumer's must not arrive sooner. If another consumer's
turn holds the host, nothing is written and the request waits until that turn ends.
Measured (``zkcrawl bench hosts``, README "Scale") against the slots booked ahead that came
before: a booked slot had to be used within a few ms of its time (the next consumer's came a
gap after it), and an item picked up late gave the whole slot up -- 4 % of the pages with 4
consumers on 500 hosts, a second of the host each; a turn taken now is never given up.

Round trips: a host only this consumer crawls costs one conditional write per request (the
version written last is tried without a read; when another consumer wrote meanwhile the
write fails -- counted as a race -- and the node is read). A node that holds another
consumer's turn is read, not written. :meth:`ClusterPoliteness.reserve` (the Fetcher's own
requests: robots.txt, a redirect to the same host) books the host's next slot ahead, and
reservations of one host made by threads of this process while a compare-and-set for it is
in flight are served together by the next one (**runs of slots**: one write for ``k``).

Limits, by design:

* the gap is measured in wall-clock time across machines, so it holds up to their clock skew
  (keep NTP running; a skew of a few ms is nothing next to a 1 s gap);
* it separates the *starts* of requests, lengthened by this consumer's last response time
  from the host: a request that opens a new connection reaches the server later than it
  started, and the next consumer's comes a gap after that as long as its response time covers
  the delay. Before this process has seen any response (its first requests) a turn is the
  gap plus :data:`~zkcrawl.politeness.local.SLOT_SLACK` only; then both requests usually open
  a new connection, and the server sees a gap shorter than the delay only if this one's
  connection took 20 ms longer than the other's. (Within a consumer,
  :class:`zkcrawl.politeness.gate.HostGate` also counts the gap from the end of the previous
  request.)
* a robots.txt ``Crawl-delay`` is known to each consumer from its own robots.txt cache (they all
  read the same file), and a ``Retry-After`` back-off is written to the host's node, so every
  consumer sees it at its next reservation;
* when ZooKeeper cannot be reached the reservation falls back to this process's own gap (still
  polite within the process), logged once per outage;
* host nodes whose time is long past are deleted by :meth:`ClusterPoliteness.prune`, which the
  consumer runs every few minutes, so ``<root>/hosts`` holds the hosts crawled lately, not every
  host ever crawled.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import structlog

from zkcrawl.politeness.local import (
    EARLY,
    MAX_BACK_OFF,
    MAX_CRAWL_DELAY,
    SLOT_SLACK,
    LocalPoliteness,
)
from zkcrawl.queue import untrusted
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import (
    BadVersionError,
    KazooException,
    KazooTimeoutError,
    NodeExistsError,
    NoNodeError,
    Stat,
    ZkClient,
)

__all__ = ["ClusterPoliteness", "HostSlot", "read_slots"]

log = structlog.get_logger(__name__)

_RACES = 32  # lost compare-and-sets before this reservation settles for the local gap
_KNOWN = 10_000  # host nodes whose last written (value, version) this process remembers
_HANDED = 256  # slots of one host remembered until their request is done
_PRUNE_CHUNK = 500
_LEAD_CAP = 0.1  # the longest a turn is planned ahead for its write's round trip
_HERD_SPREAD = 0.01  # seconds over which consumers waiting for one host's turn wake up
_MOVES = 2  # writes that move a turn whose answer came late, before it is left to run out
MAX_AHEAD = MAX_BACK_OFF  # a host slot further ahead is not believed
_ZK_TROUBLE = (KazooException, KazooTimeoutError, OSError)


class ClusterPoliteness:
    """:class:`~zkcrawl.politeness.local.Politeness` shared through ZooKeeper (see the module
    docstring). Thread-safe; every call is one or two ZooKeeper round trips."""

    def __init__(self, zk: ZkClient, root: str, delay: float,
                 max_delay: float = MAX_CRAWL_DELAY) -> None:
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")
        self.zk = zk
        self.path = Layout.of(root).hosts
        self.delay = delay
        self.max_delay = max(max_delay, delay)
        self._local = LocalPoliteness(delay, max_delay=max_delay)  # the fallback
        self._min_delay: dict[str, float] = {}
        self._lock = threading.Lock()
        self._degraded = False
        self._stop = threading.Event()
        #: reservations served, conditional writes that took, compare-and-sets lost to another
        #: writer, reservations served by the local fallback; logged by :meth:`stop`
        self.counts = {"reservations": 0, "writes": 0, "races": 0, "fallbacks": 0, "moves": 0}
        self._known: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._running: set[str] = set()  # hosts with a compare-and-set in flight
        # per host: the response time of its last request here, and the slots handed out
        # (Unix time) whose request has not been reported done
        self._took: OrderedDict[str, float] = OrderedDict()
        self._took_any = 0.0  # a moving mean over every host: for a host not measured yet
        self._starts: OrderedDict[str, float] = OrderedDict()  # latest start handed out
        self._rtt = 0.0  # a moving mean of a turn's write round trip: turns start that late
        self._next: dict[str, _Run] = {}  # reservations waiting for it, per host
        # A waiter's bound: the compare-and-set in flight gives up within its races, each
        # two calls bounded by the client's timeout.
        self._wait_s = 2 * _RACES * zk.zk_timeout + 5
        zk.ensure_path(self.path)

    # -- Politeness ---------------------------------------------------------------------
    def reserve(self, host: str) -> float:
        with self._lock:
            queued = host in self._running
            if queued:  # join the run the next compare-and-set reserves
                run = self._next.setdefault(host, _Run())
                index = run.size
                run.size += 1
            else:
                self._running.add(host)
                run, index = _Run(size=1), 0
        if index == 0 and queued:
            # The compare-and-set in flight hands this run over when it is done. Bounded:
            # past the bound this run goes anyway (two writes race; the CAS keeps it correct).
            run.turn.wait(self._wait_s)
        error: BaseException | None = None
        if index == 0:
            self._lead(host, run)
        elif not run.done.wait(self._wait_s):
            error = KazooTimeoutError(f"no slot for {host} within {self._wait_s:g} s")
        error = error or run.error
        if error is not None or run.start is None:
            self._fall_back(error or KazooException("no slot"))
            self._count("fallbacks")
            return self._local.reserve(host)
        start = run.start + index * run.gap
        self._started(host, start)
        return start + time.monotonic() - time.time()

    def take_turn(self, host: str) -> tuple[float | None, float | None]:
        """The host's turn for a request starting *now*, if no other consumer holds it.

        ``(start, None)``: this consumer holds the host from ``start`` (monotonic, at most the
        client's round trip away; the caller waits for it) for a gap plus the host's response
        time here plus :data:`SLOT_SLACK` -- written to the host's node before this returns.
        ``(None, due)``: another consumer's turn (or a back-off) holds the host until ``due``;
        nothing was written: ask again then. Without ZooKeeper: ``(now, None)``, the local gap
        only (logged once per outage).

        Nothing is reserved ahead, so no turn is ever given up: a request that starts late
        (every thread busy, a slow wake-up, this consumer's previous request still running)
        only asks later. When the write's own answer came too late to start within the turn
        (a gap before the next consumer's earliest start), the turn is moved to *now* by a
        second write conditional on this one's version -- nobody else writes a node whose
        time is still ahead, so it holds unless a back-off came in between.
        """
        path = f"{self.path}/{quote(host, safe='')}"
        gap = self._gap(host)
        with self._lock:
            length = gap + self._took.get(host, self._took_any) + SLOT_SLACK
        try:
            turn = self._turn(path, length, gap)
        except _ZK_TROUBLE as exc:
            self._fall_back(exc)
            self._count("fallbacks")
            return time.monotonic(), None
        self._recovered()
        offset = time.monotonic() - time.time()
        start, due = turn
        if start is None:
            return None, (due or 0.0) + offset
        self._count("reservations")
        self._started(host, start)
        return start + offset, None

    def _turn(self, path: str, length: float, gap: float) -> tuple[float | None, float | None]:
        """:meth:`take_turn` in Unix time: one compare-and-set; if its answer came too late
        to start within the turn, up to :data:`_MOVES` more that move it to *now*."""
        moves = 0
        for _ in range(_RACES):
            moving = moves > 0
            known = self._recall(path)  # our own last write, if nobody wrote since
            if known is not None and known[0] > time.time() + EARLY and not moving:
                return None, known[0]  # our own turn (or a hop's slot) still holds the host
            free, version = known if known is not None else self._read(path)
            now = time.time()
            if free > now + EARLY and not moving:
                # Another consumer's turn. Everyone waiting for it would read and write the
                # node the moment it ends, and all but one write would fail: each waits a
                # few random milliseconds more, and the first one's write is usually seen.
                return None, free + random.uniform(0.0, _HERD_SPREAD)
            with self._lock:
                lead = self._rtt  # the write's round trip, as lately measured: start then
            start = now + lead if moving else max(now + lead, free)
            after = start + length
            try:
                written = self._write(path, after, version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                self._forget(path)
                self._count("races")
                moves = 0  # a back-off or another consumer came in between: as new
                continue
            answered = time.time()
            with self._lock:
                self._rtt = min(_LEAD_CAP, 0.7 * self._rtt + 0.3 * (answered - now))
            self._remember(path, (after, written))
            if answered <= after - gap:
                return max(start, answered), None
            if moves == _MOVES:  # our own turn holds the host: nobody starts before it ends
                return None, after
            moves += 1
            self._count("moves")
        raise KazooException(f"{_RACES} lost races for {path}")

    def _read(self, path: str) -> tuple[float, int | None]:
        try:
            data, stat = self.zk.get(path)
        except NoNodeError:
            return -math.inf, None
        return _time(data, path, stat), stat.version

    def _write(self, path: str, after: float, version: int | None) -> int:
        """Write the node's next free time conditionally (create when ``version`` is None);
        returns the new version."""
        value = f"{after:.6f}".encode()
        if version is None:
            self.zk.create(path, value)
            written = 0
        else:
            written = self.zk.set(path, value, version=version).version
        self._count("writes")
        return written

    def _started(self, host: str, start: float) -> None:
        with self._lock:
            self._starts[host] = start
            self._starts.move_to_end(host)
            if len(self._starts) > _KNOWN:  # hosts whose requests were never reported done
                self._starts.popitem(last=False)

    def request_done(self, host: str) -> None:
        """A request this consumer started for ``host`` is over: the time since the latest
        turn or slot of the host that has come (a late start counts as response time: the
        estimate errs long) lengthens this consumer's next turns of the host."""
        now = time.time()
        with self._lock:
            start = self._starts.get(host)
            if start is None or start > now:
                return
            del self._starts[host]
            took = min(now - start, self.max_delay)
            self._took[host] = took
            self._took_any = took if not self._took_any else 0.9 * self._took_any + 0.1 * took
            self._took.move_to_end(host)
            if len(self._took) > _KNOWN:
                self._took.popitem(last=False)

    def _lead(self, host: str, run: _Run) -> None:
        """Reserve ``run``'s slots in one compare-and-set, then hand the host over to the
        reservations that queued meanwhile (or let it go)."""
        with self._lock:
            if self._next.get(host) is run:
                del self._next[host]  # from here on, newcomers queue for the next run
            size = run.size
        gap = self._gap(host)
        with self._lock:
            took = self._took.get(host, self._took_any)
        # slots a response time apart beyond the gap, as the gate will start them, and the
        # slack within which the gate starts a request after its slot (or gives it up)
        run.gap = gap + took + SLOT_SLACK
        try:
            run.start = self._advance(host, lambda now, free: max(now, free), run.gap * size)
            run.size_written = size
            self._recovered()
            self._count("reservations", size)
        except BaseException as exc:  # the run's waiters fall back; ZooKeeper trouble or not
            run.error = exc
            if not isinstance(exc, _ZK_TROUBLE):
                raise
        finally:
            run.done.set()
            with self._lock:
                nxt = self._next.get(host)
                if nxt is None:
                    self._running.discard(host)
            if nxt is not None:
                nxt.turn.set()

    def back_off(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        self._local.back_off(host, seconds)
        until = time.time() + min(seconds, MAX_BACK_OFF)
        try:
            # Never shortens a wait already there: the new time is the later of the two.
            self._advance(host, lambda _now, free: max(free, until), 0.0)
        except _ZK_TROUBLE as exc:
            self._fall_back(exc)

    def set_min_delay(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._local.set_min_delay(host, seconds)
        with self._lock:
            seconds = min(seconds, self.max_delay)
            if seconds > self.delay:
                self._min_delay[host] = seconds
            else:
                self._min_delay.pop(host, None)

    # -- housekeeping -------------------------------------------------------------------
    def prune(self, idle: float = 300.0) -> int:
        """Delete the nodes of hosts whose next slot passed more than ``idle`` seconds ago
        (a node written meanwhile is kept: the delete is conditional on its version).
        Returns how many were deleted."""
        horizon = time.time() - idle
        stale = [slot for slot in read_slots(self.zk, self.path) if slot.time < horizon]
        deleted = 0
        dels = [self.zk.delete_async(f"{self.path}/{slot.node}", version=slot.version)
                for slot in stale]
        for res in dels:
            try:
                self.zk.answer(res)
                deleted += 1
            except (BadVersionError, NoNodeError):
                pass  # reserved meanwhile, or pruned by another consumer
        return deleted

    def start_pruning(self, every: float = 300.0) -> ClusterPoliteness:
        """Prune in a daemon thread every ``every`` seconds until :meth:`stop`."""
        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    if deleted := self.prune(idle=every):
                        log.info("politeness.pruned", hosts=deleted)
                except _ZK_TROUBLE as exc:
                    log.info("politeness.prune_skipped", error=repr(exc))

        threading.Thread(target=loop, name="host-pruner", daemon=True).start()
        return self

    def snapshot(self) -> dict[str, int]:
        """The counts since start (a copy): reservations, writes, races, moves, fallbacks."""
        with self._lock:
            return dict(self.counts)

    def stop(self) -> None:
        """Stop pruning; log ``politeness.stats`` (the counts since start)."""
        self._stop.set()
        with self._lock:
            counts = dict(self.counts)
        log.info("politeness.stats", **counts)

    @staticmethod
    def host_of_node(name: str) -> str:
        """The host a node under ``<root>/hosts`` is for."""
        return unquote(name)

    # -- internals ----------------------------------------------------------------------
    def _recall(self, path: str) -> tuple[float, int] | None:
        with self._lock:
            return self._known.get(path)

    def _remember(self, path: str, known: tuple[float, int]) -> None:
        with self._lock:
            self._known[path] = known
            self._known.move_to_end(path)
            if len(self._known) > _KNOWN:
                self._known.popitem(last=False)

    def _forget(self, path: str) -> None:
        with self._lock:
            self._known.pop(path, None)

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def _gap(self, host: str) -> float:
        with self._lock:
            return self._min_delay.get(host, self.delay)

    def _advance(self, host: str, start_of: Callable[[float, float], float], gap: float
                 ) -> float:
        """Compare-and-set the host's time to ``start_of(now, current) + gap``; returns the
        start. ``start_of`` is ``(now, current) -> start``."""
        path = f"{self.path}/{quote(host, safe='')}"
        for _ in range(_RACES):
            known = self._recall(path)  # what we wrote last: try it without reading first
            free, version = known if known is not None else self._read(path)
            start = start_of(time.time(), free)
            after = max(start + gap, free)
            try:
                self._remember(path, (after, self._write(path, after, version)))
                return float(start)
            except (BadVersionError, NodeExistsError, NoNodeError):
                self._forget(path)
                self._count("races")
                continue  # another consumer moved it (or pruned it) first: read again
        raise KazooException(f"{_RACES} lost races for host {host}")

    def _fall_back(self, exc: BaseException) -> None:
        with self._lock:
            first, self._degraded = not self._degraded, True
        if first:
            log.warning("politeness.local_only", error=repr(exc),
                        note="ZooKeeper unreachable: host gaps hold within this consumer only")

    def _recovered(self) -> None:
        if self._degraded:
            with self._lock:
                was, self._degraded = self._degraded, False
            if was:
                log.info("politeness.cluster_again")


@dataclass
class _Run:
    """Reservations for one host served by one compare-and-set: ``size`` consecutive slots
    from ``start`` (Unix time), ``gap`` apart. ``turn`` is set when the run may go (the
    compare-and-set before it is over), ``done`` when ``start`` or ``error`` is known."""

    size: int = 0
    size_written: int = 0  # slots the compare-and-set reserved (``size`` when it went)
    start: float | None = None
    gap: float = 0.0
    error: BaseException | None = None
    turn: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class HostSlot:
    """One ``<root>/hosts/<node>``: the host, its next slot (Unix time; -inf when the data
    is not a time) and the node's version (for a conditional delete)."""

    node: str
    host: str
    time: float
    version: int


def read_slots(zk: ZkClient, path: str) -> list[HostSlot]:
    """Every host's slot under ``path`` (``<root>/hosts``), read with multiRead in chunks;
    a node deleted between the listing and the read is left out."""
    try:
        names = zk.get_children(path)
    except NoNodeError:
        return []
    slots: list[HostSlot] = []
    for i in range(0, len(names), _PRUNE_CHUNK):
        chunk = names[i:i + _PRUNE_CHUNK]
        for name, res in zip(chunk, zk.get_many([f"{path}/{n}" for n in chunk]), strict=True):
            if not isinstance(res, Exception):
                slots.append(HostSlot(name, unquote(name), _time(res[0]), res[1].version))
    return slots


def _time(data: bytes | None, path: str | None = None, stat: Stat | None = None) -> float:
    """The slot in a host node (untrusted, SPEC §2): a Unix time no further than
    ``MAX_AHEAD`` from now. Anything else is no constraint (-inf) -- the next reservation
    overwrites it -- and, given ``path``, a warning once per node version."""
    why = None
    if not data or len(data) > 64:
        why = "not a time" if data else None
        value = -math.inf
    else:
        try:
            value = float(data)
        except ValueError:
            value, why = -math.inf, "not a time"
        if not math.isfinite(value) or value > time.time() + MAX_AHEAD:
            value, why = -math.inf, f"not a time within {MAX_AHEAD:g} s"
    if why is not None and path is not None:
        untrusted.MALFORMED.warn(path, untrusted.version_of(stat), why)
    return value
