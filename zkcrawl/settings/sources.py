"""Where a setting's value comes from, and the one precedence rule (SPEC §4).

:func:`gather` takes each field of a settings class from the first source that sets it:
**flag > environment > TOML file (``--config``) > default** (:func:`pick`, the only place
the order is written). A repeatable flag is taken as a whole from that one source, never
merged across sources. Every value is decoded (:mod:`zkcrawl.settings.decode`) and comes
with its :class:`Source`; an unknown file key or a bad value is one
:class:`~zkcrawl.errors.UsageError` line naming the flag and the source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from zkcrawl.errors import UsageError
from zkcrawl.settings.common import is_shared
from zkcrawl.settings.config_file import load_toml
from zkcrawl.settings.decode import decode
from zkcrawl.settings.deprecated import deprecation_note, old_env_name
from zkcrawl.settings.options import env_name, fields, flag_name
from zkcrawl.settings.validate import did_you_mean


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a setting's value came from, for ``--print-config`` and error lines."""

    kind: str  # flag | env | file | default
    where: str = ""  # the variable's or the file's name
    note: str = ""  # e.g. a deprecated variable's replacement

    def __str__(self) -> str:
        return " ".join(p for p in (self.kind, self.where) if p) + (
            f" ({self.note})" if self.note else "")

    def shown(self) -> str:
        """The source as error lines name it: ``the command line``, ``$VAR``, a file."""
        return {"flag": "the command line", "env": f"${self.where}"}.get(self.kind,
                                                                        self.where)


DEFAULT = Source("default")
Found = tuple[Any, Source]


def pick(cls: type, name: str, given: Mapping[str, Any], command: str,
         env: Mapping[str, str], file: tuple[str | None, Mapping[str, Any]]) -> Found | None:
    """THE precedence rule: the raw value of field ``name`` from the command line, else the
    environment, else the ``--config`` file; None: the field keeps its default."""
    if name in given:
        return given[name], Source("flag", flag_name(name))
    from_env = env_value(cls, name, command, env)
    if from_env is not None:
        return from_env
    path, values = file
    if name in values:
        return values[name], Source("file", str(path))
    return None


def env_value(cls: type, name: str, command: str, env: Mapping[str, str]) -> Found | None:
    """The value of ``name`` from the environment, and which variable held it. A daemon
    (``legacy_env_names``) still reads the old unprefixed name when the new one is unset."""
    new = env_name(name, command, is_shared(cls, name))
    if new in env:
        return env[new], Source("env", new)
    old = old_env_name(cls, name, new)
    if old is not None and old in env:
        return env[old], Source("env", old, deprecation_note(new))
    return None


def gather(cls: type, given: Mapping[str, Any], command: str, env: Mapping[str, str]
           ) -> tuple[dict[str, Any], dict[str, Source]]:
    """The decoded values of the fields some source sets, and every field's source."""
    file = _config_file(cls, given, command, env)
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for field, tp in fields(cls):
        found = pick(cls, field.name, given, command, env, file)
        if found is None:
            sources[field.name] = DEFAULT
            continue
        raw, source = found
        values[field.name] = decode(field, tp, raw, source.shown())
        sources[field.name] = source
    return values, sources


def _config_file(cls: type, given: Mapping[str, Any], command: str, env: Mapping[str, str]
                 ) -> tuple[str | None, dict[str, Any]]:
    """The ``--config`` file (from the flag, else the environment) and its keys."""
    if given.get("config"):
        path: str | None = given["config"]
    else:
        from_env = env_value(cls, "config", command, env)
        path = from_env[0] if from_env else None
    values = load_toml(path) if path else {}
    known = {f.name for f, _ in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UsageError(f"--config: unknown key {unknown[0]!r} in {path}"
                         f"{did_you_mean(unknown[0].replace('-', '_'), known)}")
    return path, values
