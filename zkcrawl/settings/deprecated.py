"""The old environment names: ``ZKCRAWL_<FLAG>`` for a command's own flag.

Only a settings class with ``legacy_env_names`` (the daemons) reads an old name, and only
when the new ``ZKCRAWL_<COMMAND>_<FLAG>`` is unset; a value so read carries a note, and the
command says so in one line on stderr per variable used. Admin commands never read them.
"""

from __future__ import annotations

import sys

from zkcrawl.settings.options import env_name

_NOTE = "deprecated name: use "


def old_env_name(cls: type, name: str, new: str) -> str | None:
    """The old variable ``cls`` still reads for field ``name`` beside ``new``, or None."""
    old = env_name(name)
    if old == new or not getattr(cls, "legacy_env_names", False):
        return None
    return old


def deprecation_note(new: str) -> str:
    """What ``--print-config`` says beside a value read from an old name."""
    return _NOTE + new


def warn_old_name(command: str, old: str, note: str) -> None:
    """The one stderr line for an old variable that was read."""
    print(f"{command or 'zkcrawl'}: warning: ${old} is deprecated (other commands read it "
          f"too): use {note.removeprefix(_NOTE)}", file=sys.stderr)
