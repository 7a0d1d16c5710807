"""``zkcrawl status [--json] [--watch S]``: the cluster at a glance.

``--json`` prints the stable document of :func:`zkcrawl.admin.cluster.cluster_status` (one object;
with ``--watch``, one object per line). Without it, a table; ``--watch S`` redraws it in
place every S seconds on a terminal (appends blocks otherwise) until Ctrl-C.

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

from zkcrawl.admin.cluster import cluster_status, session
from zkcrawl.errors import ExitStatus, UsageError
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
"""

_CLEAR = "\x1b[H\x1b[2J"
MIN_WATCH = 0.1  # a shorter period only loads ZooKeeper with reads nobody can follow
_CELL_LIMIT = 80  # characters of one published value shown in a table cell


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    json: bool = opt(False, "print one JSON object (stable, documented fields)")
    watch: float = opt(0.0, "refresh every S seconds until Ctrl-C (0: print once)",
                       metavar="S")

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
    line = f"hosts     {h['tracked']} with a politeness slot, {h['held_back']} held back"
    if h["longest"]:
        line += ": " + ", ".join(f"{_cell(x['host'])} ({_number(x['next_slot_in_s'], 'g')} s)"
                                 for x in h["longest"][:5])
    return line


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
             f"leases    {leases['count']} in flight",
             f"dead      {doc['dead']['count']} dead letters"
             + ("  (see `zkcrawl dead list`)" if doc["dead"]["count"] else ""),
             _hosts_line(doc["hosts"]), ""]
    if doc["consumers"]:
        rows = [[c["id"], c["host"], c["state"], c["processed"], c["failed"], c["in_flight"],
                 c["leases"], _number(c["items_per_s"]), _age(c["heartbeat_age_s"]),
                 "yes" if c["acknowledged"] else "no"] for c in doc["consumers"]]
        lines += _table(["CONSUMER", "HOST", "STATE", "PROCESSED", "FAILED", "IN FLIGHT",
                         "LEASES", "ITEMS/S", "HEARTBEAT", "ACK"], rows)
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


def _show(doc: dict[str, Any], settings: Settings, out: IO[str], redraw: bool) -> None:
    if settings.json:
        out.write(json.dumps(doc, sort_keys=True) + "\n")
    else:
        out.write((_CLEAR if redraw else "") + render(doc, settings.zk))
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


def _loop(zk: ZkClient, settings: Settings, out: IO[str], redraw: bool) -> ExitStatus:
    while True:
        try:
            _show(cluster_status(zk, settings.root), settings, out, redraw)
        except KazooException as exc:
            if not settings.watch:
                raise
            # A watch outlives a ZooKeeper hiccup: say so and try again next round.
            print(f"zkcrawl status: ZooKeeper error ({type(exc).__name__}), retrying",
                  file=sys.stderr)
        if not settings.watch:
            return ExitStatus.OK
        time.sleep(settings.watch)  # the refresh period the operator asked for
