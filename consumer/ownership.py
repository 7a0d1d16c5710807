"""Hosts have owners: :class:`Ownership`, the consumer's share of the partitions (SPEC §3,
politeness is the owner's; docs/concepts/frontier.md).

Every host belongs to one of ``P`` partitions (:func:`zkcrawl.queue.partitions.partition_of`)
and every partition to one live consumer, by rendezvous hashing over the members of
``<root>/consumers`` (:func:`zkcrawl.queue.partitions.assign`): every consumer computes the
same answer alone, so a host's politeness lives in its owner's memory -- **no ZooKeeper
write per request**. Guarantees (in full: :class:`Ownership`):

* **sticky**: a join or a leave moves only the partitions it must;
* **the gap holds across a hand-over** (:meth:`Ownership.not_before`), and so does a
  back-off in force (the host state a take brings);
* **nothing while in doubt**: a consumer owns nothing while its registration is missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from zkcrawl.logs import get_logger
from zkcrawl.politeness.gate import HostGate, hold_of
from zkcrawl.queue import partition_state as ps
from zkcrawl.queue import untrusted
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_offers import recorded_partitions as recorded_partitions  # re-export
from zkcrawl.queue.partition_offers import root_changed, root_path
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS, assign, decode_root, partition_of
from zkcrawl.zk import KazooException, KazooTimeoutError, NoNodeError
from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.types import ZkState

log = get_logger(__name__)

# How long the old owner of a partition may take to see that it lost it: the member list's
# watch reaches every consumer within this on a working ensemble (a consumer that hears
# nothing from ZooKeeper for 2/3 of its session starts nothing at all).
HANDOVER_S = 2.0
_HOSTS_CACHED = 100_000  # host -> partition, memoised (BLAKE2b is cheap, not free)
HOSTS_SHOWN = 1024  # partitions whose host figures a status node carries at most (~12 KB)


class Ownership:
    """This consumer's partitions, from the live member list.

    * **Sticky**: a consumer that joins takes only the partitions it now wins (about ``P / n``);
      one that leaves hands over only its own. The others keep fetching meanwhile.
    * **The gap holds across a hand-over**: a partition this consumer gains is fetched no sooner
      than ``--domain-delay + HANDOVER_S`` after it learned of the gain (:meth:`not_before`):
      the old owner stops starting requests to it as soon as it sees the same change, and a
      request it had started began before that. A partition's first owner ever (its take at
      epoch 1) starts its hosts at once: nobody ever started a request to them. A consumer
      that loses a partition starts nothing more in it (:meth:`owns` is asked before every
      start) and gives back its items that had not started.
    * **Nothing while in doubt**: a consumer owns nothing while its own registration is not in
      the member list (the others cannot see it, so they own its share), and after its session is
      lost it owns nothing until its registration is back; every partition is then gained afresh,
      with the hand-over wait.
    * Reads only: membership is the registration every consumer already keeps, read again by
      the claim loop when its watch fires (:meth:`refresh`).

    * **A back-off in force survives the hand-over**: a partition taken brings the host state its
      previous owners checkpointed (:mod:`zkcrawl.queue.partition_state`, written by
      :mod:`zkcrawl.consumer.owned_queue`); :meth:`taken` seeds :meth:`not_before` with it, so a
      host that said ``Retry-After: 120`` (or was down, or asks a ``Crawl-delay`` above the gap) is
      asked again no sooner than its hold ends (a Crawl-delay: that long after the take), and
      never sooner than one gap after the take. The holds are wall-clock times: the consumers'
      clocks are assumed to agree (NTP); a skew adds to or cuts from the wait, never past
      :data:`~zkcrawl.queue.partition_state.HOLD_CAP`.

    Limits: a host's failures in a row are not handed over (the new owner's next failure
    backs off from the bottom again, after the inherited hold); a redirect's target host is
    another partition's and its back-off is not kept. P is recorded in the root by the first
    consumer (:func:`recorded_partitions`, ``--partitions``) and fixed: a consumer watches the
    root, and when its P changes (edited by hand) or becomes unreadable it stops with one line
    and exit 2 (:meth:`refresh`) -- consumers that disagree on P would each own a host.
    """

    def __init__(self, zk: ZkClient, root: str, me: str, gap: float, *,
                 partitions: int = DEFAULT_PARTITIONS, recorded: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.zk = zk
        self.me = me
        self.partitions = partitions
        # ``partitions`` is what the root recorded (recorded_partitions): any other reading
        # of the root is an edit (_check_root)
        self.recorded = recorded
        self.gap = gap
        self.wait = gap + HANDOVER_S
        self._taken: dict[int, float] = {}  # partition -> when its owner node became ours
        # partitions whose take was the first ever (epoch 1): no request was ever started to
        # their hosts, which start at once
        self._first: set[int] = set()
        self._clock = clock
        self._path = Layout.of(root).consumers
        self._lock = threading.Lock()
        self._owned: dict[int, float] = {}  # partition -> monotonic time it was gained
        self._members: tuple[str, ...] = ()
        self._in_doubt = True  # nothing owned until the member list has been read
        self._part: dict[str, int] = {}
        self.generation = 0  # bumped on every change of the owned set
        self.handovers = 0  # partitions gained or lost after the first assignment
        self.rebalances = 0  # changes of the owned set after the first assignment
        self.partitions_taken = 0  # owner nodes taken (a partition's hand-over done)
        self.holds_inherited = 0  # hosts held on a take by what the previous owner kept
        self.states_ignored = 0  # takes whose host state was malformed, whole or in part
        self._seeded: dict[int, dict[str, float]] = {}  # p -> host -> monotonic not-before
        self._gate: HostGate | None = None
        # per owned partition (active hosts, backed-off hosts): zkcrawl.consumer.owned_queue's
        self.figures: Callable[[], dict[int, tuple[int, int]]] = dict
        self._on_change: Callable[[], None] = lambda: None
        self._dirty = threading.Event()
        self._dirty.set()
        self._root = root_path(root)
        self._root_dirty = threading.Event()  # the root's data to read again (its P)
        self._root_dirty.set()
        # the first reading: the reference when ``partitions`` was not read from the root
        self._root_read: tuple[int | None, str | None] | None = None
        self._foreign: set[str] = set()  # member names warned about (not a consumer)

    def start(self, on_change: Callable[[], None] | None = None) -> Ownership:
        if on_change is not None:
            self._on_change = on_change
        self.zk.add_listener(self._on_state)
        self.zk.ensure_path(self._path)
        self.refresh()
        return self

    def stop(self) -> None:
        self.zk.remove_listener(self._on_state)

    def refresh(self) -> None:
        """Read the member list again if it changed (a watch fired, or the connection came
        back): the claim loop calls this every tick. Bounded by --zk-timeout; a failed read
        is tried again at the next tick. (Not kazoo's ChildrenWatch: its retries run on
        kazoo's thread and end in a logged traceback when the client closes meanwhile.)"""
        if not self.zk.connected:
            return  # away: the read would hold the claim loop; CONNECTED marks it dirty
        if self._root_dirty.is_set():
            self._check_root()
        if not self._dirty.is_set():
            return
        self._dirty.clear()
        try:
            children = self.zk.get_children(self._path, watch=self._on_watch)
            children = self._consumers(children)
        except (KazooException, KazooTimeoutError):
            self._dirty.set()
            return
        self.update(children)

    def _check_root(self) -> None:
        """The root's P read again (its watch fired, or a start or a reconnection): still the
        one this consumer owns by (or as it was at the first reading), or
        :class:`~zkcrawl.errors.UsageError` (one line, exit 2). A root deleted meanwhile, or
        no answer: nothing to tell yet."""
        self._root_dirty.clear()
        try:
            data, _stat = self.zk.get(self._root, watch=self._on_root)
        except NoNodeError:
            return
        except (KazooException, KazooTimeoutError):
            self._root_dirty.set()
            return
        p, why = decode_root(data)
        if why is None and p == self.partitions:
            return
        if self._root_read is None and not self.recorded:
            # P given, not read from the root (a test's Ownership): the first reading is the
            # reference. A consumer's P was read from the root (recorded_partitions): anything
            # else is an edit, also one made between its start and this first reading (CI
            # once ran a test into that gap).
            self._root_read = (p, why)
        if (p, why) == self._root_read:
            return
        raise root_changed(self._root, self.partitions, p, why)

    def _on_root(self, _event: object) -> None:
        self._root_dirty.set()

    def _consumers(self, children: list[str]) -> list[str]:
        """The children that are consumers: their status node is a JSON object that names
        no other id than its own (untrusted, SPEC §2; a consumer's names its id). Any other
        node there -- garbage, or another client's -- gets no share: it would never take
        its partitions, and their hosts would stall. One warning per such name."""
        out = []
        paths = [f"{self._path}/{c}" for c in children]
        for name, res in zip(children, self.zk.get_many(paths), strict=True):
            if isinstance(res, NoNodeError):
                continue  # gone since the listing
            if isinstance(res, Exception):  # unreadable (an ACL): cannot tell, a member
                out.append(name)
                continue
            doc, why = untrusted.load_json(res[0])
            if why is None and isinstance(doc, dict) and doc.get("id", name) == name:
                out.append(name)
            elif name not in self._foreign:
                self._foreign.add(name)
                log.warning("ownership.not_a_consumer", consumer=self.me, member=name[:200],
                            reason=why or "no status object of this id",
                            note="a node under consumers/ that is no consumer's status: "
                                 "given no partitions")
        return out

    # -- kazoo's thread: set flags, never block ---------------------------------------------
    def _on_watch(self, _event: object) -> None:
        self._dirty.set()

    def _on_state(self, state: str) -> bool:
        if state == ZkState.LOST:
            with self._lock:
                # Its registration went with the session: whatever it owned may be another's
                # now. Every partition is gained afresh (and waited for) once it is back.
                self._in_doubt = True
                self._owned.clear()
                self._taken.clear()
                self._first.clear()
                self._seeded.clear()
                self.generation += 1
            self._on_change()
        if state == ZkState.CONNECTED:
            self._dirty.set()  # a watch set in a lost session is gone: list again
            self._root_dirty.set()
        return False

    def update(self, children: list[str]) -> None:
        """A new member list. This consumer owns nothing while its own registration is not
        in it: the others cannot see it then, and own its share."""
        members = tuple(sorted(set(children)))
        mine = (set(assign(self.partitions, members)[self.me]) if self.me in members
                else set())
        now = self._clock()
        with self._lock:
            first = not self._members
            gained = mine - self._owned.keys()
            lost = self._owned.keys() - mine
            for p in lost:
                del self._owned[p]
                self._taken.pop(p, None)
                self._first.discard(p)
                self._seeded.pop(p, None)
            for p in gained:
                # the very first assignment of a consumer that starts with the crawl waits
                # too: another consumer may have owned these a moment ago
                self._owned[p] = now
            changed = bool(gained or lost) or self._in_doubt
            self._members, self._in_doubt = members, False
            if changed:
                self.generation += 1
                if not first:
                    self.handovers += len(gained) + len(lost)
                    self.rebalances += 1 if gained or lost else 0
        if changed:
            log.info("ownership.changed", consumer=self.me, members=len(members),
                     owned=len(mine), gained=len(gained), lost=len(lost))
            self._on_change()

    # -- anyone ---------------------------------------------------------------------------
    def partition(self, host: str) -> int:
        p = self._part.get(host)
        if p is None:
            p = partition_of(host, self.partitions)
            if len(self._part) >= _HOSTS_CACHED:
                self._part.clear()
            self._part[host] = p
        return p

    def owns(self, host: str) -> bool:
        """Is ``host`` this consumer's to fetch now? ("" -- no request -- always is.)"""
        if not host:
            return True
        return not self._in_doubt and self.partition(host) in self._owned

    def owned(self) -> frozenset[int]:
        """The partitions this consumer owns now (none while in doubt)."""
        with self._lock:
            return frozenset() if self._in_doubt else frozenset(self._owned)

    def taken(self, partition: int, at: float, state: ps.Decoded | None = None, *,
              first: bool = False) -> None:
        """The partition's owner node is ours since ``at`` (monotonic): its hosts wait one
        gap from then (the previous owner let go with nothing in flight, or its session
        ended -- after its last request began), not the hand-over wait of a mere member
        list change (:mod:`zkcrawl.consumer.owned_queue`); a host the take's ``state`` holds waits
        until its hold ends (a Crawl-delay: that long after ``at``), clamped by the
        decoder (never past ``HOLD_CAP`` from now).

        ``first``: the partition's first take ever (its node's epoch 1: every take moves its
        version on, and only owners write it) -- no consumer ever owned it, so none ever
        started a request to its hosts, and they start at once. A crawl's first pages no
        longer wait a gap (bench hosts: every host's first page waited ~1 s)."""
        seeds = self._seeds(at, state) if state is not None else {}
        if state is not None:
            self._seed_gate(state)
        with self._lock:
            self._taken[partition] = at
            if first and not seeds:
                self._first.add(partition)
            else:
                self._first.discard(partition)
            self.partitions_taken += 1
            self.holds_inherited += len(seeds)
            self.states_ignored += bool(state is not None
                                        and (state.error is not None or state.dropped))
            if seeds:
                self._seeded[partition] = seeds
            else:
                self._seeded.pop(partition, None)

    def _seeds(self, at: float, state: ps.Decoded) -> dict[str, float]:
        now, wall = self._clock(), time.time()
        seeds: dict[str, float] = {}
        for h in state.holds:
            due = at + self.gap
            if h.until:
                due = max(due, now + min(max(0.0, h.until - wall), ps.HOLD_CAP))
            if h.delay:
                due = max(due, at + h.delay)
            if due > at + self.gap:
                seeds[h.host] = due
        return seeds

    def _seed_gate(self, state: ps.Decoded) -> None:
        """The inherited back-offs (``until``) into this consumer's politeness too: every
        request to such a host waits -- a redirect hop to it included -- and its next
        checkpoint keeps them (a Crawl-delay is :meth:`not_before`'s, from the take)."""
        if self._gate is None:
            return
        wall = time.time()
        for h in state.holds:
            if h.until > wall:
                self._gate.back_off(h.host, min(h.until - wall, ps.HOLD_CAP))

    def keep_holds(self, gate: HostGate) -> None:
        """Read this consumer's politeness from ``gate`` (:meth:`hold`): what must survive a
        hand-over is checkpointed with its partition."""
        self._gate = gate

    def hold(self, host: str) -> ps.Hold | None:
        """``host``'s back-off in force in this consumer, as its partition's checkpoint keeps
        it (wall clock), or None: no back-off, a gap no longer than ``--domain-delay``, or no
        politeness to read (:meth:`keep_holds`)."""
        if self._gate is None:
            return None
        left, gap, down = hold_of(self._gate, host)
        until = time.time() + left if left > 0 else 0.0
        delay = gap if gap > self.gap else 0.0
        if not until and not delay:
            return None
        reason = ("down" if down else "retry-after") if until else "crawl-delay"
        return ps.Hold(host, until, delay, reason)

    def not_before(self, host: str) -> float:
        """The monotonic time from which this consumer may make its first request to
        ``host`` (0.0 for a host it does not own: :meth:`owns` says no first)."""
        if not host:
            return 0.0
        p = self.partition(host)
        taken = self._taken.get(p)
        if taken is not None and p in self._owned:
            if p in self._first:
                return taken
            seeded = self._seeded.get(p)
            due = seeded.get(host) if seeded else None
            return taken + self.gap if due is None else due
        gained = self._owned.get(p)
        return 0.0 if gained is None else gained + self.wait

    def snapshot(self) -> dict[str, Any]:
        """The ``ownership`` of the consumer's status node and its metrics: counts, and per
        owned partition that has any ``hosts`` ``{"<p>": [active, backed off]}`` (at most
        :data:`HOSTS_SHOWN` partitions, the most active first) with their sums."""
        figures = self.figures()
        shown = sorted(((p, a, b) for p, (a, b) in figures.items() if a or b),
                       key=lambda x: (-x[1], -x[2], x[0]))[:HOSTS_SHOWN]
        with self._lock:
            return {"members": len(self._members), "partitions": len(self._owned),
                    "handovers": self.handovers, "rebalances": self.rebalances,
                    "partitions_taken": self.partitions_taken,
                    "holds_inherited": self.holds_inherited,
                    "states_ignored": self.states_ignored,
                    "hosts_active": sum(a for a, _ in figures.values()),
                    "hosts_backed_off": sum(b for _, b in figures.values()),
                    "hosts": {str(p): [a, b] for p, a, b in sorted(shown)}}
