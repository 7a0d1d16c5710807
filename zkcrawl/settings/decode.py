"""Decoders of raw setting values: a flag's or variable's string, or any TOML value.

:func:`decode` returns a value of the field's type or raises
:class:`~zkcrawl.errors.UsageError` naming the flag and the source, nothing else, for any
input (NaN, 1e400, 5000-digit numbers, NUL, lone surrogates, nesting deep enough to
exhaust the stack). What it returns holds only finite floats of magnitude <=
:data:`MAX_FLOAT`, integers of magnitude <= :data:`MAX_INT`, strings without NUL, and a
declared choice where the field has choices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from zkcrawl.errors import UsageError
from zkcrawl.settings.options import Field, base_type, flag_name

#: No count, size or port needs more; beyond 2**53 floats and C APIs start to lose digits.
MAX_INT = 2**53
#: Every float setting is seconds or a rate: 1e9 s is 31 years, while threading and sleeps
#: refuse timeouts above threading.TIMEOUT_MAX (~9.2e9 s) with OverflowError.
MAX_FLOAT = 1e9


def decode(field: Field, tp: Any, raw: Any, source: str) -> Any:
    """``raw`` as a value of ``field`` (type ``tp``); ``source`` names where it came from
    in the error line (``the command line``, ``$ZKCRAWL_ZK``, a file name)."""
    value = _convert(field.name, tp, raw, source)
    choices = field.metadata.get("choices")
    if choices and value not in choices:
        raise UsageError(f"{flag_name(field.name)} from {source}: {value!r} is not one of "
                         f"{', '.join(choices)}")
    return value


def _convert(name: str, tp: Any, raw: Any, source: str) -> Any:
    convert = _CONVERTERS.get(base_type(tp))
    if convert is None:
        return raw
    try:
        return convert(raw)
    # OverflowError: int(inf), float(10**400); RecursionError: str() of deeply nested TOML.
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise UsageError(f"{flag_name(name)} from {source}: {exc}") from None


def _kind(raw: Any) -> str:
    """What a value is, for messages: never the repr of a (possibly huge) container."""
    if isinstance(raw, str):
        return repr(raw) if len(raw) <= 40 else repr(raw[:40]) + "..."
    if isinstance(raw, float) or (isinstance(raw, int) and abs(raw) < 10**40):
        return repr(raw)
    return f"a value of type {type(raw).__name__}"


def _to_str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {_kind(raw)}")
    if "\x00" in raw:
        raise ValueError("a NUL character is not allowed")
    return raw


def _to_list(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [line.strip() for line in raw.splitlines() if line.strip()]
    if not isinstance(raw, tuple | list):
        raise ValueError(f"expected a list of strings, got {_kind(raw)}")
    return tuple(_to_str(v) for v in raw)


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {_kind(raw)}")


def _to_int(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"not an integer: {_kind(raw)}")
    if isinstance(raw, float) and not raw.is_integer():
        raise ValueError(f"not an integer: {_kind(raw)}")
    if isinstance(raw, str) and len(raw) > 64:  # int() refuses 4300 digits in its own words
        raise ValueError(f"out of range: {_kind(raw)}")
    value = int(raw)
    if abs(value) > MAX_INT:
        raise ValueError(f"out of range: magnitude above 2**53 ({_kind(raw)})")
    return value


def _to_float(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"not a number: {_kind(raw)}")
    value = float(raw)
    if not math.isfinite(value) or abs(value) > MAX_FLOAT:
        raise ValueError(f"out of range: not a finite number of magnitude <= {MAX_FLOAT:g} "
                         f"({_kind(raw)})")
    return value


_CONVERTERS: dict[Any, Callable[[Any], Any]] = {
    tuple: _to_list, list: _to_list, bool: _to_bool, int: _to_int, float: _to_float,
    str: _to_str}
