"""Which stage sets a crawl's pace, named from the measured stages: :func:`judge`, the one
function behind ``consumer.stats``, ``zkcrawl report`` (text and HTML) and the demo.

A full consumer's throughput is its capacity over the time an item spends in it (Little's
law), the sum of the stages: the stage with the largest share is the pace-setter
(:class:`PaceSetter`: politeness, pool, zookeeper, site, parse, sink, supply, backlog), and
the verdict says what to change. When more than :data:`FAILURE_LEAD` of the items failed
for one reason, the verdict leads with that reason (``Verdict.failure``). Every number is
untrusted-safe: negative, NaN or infinite figures count as 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from zkcrawl.textsafe import printable

__all__ = ["FAILURE_LEAD", "SUPPLY_FILL", "PaceSetter", "Stages", "Verdict", "failures_of",
           "judge"]

#: Below this share of its capacity held, the consumer is not what limits the crawl.
SUPPLY_FILL = 0.5
#: A reason that more than this share of the items failed with leads the verdict.
FAILURE_LEAD = 0.5
#: What to do about a dominant failure reason (a prefix of it: ``http-4`` covers 404, 410...).
_FAILURE_HINTS = (
    ("blocked-address", "the address guard refused the hosts' addresses: if the site is "
     "yours, run the consumer with --allow-private-addresses, then `zkcrawl dead requeue "
     "--error blocked-address`"),
    ("processor", "your --processor raised: its traceback is in the consumer's log "
     "(processor.failed); try it with `zkcrawl try URL --processor ...`"),
    ("pipeline", "your --pipeline raised: its traceback is in the consumer's log"),
    ("robots", "robots.txt disallows these URLs (--no-robots only where you may)"),
    ("http-4", "the site answers these URLs with a client error: check the URLs offered"),
    ("http-5", "the site fails: check it, the items are retried up to --max-attempts"),
    ("connection", "the site does not answer: check that it is up and reachable"),
    ("timeout", "the site answers too slowly: check it, or raise --timeout"),
    ("content-type", "these URLs are not HTML pages: check the links offered"),
)


class PaceSetter(StrEnum):
    """What sets the pace (a ``str``: the values go into logs and JSON).

    =============  =============================================  =============================
    pace-setter    stage (mean ms per item)                       what to change
    =============  =============================================  =============================
    politeness     ``polite``: waiting for the host's next slot   more hosts, or a smaller
                   (``--domain-delay``, Crawl-delay, Retry-After)  ``--domain-delay`` if the site
                                                                  allows it; not threads
    pool           ``pool``: waiting for a free worker thread     ``--threads``, or consumers
    zookeeper      ``dispatch``: claim until handed to the pool   ZooKeeper latency, consumers
                                                                  per ensemble
    site           ``fetch``: the request and the response        ``--threads`` if the site can
                                                                  take it (politeness permitting)
    parse          ``parse``: extraction, this process's CPU      more consumer processes
    sink           ``write``: record queued until written+synced  a faster disk for ``--out``
    supply         the consumer holds under half its capacity     nothing in the consumer: the
                   (``fill``) and its items do not wait (the      queue is short or empty
                   largest stage is not a wait)
    backlog        ``pool`` when ``polite`` is unknown (records   -- (politeness and pool not
                   of consumers older than ``polite_ms``)         told apart)
    =============  =============================================  =============================

    ``fetch`` may include parsing when the two are not measured apart (records carry
    ``process_ms``, fetch + parse); ``write`` and ``fill`` are known to a running consumer only.
    Every number is untrusted-safe: negative, NaN or infinite figures count as 0.
    """

    POLITENESS = "politeness"
    POOL = "pool"
    ZOOKEEPER = "zookeeper"
    SITE = "site"
    PARSE = "parse"
    SINK = "sink"
    SUPPLY = "supply"
    BACKLOG = "backlog"  # a wait not told apart (records without polite_ms)
    IDLE = "idle"  # nothing measured


@dataclass(frozen=True)
class Stages:
    """Mean milliseconds per item of each stage in the consumer, over the same items.
    ``write`` and ``fill`` (mean share of the capacity held) are None when not measured;
    ``polite`` None: the politeness wait is not told apart, ``pool`` holds the whole wait
    (records written before ``polite_ms``); ``queue`` (time in ZooKeeper before the claim)
    is context, not a stage of the consumer."""

    items: int
    dispatch: float = 0.0
    polite: float | None = 0.0
    pool: float = 0.0
    fetch: float = 0.0
    parse: float = 0.0
    write: float | None = None
    queue: float | None = None
    fill: float | None = None
    #: ``(reason, count)`` of the items that failed, among ``finals`` items with a final
    #: outcome (None: among ``items``).
    failures: tuple[tuple[str, int], ...] = ()
    finals: int | None = None


@dataclass(frozen=True)
class Verdict:
    """``pace`` with the number behind it: ``figure_ms`` (mean per item of its stage) and
    ``share`` (of an item's time in the consumer); ``text`` is one line for an operator."""

    pace: PaceSetter
    figure_ms: float
    share: float
    text: str
    failure: str | None = None  # the reason most items failed with, when it leads the text

    def as_dict(self) -> dict[str, object]:
        return {"pace": str(self.pace), "figure_ms": round(self.figure_ms, 3),
                "share": round(self.share, 4), "text": self.text, "failure": self.failure}


#: Stages that are waits: a consumer not full whose items wait is still held by them
#: (a host's turn comes no sooner, a busy pool frees no sooner, with more items).
_WAITS = frozenset({PaceSetter.POLITENESS, PaceSetter.POOL, PaceSetter.BACKLOG})
_STAGE_OF = {"polite": PaceSetter.POLITENESS, "pool": PaceSetter.POOL,
             "backlog": PaceSetter.BACKLOG,
             "dispatch": PaceSetter.ZOOKEEPER, "fetch": PaceSetter.SITE,
             "parse": PaceSetter.PARSE, "write": PaceSetter.SINK}


def _clean(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) and value > 0 else 0.0


def _ms(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f} s"
    if value >= 1000:
        return f"{value / 1000:.1f} s"
    return f"{value:.0f} ms" if value >= 10 else f"{value:.2g} ms"


def failures_of(counts: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """``Stages.failures`` from a reason -> count mapping (bad counts dropped), largest first."""
    kept = [(str(k), int(v)) for k, v in counts.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return tuple(sorted(kept, key=lambda kv: (-kv[1], kv[0])))


def _failure_lead(st: Stages) -> tuple[str, str] | None:
    """``(reason, sentence)`` when one reason holds more than :data:`FAILURE_LEAD` of the
    items, else None."""
    total = st.finals if st.finals is not None else st.items
    if total <= 0 or not st.failures:
        return None
    reason, count = max(st.failures, key=lambda kv: (kv[1], kv[0]))
    share = min(1.0, max(0, count) / total)
    if share <= FAILURE_LEAD:
        return None
    reason = printable(reason, 60)
    hint = next((h for prefix, h in _FAILURE_HINTS if reason.startswith(prefix)),
                "see the records' error and the consumer's log")
    return reason, f"{round(share * 100)} % of items failed: {reason} -- {hint}"


def judge(st: Stages) -> Verdict:
    """Name the pace-setter of ``st`` (:class:`PaceSetter`) in one line; a reason most
    items failed with leads it."""
    verdict = _judge_pace(st)
    lead = _failure_lead(st)
    if lead is None:
        return verdict
    reason, text = lead
    return Verdict(verdict.pace, verdict.figure_ms, verdict.share, f"{text}; {verdict.text}",
                   reason)


def _judge_pace(st: Stages) -> Verdict:
    wait = "pool" if st.polite is not None else "backlog"
    parts = {"polite": _clean(st.polite), wait: _clean(st.pool),
             "dispatch": _clean(st.dispatch), "fetch": _clean(st.fetch),
             "parse": _clean(st.parse), "write": _clean(st.write)}
    total = sum(parts.values())
    if st.items <= 0 or total <= 0:
        return Verdict(PaceSetter.IDLE, 0.0, 0.0, "idle: nothing processed")
    stage = max(parts, key=lambda k: parts[k])
    figure, share = parts[stage], parts[stage] / total
    pace = _STAGE_OF[stage]
    fill = st.fill
    if pace not in _WAITS and fill is not None and math.isfinite(fill) \
            and 0 <= fill < SUPPLY_FILL:
        # Spare capacity and nothing waiting: more items would run alongside these.
        return Verdict(PaceSetter.SUPPLY, total, 1.0,
                       f"supply sets the pace: the consumer held {fill:.0%} of its capacity "
                       f"on average and items took {_ms(total)} here without waiting: the "
                       "queue is short or empty, more threads or consumers will not help")
    return Verdict(pace, figure, share, f"{_TEXT[pace](figure, share)}{_next(parts, stage, total)}")


def _next(parts: dict[str, float], stage: str, total: float) -> str:
    rest = sorted((v, k) for k, v in parts.items() if k != stage and v > 0)
    if not rest:
        return ""
    value, name = rest[-1]
    return f" (next: {name} {value / total:.0%})"


def _politeness(ms: float, share: float) -> str:
    return (f"politeness sets the pace: items waited {_ms(ms)} for their host's turn "
            f"({share:.0%} of their time here); more threads will not help: more hosts, or "
            "a smaller --domain-delay where the site allows it")


def _pool(ms: float, share: float) -> str:
    return (f"the pool sets the pace: items waited {_ms(ms)} for a free thread "
            f"({share:.0%} of their time here); add --threads or consumers")


def _backlog(ms: float, share: float) -> str:
    return (f"the backlog sets the pace: items waited {_ms(ms)} to start ({share:.0%} of "
            "their time here), for their host's turn or a free thread: these records have no "
            "polite_ms to tell which (consumers older than that field)")


def _zookeeper(ms: float, share: float) -> str:
    return (f"ZooKeeper sets the pace: a claim took {_ms(ms)} to reach the pool "
            f"({share:.0%} of an item's time here); check ZooKeeper's latency and the "
            "consumers per ensemble")


def _site(ms: float, share: float) -> str:
    return (f"the site sets the pace: a fetch took {_ms(ms)} ({share:.0%} of an item's time "
            "here); each thread does 1 page per fetch time: add --threads if the site can "
            "take it")


def _parse(ms: float, share: float) -> str:
    return (f"parsing sets the pace: {_ms(ms)} of CPU per page ({share:.0%} of an item's "
            "time here); run more consumer processes (one process uses one core)")


def _sink(ms: float, share: float) -> str:
    return (f"the sink sets the pace: a record took {_ms(ms)} to be written and synced "
            f"({share:.0%} of an item's time here); put --out on a faster disk")


_TEXT = {PaceSetter.POLITENESS: _politeness, PaceSetter.POOL: _pool,
         PaceSetter.BACKLOG: _backlog,
         PaceSetter.ZOOKEEPER: _zookeeper, PaceSetter.SITE: _site, PaceSetter.PARSE: _parse,
         PaceSetter.SINK: _sink}
