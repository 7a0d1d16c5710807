"""``zkcrawl status [--consumer ID] [--json] [--watch S]``: the cluster at a glance.

``--json`` prints the stable document of :func:`zkcrawl.admin.cluster.cluster_status` (with
``--watch``, one object per line); otherwise a table, redrawn every S seconds with
``--watch``, with the partitions block of :mod:`zkcrawl.admin.partition_status`.
``--consumer ID`` shows one consumer (:func:`zkcrawl.admin.cluster.consumer_status`); an id
neither registered nor holding a lease is exit 1.

* Words mean the same in the table and the JSON: leases *held*, *fetching* or *waiting*;
  processed = ok + failed; *backed off* only by a Retry-After or a down host; *STALE* at 3
  heartbeat intervals.
* Published values are untrusted: the table shows them through
  :func:`zkcrawl.textsafe.printable`; ``--json`` is ASCII JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from zkcrawl.admin.cluster import STALE_AFTER, cluster_status, consumer_status, session
from zkcrawl.errors import ExitStatus, UsageError, ZkCrawlError
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt
from zkcrawl.textsafe import printable, shown_url
from zkcrawl.zk import KazooException
from zkcrawl.zk.client import ZkClient

NAME = "status"
HELP = "show queue depth, leases, consumers, producers, dead letters and the control state"
EXAMPLES = """
    zkcrawl status --zk zk1:2181,zk2:2181,zk3:2181    # the cluster at a glance
    zkcrawl status --watch 2                          # redraw every 2 s until Ctrl-C
    zkcrawl status --json | jq .queue                 # the stable JSON document
    zkcrawl status --consumer web1-4242               # one consumer: its leases, hosts, heartbeat
"""

_CLEAR = "\x1b[H\x1b[2J"
MIN_WATCH = 0.1  # a shorter period only loads ZooKeeper with reads nobody can follow
_CELL_LIMIT = 80  # characters of one published value shown in a table cell


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    json: bool = opt(False, "print one JSON object (stable, documented fields)")
    watch: float = opt(0.0, "refresh every S seconds until Ctrl-C (0: print once)",
                       metavar="S")
    consumer: str | None = opt(None, "show this consumer: its leases with ages, what it "
                               "fetches and what waits, the hosts it waits on, its last "
                               "heartbeat", metavar="ID")

    def validate(self) -> None:
        super().validate()
        if self.watch < 0 or 0 < self.watch < MIN_WATCH:
            raise UsageError(f"--watch must be 0 (once) or at least {MIN_WATCH:g} seconds, "
                             f"got {self.watch:g}")


def configure(parser: argparse.ArgumentParser) -> None:
    """No positionals."""


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _cell(value: Any) -> str:
    return "-" if value is None else shown_url(str(value), _CELL_LIMIT)


def _number(value: Any, spec: str = ".1f") -> str:
    try:
        return format(value, spec)
    except (TypeError, ValueError, OverflowError):  # not a number, or an int past float
        return "-"


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [head] + [[_cell(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in cells]


def _stale_hosts_line(doc: dict[str, Any]) -> list[str]:
    """One line for ``<root>/hosts`` nodes left by the layout before hosts had owners."""
    n = doc.get("stale_hosts") or 0
    if not n:
        return []
    return [f"stale     {n} nodes under {_cell(doc['root'].rstrip('/'))}/hosts from before "
            "hosts had owners: ignored (safe to delete)"]


UNOWNED_SHOWN = 20  # partitions without an owner listed in the table (all are counted)
PARTITIONS_SHOWN = 10  # rows of the per-partition table: the deepest (the JSON has all)


def _partitions_head(s: dict[str, Any]) -> list[str]:
    count = "P unknown" if s["count"] is None else f"P={s['count']}"
    if s["count_error"]:
        count += f" (root data refused: {_cell(s['count_error'])})"
    owners = ", ".join(f"{_cell(k)} {v}" for k, v in list(s["by_owner"].items())[:10])
    more = " ..." if len(s["by_owner"]) > 10 else ""
    items = (f"{s['items']} items queued" if s["items_counted"]
             else f"items not counted ({_cell(s['items_note'])})")
    lines = [f"partitions {count}: {s['present']} present, {s['owned']} owned"
             + (f" ({owners}{more})" if owners else ""),
             f"           {s['batches']} batches, {items}, oldest {_age(s['oldest_age_s'])}"
             + (f"; {s['malformed_batches']} malformed batches"
                if s["malformed_batches"] else "")]
    if s.get("hosts_active") is not None:
        lines.append(f"           hosts: {s['hosts_active']} active, "
                     f"{s['hosts_backed_off']} backed off (Retry-After or down, kept for a "
                     "hand-over)")
    if s["unverified"]:
        lines.append(f"           {len(s['unverified'])} owner nodes not held by the live "
                     "consumer they name (forged, or a consumer going): "
                     + ", ".join(str(p) for p in s["unverified"][:UNOWNED_SHOWN]))
    if s["ignored"]:
        lines.append(f"           {s['ignored']} children of partitions/ that are no "
                     "partition (ignored)")
    return lines


def _count(value: object) -> str:
    return "-" if value is None else str(value)


def _partition_lines(s: dict[str, Any] | None) -> list[str]:
    """The ``partitions`` section (``--politeness owner``); nothing without partitions."""
    if s is None:
        return []
    lines = _partitions_head(s)
    unowned = s["unowned"]
    if unowned:
        shown = ", ".join(str(p) for p in unowned[:UNOWNED_SHOWN])
        more = f" and {len(unowned) - UNOWNED_SHOWN} more" if len(unowned) > UNOWNED_SHOWN else ""
        lines.append(f"           WITHOUT AN OWNER, holding items: {len(unowned)} "
                     f"({shown}{more})")
    deep = sorted((x for x in s["list"] if x["batches"]),
                  key=lambda x: (-(x["depth"] or 0), -x["batches"], x["partition"]))
    if deep:
        rows = [[x["partition"], "NONE" if x["owner"] is None
                 else x["owner"] + ("" if x["verified"] else " (unverified)"),
                 x["batches"], x["depth"], _age(x["oldest_age_s"]),
                 _count(x.get("hosts_active")), _count(x.get("hosts_backed_off"))]
                for x in deep[:PARTITIONS_SHOWN]]
        lines += ["", *_table(["PARTITION", "OWNER", "BATCHES", "ITEMS", "OLDEST", "HOSTS",
                               "BACKED OFF"], rows)]
        if len(deep) > PARTITIONS_SHOWN:
            lines.append(f"... {len(deep) - PARTITIONS_SHOWN} more partitions hold items "
                         "(--json lists all)")
    return lines


def _heartbeat(c: dict[str, Any]) -> str:
    return _age(c["heartbeat_age_s"]) + (" STALE" if c.get("stale") else "")


def _leases_line(leases: dict[str, Any]) -> str:
    return (f"leases    {leases['count']} held: {leases['fetching']} fetching now, "
            f"{leases['waiting']} waiting in consumer backlogs")


def render(doc: dict[str, Any], hosts: str) -> str:
    """The human-readable status: a header, a consumer table, a producer table."""
    q, leases = doc["queue"], doc["leases"]
    pending = doc["control_pending"]
    ack = (f"all {len(doc['consumers'])} consumers acknowledged" if not pending
           else f"waiting for {len(pending)}: {', '.join(_cell(p) for p in pending)}")
    lines = [f"zkcrawl {_cell(doc['root'])} @ {_cell(hosts)}"
             + ("" if doc["exists"] else "  (root does not exist yet: nothing ran here)"),
             f"control   {doc['control']} ({ack})",
             f"queue     {q['depth']} items, {q['claimable']} claimable, "
             f"oldest {_age(q['oldest_age_s'])}",
             _leases_line(leases),
             f"dead      {doc['dead']['count']} dead letters"
             + ("  (see `zkcrawl dead list`)" if doc["dead"]["count"] else ""),
             *([f"found     {doc['discovered']['batches']} batches of discovered links "
                "waiting for a `zkcrawl-producer --follow`"]
               if doc.get("discovered", {}).get("batches") else []),
             *_stale_hosts_line(doc), *_partition_lines(doc.get("partitions")), ""]
    if doc["consumers"]:
        rows = [[c["id"], c["host"], c["state"], c["ok"], c["failed"], c["leases"],
                 c["in_flight"], c["waiting"], _number(c["items_per_s"]), _heartbeat(c),
                 "yes" if c["acknowledged"] else "no"] for c in doc["consumers"]]
        lines += _table(["CONSUMER", "HOST", "STATE", "OK", "FAILED", "LEASES", "FETCHING",
                         "WAITING", "ITEMS/S", "HEARTBEAT", "ACK"], rows)
        stale = [c for c in doc["consumers"] if c.get("stale")]
        if stale:
            lines.append(f"STALE: no heartbeat for {STALE_AFTER} intervals (frozen, or cut "
                         "off from ZooKeeper): " + ", ".join(_cell(c["id"]) for c in stale)
                         + "; see `zkcrawl status --consumer ID`")
    else:
        lines.append("no live consumers")
    orphans = {k: v for k, v in leases["by_consumer"].items()
               if k not in {c["id"] for c in doc["consumers"]}}
    if orphans:
        lines.append("leases held by unregistered clients: "
                     + ", ".join(f"{_cell(k)}={v}" for k, v in orphans.items()))
    lines.append("")
    if doc["producers"]:
        from zkcrawl.producer.summary import held_back_text

        rows = [[p["id"], p["host"], p["state"], p.get("pages", "-"), p.get("offered", "-"),
                 held_back_text(p), _age(p["heartbeat_age_s"]), _last_pass(p)]
                for p in doc["producers"]]
        lines += _table(["PRODUCER", "HOST", "STATE", "PAGES", "OFFERED", "HELD BACK",
                         "HEARTBEAT", "LAST PASS"], rows)
    else:
        lines.append("no live producers")
    return "\n".join(lines) + "\n"


def _last_pass(producer: dict[str, Any]) -> str:
    """A watching producer's last pass (``--watch``): "#3 40.2s ago: 1 pages, 0 sitemaps,
    0 new"; "-" for a producer that does not watch (or publishes a malformed pass)."""
    from zkcrawl.producer.watch import last_pass

    lp = last_pass(producer)
    if lp is None:
        return "-"
    return (f"#{lp['number']} {_age(max(0.0, time.time() - lp['started_at']))} ago: "
            f"{lp['pages']} pages, {lp['sitemaps']} sitemaps, {lp['new']} new")


_LEASES_SHOWN = 50  # lease rows of the one-consumer view (the JSON has them all)


def render_consumer(doc: dict[str, Any], hosts: str) -> str:
    """``status --consumer ID``: one consumer, its leases and the hosts it waits on."""
    c = doc["consumer"]
    lines = [f"consumer  {_cell(doc['id'])}  under {_cell(doc['root'])} @ {_cell(hosts)}"]
    if c is None:
        lines.append("status    not registered (no live session): its leases go when its "
                     "session expires")
    else:
        stale = (f"  STALE: older than {STALE_AFTER} x {_number(c['heartbeat_interval_s'], 'g')}"
                 " s" if c["stale"] else "")
        lines += [f"status    {_cell(c['state'])} on {_cell(c['host'])} pid {_cell(c['pid'])}, "
                  f"control {'acknowledged' if c['acknowledged'] else 'NOT acknowledged'}",
                  f"heartbeat {_heartbeat(c)} ago (every "
                  f"{_number(c['heartbeat_interval_s'], 'g')} s){stale}",
                  f"items     {_cell(c['ok'])} ok, {_cell(c['failed'])} failed, "
                  f"{_number(c['items_per_s'])} items/s; {_cell(c['redelivered'])} "
                  "settled after a holder died on them",
                  f"leases    {len(doc['leases'])} started (marked in ZooKeeper); it holds "
                  f"{_cell(c['in_flight'])} fetching now, {_cell(c['waiting'])} waiting in "
                  f"its backlog (capacity {_cell(c.get('capacity'))})"]
    lines.append("hosts     " + (", ".join(
        f"{_cell(h['host'])} ({h['leased_items']} items)" for h in doc["hosts"][:10])
        or "no host"))
    lines.append("")
    if doc["leases"]:
        rows = [[x["item"], _age(x["age_s"]), x["attempt"], x["host"], x["url"]]
                for x in doc["leases"][:_LEASES_SHOWN]]
        lines += _table(["LEASE", "AGE", "ATTEMPT", "HOST", "URL"], rows)
        if len(doc["leases"]) > _LEASES_SHOWN:
            lines.append(f"... {len(doc['leases']) - _LEASES_SHOWN} more (--json lists all)")
    else:
        lines.append("no leases")
    return "\n".join(lines) + "\n"


def _show(doc: dict[str, Any], settings: Settings, out: IO[str], redraw: bool) -> None:
    if settings.json:
        out.write(json.dumps(doc, sort_keys=True) + "\n")
    else:
        text = render_consumer(doc, settings.zk) if settings.consumer else render(doc,
                                                                                  settings.zk)
        out.write((_CLEAR if redraw else "") + text)
        if settings.watch and not redraw:
            out.write("\n")
    out.flush()


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    setup_logging(settings)
    out = sys.stdout
    redraw = bool(settings.watch) and not settings.json and out.isatty()
    try:
        with session(settings) as zk:
            return _loop(zk, settings, out, redraw)
    except KeyboardInterrupt:
        return ExitStatus.OK  # Ctrl-C is how a watch ends


def _doc(zk: ZkClient, settings: Settings) -> dict[str, Any]:
    if settings.consumer is None:
        return cluster_status(zk, settings.root)
    doc = consumer_status(zk, settings.root, settings.consumer)
    if not settings.watch and not doc["registered"] and not doc["leases"]:
        live = sorted(c["id"] for c in cluster_status(zk, settings.root, partitions=False)[
            "consumers"])
        raise ZkCrawlError(f"no consumer {settings.consumer!r} under {settings.root}"
                           f"/consumers and no lease held by it (live: "
                           f"{', '.join(printable(x, 80) for x in live) or 'none'})")
    return doc


def _loop(zk: ZkClient, settings: Settings, out: IO[str], redraw: bool) -> ExitStatus:
    while True:
        try:
            _show(_doc(zk, settings), settings, out, redraw)
        except KazooException as exc:
            if not settings.watch:
                raise
            # A watch outlives a ZooKeeper hiccup: say so and try again next round.
            print(f"zkcrawl status: ZooKeeper error ({type(exc).__name__}), retrying",
                  file=sys.stderr)
        if not settings.watch:
            return ExitStatus.OK
        time.sleep(settings.watch)  # the refresh period the operator asked for
