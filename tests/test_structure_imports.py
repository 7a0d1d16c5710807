"""The import structure: no circle among zkcrawl's modules (consumer and producer included),
counting the imports inside functions too -- so none of those can be closing a circle the
top-level imports would show -- and the seams import one way: a seam's interface
(``base``) imports none of its implementations, an implementation no sibling but ``base``;
nothing in ``zkcrawl.admin`` imports ``zkcrawl.bench`` (the rule is in that package's
docstring). Read from the source with :mod:`ast` (nothing is imported): well under a second.
``if TYPE_CHECKING:`` blocks are skipped (they never run).
"""

from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zkcrawl", "consumer", "producer")
# consumer/ and producer/ install as zkcrawl.consumer and zkcrawl.producer (pyproject.toml's
# package-dir): a module is named as installed; a former top-level name maps to it.
ALIASES = {"consumer": "zkcrawl.consumer", "producer": "zkcrawl.producer"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    in_function: bool

    def __str__(self) -> str:
        where = "inside a function" if self.in_function else "at the top"
        return f"{self.source} -> {self.target} (line {self.line}, {where})"


def canonical(name: str) -> str:
    for alias, real in ALIASES.items():
        if name == alias or name.startswith(alias + "."):
            return real + name[len(alias):]
    return name


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every package in ``PACKAGES`` under ``root`` (the directories:
    rglob does not follow zkcrawl/consumer, zkcrawl/producer, the symlinks to them)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[canonical(".".join(parts))] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             known: dict[str, Path]) -> list[str]:
    """The known modules one import statement loads (``from pkg import sub``: ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")[: None if is_package else -1]
            base = base[: len(base) - node.level + 1]
            prefix = ".".join([*base, *([node.module] if node.module else [])])
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if canonical(f"{prefix}.{a.name}") in known else prefix
                 for a in node.names]
    out = []
    for name in map(canonical, names):
        while name and name not in known:  # a name inside a module: the module
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def edges(known: dict[str, Path]) -> list[Edge]:
    """Every import between known modules, with where it is."""
    out: list[Edge] = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        todo: list[tuple[ast.AST, bool]] = [(tree, False)]
        while todo:
            node, in_function = todo.pop()
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, _BLOCKS) or _type_checking(child):
                    continue  # an import is a statement: expressions are not walked
                if isinstance(child, ast.Import | ast.ImportFrom):
                    out += [Edge(module, t, child.lineno, in_function)
                            for t in _targets(child, module, is_package, known)]
                nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                todo.append((child, in_function or nested))
    return out


def circle(found: list[Edge]) -> list[Edge] | None:
    """The edges of one import circle, or None."""
    graph: dict[str, set[str]] = {}
    for e in found:
        graph.setdefault(e.source, set()).add(e.target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        ring = exc.args[1]  # [a, b, ..., a]: each imports the one before it
        by_pair = {(e.source, e.target): e for e in found}
        return [by_pair[(ring[i + 1], ring[i])] for i in range(len(ring) - 1)]
    return None


KNOWN = modules(ROOT)
EDGES = edges(KNOWN)


def imports_of(source_prefix: str) -> list[Edge]:
    return [e for e in EDGES if e.source == source_prefix
            or e.source.startswith(source_prefix + ".")]


def test_the_scan_sees_the_tree():
    assert {"zkcrawl.cli", "zkcrawl.consumer.sinks.base", "zkcrawl.web.transports.base",
            "zkcrawl.producer.main"} <= set(KNOWN)
    assert Edge("zkcrawl.consumer.sinks.postgres", "zkcrawl.consumer.sinks.base", 0,
                False).target in {
        e.target for e in imports_of("zkcrawl.consumer.sinks.postgres")}
    assert any(e.in_function for e in EDGES)  # the imports inside functions are counted


def test_no_import_circle_even_through_imports_inside_functions():
    found = circle(EDGES)
    assert found is None, "import circle:\n  " + "\n  ".join(map(str, found or []))


def test_the_check_finds_a_circle_closed_inside_a_function(tmp_path):
    pkg = tmp_path / "zkcrawl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from zkcrawl.sub.b import thing\n")
    (pkg / "sub" / "b.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from zkcrawl.sub import a\n"
        "def thing():\n    from . import a\n    return a\n")
    known = modules(tmp_path)
    found = circle(edges(known))
    assert found is not None
    assert {(e.source, e.target, e.in_function) for e in found} == {
        ("zkcrawl.sub.a", "zkcrawl.sub.b", False), ("zkcrawl.sub.b", "zkcrawl.sub.a", True)}
    (pkg / "sub" / "b.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from zkcrawl.sub import a\n")
    assert circle(edges(modules(tmp_path))) is None  # a type-only import runs nothing


@pytest.mark.parametrize("seam, implementations", [
    ("zkcrawl.consumer.sinks", ("jsonl", "postgres")),
    ("zkcrawl.web.transports", ("curl", "requests")),
])
def test_a_seam_imports_one_way(seam, implementations):
    base = f"{seam}.base"
    siblings = {f"{seam}.{name}" for name in implementations}
    assert base in KNOWN and siblings <= set(KNOWN)
    assert not [str(e) for e in imports_of(base) if e.target.startswith(seam)]
    for impl in siblings:
        # an implementation's own helpers (``curl_headers`` of ``curl``) are its alone
        own = impl + "_"
        wrong = [str(e) for e in imports_of(impl)
                 if (e.target == seam or e.target.startswith(seam + ".")) and e.target != base
                 and not e.target.startswith(own)]
        assert not wrong, wrong
        strangers = {e.source for e in EDGES if e.target.startswith(own)} - {impl}
        assert not strangers, strangers
    # the factory (the package) is the one module that imports the implementations
    users = {e.source for e in EDGES if e.target in siblings} - siblings
    assert users <= {seam}, users


def test_no_former_path_is_left():
    """The seams' modules are the only import paths: the re-exporting ones went when the
    packages moved under zkcrawl (nothing outside could have imported them there)."""
    for old in ("zkcrawl.consumer.sink", "zkcrawl.consumer.sink_postgres", "zkcrawl.web.transfer",
                "zkcrawl.web.transfer_requests"):
        assert old not in KNOWN, old


def test_admin_never_imports_bench_and_zk_security_never_the_client():
    wrong = [str(e) for e in imports_of("zkcrawl.admin") if e.target.startswith("zkcrawl.bench")]
    assert not wrong, wrong
    assert [str(e) for e in imports_of("zkcrawl.bench") if e.target.startswith("zkcrawl.admin")]
    for module, path in KNOWN.items():  # nor by name (importlib.import_module("zkcrawl.bench..."))
        if module.startswith("zkcrawl.admin"):
            names = [n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            assert not [n for n in names if n.startswith("zkcrawl.bench")], module
    assert "zkcrawl.zk.client" not in {e.target for e in imports_of("zkcrawl.zk.security")}
