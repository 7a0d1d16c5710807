"""Admin subcommands of ``zkcrawl``: one module per command, each exposing

``NAME``, ``HELP``, ``Settings`` (a frozen dataclass extending CommonSettings),
``configure(parser)`` for positionals, and ``execute(settings, ns, env) -> ExitStatus``.
"""

COMMANDS = ("status", "pause", "resume", "dead", "queue", "report", "local_zk", "demo", "bench",
            "try_", "exporter")
