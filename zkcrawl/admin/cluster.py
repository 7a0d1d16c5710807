"""Cluster reads and repairs behind the admin commands (``zkcrawl status``, ``dead``, ``queue``).

* Everything here talks to ZooKeeper through a connected :class:`~zkcrawl.zk.client.ZkClient`
  and returns plain data; the command modules only parse flags and print.
* Reads are pipelined: a status of a large cluster costs a few round trips, not one per
  consumer or lease. The documents: :func:`cluster_status` (``zkcrawl status --json``, SPEC
  §4) and :func:`consumer_status`.
* Credentials never leave here: every URL (and a dead letter's error and data) returned has
  its userinfo masked (:func:`~zkcrawl.textsafe.redact_userinfo`); text output shows URLs
  through :func:`~zkcrawl.textsafe.shown_url`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from zkcrawl.admin.held import held_items
from zkcrawl.admin.partition_status import partition_status
from zkcrawl.errors import UsageError, ZkCrawlError
from zkcrawl.queue import items as item_codec
from zkcrawl.queue import untrusted
from zkcrawl.queue.claims import attempts_text
from zkcrawl.queue.control import PAUSED, RUNNING, parse_state
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.runner import connect
from zkcrawl.settings import CommonSettings
from zkcrawl.textsafe import redact_userinfo
from zkcrawl.web.urls import host_key
from zkcrawl.zk import (
    KazooException,
    Multi,
    NoNodeError,
    Stat,
    TxResult,
    WatchedEvent,
    ZkClient,
    gather,
    tx_ok,
)

# Consumer states that show a consumer is taking work (i.e. it has seen "running").
_RUNNING_STATES = ("running", "idle")
#: A consumer whose heartbeat is older than this many intervals is marked stale.
STALE_AFTER = 3
#: The heartbeat interval of a status node that does not publish one (SPEC §2: "at least
#: every 5 s").
DEFAULT_HEARTBEAT_S = 5.0


@contextlib.contextmanager
def session(settings: CommonSettings, guard: bool = True) -> Iterator[ZkClient]:
    """A connected client for one admin command (unreachable -> exit 75; a refused
    loopback port at once, terminal or not: a one-shot command has no ZooKeeper start to
    wait for); a ZooKeeper error in the middle of the command becomes one line and exit 1,
    not a traceback. ``guard``: check the root's ACLs first (``zkcrawl acl`` repairs them:
    it does not)."""
    # unreachable: one line (ZkClient holds kazoo's warnings back)
    zk = connect(settings, guard=guard, one_shot=True)
    try:
        yield zk
    except KazooException as exc:
        detail = f": {exc}" if str(exc) else ""
        raise ZkCrawlError(f"ZooKeeper error on {settings.zk}: {type(exc).__name__}{detail}"
                           ) from None
    finally:
        zk.close()


def _paths(root: str) -> dict[str, str]:
    layout = Layout.of(root)
    return {k: getattr(layout, k) for k in ("queue", "leases", "consumers", "producers", "dead",
                                            "control", "hosts", "discovered")}


def _child_count(zk: ZkClient, path: str) -> int:
    stat = zk.exists(path)
    return int(stat.numChildren) if stat is not None else 0


def _children(zk: ZkClient, path: str) -> list[str]:
    try:
        return zk.get_children(path)
    except NoNodeError:
        return []


def _read_json(zk: ZkClient, base: str, names: Sequence[str]
               ) -> list[tuple[str, dict[str, Any], Stat]]:
    """(name, JSON object or {}, stat) for each node still there, read pipelined."""
    results = gather([zk.get_async(f"{base}/{n}") for n in names], zk.zk_timeout)
    out = []
    for name, res in zip(names, results, strict=True):
        if isinstance(res, Exception):
            continue  # gone between the listing and the read: it is no longer live
        data, stat = res
        doc, why = untrusted.load_json(data or b"{}")
        if not isinstance(doc, dict):  # untrusted (SPEC §2): shown with what the stat says
            untrusted.MALFORMED.warn(f"{base}/{name}", untrusted.version_of(stat),
                                     why or "not a JSON object")
            doc = {}
        out.append((name, doc, stat))
    return out


def _age(now: float, doc: dict[str, Any], stat: Stat) -> float:
    """Seconds since the node's last heartbeat (its own clock, else the server's mtime)."""
    at = untrusted.number(doc.get("heartbeat_at"), stat.mtime / 1000.0, lo=0.0)
    return round(max(0.0, now - at), 3)


def _num(doc: dict[str, Any], key: str, default: float | None = 0) -> Any:
    """A number from an untrusted status node: finite and within ±1e15, else ``default``."""
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return value if untrusted.number(value, math.inf) != math.inf else default


def control_seen(doc: dict[str, Any]) -> str | None:
    """The control state a consumer's status node says it runs under, if it says."""
    seen = doc.get("control")
    if seen in (RUNNING, PAUSED):
        return str(seen)
    state = doc.get("state")
    if state == PAUSED:
        return PAUSED
    if state in _RUNNING_STATES:
        return RUNNING
    return None


def _consumer(now: float, name: str, doc: dict[str, Any], stat: Stat, leases: int,
              control: str) -> dict[str, Any]:
    seen = control_seen(doc)
    extra = {k: v for k, v in doc.items() if k not in ("heartbeat_at", "control")}
    processed, failed = _num(doc, "processed"), _num(doc, "failed")
    interval = untrusted.number(doc.get("heartbeat_interval_s"), DEFAULT_HEARTBEAT_S,
                                lo=0.001, hi=86400.0)
    age = _age(now, doc, stat)
    return {
        **extra,  # whatever else the consumer publishes (backlog, threads...), passed on
        "id": str(doc.get("id") or name),
        "host": doc.get("host"),
        "pid": doc.get("pid"),
        "state": doc.get("state", "unknown"),
        "processed": processed,
        "ok": max(0, processed - failed),
        "failed": failed,
        "redelivered": _num(doc, "redelivered"),  # items settled after a holder died on them
        "in_flight": _num(doc, "in_flight", leases),
        "waiting": _num(doc, "backlog", None),
        "items_per_s": _num(doc, "items_per_s", 0.0),
        "heartbeat_age_s": age,
        "heartbeat_interval_s": interval,
        "stale": age > STALE_AFTER * interval,
        "started_at": doc.get("started_at"),
        "leases": leases,
        "control_seen": seen,
        "acknowledged": seen == control,
    }


def _producer(now: float, name: str, doc: dict[str, Any], stat: Stat) -> dict[str, Any]:
    extra = {k: v for k, v in doc.items() if k not in ("heartbeat_at",)}
    return {**extra, "id": str(doc.get("id") or name), "host": doc.get("host"),
            "state": doc.get("state", "unknown"), "heartbeat_age_s": _age(now, doc, stat)}


def _oldest_age(zk: ZkClient, queue: str, names: list[str], now: float) -> float | None:
    """Age of the lowest-numbered item (znode ctime, server clock); None when empty."""
    for _, name in item_codec.sort_names(names)[:3]:  # the head may be completed meanwhile
        stat = zk.exists(f"{queue}/{name}")
        if stat is not None:
            return round(max(0.0, now - stat.ctime / 1000.0), 3)
    return None


def _leased_items(zk: ZkClient, p: dict[str, str], leases: list[tuple[str, dict[str, Any], Stat]],
                  now: float) -> list[dict[str, Any]]:
    """Each lease with its holder, age and the item's URL and host (items read pipelined; an
    item completed meanwhile, or malformed, has no URL)."""
    reads = gather([zk.get_async(f"{p['queue']}/{name}") for name, _, _ in leases],
                   zk.zk_timeout)
    out = []
    for (name, doc, stat), res in zip(leases, reads, strict=True):
        item = None if isinstance(res, Exception) else item_codec.decode(bytes(res[0] or b"")).item
        claimed = untrusted.number(doc.get("claimed_at"), stat.ctime / 1000.0, lo=0.0)
        out.append({"item": name, "consumer": str(doc.get("consumer", "?")),
                    "age_s": round(max(0.0, now - claimed), 3),
                    "attempt": item.attempt if item else None,
                    "url": redact_userinfo(item.url) if item else None,
                    "host": host_key(item.url) if item else None})
    return out


def cluster_status(zk: ZkClient, root: str, now: float | None = None, *,
                   partitions: bool = True) -> dict[str, Any]:
    """The stable ``zkcrawl status --json`` document for ``root`` (SPEC §4);
    ``partitions=False`` leaves the ``partitions`` section out (the key absent: the
    exporter reads it less often)::

        {"root", "time", "control",                       # "running" | "paused"
         "queue": {"depth", "claimable", "oldest_age_s"},
         "leases": {"count", "fetching", "waiting", "by_consumer": {id: n}},
         "consumers": [{"id", "host", "pid", "state", "processed", "ok", "failed", "in_flight",
                        "waiting", "items_per_s", "heartbeat_age_s", "heartbeat_interval_s",
                        "stale", "leases", "control_seen", "acknowledged", "partitions"}],
         "producers": [{"id", "host", "state", "heartbeat_age_s", ...as published}],
         "dead": {"count"}, "control_pending": [ids that have not acknowledged yet],
         "discovered": {"batches"},                        # waiting for a --follow producer
         "stale_hosts": n,                                 # <root>/hosts nodes: ignored
         "partitions": {...} | null}                       # zkcrawl.admin.partition_status

    Words mean one thing: ``processed`` counts every finished item, ``ok`` those without an
    error and ``failed`` the others (``processed = ok + failed``); a lease is *held* from the
    claim to the completion, and of those held ``fetching`` (a consumer's ``in_flight``) run
    on a pool thread now while ``waiting`` sit in its backlog. A consumer is ``stale`` when
    its heartbeat is older than :data:`STALE_AFTER` x the interval it publishes (5 s, SPEC §2,
    if it does not say): frozen, or cut off from ZooKeeper but not yet expired.

    Hosts live in their owners' memory (SPEC §4): the ``partitions`` section has, per
    partition, its hosts with items and those backed off (a ``Retry-After`` or a down host),
    as each verified owner publishes them. ``stale_hosts`` counts the children of
    ``<root>/hosts``, which nothing reads or writes (one ``exists``, their data never read):
    a root may keep them until someone deletes them.

    A consumer *acknowledges* the control state when its status node reports it: the node's
    ``control`` key (the state its ControlWatch last saw) equals the cluster's; a node without
    that key is judged by its ``state`` (``paused`` acknowledges a pause, ``running`` or
    ``idle`` a resume).
    """
    p = _paths(root)
    now = time.time() if now is None else now
    names = {k: _children(zk, p[k]) for k in ("queue", "leases", "consumers", "producers",
                                               "dead")}
    control_stat = zk.exists(p["control"])
    control = parse_state(zk.get(p["control"])[0]) if control_stat else RUNNING
    leases = _read_json(zk, p["leases"], names["leases"])
    by_consumer = Counter(str(doc.get("consumer", "?")) for _, doc, _ in leases)
    registered = _read_json(zk, p["consumers"], sorted(names["consumers"]))
    consumers = [_consumer(now, n, doc, st, by_consumer.get(str(doc.get("id") or n), 0),
                           control)
                 for n, doc, st in registered]
    producers = [_producer(now, n, doc, st)
                 for n, doc, st in _read_json(zk, p["producers"], sorted(names["producers"]))]
    depth = len(names["queue"])
    out: dict[str, Any] = {
        "root": root,
        "exists": zk.exists(root.rstrip("/") or "/") is not None,
        "time": round(now, 3),
        "control": control,
        "control_pending": [c["id"] for c in consumers if not c["acknowledged"]],
        "queue": {"depth": depth, "claimable": max(0, depth - len(leases)),
                  "oldest_age_s": _oldest_age(zk, p["queue"], names["queue"], now)},
        "leases": {"count": len(leases),
                   "fetching": sum(c["in_flight"] for c in consumers),
                   "waiting": sum(c["waiting"] or 0 for c in consumers),
                   "by_consumer": dict(sorted(by_consumer.items()))},
        "consumers": consumers,
        "producers": producers,
        "dead": {"count": len(names["dead"])},
        # Batches of links found by page processors, waiting for a --follow producer: the
        # parent's child count (one stat, however many nodes).
        "discovered": {"batches": _child_count(zk, p["discovered"])},
        # The previous layout's per-host slots: ignored, counted (one stat) so that an
        # operator sees them once and may delete them.
        "stale_hosts": _child_count(zk, p["hosts"]),
    }
    if partitions:
        # --politeness owner: the partitions, their owners and queues (None without them).
        # An owner is verified by the session of the status node it names (the node name).
        out["partitions"] = partition_status(zk, root, now, {n: int(st.ephemeralOwner or 0)
                                                             for n, _, st in registered},
                                             {n: doc for n, doc, _ in registered})
        _owned_by(out["partitions"], registered, consumers)
        _held_by_owners(out, registered)
    return out


def _held_by_owners(out: dict[str, Any], registered: list[tuple[str, Any, Stat]]) -> None:
    """Hosts have owners (SPEC §3): items are queued in partition batches, held by their
    partition's owner -- no lease nodes. The queue's depth counts the batches' items too
    (when counted) and its oldest age is the oldest batch's; a consumer that owns
    partitions (verified by its session) holds what its status node publishes (``leases``:
    its pool and backlog)."""
    section = out.get("partitions")
    if not section or out["leases"]["count"]:
        return  # no partitions, or a root of the previous layout with lease nodes
    queue, leases = out["queue"], out["leases"]
    queue["depth"] += section["items"] or 0
    ages = [a for a in (queue["oldest_age_s"], section["oldest_age_s"]) if a is not None]
    queue["oldest_age_s"] = max(ages, default=None)  # the ingress's or the oldest batch's
    docs = {n: doc for n, doc, _ in registered}
    for c, (name, _, _) in zip(out["consumers"], registered, strict=True):
        if c.get("partitions"):
            c["leases"] = int(untrusted.number(docs[name].get("leases"), 0, lo=0, hi=1e9))
            leases["by_consumer"][c["id"]] = c["leases"]
    leases["by_consumer"] = dict(sorted(leases["by_consumer"].items()))
    leases["count"] = sum(leases["by_consumer"].values())
    queue["claimable"] = max(0, queue["depth"] - leases["count"])


def _owned_by(section: dict[str, Any] | None, registered: list[tuple[str, Any, Stat]],
              consumers: list[dict[str, Any]]) -> None:
    """Each consumer's ``partitions``: the owner nodes its session holds (verified), None
    on a root without partitions -- what ZooKeeper says, not what the consumer publishes."""
    held = Counter(x["owner"] for x in section["list"] if x["verified"]) if section else None
    for (name, _, _), c in zip(registered, consumers, strict=True):
        c["partitions"] = None if held is None else held.get(name, 0)


def consumer_status(zk: ZkClient, root: str, consumer_id: str, now: float | None = None
                    ) -> dict[str, Any]:
    """``zkcrawl status --consumer ID --json``: that consumer's entry, its leases with ages
    and URLs (oldest first) and the hosts of those items::

        {"root", "time", "id", "registered", "consumer": {...as in cluster_status} | null,
         "leases": [{"item", "age_s", "attempt", "url", "host"}],
         "hosts": [{"host", "leased_items"}]}
    """
    p = _paths(root)
    now = time.time() if now is None else now
    control_stat = zk.exists(p["control"])
    control = parse_state(zk.get(p["control"])[0]) if control_stat else RUNNING
    leases = [lease for lease in _read_json(zk, p["leases"], _children(zk, p["leases"]))
              if str(lease[1].get("consumer", "?")) == consumer_id]
    mine = sorted(_leased_items(zk, p, leases, now) + held_items(zk, root, consumer_id, now),
                  key=lambda x: (-x["age_s"], x["item"]))  # leases, or items held in batches
    found = _read_json(zk, p["consumers"], [n for n in _children(zk, p["consumers"])
                                            if n == consumer_id])
    entry = (_consumer(now, *found[0], len(mine), control) if found else None)
    per_host = Counter(x["host"] for x in mine if x["host"])
    hosts = [{"host": h, "leased_items": n} for h, n in per_host.most_common()]
    for x in mine:
        del x["consumer"]
    return {"root": root, "time": round(now, 3), "id": consumer_id,
            "registered": entry is not None, "consumer": entry, "leases": mine,
            "hosts": hosts}


# ----------------------------------------------------------------- dead letters --
@dataclass(frozen=True)
class DeadLetter:
    """One ``<root>/dead/dl-NNNNNNNNNN`` node, decoded tolerantly."""

    id: str
    item: str | None
    url: str | None
    error: str | None
    attempts: int
    dead_at: float | None
    data: str | None
    holder_deaths: int = 0  # of the attempts, holders that died (the rest were fetches)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "item": self.item, "url": self.url, "error": self.error,
                "attempts": self.attempts, "holder_deaths": self.holder_deaths,
                "fetches": self.attempts - self.holder_deaths, "dead_at": self.dead_at,
                "data": self.data}

    @property
    def attempts_text(self) -> str:
        """``3 (2 fetched, 1 holder died)``."""
        return attempts_text(self.attempts, self.holder_deaths)


@dataclass
class RepairOutcome:
    """What a requeue or purge did, per dead-letter id."""

    done: list[tuple[str, str | None]] = field(default_factory=list)  # (dl id, new item)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (dl id, why)


def dead_id(text: str) -> str:
    """``dl-0000000007``, ``7`` or ``0000000007`` -> ``dl-0000000007``."""
    raw = text.strip().removeprefix(item_codec.DEAD_PREFIX)
    if not raw.lstrip("-").isdigit():
        raise UsageError(f"not a dead-letter id: {text!r} (expected dl-NNNNNNNNNN or a number)")
    prefix = item_codec.DEAD_PREFIX
    return f"{prefix}{int(raw):010d}" if int(raw) >= 0 else f"{prefix}{raw}"


def _decode_dead(name: str, data: bytes, stat: Stat) -> DeadLetter:
    doc, _why = untrusted.load_json(data)
    if not isinstance(doc, dict):
        text = data[:item_codec.DEAD_DATA_LIMIT].decode("utf-8", errors="backslashreplace")
        return DeadLetter(name, None, None, "unreadable dead letter", 0,
                          stat.ctime / 1000.0, redact_userinfo(text))
    url = doc.get("url")
    attempts = doc.get("attempts")
    dead_at = doc.get("dead_at")
    error = str(doc["error"])[:item_codec.ERROR_LIMIT] if doc.get("error") is not None else None
    shown = doc.get("data") if isinstance(doc.get("data"), str) else None
    return DeadLetter(
        id=name, item=doc.get("item") if isinstance(doc.get("item"), str) else None,
        url=redact_userinfo(url) if isinstance(url, str) else None,
        error=redact_userinfo(error) if error is not None else None,
        attempts=(tries := int(untrusted.number(attempts, 0, lo=0, hi=1e9))),
        holder_deaths=min(tries, int(untrusted.number(doc.get("holder_deaths"), 0, lo=0,
                                                      hi=1e9))),
        dead_at=untrusted.number(dead_at, stat.ctime / 1000.0, lo=0.0),
        data=redact_userinfo(shown) if shown is not None else None)


def list_dead(zk: ZkClient, root: str) -> list[DeadLetter]:
    """Every dead letter, oldest first."""
    base = _paths(root)["dead"]
    names = [n for _, n in item_codec.sort_names(_children(zk, base))]
    results = gather([zk.get_async(f"{base}/{n}") for n in names], zk.zk_timeout)
    return [_decode_dead(n, bytes(r[0] or b""), r[1])
            for n, r in zip(names, results, strict=True) if not isinstance(r, Exception)]


@dataclass(frozen=True)
class DeadFilter:
    """Which dead letters an action takes: ``error`` a glob on the reason (``http-5*``;
    exact without wildcards), ``host`` the URL's ``host[:port]`` (or its host name alone),
    ``older_than`` seconds since the letter died. Unset criteria match everything."""

    error: str | None = None
    host: str | None = None
    older_than: float | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.error, self.host, self.older_than))

    def matches(self, letter: DeadLetter, now: float) -> bool:
        if self.error is not None and not fnmatch.fnmatchcase(letter.error or "", self.error):
            return False
        if self.host is not None:
            host = host_key(letter.url) if letter.url else ""
            wanted = self.host.lower()
            if wanted not in (host, _host_name(host)):
                return False
        return self.older_than is None or (letter.dead_at is not None
                                           and now - letter.dead_at >= self.older_than)


def _host_name(host: str) -> str:
    """``host[:port]`` -> host (``[::1]:8080`` -> ``[::1]``)."""
    return host.rsplit(":", 1)[0] if host.rsplit(":", 1)[-1].isdigit() and \
        not host.endswith("]") else host


def select_dead(zk: ZkClient, root: str, ids: Sequence[str], all_: bool,
                where: DeadFilter | None = None, now: float | None = None
                ) -> list[DeadLetter]:
    """The dead letters named by ``ids``, or all of them, kept where ``where`` matches (a
    filter alone selects among all); an unknown id is a usage error."""
    where = where or DeadFilter()
    if all_ and ids:
        raise UsageError("name the dead letters (ID...) or use --all, not both")
    if not (all_ or ids or where):
        raise UsageError("name the dead letters (ID...), use --all, or select them with "
                         "--error/--host/--older-than")
    letters = list_dead(zk, root)
    now = time.time() if now is None else now
    if not ids:
        return [d for d in letters if where.matches(d, now)]
    by_id = {d.id: d for d in letters}
    wanted = [dead_id(i) for i in ids]
    missing = [w for w in wanted if w not in by_id]
    if missing:
        raise UsageError(f"no such dead letter: {', '.join(missing)} under {root}/dead "
                         f"(see `zkcrawl dead list`)")
    return [by_id[w] for w in dict.fromkeys(wanted) if where.matches(by_id[w], now)]


#: What :func:`~zkcrawl.textsafe.redact_userinfo` leaves of a URL's credentials.
MASKED = "://***@"


def requeue_item(letter: DeadLetter) -> Item | None:
    """The item to offer again: the original (if its data is a JSON item) with attempt 0."""
    if letter.url is None:
        return None
    data = letter.data.encode("utf-8", "surrogatepass") if letter.data else b""
    original = item_codec.decode(data).item if data else None
    meta = dict(original.meta) if original and original.url == letter.url else {}
    meta.update({"requeued_from": letter.id, "last_error": letter.error})
    producer = original.producer if original and original.url == letter.url else None
    return Item(url=letter.url, attempt=0, producer=producer, meta=meta)


def _requeue_body(item: Item) -> tuple[bytes | None, str]:
    """The item's data if it would pass the consumer's decoder (a dead letter is untrusted
    input too: its URL may be anything), else ``(None, reason)``."""
    try:
        body = item.encode()
    except UnicodeEncodeError:
        return None, "its URL is not valid Unicode: purge it instead"
    dec = item_codec.decode(body)
    return (body, "") if dec.item is not None else (None, f"{dec.error}: purge it instead")


def _commit_each(zk: ZkClient, builds: Sequence[Callable[[Multi], None]]
                 ) -> list[list[TxResult] | Exception]:
    """One small transaction per dead letter, pipelined: a letter changed meanwhile by
    someone else fails alone and does not hold the others back."""
    txs = []
    for build in builds:
        tx = zk.transaction()
        build(tx)
        txs.append(tx.commit_async())
    return gather(txs, zk.zk_timeout)


def requeue_dead(zk: ZkClient, root: str, letters: Sequence[DeadLetter]) -> RepairOutcome:
    """Offer each letter's item again (attempt 0) and delete the letter, atomically per item."""
    p = _paths(root)
    zk.ensure_path(p["queue"])
    out = RepairOutcome()
    ops: list[tuple[str, Callable[[Multi], None]]] = []
    for letter in letters:
        item = requeue_item(letter)
        if item is None:
            out.skipped.append((letter.id, "no URL (a malformed item): purge it instead"))
            continue
        if MASKED in item.url:
            out.skipped.append((letter.id, "its URL's credentials were masked (never stored "
                                "in a dead letter): offer it again from its source, or purge it"))
            continue
        body, why = _requeue_body(item)
        if body is None:
            out.skipped.append((letter.id, why))
            continue

        def build(tx: Multi, name: str = letter.id, body: bytes = body) -> None:
            tx.create(f"{p['queue']}/{item_codec.PREFIX}", body, sequence=True)
            tx.delete(f"{p['dead']}/{name}")

        ops.append((letter.id, build))
    for (name, _), res in zip(ops, _commit_each(zk, [b for _, b in ops]), strict=True):
        if isinstance(res, Exception) or not tx_ok(res):
            out.skipped.append((name, "changed meanwhile (requeued or purged by someone else)"))
        else:
            out.done.append((name, str(res[0]).rsplit("/", 1)[1]))
    return out


def purge_dead(zk: ZkClient, root: str, letters: Sequence[DeadLetter]) -> RepairOutcome:
    """Delete the given dead letters for good."""
    base = _paths(root)["dead"]
    out = RepairOutcome()
    results = gather([zk.delete_async(f"{base}/{d.id}") for d in letters], zk.zk_timeout)
    for letter, res in zip(letters, results, strict=True):
        if isinstance(res, NoNodeError):
            out.skipped.append((letter.id, "already gone"))
        elif isinstance(res, Exception):
            out.skipped.append((letter.id, f"delete failed: {type(res).__name__}"))
        else:
            out.done.append((letter.id, None))
    return out


# -------------------------------------------------------------------- queue --
def list_queue(zk: ZkClient, root: str, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` items (what consumers take next), with their lease holder."""
    p = _paths(root)
    names = [n for _, n in item_codec.sort_names(_children(zk, p["queue"]))][:max(0, limit)]
    reads = gather([zk.get_async(f"{p['queue']}/{n}") for n in names], zk.zk_timeout)
    leases = gather([zk.get_async(f"{p['leases']}/{n}") for n in names], zk.zk_timeout)
    now = time.time()
    out = []
    for name, res, lease in zip(names, reads, leases, strict=True):
        if isinstance(res, Exception):
            continue
        dec = item_codec.decode(bytes(res[0] or b""))
        holder = None
        if not isinstance(lease, Exception):
            doc, _why = untrusted.load_object(lease[0], {"consumer": str})
            holder = (doc or {}).get("consumer", "?")
        out.append({"item": name, "url": redact_userinfo(dec.item.url) if dec.item else None,
                    "attempt": dec.item.attempt if dec.item else 0, "error": dec.error,
                    "age_s": round(max(0.0, now - res[1].ctime / 1000.0), 3),
                    "leased_by": holder})
    return out


def purge_queue(zk: ZkClient, root: str) -> tuple[int, int]:
    """Delete every queued item; returns (deleted, of which were leased at the time).

    Leases are left to their holders: a consumer that completes a purged item finds it
    gone and moves on (its record is still written).
    """
    p = _paths(root)
    names = _children(zk, p["queue"])
    leased = set(_children(zk, p["leases"]))
    results = gather([zk.delete_async(f"{p['queue']}/{n}") for n in names], zk.zk_timeout)
    deleted = [n for n, r in zip(names, results, strict=True) if not isinstance(r, Exception)]
    return len(deleted), len(leased.intersection(deleted))


# ------------------------------------------------------------------ control --
def wait_acknowledged(zk: ZkClient, root: str, timeout: float) -> list[str]:
    """Block until every live consumer reports the current control state, or ``timeout``.

    Returns the ids still pending (empty: all acknowledged). Woken by watches on the
    consumers' status nodes (they republish at once on a state change), never by polling.
    """
    p = _paths(root)
    deadline = time.monotonic() + timeout
    changed = threading.Event()

    def wake(_event: WatchedEvent) -> None:
        changed.set()  # kazoo thread: set a flag, never block

    while True:
        changed.clear()
        try:
            names = zk.get_children(p["consumers"], watch=wake)
        except NoNodeError:
            names = []
        for name in names:
            zk.exists(f"{p['consumers']}/{name}", watch=wake)
        pending: list[str] = cluster_status(zk, root, partitions=False)["control_pending"]
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            return pending
        changed.wait(remaining)
