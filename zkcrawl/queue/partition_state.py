"""A partition's checkpoint (SPEC §2, §3): the back-offs in force on its hosts, kept in the
partition node's data so that they survive a hand-over. Pure functions, no ZooKeeper
(:mod:`zkcrawl.queue.partition_queue` writes it in its fenced checkpoints)::

    {"v": 1, "at": <wall-clock s>, "hosts": {"<host[:port]>": [<until>, <delay>, "<reason>"]}}

* ``until``: wall-clock time before which the host must not be asked (``retry-after``,
  ``down``); ``delay``: its ``crawl-delay`` above ``--domain-delay``, waited after a take.
* :func:`decode` never raises and trusts nothing: a bad state is one reason and no hold, a
  bad entry is dropped, every value clamped (``until`` at most :data:`HOLD_CAP` ahead).
* :func:`encode` is bounded (:data:`MAX_HOSTS`, :data:`STATE_LIMIT`: the holds that end
  soonest dropped first) and rounds ``until`` up, so a reader never waits less.
* Clocks are assumed to agree (NTP); a skew changes a wait by the skew, at most
  :data:`HOLD_CAP`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from zkcrawl.backoff import HOST_DOWN
from zkcrawl.politeness.local import MAX_CRAWL_DELAY
from zkcrawl.queue import untrusted

__all__ = [
    "HOLD_CAP",
    "MAX_HOSTS",
    "STATE_LIMIT",
    "Decoded",
    "Hold",
    "decode",
    "encode",
    "in_force",
]

VERSION = 1
#: The longest an inherited back-off holds a host: the longest back-off zkcrawl itself sets
#: (a host down: ``HOST_DOWN.cap``; a Retry-After is capped lower, by the fetcher).
HOLD_CAP = HOST_DOWN.cap
#: Entries a partition's state keeps at most (the soonest-ending dropped first).
MAX_HOSTS = 500
#: Bytes of a partition node's data written at most: far below jute.maxbuffer (1 MB); a
#: reader reads up to :data:`READ_LIMIT` (another writer's, within every znode's limit).
STATE_LIMIT = 32 * 1024
READ_LIMIT = untrusted.NODE_LIMIT
HOST_LIMIT = 300  # bytes of a host key (a DNS name is at most 253, a port 6 more)
REASONS = ("retry-after", "down", "crawl-delay")
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Hold:
    """What must survive a hand-over of one host: ``until`` (wall-clock s, 0: none),
    ``delay`` (s after the take, 0: none) and the reason of the longer of the two."""

    host: str
    until: float = 0.0
    delay: float = 0.0
    reason: str = "retry-after"

    def ends(self, now: float) -> float:
        """Wall-clock time after which this hold protects nothing (for eviction)."""
        return max(self.until, now + self.delay if self.delay else 0.0)


@dataclass(frozen=True)
class Decoded:
    """:func:`decode`'s answer: the holds, the entries dropped, and why the data as a whole
    was refused (None: it was a state, or empty)."""

    holds: tuple[Hold, ...] = ()
    dropped: int = 0
    error: str | None = None


def in_force(holds: Iterable[Hold], now: float) -> list[Hold]:
    """The holds that still protect something at ``now`` (wall clock)."""
    return [h for h in holds if h.until > now or h.delay > 0]


def _ceil(x: float) -> float:
    return math.ceil(x * 100.0) / 100.0


def _entry(h: Hold) -> list[object]:
    return [_ceil(h.until) if h.until else 0, _ceil(h.delay) if h.delay else 0, h.reason]


def encode(holds: Iterable[Hold], now: float) -> bytes:
    """The partition node's data for ``holds`` at ``now`` (wall clock): the ones in force,
    at most :data:`MAX_HOSTS` and :data:`STATE_LIMIT` bytes, those ending soonest dropped
    first (module docstring)."""
    keep = sorted(in_force(holds, now), key=lambda h: -h.ends(now))[:MAX_HOSTS]
    entries: dict[str, list[object]] = {}
    for h in keep:  # a host twice: its longest-lasting hold
        if len(h.host.encode()) <= HOST_LIMIT:
            entries.setdefault(h.host, _entry(h))
    head = {"v": VERSION, "at": round(now, 3)}
    data = _ENCODER.encode({**head, "hosts": entries}).encode("utf-8")
    if len(data) <= STATE_LIMIT:
        return data
    # Over the bytes: keep the longest-lasting entries that fit (each costs its own bytes).
    out: dict[str, list[object]] = {}
    size = len(_ENCODER.encode({**head, "hosts": {}}).encode("utf-8"))
    for host, entry in entries.items():  # longest-lasting first
        n = len(_ENCODER.encode({host: entry}).encode("utf-8"))  # '{...}' ~ ',' + entry
        if size + n > STATE_LIMIT:
            continue
        out[host] = entry
        size += n
    return _ENCODER.encode({**head, "hosts": out}).encode("utf-8")


def _number(value: object, lo: float, hi: float) -> float | None:
    """A finite JSON number clamped to [lo, hi]; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    if not math.isfinite(f):
        return None
    return min(max(f, lo), hi)


def _hold(host: object, entry: object, now: float) -> tuple[Hold | None, bool]:
    """``(hold, False)``; ``(None, False)`` for an entry that expired (not a fault);
    ``(None, True)`` for one that is no hold."""
    if not isinstance(host, str) or not host or len(host.encode("utf-8", "replace")) > \
            HOST_LIMIT or not host.isprintable() or " " in host:
        return None, True
    if not isinstance(entry, list) or len(entry) != 3:
        return None, True
    until = _number(entry[0], 0.0, now + HOLD_CAP)
    delay = _number(entry[1], 0.0, MAX_CRAWL_DELAY)
    reason = entry[2]
    if until is None or delay is None or reason not in REASONS:
        return None, True
    if until <= now and delay <= 0:
        return None, False  # expired: protects nothing
    return Hold(host, until if until > now else 0.0, delay, str(reason)), False


def decode(data: bytes | None, now: float) -> Decoded:
    """The holds of a partition node's data, read at ``now`` (this machine's wall clock);
    never raises (module docstring). Empty data or ``{}`` (a partition never checkpointed)
    is no hold and no error."""
    if not data or data.strip() in (b"{}", b""):
        return Decoded()
    doc, why = untrusted.load_json(data, limit=READ_LIMIT)
    if why is not None:
        return Decoded(error=why)
    if not isinstance(doc, dict):
        return Decoded(error=f"not a JSON object ({type(doc).__name__})")
    hosts = doc.get("hosts")
    if hosts is None:
        return Decoded()
    if not isinstance(hosts, Mapping):
        return Decoded(error="'hosts' is not an object")
    holds: list[Hold] = []
    dropped = 0
    for i, (host, entry) in enumerate(hosts.items()):
        if i >= MAX_HOSTS:
            dropped += len(hosts) - MAX_HOSTS
            break
        h, bad = _hold(host, entry, now)
        if h is not None:
            holds.append(h)
        dropped += bad
    return Decoded(tuple(holds), dropped)
