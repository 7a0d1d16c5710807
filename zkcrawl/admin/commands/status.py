"""``zkcrawl status [--consumer ID] [--json] [--watch S]``: the cluster at a glance.

``--json`` prints the stable document of :func:`zkcrawl.admin.cluster.cluster_status` (one object;
with ``--watch``, one object per line). Without it, a table; ``--watch S`` redraws it in
place every S seconds on a terminal (appends blocks otherwise) until Ctrl-C.
``--consumer ID`` shows one consumer instead (:func:`zkcrawl.admin.cluster.consumer_status`):
its leases with their ages, what it fetches and what waits, the hosts its items wait on, its
last heartbeat; an id that is neither registered nor holding a lease is exit 1.

Wording, the same in the table and the JSON: leases are *held*, of which *fetching* now or
*waiting* in a backlog; *ok* and *failed* items apart (processed = ok + failed); a host is
*held back* only by a Retry-After, a failure's cool-down or a Crawl-delay, not by items
waiting their turn; a consumer whose heartbeat is 3 intervals old is *STALE*.

The table shows what consumers and producers published, which anyone who reaches the
ensemble may have written: every value goes through :func:`zkcrawl.textsafe.printable`
(no control, ANSI or bidi character reaches the terminal) and a number too large to format
shows as ``-``. ``--json`` is ASCII JSON.
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
from zkcrawl.textsafe import printable
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
    return "-" if value is None else printable(str(value), _CELL_LIMIT)


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


def _hosts_line(h: dict[str, Any]) -> str:
    line = (f"hosts     {h['tracked']} with a politeness slot, {h['held_back']} held back "
            "(Retry-After, failures, Crawl-delay)")
    if h["longest"]:
        line += ": " + ", ".join(f"{_cell(x['host'])} ({_number(x['next_slot_in_s'], 'g')} s)"
                                 for x in h["longest"][:5])
    return line


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
             _hosts_line(doc["hosts"]), ""]
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
        rows = [[p["id"], p["host"], p["state"], p.get("pages", "-"), p.get("offered", "-"),
                 _age(p["heartbeat_age_s"])] for p in doc["producers"]]
        lines += _table(["PRODUCER", "HOST", "STATE", "PAGES", "OFFERED", "HEARTBEAT"], rows)
    else:
        lines.append("no live producers")
    return "\n".join(lines) + "\n"


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
                  f"{_number(c['items_per_s'])} items/s",
                  f"leases    {len(doc['leases'])} held: {_cell(c['in_flight'])} fetching now, "
                  f"{_cell(c['waiting'])} waiting in its backlog (capacity "
                  f"{_cell(c.get('capacity'))})"]
    waits = [h for h in doc["hosts"] if h["next_slot_in_s"]]
    lines.append("waits on  " + (", ".join(
        f"{_cell(h['host'])} ({h['leased_items']} items, next slot in "
        f"{_number(h['next_slot_in_s'], 'g')} s)" for h in waits[:10]) or "no host"))
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
        live = sorted(c["id"] for c in cluster_status(zk, settings.root)["consumers"])
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
