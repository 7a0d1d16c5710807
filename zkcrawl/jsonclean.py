"""The one home of JSON cleaning: any value a record may hold made strict JSON (RFC 8259).

The rule, stated once (:func:`json_clean`):

* every string -- values and keys -- goes through ``text`` (default
  :func:`~zkcrawl.textsafe.scrub`: a lone surrogate becomes U+FFFD, so the result encodes
  as UTF-8; the PostgreSQL sink also turns NUL into U+FFFD, which its ``text`` cannot hold);
* a NaN or infinite float *value* becomes ``null``;
* a NaN or infinite float *key* becomes its text, ``"nan"``, ``"inf"`` or ``"-inf"`` (a key
  cannot be null, and dropping it would lose the value);
* lists and tuples are cleaned item by item (a tuple becomes a list, as ``json`` writes it);
  anything else is returned as it is (the encoder refuses what is no JSON at all: a date, a
  set -- the sinks record that as ``not JSON``).

Callers try the plain encoding first and clean only a value that failed it: the common case
costs nothing here. Never raises for a JSON-shaped value (recursion aside).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from zkcrawl.textsafe import scrub

__all__ = ["json_clean"]


def json_clean(value: Any, text: Callable[[str], str] = scrub) -> Any:
    """``value`` made strict JSON by the module's rule; ``text`` cleans each string."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_key(k, text): json_clean(v, text) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_clean(v, text) for v in value]
    return value


def _key(key: Any, text: Callable[[str], str]) -> Any:
    if isinstance(key, str):
        return text(key)
    if isinstance(key, float) and not math.isfinite(key):
        return str(key)  # "nan", "inf", "-inf": json refuses the float
    return key
