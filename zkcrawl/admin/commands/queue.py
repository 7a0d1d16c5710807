"""``zkcrawl queue list [--limit N] [--json]`` and ``zkcrawl queue purge --yes``.

``list`` shows the items consumers take next (and who holds a lease on them); ``purge``
deletes every queued item and refuses without ``--yes`` (a flag only: no environment
variable or config key confirms it). Leases stay with their holders, which find their
item gone on completion and move on.

Queued URLs and lease holders are whatever was written to ZooKeeper: the text list shows
them through :func:`zkcrawl.textsafe.printable` (no control, ANSI or bidi character reaches
the terminal), and ``--json`` is always valid UTF-8 (a lone surrogate becomes U+FFFD).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from zkcrawl.admin.cluster import list_queue, purge_queue
from zkcrawl.admin.cluster import session as zk_session
from zkcrawl.admin.commands.dead import root_missing
from zkcrawl.errors import ExitStatus, UsageError, ZkCrawlError
from zkcrawl.queue.layout import Layout
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt
from zkcrawl.textsafe import printable, scrub, shown_url

NAME = "queue"
HELP = "list the head of the queue, or purge every queued item (--yes)"
URL_SHOWN = 2048  # characters of a URL (or decoding error) shown by the text list
EXAMPLES = """
    zkcrawl queue list --limit 50  # the items consumers take next, with their lease holders
    zkcrawl queue purge --yes      # delete every queued item
"""


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    json: bool = opt(False, "queue list: print a JSON array")
    limit: int = opt(20, "queue list: how many items from the head", metavar="N")

    def validate(self) -> None:
        super().validate()
        if self.limit < 0:
            raise UsageError("--limit must be >= 0")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "purge"))
    parser.add_argument("--yes", action="store_true", help="purge: confirm (required)")


def _row(r: dict[str, Any]) -> str:
    """One item of the text list, every value from ZooKeeper escaped."""
    held = f"  leased by {printable(str(r['leased_by']), 200)}" if r["leased_by"] else ""
    what = (shown_url(r["url"], URL_SHOWN) if r["url"]
            else f"(malformed: {printable(str(r['error']), URL_SHOWN)})")
    return (f"{printable(r['item'])}  attempt={printable(str(r['attempt']))}  "
            f"age={r['age_s']:.1f}s  {what}{held}")


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    if ns.action == "purge" and not ns.yes:
        raise UsageError("queue purge deletes every queued item for good: add --yes to confirm")
    setup_logging(settings)
    with zk_session(settings) as zk:
        missing = root_missing(zk, settings.root)
        if missing and ns.action == "purge":
            raise ZkCrawlError(missing)
        if missing:  # as `zkcrawl status` says it; the JSON stays a list
            print("[]" if settings.json else f"0 queued: {missing}")
            return ExitStatus.OK
        if ns.action == "purge":
            deleted, leased = purge_queue(zk, settings.root)
            print(f"purged {deleted} item(s) from {Layout.of(settings.root).queue}"
                  + (f" ({leased} were leased: their consumers finish and move on)"
                     if leased else ""))
            return ExitStatus.OK
        rows = list_queue(zk, settings.root, settings.limit)
        depth = zk.exists(Layout.of(settings.root).queue)
    if settings.json:
        print(scrub(json.dumps(rows, ensure_ascii=False)))
        return ExitStatus.OK
    for r in rows:
        print(_row(r))
    total = depth.numChildren if depth else 0
    print(f"{len(rows)} shown of {total} queued")
    return ExitStatus.OK
