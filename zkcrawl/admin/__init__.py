"""The operator's side: :mod:`.cluster` (what ``status``, ``dead``, ``queue``, ``pause`` read
and change in ZooKeeper), :mod:`.commands` (one module per ``zkcrawl`` subcommand),
:mod:`.report`, :mod:`.demo` with its :mod:`.samplesite`, and the throwaway local servers
:mod:`.localzk` (ZooKeeper) and :mod:`.localpg` (PostgreSQL).

Nothing here imports :mod:`zkcrawl.bench`; the benchmarks import this package's local
servers and sample site (the rule is written in :mod:`zkcrawl.bench`)."""
