"""One meaning per name, and module docstrings that say what a module guarantees now.

Read from the source with :mod:`ast` (nothing is imported), over zkcrawl, consumer and
producer:

* no two classes share a private name (``_Run`` was two unrelated classes), and no two
  top-level public classes share a name but the per-module conventions (:data:`CONVENTIONS`);
* the names once overloaded keep one meaning: ``Wire`` is the ZooKeeper request sender of
  ``zkcrawl/zk/wire.py`` (the HTTP transports are ``CurlTransport``/``RequestsTransport``),
  the item codec is never imported as ``wire``, "pipeline" is the user's ``--pipeline``
  stages (no class ``Pipeline``: the per-item class is ``ItemHandler``), and ``dead_letter``
  is the queue's action (the body is ``encode_dead_letter``, the path
  ``Layout.dead_letter_path``);
* module docstrings stay short (:data:`MAX_LINES` each, a median of at most
  :data:`MEDIAN_LINES`) and tell no history: no issue numbers, no "no longer"/"used to".
"""

from __future__ import annotations

import ast
import re
import statistics
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zkcrawl", "consumer", "producer")

#: Public class names that are a convention, one per module: each codec's ``decode`` result,
#: each command's flags.
CONVENTIONS = frozenset({"Decoded", "Settings"})

MAX_LINES = 25
MEDIAN_LINES = 12
HISTORY = re.compile(r"\bissue #?\d+|\(#\d+\)|\bno longer\b|\bused to\b|\bany ?more\b"
                     r"|\bformerly\b", re.IGNORECASE)


def _modules() -> dict[str, ast.Module]:
    found: dict[str, ast.Module] = {}
    seen: set[Path] = set()
    for package in PACKAGES:
        base = ROOT / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            rel = path.relative_to(ROOT).as_posix()
            found[rel] = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    return found


MODULES = _modules()


def _kept() -> dict[str, ast.Module]:
    return dict(MODULES)


def _classes(tree: ast.Module) -> list[ast.ClassDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def test_the_tree_is_read() -> None:
    assert len(MODULES) > 100
    assert "zkcrawl/zk/wire.py" in MODULES


def test_no_two_classes_share_a_private_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for rel, tree in MODULES.items():
        for cls in _classes(tree):
            if cls.name.startswith("_"):
                where[cls.name].append(f"{rel}:{cls.lineno}")
    shared = {name: places for name, places in where.items() if len(places) > 1}
    assert not shared, f"private class names used twice (name each for what it is): {shared}"


def test_no_two_public_classes_share_a_name_but_the_conventions() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for rel, tree in MODULES.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(f"{rel}:{node.lineno}")
    shared = {name: places for name, places in where.items()
              if len(places) > 1 and name not in CONVENTIONS}
    assert not shared, f"public class names used twice: {shared}"


def test_wire_is_the_zookeeper_request_sender_only() -> None:
    wires = [f"{rel}:{cls.lineno}" for rel, tree in MODULES.items() for cls in _classes(tree)
             if cls.name.endswith("Wire")]
    assert wires == [f"zkcrawl/zk/wire.py:{_line_of(MODULES['zkcrawl/zk/wire.py'], 'Wire')}"]
    aliased = []
    for rel, tree in _kept().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                for alias in node.names:
                    if alias.asname == "wire":
                        aliased.append(f"{rel}:{node.lineno}")
    assert not aliased, f"a module imported as 'wire' (the item codec is item_codec): {aliased}"


def test_pipeline_is_the_users_result_stages() -> None:
    classes = [f"{rel}:{cls.lineno} {cls.name}" for rel, tree in MODULES.items()
               for cls in _classes(tree) if "Pipeline" in cls.name]
    assert classes == [f"zkcrawl/page.py:{_line_of(MODULES['zkcrawl/page.py'], 'ResultPipeline')}"
                       " ResultPipeline"]


def test_dead_letter_is_the_queues_action() -> None:
    functions = [f"{rel}:{node.lineno}" for rel, tree in _kept().items() for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name == "dead_letter"]
    assert not functions, f"module-level dead_letter (the body is encode_dead_letter): {functions}"
    layout = next(n for n in MODULES["zkcrawl/queue/layout.py"].body
                  if isinstance(n, ast.ClassDef) and n.name == "Layout")
    methods = {n.name for n in layout.body if isinstance(n, ast.FunctionDef)}
    assert "dead_letter_path" in methods and "dead_letter" not in methods


def _docstring_lines() -> dict[str, int]:
    out = {}
    for rel, tree in _kept().items():
        doc = ast.get_docstring(tree)
        out[rel] = len(doc.splitlines()) if doc else 0
    return out


def test_module_docstrings_are_short() -> None:
    lines = _docstring_lines()
    long = {rel: n for rel, n in lines.items() if n > MAX_LINES}
    assert not long, (f"module docstrings over {MAX_LINES} lines (say what the module "
                      f"guarantees; details go on the class or function): {long}")
    assert statistics.median(lines.values()) <= MEDIAN_LINES


def test_module_docstrings_tell_no_history() -> None:
    told = {}
    for rel, tree in _kept().items():
        doc = ast.get_docstring(tree) or ""
        hits = HISTORY.findall(doc)
        if hits:
            told[rel] = hits
    assert not told, f"module docstrings telling history (it belongs in commits): {told}"


def _line_of(tree: ast.Module, name: str) -> int:
    return next(n.lineno for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
