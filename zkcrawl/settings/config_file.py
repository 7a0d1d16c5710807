"""The ``--config`` source: a TOML file whose keys are the flag names.

:func:`load_toml` returns the file's top-level table with its keys spelt like field names
(``max-attempts`` and ``max_attempts`` are one key), or raises one
:class:`~zkcrawl.errors.UsageError` line (exit 2) for any problem: a missing or unreadable
file, a name with NUL, bytes that are not UTF-8 or not TOML, nesting too deep.
"""

from __future__ import annotations

import os
import tomllib
from typing import Any

from zkcrawl.errors import UsageError


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML settings file; any problem is one clear :class:`UsageError`."""
    _check_file_name(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"--config: no such file: {path}") from None
    except OSError as exc:
        raise UsageError(f"--config: cannot read {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError, UnicodeDecodeError (not UTF-8), ValueError (an integer of more than
        # 4300 digits), RecursionError (arrays or tables nested too deep)...
        raise UsageError(f"--config: {path} is not valid TOML: {exc}") from None
    return {key.replace("-", "_"): value for key, value in data.items()}


def _check_file_name(path: str) -> None:
    try:
        if b"\x00" not in os.fsencode(path):
            return
    except UnicodeEncodeError:  # a lone surrogate that surrogateescape cannot map to a byte
        pass
    raise UsageError(f"--config: not a usable file name: {path!r}")
