"""From argv, the environment and the ``--config`` file to validated settings.

Whatever the flags, the environment and the file hold (any bytes, any TOML type),
:func:`resolve` and :func:`parse` return settings that passed their ``validate()`` or
raise :class:`~zkcrawl.errors.UsageError` (exit 2), whose line names the variable or file a
bad value came from; nothing else (property-tested in tests/test_props_web.py). With
``--print-config`` they print the settings (:mod:`zkcrawl.settings.show`) and raise
SystemExit(0) after a valid configuration, as argparse's ``--help`` does.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from zkcrawl.errors import UsageError
from zkcrawl.settings.deprecated import warn_old_name
from zkcrawl.settings.parser import PROG
from zkcrawl.settings.show import render_config
from zkcrawl.settings.sources import Source, gather

T = TypeVar("T")


def parse(cls: type[T], parser: argparse.ArgumentParser, argv: Sequence[str],
          env: Mapping[str, str] | None = None) -> tuple[T, argparse.Namespace]:
    """Parse ``argv`` with ``parser`` (already holding ``cls``'s options) and resolve."""
    ns = parser.parse_args(list(argv))
    return resolve(cls, ns, os.environ if env is None else env), ns


def resolve(cls: type[T], ns: argparse.Namespace, env: Mapping[str, str]) -> T:
    """Build ``cls`` from parsed flags, the environment and the config file. With
    ``--print-config``: print each effective value and its source, then exit 0 (or 2 if a
    value is invalid) without connecting anywhere."""
    given = vars(ns)
    command = given.get(PROG) or ""
    values, sources = gather(cls, given, command, env)
    for source in sources.values():
        if source.note:  # one line per deprecated variable actually used
            warn_old_name(command, source.where, source.note)
    obj = cls(**values)
    if given.get("print_config"):
        sys.stdout.write(render_config(obj, sources, command))
        sys.stdout.flush()
    _validate(obj, sources)
    if given.get("print_config"):
        raise SystemExit(0)
    return obj


def _validate(obj: Any, sources: Mapping[str, Source]) -> None:
    validate = getattr(obj, "validate", None)
    if validate is None:
        return
    try:
        validate()
    except UsageError as exc:
        raise _with_source(exc, sources) from None


def _with_source(exc: UsageError, sources: Mapping[str, Source]) -> UsageError:
    """``--threads must be at least 1, got 0`` + `` (from env ZKCRAWL_CONSUMER_THREADS)``
    when the flag the message starts with came from the environment or a file."""
    message = str(exc)
    flag = re.match(r"--([a-z0-9-]+)", message)
    source = sources.get(flag.group(1).replace("-", "_")) if flag else None
    if source is None or source.kind not in ("env", "file"):
        return exc
    new = UsageError(f"{message} (from {source.kind} {source.where})")
    new.__dict__.update(exc.__dict__)  # a prog set on the original
    return new
