"""How an option is declared and named.

A command's settings are a frozen dataclass whose fields are made by :func:`opt`. From a
field's name come its flag (:func:`flag_name`), its TOML key (the flag without ``--``;
dashes or underscores) and its environment variable (:func:`env_name`, SPEC §4). The help
groups and their order are fixed here. No other module of the package is imported.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

#: Help groups, in the order ``--help`` shows them: the command's own options first, the
#: flags every command shares (:data:`SHARED_GROUPS`) after them. A field names its group
#: with ``opt(..., group=...)``; without one it lands in the command's ``options`` group
#: (with the options ``configure()`` adds), which comes first of all.
INPUT = "input"
FILTERING = "link filtering"
DEDUP = "de-duplication"
QUEUE = "queue"
WORKERS = "workers"
FETCHING = "fetching"
POLITENESS = "politeness"
OUTPUT = "output"
DELIVERY = "delivery"
OPERATIONS = "operations"
ZOOKEEPER = "ZooKeeper"
ZK_SECURITY = "ZooKeeper security"
LOGGING = "logging"
CONFIGURATION = "configuration"
GROUP_ORDER = (INPUT, FILTERING, DEDUP, QUEUE, WORKERS, FETCHING, POLITENESS, OUTPUT, DELIVERY,
               OPERATIONS)
SHARED_GROUPS = (ZOOKEEPER, ZK_SECURITY, LOGGING, CONFIGURATION)

Field = dataclasses.Field[Any]


def opt(default: Any, help: str, *, group: str | None = None, repeat: bool = False,
        choices: Sequence[str] | None = None, negatable: bool = False,
        metavar: str | None = None, short: str | None = None, secret: bool = False) -> Any:
    """A settings field: its default and how it appears on the command line. ``group`` is
    its heading in ``--help`` (e.g. :data:`OUTPUT`; a new name makes a new heading).
    A ``secret`` one is left out of the dataclass's repr and shown as ``***`` by
    :func:`~zkcrawl.settings.show.redacted`."""
    meta = {"help": help, "group": group, "repeat": repeat, "choices": choices,
            "negatable": negatable, "metavar": metavar, "short": short, "secret": secret}
    if repeat:
        return dataclasses.field(default=tuple(default), metadata=meta, repr=not secret)
    return dataclasses.field(default=default, metadata=meta, repr=not secret)


def is_secret(field: Field) -> bool:
    """True for a field declared with ``opt(..., secret=True)``."""
    return bool(field.metadata.get("secret"))


def fields(cls: type) -> list[tuple[Field, Any]]:
    """The settable fields of a settings class with their resolved type hints."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def base_type(tp: Any) -> Any:
    """``float | None`` -> float; ``tuple[str, ...]`` -> tuple."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return base_type(args[0])
    return origin or tp


def flag_name(field: str) -> str:
    """``max_attempts`` -> ``--max-attempts``."""
    return "--" + field.replace("_", "-")


def env_name(field: str, command: str = "", shared: bool = False) -> str:
    """The environment variable of ``field``: ``ZKCRAWL_<FLAG>`` for the flags every command
    shares, ``ZKCRAWL_<COMMAND>_<FLAG>`` for a command's own (``--timeout`` of
    ``zkcrawl-consumer``: ``ZKCRAWL_CONSUMER_TIMEOUT``), so no two commands read one name
    with two meanings. ``command`` is the program (``zkcrawl-consumer``, ``zkcrawl demo``);
    none: the old unprefixed name."""
    prefix = "" if shared else command_prefix(command)
    return "ZKCRAWL_" + (prefix + "_" if prefix else "") + field.upper()


def command_prefix(command: str) -> str:
    """``zkcrawl-consumer`` -> ``CONSUMER``; ``zkcrawl local-zk`` -> ``LOCAL_ZK``."""
    rest = command.removeprefix("zkcrawl").strip(" -")
    return re.sub(r"[^A-Za-z0-9]+", "_", rest).upper()


def group_rank(group: str | None) -> int:
    """Where a group's options go: own ungrouped, known groups, new groups, shared ones."""
    if group is None:
        return 0
    if group in SHARED_GROUPS:
        return 100 + SHARED_GROUPS.index(group)
    return 1 + GROUP_ORDER.index(group) if group in GROUP_ORDER else 50
