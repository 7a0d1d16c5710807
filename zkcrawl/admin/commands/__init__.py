"""Admin subcommands of ``zkcrawl``: one module per command, each exposing

``NAME``, ``HELP``, ``Settings`` (a frozen dataclass extending CommonSettings),
``configure(parser)`` for positionals, and ``execute(settings, ns, env) -> ExitStatus``.
``zkcrawl bench`` has the same shape but lives with the benchmarks
(:mod:`zkcrawl.bench.command`); :mod:`zkcrawl.cli` lists every subcommand.
"""

COMMANDS = ("status", "pause", "resume", "dead", "queue", "report", "local_zk", "demo",
            "try_", "exporter", "acl")
