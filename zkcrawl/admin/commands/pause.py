"""``zkcrawl pause``: stop every consumer from claiming and starting fetches.

It writes ``{"state": "paused"}`` to ``<root>/control`` and returns once ZooKeeper has it;
consumers react through their watch within a second and publish the state they run under,
which ``zkcrawl status`` shows as ACK. ``--wait S`` also waits for those acknowledgements; a
consumer that has not acknowledged by then is named in one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
from collections.abc import Mapping

from zkcrawl.admin.cluster import session, wait_acknowledged
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.queue.control import PAUSED, set_state
from zkcrawl.queue.layout import Layout
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt
from zkcrawl.textsafe import printable

NAME = "pause"
HELP = "pause the whole cluster: consumers stop claiming and starting fetches"
EXAMPLES = """
    zkcrawl pause                  # consumers stop claiming within a second
    zkcrawl pause --wait 10        # ... and wait until every live consumer acknowledged
    zkcrawl resume
"""


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    wait: float = opt(0.0, "also wait up to S seconds until every live consumer has "
                      "acknowledged (exit 1 if one has not)", metavar="S")

    def validate(self) -> None:
        super().validate()
        if self.wait < 0:
            raise UsageError("--wait must be >= 0 seconds")


def configure(parser: argparse.ArgumentParser) -> None:
    """No positionals."""


def switch(settings: Settings, state: str) -> ExitStatus:
    """Write ``state`` to the control node, report, optionally await acknowledgement."""
    setup_logging(settings)
    with session(settings) as zk:
        set_state(zk, settings.root, state, by=f"zkcrawl@{socket.gethostname()}")
        print(f"{Layout.of(settings.root).control}: {state}")
        pending = wait_acknowledged(zk, settings.root, settings.wait)
    if not pending:
        if settings.wait:
            print(f"every live consumer acknowledged {state}")
        return ExitStatus.OK
    if not settings.wait:
        print(f"{len(pending)} consumer(s) have not acknowledged yet (they do within about "
              "a second; see `zkcrawl status`)")
        return ExitStatus.OK
    names = ", ".join(printable(p, 80) for p in pending)  # ids are read from ZooKeeper
    command = "pause" if state == PAUSED else "resume"
    print(f"zkcrawl {command}: error: {state} not acknowledged within {settings.wait:g}s by: "
          f"{names}", file=sys.stderr)
    return ExitStatus.FAILURE


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    return switch(settings, PAUSED)
