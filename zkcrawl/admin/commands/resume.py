"""``zkcrawl resume``: let every consumer claim again (``<root>/control`` = running)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from zkcrawl.admin.commands.pause import Settings, switch
from zkcrawl.errors import ExitStatus
from zkcrawl.queue.control import RUNNING

NAME = "resume"
HELP = "resume the whole cluster after a pause"
EXAMPLES = """
    zkcrawl resume                 # consumers claim again
    zkcrawl resume --wait 10       # ... and wait until every live consumer acknowledged
"""

__all__ = ["EXAMPLES", "HELP", "NAME", "Settings", "configure", "execute"]


def configure(parser: argparse.ArgumentParser) -> None:
    """No positionals."""


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    return switch(settings, RUNNING)
