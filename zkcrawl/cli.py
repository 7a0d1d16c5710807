"""``zkcrawl``: the admin command. ``main(argv, env) -> ExitStatus`` runs in-process."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

from zkcrawl.errors import ExitStatus, ZkCrawlError
from zkcrawl.runner import guarded
from zkcrawl.settings import ArgumentParser, add_options, resolve

PROG = "zkcrawl"
EXAMPLES = """examples:
  zkcrawl demo                                  # the whole system on this machine
  zkcrawl local-zk start                        # a throwaway ZooKeeper on 127.0.0.1:2181
  zkcrawl status --zk zk1:2181,zk2:2181,zk3:2181
  zkcrawl COMMAND --help                        # a command's options and examples"""


#: Every subcommand's module, in --help order: ``zkcrawl.admin.commands.<name>``, except the
#: benchmarks' command, which lives with them (zkcrawl.bench imports zkcrawl.admin, never the
#: reverse: this module is the one that knows both).
COMMANDS = ("status", "pause", "resume", "dead", "queue", "report", "local_zk", "demo", "bench",
            "try_", "exporter", "acl")
_ELSEWHERE = {"bench": "zkcrawl.bench.command"}


def _load(name: str) -> ModuleType:
    return importlib.import_module(_ELSEWHERE.get(name, f"zkcrawl.admin.commands.{name}"))


def build_parser() -> tuple[ArgumentParser, dict[str, ModuleType]]:
    parser = ArgumentParser(prog=PROG, description="Admin command of a zkcrawl cluster.",
                            epilog=EXAMPLES)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    modules = {}
    for name in COMMANDS:
        mod = _load(name)
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        add_options(p, mod.Settings, getattr(mod, "EXAMPLES", ""))
        mod.configure(p)
        modules[mod.NAME] = mod
    return parser, modules


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    env = os.environ if env is None else env
    def work() -> ExitStatus:
        parser, modules = build_parser()
        ns = parser.parse_args(list(argv))
        if not ns.command:
            parser.print_help(sys.stderr)
            return ExitStatus.USAGE
        mod = modules[ns.command]
        try:
            settings = resolve(mod.Settings, ns, env)
            return ExitStatus(mod.execute(settings, ns, env))
        except ZkCrawlError as exc:  # its one line names the command: "zkcrawl bench: ..."
            if not exc.prog:
                exc.prog = f"{PROG} {ns.command}"
            raise

    return guarded(PROG, work)


def run() -> None:
    sys.exit(int(main(sys.argv[1:], os.environ)))


if __name__ == "__main__":
    run()
