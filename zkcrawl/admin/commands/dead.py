"""``zkcrawl dead list|requeue|purge``: the items that failed ``--max-attempts`` times.

* ``list [--json]``: id, attempts, last error, URL, age.
* ``requeue``: offer each item again with attempt 0 (its producer and meta kept,
  ``meta.requeued_from`` and ``meta.last_error`` added) and delete the letter, one
  transaction per letter; a letter without a URL is reported and left for ``purge``.
* ``purge ... --yes``: delete for good; refuses without ``--yes``.

Select with IDs (``dl-0000000007`` or ``7``), ``--all`` or the filters (on ``list`` too, ANDed):
``--error`` (a glob), ``--host``, ``--older-than``. ``--yes``, ``--all`` and the filters are
flags only: no environment variable or config key can confirm or widen a destructive command.
Shown text is untrusted: through :func:`zkcrawl.textsafe.printable`; ``--json`` is valid UTF-8.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from collections.abc import Mapping

from zkcrawl.admin.cluster import (
    DeadFilter,
    DeadLetter,
    RepairOutcome,
    list_dead,
    purge_dead,
    requeue_dead,
    select_dead,
)
from zkcrawl.admin.cluster import session as zk_session
from zkcrawl.errors import ExitStatus, UsageError, ZkCrawlError
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt
from zkcrawl.textsafe import printable, scrub, shown_url
from zkcrawl.zk.client import ZkClient

NAME = "dead"
HELP = "list, requeue or purge dead letters (items that failed --max-attempts times)"
URL_SHOWN = 2048  # characters of a URL shown by the text list
ERROR_SHOWN = 300  # characters of an error shown by the text list
EXAMPLES = """
    zkcrawl dead list
    zkcrawl dead requeue 7 12      # dl-0000000007 and dl-0000000012, attempt 0 again
    zkcrawl dead requeue --all
    zkcrawl dead requeue --error 'http-5*' --host shop.example.com --older-than 1h
    zkcrawl dead list --error timeout --json
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
    parser.add_argument("--error", metavar="REASON",
                        help="only letters whose error matches REASON (a glob: http-5*)")
    parser.add_argument("--host", metavar="HOST",
                        help="only letters whose URL is on HOST (host[:port] or the name)")
    parser.add_argument("--older-than", metavar="AGE", type=parse_age,
                        help="only letters dead for at least AGE (90, 90s, 15m, 2h, 1d)")


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_AGE = re.compile(r"\s*(\d{1,12}(?:\.\d{1,9})?)\s*([smhd]?)\s*")


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds; anything else raises
    ArgumentTypeError (argparse makes it one usage line naming the flag)."""
    m = _AGE.fullmatch(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not an age (90, 90s, 15m, 2h, 1d): {text[:40]!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


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
        error = shown_url(d.error, ERROR_SHOWN) if d.error else "-"
        url = shown_url(d.url, URL_SHOWN) if d.url else "(none: malformed item)"
        print(f"{printable(d.id)}  attempts={d.attempts_text}  age={_age(d.dead_at)}  "
              f"error={error}  url={url}")
    print(f"{len(letters)} dead letter(s)")


def root_missing(zk: ZkClient, root: str) -> str | None:
    """``root /x does not exist yet: ...`` when ``--root`` names no znode (a typo, another
    cluster's root), else None; `zkcrawl status` says the same in its header."""
    if zk.exists(root.rstrip("/") or "/") is not None:
        return None
    return (f"root {printable(root, 300)} does not exist yet: nothing ran here "
            "(check --root)")


def _report(verb: str, out: RepairOutcome) -> ExitStatus:
    for name, new in out.done:
        print(f"{printable(name)} {verb}" + (f" as {printable(new)}" if new else ""))
    for name, why in out.skipped:
        print(f"zkcrawl dead: {printable(name)} not {verb}: {printable(why)}", file=sys.stderr)
    print(f"{len(out.done)} {verb}, {len(out.skipped)} skipped")
    return ExitStatus.FAILURE if out.skipped else ExitStatus.OK


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    where = DeadFilter(ns.error, ns.host, ns.older_than)
    if ns.action == "list" and (ns.ids or ns.all_ or ns.yes):
        raise UsageError("dead list takes no ID, --all or --yes (filters: --error, --host, "
                         "--older-than)")
    if ns.action != "list" and ns.all_ and ns.ids:
        raise UsageError(f"dead {ns.action}: name the dead letters (ID...) or use --all, "
                         "not both")
    if ns.action != "list" and not (ns.all_ or ns.ids or where):
        raise UsageError(f"dead {ns.action}: name the dead letters (ID...), use --all, or "
                         "select them with --error/--host/--older-than")
    if ns.action == "purge" and not ns.yes:
        raise UsageError("dead purge deletes dead letters for good: add --yes to confirm")
    setup_logging(settings)
    with zk_session(settings) as zk:
        missing = root_missing(zk, settings.root)
        if missing and ns.action != "list":
            raise ZkCrawlError(missing)
        if missing:  # as `zkcrawl status` says it; the JSON stays a list
            print("[]" if settings.json else f"no dead letters: {missing}")
            return ExitStatus.OK
        if ns.action == "list":
            now = time.time()
            _print_list([d for d in list_dead(zk, settings.root) if where.matches(d, now)],
                        settings.json)
            return ExitStatus.OK
        letters = select_dead(zk, settings.root, ns.ids, ns.all_, where)
        if ns.action == "requeue":
            return _report("requeued", requeue_dead(zk, settings.root, letters))
        return _report("purged", purge_dead(zk, settings.root, letters))
