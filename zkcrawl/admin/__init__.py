"""The operator's side: :mod:`.cluster` (what ``status``, ``dead``, ``queue``, ``pause`` read
and change in ZooKeeper), :mod:`.commands` (one module per ``zkcrawl`` subcommand),
:mod:`.report`, :mod:`.demo` with its :mod:`.samplesite`, and :mod:`.localzk` (a throwaway
local ZooKeeper)."""
