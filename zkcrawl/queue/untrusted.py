"""One safe decoder for everything zkcrawl reads from ZooKeeper (SPEC §2): any process that
reaches the ensemble may have written any znode, so znode data is hostile until decoded here.

* :func:`load_json` **never raises**: invalid UTF-8 or JSON, ``NaN``/``Infinity``, huge
  integers, nesting deeper than :data:`MAX_DEPTH` (checked before the parser recurses), data
  over the size cap -- each is a short reason string instead.
* **Bounded cost**: the size cap first, then one linear scan.
* :func:`fields` type-checks the decoded object against a small schema;
  :class:`MalformedLog` warns once per node *version* for data that is only ignored.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from zkcrawl.logs import get_logger

MAX_DEPTH = 32
ITEM_LIMIT = 64 * 1024  # an item's data (SPEC §2)
URL_LIMIT = 8 * 1024  # a URL, UTF-8 bytes (SPEC §2)
NODE_LIMIT = 64 * 1024  # any other znode zkcrawl reads (status, lease, control, hosts, dead)

log = get_logger(__name__)

# The nesting scan: a whole JSON string (brackets inside it do not count; the possessive
# quantifiers never backtrack, so the scan is linear) is cut out, in C; what is left are
# the brackets outside strings and any quote that opens a string never closed.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def url_too_long(text: str) -> bool:
    """``text`` is over ``URL_LIMIT`` UTF-8 bytes (SPEC §2); encoded only when it may be."""
    return len(text) * 4 > URL_LIMIT and len(text.encode("utf-8", "surrogatepass")) > URL_LIMIT


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """True when JSON ``text`` nests arrays/objects deeper than ``limit``, or holds a string
    that is never closed (linear time)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    rest = _STRING.sub("", text)
    if '"' in rest:
        return True  # unterminated string: invalid anyway, and not worth parsing
    depth = 0
    for step in map(_STEP.__getitem__, _BRACKET.findall(rest)):
        depth += step
        if depth > limit:
            return True
    return False


def load_json(data: bytes | None, *, limit: int = NODE_LIMIT) -> tuple[Any, str | None]:
    """``(value, None)`` for well-formed JSON data, else ``(None, reason)``; never raises."""
    if data is None:
        return None, "empty"
    if len(data) > limit:
        return None, f"too large ({len(data)} bytes > {limit})"
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    return loads_text(text)


def loads_text(text: str) -> tuple[Any, str | None]:
    """Like :func:`load_json` for text already decoded (and already size-checked)."""
    if not text.strip():
        return None, "empty"
    if too_deep(text):
        return None, f"nested deeper than {MAX_DEPTH}"
    try:
        return _DECODER.decode(text), None
    except (ValueError, RecursionError, OverflowError) as exc:
        # ValueError covers JSONDecodeError, NaN/Infinity and ints past the digit limit.
        return None, f"invalid JSON: {str(exc)[:80]}"


def load_object(data: bytes | None, schema: Mapping[str, type | tuple[type, ...]],
                *, limit: int = NODE_LIMIT) -> tuple[dict[str, Any] | None, str | None]:
    """A JSON object whose listed keys, when present, have the listed types.

    Keys of the wrong type are dropped (``bool`` never passes for ``int``/``float``);
    missing keys stay missing. Not an object: ``(None, reason)``.
    """
    doc, why = load_json(data, limit=limit)
    if why is not None:
        return None, why
    if not isinstance(doc, dict):
        return None, f"not a JSON object ({type(doc).__name__})"
    return fields(doc, schema), None


def fields(doc: Mapping[str, Any], schema: Mapping[str, type | tuple[type, ...]]
           ) -> dict[str, Any]:
    """The keys of ``schema`` present in ``doc`` with the right type; others dropped."""
    out: dict[str, Any] = {}
    for key, kind in schema.items():
        value = doc.get(key)
        if value is None or (isinstance(value, bool) and kind is not bool):
            continue
        if isinstance(value, kind):
            out[key] = value
    return out


NUMBER = (int, float)


def number(value: Any, default: float = 0.0, *, lo: float = -1e15, hi: float = 1e15
           ) -> float:
    """A finite float within ``[lo, hi]`` from an untrusted JSON value, else ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    try:
        f = float(value)
    except OverflowError:
        return default
    return f if math.isfinite(f) and lo <= f <= hi else default


class MalformedLog:
    """Warn once per (path, version) about a malformed node; remembers a bounded set."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def warn(self, path: str, version: int | None, reason: str) -> bool:
        """Log ``znode.malformed`` unless this node version was reported; True if logged."""
        key = (path, -1 if version is None else int(version))
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > self._size:
                self._seen.popitem(last=False)
        log.warning("znode.malformed", path=path, reason=reason, ignored=True)
        return True


MALFORMED = MalformedLog()


def version_of(stat: object) -> int | None:
    """The data version of a znode's stat (mzxid: it also changes on re-create); None
    for no stat."""
    return getattr(stat, "mzxid", None)
