"""Settings for display: ``--print-config``, logs, status nodes.

Nothing shown here holds a secret: a field declared ``secret`` is ``***`` when set, and the
credentials of a URL in any string value (in lists and tables too) are masked.
:func:`render_config` writes TOML that ``--config`` accepts, one line per setting in help
order with its :class:`~zkcrawl.settings.sources.Source`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from zkcrawl.settings.common import group_of
from zkcrawl.settings.options import fields, group_rank, is_secret
from zkcrawl.settings.sources import DEFAULT, Source
from zkcrawl.textsafe import redact_userinfo


def redacted(settings: Any) -> dict[str, Any]:
    """The settings as a dict for display (logs, status nodes, ``--print-config``): secret
    fields ``***``, and the credentials of any URL in a string value masked (``--out
    postgresql://user:pw@db/crawl`` shows ``postgresql://***@db/crawl``), in lists and tables
    too."""
    return {f.name: ("***" if is_secret(f) and getattr(settings, f.name)
                     else _masked(getattr(settings, f.name)))
            for f in dataclasses.fields(settings)}


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return redact_userinfo(value)
    if isinstance(value, tuple | list):
        return type(value)(_masked(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _masked(v) for k, v in value.items()}
    return value


def render_config(settings: Any, sources: Mapping[str, Source], command: str = "") -> str:
    """``--print-config``: one ``key = value  # source`` line per setting in help order,
    TOML a ``--config`` file accepts (unset ones commented out), secrets as ``***``."""
    shown = redacted(settings)
    ordered = sorted(fields(type(settings)), key=lambda ft: group_rank(group_of(ft[0])))
    rows = []
    for field, _tp in ordered:
        value = shown[field.name]
        key = field.name.replace("_", "-")
        text = f"# {key} = (not set)" if value is None else f"{key} = {_toml(value)}"
        rows.append((text, str(sources.get(field.name, DEFAULT))))
    width = min(max(len(t) for t, _ in rows), 60)
    head = (f"# {command or 'zkcrawl'}: effective settings and their sources "
            "(flag > env > file > default)\n")
    return head + "".join(f"{t.ljust(width)}  # {src}\n" for t, src in rows)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):  # an inline table ([processors] of the consumer)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's
