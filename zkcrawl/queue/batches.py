"""Packing entries into batch nodes: one envelope, at most 64 KiB a node.

``{"<key>": [entry, ...], "consumer": <id>}`` is the shape of ``<root>/discovered/`` and
``<root>/fetched/`` nodes (SPEC §2); :func:`pack` writes it for any list of JSON-able entries.

Guarantees: every node is at most ``limit`` bytes (the entries' UTF-8 plus the envelope);
the entries keep their order; an entry that alone would not fit is left out and reported to
``too_large`` (never sent to ZooKeeper); lone surrogates in hostile text are escaped, so a
node is always valid UTF-8. Pure: no ZooKeeper.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from zkcrawl.queue.untrusted import NODE_LIMIT

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
ENVELOPE = 64  # bytes of {"<key>":[...],"consumer":...} around the entries, the id excluded
# The same encoding without JSONEncoder.encode's per-call set-up (half the cost of a small
# entry): the C encoder built once, without a circular check (entries are ours: flat dicts).
_C_ENCODE = (None if c_make_encoder is None else c_make_encoder(
    None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, True))


def _encode(doc: dict[str, Any]) -> str:
    return _ENCODER.encode(doc) if _C_ENCODE is None else "".join(_C_ENCODE(doc, 0))


def pack(docs: Iterable[dict[str, Any]], key: str, consumer: str, *,
         too_large: Callable[[dict[str, Any], int], None], limit: int = NODE_LIMIT
         ) -> list[bytes]:
    """The nodes' data for ``docs`` (module docstring)."""
    head = len(_ENCODER.encode(consumer).encode("utf-8", "backslashreplace")) + ENVELOPE
    nodes: list[bytes] = []
    part: list[bytes] = []
    size = head
    for doc in docs:
        # measured as written: a lone surrogate (hostile text) grows to a 6-byte escape
        data = _encode(doc).encode("utf-8", "backslashreplace")
        n = len(data) + 1
        if head + n > limit:
            too_large(doc, n)
            continue
        if part and size + n > limit:
            nodes.append(_node(key, part, consumer))
            part, size = [], head
        part.append(data)
        size += n
    if part:
        nodes.append(_node(key, part, consumer))
    return nodes


def _node(key: str, entries: list[bytes], consumer: str) -> bytes:
    return (f'{{"{key}":['.encode() + b",".join(entries) + b'],"consumer":'
            + _ENCODER.encode(consumer).encode("utf-8", "backslashreplace") + b"}")
