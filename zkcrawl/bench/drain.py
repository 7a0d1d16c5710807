"""``zkcrawl bench queue``: the consumer's queue against its baselines, in one run.

Cases (same server, a fresh root per case):

* ``seed_take``      the seed's take: getChildren + sort + getData + delete, every time
* ``kazoo_locking``  kazoo's LockingQueue get + consume (a KazooClient of its own)
* ``zkcrawl_alo``    what a consumer runs: :class:`~zkcrawl.consumer.owned_queue.OwnedQueue`
  at-least-once -- claim, mark started, complete, settled in checkpoints -- over items of
  ``HOSTS`` hosts offered into their partitions (``zkcrawl_amo``: at-most-once)
* ``zkcrawl_alo_4proc`` four consumer processes, each owning its share of the partitions
* ``offer_single`` / ``offer_batched``  one create per round trip vs the ingress's offers

The O(n) baselines are timed on samples of takes at depth N and N/10 (never more than the
queue holds); the zkcrawl cases drain N items, then N/10: items per second over the whole
drain, per-take time over its steady state (:func:`_steady_ms`). Every node lives under one
run node ``<root>/run-<hex>``, removed on exit, Ctrl-C included (the worker processes, in
sessions of their own, are stopped first).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from zkcrawl import logs
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.consumer.owned_queue import OwnedQueue
from zkcrawl.consumer.ownership import Ownership
from zkcrawl.queue.claims import AT_LEAST_ONCE, AT_MOST_ONCE, Claimed
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_queue import PartitionQueue
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS
from zkcrawl.zk import NoNodeError, NotEmptyError, ZkClient
from zkcrawl.zk.client import gather
from zkcrawl.zk.kazoo_baseline import BaselineQueue, KazooBaseline

SAMPLE = 300
DEFAULT_ROOT = "/zkcrawl-bench"
HOSTS = 1000  # the items' hosts (never fetched): spread over the partitions, as in a crawl


def _items(n: int) -> list[Item]:
    return [Item(url=f"http://h{i % HOSTS}.bench.test/a/{i}.html", producer="bench")
            for i in range(n)]


def _fill(zk: ZkClient, root: str, n: int) -> None:
    """``n`` items into the ingress ``<root>/queue`` (the baselines take from there)."""
    IngressQueue(zk, root).offer_many(_items(n))


def _fill_partitions(zk: ZkClient, root: str, n: int) -> None:
    """``n`` items into their partitions, packed in batches, as the producer offers them."""
    PartitionQueue(zk, root, DEFAULT_PARTITIONS, consumer="bench").offer(_items(n))


def owned_queue(zk: ZkClient, root: str, consumer: str, delivery: str = AT_LEAST_ONCE, *,
                partitions: int = DEFAULT_PARTITIONS) -> OwnedQueue:
    """A registered consumer's queue over the partitions it owns (no gap: no HTTP here)."""
    layout = Layout.of(root)
    zk.ensure_path(layout.consumers)
    zk.create(layout.consumer(consumer), b"{}", ephemeral=True)
    ownership = Ownership(zk, root, consumer, 0.0, partitions=partitions).start()
    return OwnedQueue(zk, root, consumer, ownership, delivery=delivery)


def _seed_take(zk: ZkClient, path: str) -> bytes | None:
    """Curator SimpleDistributedQueue.take(), as the seed uses it."""
    while True:
        nodes = sorted(zk.get_children(path))
        if not nodes:
            return None
        for node in nodes:
            try:
                data, _ = zk.get(f"{path}/{node}")
                zk.delete(f"{path}/{node}")
                return data
            except Exception:  # NoNode: another consumer won; next one
                continue


def _sampled(take: Callable[[], object], n: int, reset: Callable[[int], None]) -> dict[str, float]:
    """Milliseconds per take over at most SAMPLE takes at depth n, then at depth n/10."""
    per_take, takes = [], 0
    for depth in (max(1, n), max(1, n // 10)):
        reset(depth)
        sample = min(SAMPLE, depth)  # never more takes than items: an empty get() waits
        t0 = time.perf_counter()
        for _ in range(sample):
            take()
        per_take.append((time.perf_counter() - t0) / sample * 1000)
        takes += sample
    at_n, at_n10 = per_take
    mean = (at_n + at_n10) / 2
    return {"items_per_s": round(1000 / mean, 1), "ms_per_take_at_n": round(at_n, 3),
            "ms_per_take_at_n_10": round(at_n10, 3), "wasted_requests_per_item": 0.0,
            "sampled_takes": takes}


def _case_root(base: str) -> str:
    return f"{base}/case-{uuid.uuid4().hex[:8]}"


def bench_seed(zk: ZkClient, n: int, base: str = "") -> dict[str, float]:
    root = _case_root(base)
    path = Layout.of(root).queue

    def reset(depth: int) -> None:
        zk.delete(root, recursive=True) if zk.exists(root) else None
        _fill(zk, root, depth)

    res = _sampled(lambda: _seed_take(zk, path), n, reset)
    zk.delete(root, recursive=True)
    return res


def bench_kazoo(zk: ZkClient, n: int, base: str = "") -> dict[str, float]:
    # kazoo's own recipe is the baseline, so it runs on a plain KazooClient of its own
    # (zkcrawl.zk.kazoo_baseline), on the same server as the other cases.
    raw = KazooBaseline(zk.hosts, session_timeout=30)
    raw.start(timeout=zk.zk_timeout)
    root = _case_root(base)
    holder: dict[str, BaselineQueue] = {}

    def reset(depth: int) -> None:
        if zk.exists(root):
            zk.delete(root, recursive=True)
        q = raw.locking_queue(root)
        for i in range(0, depth, 1000):
            chunk = range(i, min(depth, i + 1000))
            q.put_all([f"http://127.0.0.1:9/a/{j}".encode() for j in chunk])
        holder["q"] = q

    def take() -> None:
        q = holder["q"]
        q.get(timeout=5)
        q.consume()

    try:
        res = _sampled(take, n, reset)
        zk.delete(root, recursive=True)
    finally:
        raw.close()
    return res


def drain(q: OwnedQueue, n: int, idle_timeout: float = 2.0, stop_when_empty: bool = False,
          progress: list[tuple[float, int]] | None = None) -> int:
    """Claim, mark and complete like the consumer does: the claiming thread marks what it
    claimed (an item starts once its mark is written: ``on_marked``), another thread
    completes, so the round trips overlap; returns once every completion is checkpointed.
    ``progress`` gets ``(perf_counter, items claimed so far)`` after every claim."""
    completer = _Completer(q)
    q.on_marked = completer.put
    completer.start()
    done = 0
    try:
        while done < n:
            got = q.claim(500, timeout=idle_timeout)
            if not got:
                if not stop_when_empty or q.depth() == 0:
                    break
                continue
            completer.put([c for c in got if q.mark(c)])  # the others come via on_marked
            done += len(got)
            if progress is not None:
                progress.append((time.perf_counter(), done))
    except BaseException:
        completer.finish(done, timeout=0.0)  # Ctrl-C: no wait for what is in flight
        raise
    completer.finish(done)
    _await_settled(q)
    return done


class _Completer(threading.Thread):
    """Completes what it is handed, a group at a time (the consumer's committer part)."""

    def __init__(self, q: OwnedQueue) -> None:
        super().__init__(name="completer", daemon=True)
        self.q = q
        self.ready: queue.Queue[list[Claimed] | None] = queue.Queue()
        self.completed = 0
        self.error: BaseException | None = None
        self._progress = threading.Condition()

    def put(self, claimed: Sequence[Claimed]) -> None:
        if claimed:
            self.ready.put(list(claimed))

    def run(self) -> None:
        while (got := self.ready.get()) is not None:
            while not self.ready.empty():  # what came meanwhile: one group
                more = self.ready.get()
                if more is None:
                    self.ready.put(None)
                    break
                got.extend(more)
            try:
                self.q.complete(got)
            except BaseException as exc:  # raised by finish()
                self.error = exc
            with self._progress:
                self.completed += len(got)
                self._progress.notify_all()

    def finish(self, expected: int, timeout: float = 60.0) -> None:
        """Once ``expected`` items are completed (their marks may come later), or
        ``timeout``: stop, and raise what a completion raised."""
        with self._progress:
            self._progress.wait_for(lambda: self.completed >= expected or self.error is not None,
                                    timeout)
        self.ready.put(None)
        self.join()
        if self.error is not None:
            raise self.error


def _await_settled(q: OwnedQueue, timeout: float = 60.0) -> None:
    """Until every completion is in a checkpoint (none held), bounded."""
    deadline = time.monotonic() + timeout
    while q.held and time.monotonic() < deadline:
        time.sleep(0.01)  # the checkpoint thread writes within FLUSH_S; no event to watch


def _drain_from(zk: ZkClient, n: int, delivery: str, base: str = ""
                ) -> tuple[float, int, float]:
    """(seconds, items, ms per take in the steady state) of one drain from depth ``n``."""
    root = _case_root(base)
    _fill_partitions(zk, root, n)
    q = owned_queue(zk, root, "solo", delivery)
    progress: list[tuple[float, int]] = []
    try:
        t0 = time.perf_counter()
        done = drain(q, n, progress=progress)
        elapsed = time.perf_counter() - t0
    except BaseException:  # Ctrl-C: the run node goes anyway, so a stop need not be clean
        _close_within(q, INTERRUPTED_CLOSE_S)
        raise
    q.close()
    zk.delete(root, recursive=True)
    return elapsed, done, _steady_ms(progress, elapsed / max(done, 1) * 1000)


INTERRUPTED_CLOSE_S = 5.0  # an interrupted case's queue may take this long to close


def _close_within(q: OwnedQueue, timeout: float) -> None:
    """Close ``q`` on a daemon thread, waiting at most ``timeout`` s: an interrupt may have
    struck the queue's caller anywhere, and the process is about to exit."""
    closer = threading.Thread(target=q.close, name="bench-close", daemon=True)
    closer.start()
    closer.join(timeout)


def _steady_ms(progress: list[tuple[float, int]], whole: float) -> float:
    """Milliseconds per take from the claim that passed 10 % of the drain to the one that
    passed 90 %: the take itself, without what a drain pays once (taking and listing the
    partitions, the last checkpoint). ``whole`` when the drain had too few claims."""
    if not progress:
        return whole
    total = progress[-1][1]
    lo = next(p for p in progress if p[1] >= total * 0.1)
    hi = next(p for p in progress if p[1] >= total * 0.9)
    if hi[1] <= lo[1]:
        return whole
    return (hi[0] - lo[0]) / (hi[1] - lo[1]) * 1000


def bench_owned(zk: ZkClient, n: int, delivery: str, base: str = "") -> dict[str, Any]:
    """A whole drain from depth N, then a whole drain from depth N/10.

    ``items_per_s``: the drain from N, claim to checkpointed settle, everything included.
    Per-take times: each drain's steady state (:func:`_steady_ms`) -- O(1) takes give the
    same time at both depths; the seed's O(n) take is ~depth-proportional. No request is
    wasted on a race: one owner per partition (``wasted_requests_per_item`` is None)."""
    elapsed, done, at_n = _drain_from(zk, n, delivery, base)
    _, _, at_n_10 = _drain_from(zk, max(1, n // 10), delivery, base)
    return {"items_per_s": round(done / elapsed, 1), "ms_per_take_at_n": round(at_n, 4),
            "ms_per_take_at_n_10": round(at_n_10, 4), "wasted_requests_per_item": None,
            "items": done}


def bench_procs(zk: ZkClient, n: int, procs: int = 4, base: str = "") -> dict[str, Any]:
    """``procs`` worker processes drain one queue; each runs in a session of its own (the
    terminal's Ctrl-C reaches only the parent, which stops them: none is left behind)."""
    root = _case_root(base)
    _fill_partitions(zk, root, n)
    go = f"{root}/go"
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    children: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(procs):
            children.append(subprocess.Popen(
                [sys.executable, "-m", "zkcrawl.bench.drain", "--worker", zk.hosts, root,
                 f"w{i}", str(procs)], stdout=subprocess.PIPE, env=env,
                start_new_session=True))
        _await_children(zk, Layout.of(root).consumers, procs, children)
        zk.create(go, b"")
        outs = [json.loads(c.communicate(timeout=600)[0]) for c in children]
        leftover = PartitionQueue(zk, root, DEFAULT_PARTITIONS).depth()  # batches left
        zk.delete(root, recursive=True)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
    total = sum(o["items"] for o in outs)
    span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    fair = n / procs
    return {"items_per_s": round(total / span, 1), "wasted_requests_per_item": None,
            "per_consumer": [o["items"] for o in outs],
            "max_share_vs_fair": round(max(o["items"] for o in outs) / fair, 3),
            "items": total, "left_in_queue": leftover,
            "ms_per_take_at_n": None, "ms_per_take_at_n_10": None}


def _await_children(zk: ZkClient, path: str, want: int,
                    children: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if zk.exists(path) and len(zk.get_children(path)) >= want:
            return
        if any(c.poll() is not None for c in children):
            raise RuntimeError("a bench worker died before starting")
        time.sleep(0.05)  # worker start-up has no event we can watch cheaply; bounded
    raise RuntimeError("bench workers did not register")


def _pythonpath() -> str:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])


def _worker(hosts: str, root: str, wid: str, _procs: str) -> None:
    """One bench consumer process: register, wait for the go node, own its share of the
    partitions, drain until nothing is queued anywhere, report (stdout: one JSON line)."""
    logs.configure(level="warning")  # to stderr
    zk = ZkClient(hosts, session_timeout=10).connect()
    layout = Layout.of(root)
    zk.create(layout.consumer(wid), b"{}", ephemeral=True, makepath=True)
    go = threading.Event()
    if zk.exists(f"{root}/go", watch=lambda _e: go.set()):
        go.set()
    go.wait(60)
    ownership = Ownership(zk, root, wid, 0.0, partitions=DEFAULT_PARTITIONS).start()
    q = OwnedQueue(zk, root, wid, ownership)
    start = time.time()
    done = drain(q, 1 << 62, idle_timeout=0.5, stop_when_empty=True)
    end = time.time()
    q.close()
    print(json.dumps({"items": done, "start": start, "end": end}))
    zk.close()


def bench_offers(zk: ZkClient, n: int, base: str = ""
                 ) -> tuple[dict[str, float], dict[str, float]]:
    root = _case_root(base)
    zk.ensure_path(Layout.of(root).queue)
    sample = min(n, 3000)
    data = [Item(url=f"http://127.0.0.1:9/s/{i}").encode() for i in range(sample)]
    t0 = time.perf_counter()
    for d in data:
        zk.create(Layout.of(root).item_prefix, d, sequence=True)
    single = sample / (time.perf_counter() - t0)
    zk.delete(root, recursive=True)
    q = IngressQueue(zk, root)
    items = _items(n)
    t0 = time.perf_counter()
    q.offer_many(items)
    batched = n / (time.perf_counter() - t0)
    zk.delete(root, recursive=True)
    return ({"items_per_s": round(single, 1), "sampled": sample},
            {"items_per_s": round(batched, 1), "items": n})


def run_bench(hosts: str | None, n: int = 20_000, root: str = DEFAULT_ROOT
              ) -> dict[str, Any]:
    """Run every case under ``<root>/run-<hex>``; starts a throwaway local ZooKeeper when
    ``hosts`` is None. The run node is removed however the run ends (Ctrl-C included)."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-") as tmp:
        server = None
        if hosts is None:
            server = ZkServer(tmp, heap_mb=512).start(wait=60)
            hosts = server.hosts
        try:
            zk = ZkClient(hosts, session_timeout=30).connect()
            made_root = zk.exists(root) is None
            base = f"{root.rstrip('/')}/run-{uuid.uuid4().hex[:8]}"
            try:
                zk.ensure_path(base)
                out = _cases(zk, n, base)
            finally:
                _remove(zk, base, root if made_root else None)
                zk.close()
        finally:
            if server is not None:
                server.stop()
    out["ratios"] = _ratios(out)
    return out


def _cases(zk: ZkClient, n: int, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n, "zk": zk.hosts, "root": base.rsplit("/", 1)[0] or "/"}
    bench_owned(zk, min(n, 2000), AT_LEAST_ONCE, base=base)  # warm-up: JIT, caches
    out["offer_single"], out["offer_batched"] = bench_offers(zk, n, base)
    out["seed_take"] = bench_seed(zk, n, base)
    out["kazoo_locking"] = bench_kazoo(zk, n, base)
    out["zkcrawl_alo"] = bench_owned(zk, n, AT_LEAST_ONCE, base=base)
    out["zkcrawl_amo"] = bench_owned(zk, n, AT_MOST_ONCE, base=base)
    out["zkcrawl_alo_4proc"] = bench_procs(zk, n, 4, base)
    return out


_REMOVE_TRIES = 20


def _remove(zk: ZkClient, base: str, root: str | None) -> None:
    """Delete the run node, and ``root`` when this run created it and it is empty now.
    A Ctrl-C leaves the case's pipelined requests in flight: one may create a node after the
    recursive delete listed its parent (NotEmpty), so the delete is tried again, a bounded
    number of times, until those requests have been answered."""
    for _ in range(_REMOVE_TRIES):
        try:
            if zk.exists(base):
                _delete_tree(zk, base)
            break
        except (NotEmptyError, NoNodeError):
            time.sleep(0.1)  # the answers of the requests still in flight; bounded
    if root not in (None, "/") and zk.exists(root) and not zk.get_children(root):
        zk.delete(root)


_DELETE_WINDOW = 1000  # deletes in flight at once


def _delete_tree(zk: ZkClient, path: str) -> None:
    """``path`` and everything below it, leaves pipelined ``_DELETE_WINDOW`` at a time
    (kazoo's recursive delete waits for each answer: 20,000 items took over a minute of a
    Ctrl-C on a loaded machine). A node gone meanwhile is fine; NotEmpty (a create still in
    flight) is raised for the caller to try again."""
    children = zk.get_children(path)
    leaves = []
    for name in children:
        child = f"{path}/{name}"
        stat = zk.exists(child) if len(children) < _DELETE_WINDOW else None
        if stat is not None and stat.numChildren:
            _delete_tree(zk, child)
        else:
            leaves.append(child)
    for i in range(0, len(leaves), _DELETE_WINDOW):
        done = gather([zk.delete_async(c) for c in leaves[i:i + _DELETE_WINDOW]], zk.zk_timeout)
        for res in done:
            if isinstance(res, NotEmptyError):
                _delete_tree(zk, leaves[i + done.index(res)])
            elif isinstance(res, Exception) and not isinstance(res, NoNodeError):
                raise res
    zk.delete(path)


def _ratios(out: dict[str, Any]) -> dict[str, float]:
    alo = out["zkcrawl_alo"]

    def r(a: float, b: float) -> float:
        return round(a / b, 2) if b else 0.0

    return {"alo_vs_seed": r(alo["items_per_s"], out["seed_take"]["items_per_s"]),
            "alo_vs_kazoo": r(alo["items_per_s"], out["kazoo_locking"]["items_per_s"]),
            "alo_take_n_vs_n10": r(alo["ms_per_take_at_n"], alo["ms_per_take_at_n_10"]),
            "amo_vs_alo": r(out["zkcrawl_amo"]["items_per_s"], alo["items_per_s"]),
            "batched_vs_single_offer": r(out["offer_batched"]["items_per_s"],
                                         out["offer_single"]["items_per_s"])}


def render(out: dict[str, Any]) -> str:
    rows = [f"zkcrawl bench queue  N={out['n']}  zk={out['zk']}",
            f"{'case':<20}{'items/s':>12}{'ms/take@N':>12}{'ms/take@N/10':>14}{'wasted/item':>13}"]
    for key in ("seed_take", "kazoo_locking", "zkcrawl_alo", "zkcrawl_amo",
                "zkcrawl_alo_4proc", "offer_single", "offer_batched"):
        c = out[key]
        rows.append(f"{key:<20}{c['items_per_s']:>12,.0f}{_fmt(c.get('ms_per_take_at_n')):>12}"
                    f"{_fmt(c.get('ms_per_take_at_n_10')):>14}"
                    f"{_fmt(c.get('wasted_requests_per_item')):>13}")
    p = out["zkcrawl_alo_4proc"]
    rows.append(f"4 processes: per consumer {p['per_consumer']}, max share "
                f"{p['max_share_vs_fair']}x fair, left in queue {p['left_in_queue']}")
    rows.append("ratios: " + ", ".join(f"{k}={v}" for k, v in out["ratios"].items()))
    return "\n".join(rows)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--worker":
    try:
        _worker(*sys.argv[2:6])
    except KeyboardInterrupt:  # stopped with the run: no traceback
        sys.exit(130)
