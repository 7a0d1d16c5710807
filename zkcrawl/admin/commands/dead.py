"""``zkcrawl dead list|requeue|purge``: the items that failed ``--max-attempts`` times.

* ``dead list [--json]``: id, attempts, last error, URL, age.
* ``dead requeue (--all | ID...)``: offer each item again with attempt 0 (the original
  item's producer and meta kept, ``meta.requeued_from`` and ``meta.last_error`` added) and
  delete the letter, one transaction per letter. A letter without a URL (a malformed item)
  cannot be requeued: it is reported and left for ``purge``.
* ``dead purge (--all | ID...) --yes``: delete for good; refuses without ``--yes``.

IDs are ``dl-0000000007`` or just ``7``, written right after the action. ``--yes`` and
``--all`` are flags only, on purpose: no environment variable or config key can confirm a
destructive command for you.

A dead letter's URL and error come from crawled pages and znodes: the text list shows them
through :func:`zkcrawl.textsafe.printable` (no control, ANSI or bidi character reaches the
terminal), and ``--json`` is always valid UTF-8 (a lone surrogate becomes U+FFFD).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Mapping

from zkcrawl.admin.cluster import (
    DeadLetter,
    Outcome,
    list_dead,
    purge_dead,
    requeue_dead,
    select_dead,
)
from zkcrawl.admin.cluster import session as zk_session
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt
from zkcrawl.textsafe import printable, scrub

NAME = "dead"
HELP = "list, requeue or purge dead letters (items that failed --max-attempts times)"
URL_SHOWN = 2048  # characters of a URL shown by the text list
ERROR_SHOWN = 300  # characters of an error shown by the text list
EXAMPLES = """
    zkcrawl dead list
    zkcrawl dead requeue 7 12      # dl-0000000007 and dl-0000000012, attempt 0 again
    zkcrawl dead requeue --all
    zkcrawl dead purge --all --yes
"""


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    json: bool = opt(False, "dead list: print a JSON array")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "requeue", "purge"))
    parser.add_argument("ids", nargs="*", metavar="ID",
                        help="dead-letter ids (dl-NNNNNNNNNN or the number), right after "
                             "the action")
    parser.add_argument("--all", action="store_true", dest="all_",
                        help="requeue/purge: every dead letter")
    parser.add_argument("--yes", action="store_true",
                        help="purge: confirm the deletion (required)")


def _age(at: float | None) -> str:
    if at is None:
        return "-"
    s = max(0.0, time.time() - at)
    return f"{s:.0f}s" if s < 120 else (f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h")


def _print_list(letters: list[DeadLetter], as_json: bool) -> None:
    if as_json:
        print(scrub(json.dumps([d.to_json() for d in letters], ensure_ascii=False)))
        return
    if not letters:
        print("no dead letters")
        return
    for d in letters:
        error = printable(d.error, ERROR_SHOWN) if d.error else "-"
        url = printable(d.url, URL_SHOWN) if d.url else "(none: malformed item)"
        print(f"{printable(d.id)}  attempts={d.attempts}  age={_age(d.dead_at)}  "
              f"error={error}  url={url}")
    print(f"{len(letters)} dead letter(s)")


def _report(verb: str, out: Outcome) -> ExitStatus:
    for name, new in out.done:
        print(f"{printable(name)} {verb}" + (f" as {printable(new)}" if new else ""))
    for name, why in out.skipped:
        print(f"zkcrawl dead: {printable(name)} not {verb}: {printable(why)}", file=sys.stderr)
    print(f"{len(out.done)} {verb}, {len(out.skipped)} skipped")
    return ExitStatus.FAILURE if out.skipped else ExitStatus.OK


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    if ns.action == "list" and (ns.ids or ns.all_ or ns.yes):
        raise UsageError("dead list takes no ID, --all or --yes")
    if ns.action != "list" and ns.all_ == bool(ns.ids):
        raise UsageError(f"dead {ns.action}: name the dead letters (ID...) or use --all")
    if ns.action == "purge" and not ns.yes:
        raise UsageError("dead purge deletes dead letters for good: add --yes to confirm")
    setup_logging(settings)
    with zk_session(settings) as zk:
        if ns.action == "list":
            _print_list(list_dead(zk, settings.root), settings.json)
            return ExitStatus.OK
        letters = select_dead(zk, settings.root, ns.ids, ns.all_)
        if ns.action == "requeue":
            return _report("requeued", requeue_dead(zk, settings.root, letters))
        return _report("purged", purge_dead(zk, settings.root, letters))
