"""zkcrawl/zk is the only package of zkcrawl that imports kazoo (issue #22, item 9): an AST
scan of every module of the package -- zkcrawl/, with consumer/ and producer/ that it reaches
through symlinks, each file once -- finds no ``import kazoo...`` / ``from kazoo... import``
elsewhere, nested in a function or not (ruff's TID251 says the same, but per-file ignores
can silence it; this cannot). Tests may import kazoo; the package may not."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "zkcrawl"
ZK = (PACKAGE / "zk").resolve()


def _package_files() -> list[Path]:
    """Every .py file of the package, resolved (the symlinked consumer/ and producer/
    included) and each once."""
    seen: set[Path] = set()
    for top in (PACKAGE, ROOT / "consumer", ROOT / "producer"):
        for folder, _dirs, files in os.walk(top, followlinks=True):
            seen.update((Path(folder) / f).resolve() for f in files if f.endswith(".py"))
    return sorted(seen)


def _is_kazoo(module: str | None) -> bool:
    return module is not None and (module == "kazoo" or module.startswith("kazoo."))


def kazoo_imports(tree: ast.AST) -> list[int]:
    """Line numbers of the kazoo imports anywhere in ``tree`` (nested ones included;
    ``importlib.import_module("kazoo...")`` and ``__import__("kazoo...")`` too)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hit = any(_is_kazoo(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            hit = node.level == 0 and _is_kazoo(node.module)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else ""
            first = node.args[0]
            hit = (name in ("import_module", "__import__") and isinstance(first, ast.Constant)
                   and isinstance(first.value, str) and _is_kazoo(first.value))
        else:
            continue
        if hit:
            lines.append(node.lineno)
    return sorted(lines)


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


FILES = _package_files()


def test_the_scan_sees_the_whole_package_once() -> None:
    names = {_relative(p) for p in FILES}
    assert len(names) == len(FILES)  # resolved: nothing twice through the symlinks
    assert {"zkcrawl/cli.py", "zkcrawl/bench/drain.py", "zkcrawl/zk/client.py",
            "consumer/processors.py", "consumer/main.py", "producer/offerer.py"} <= names
    assert not any(n.startswith(("zkcrawl/consumer/", "zkcrawl/producer/")) for n in names)
    # the scan finds what is there: the zk package does import kazoo
    assert kazoo_imports(ast.parse((ZK / "client.py").read_text(encoding="utf-8")))


def test_the_detector_finds_every_form_of_import() -> None:
    source = ("import os\nimport kazoo\nimport kazoo.client as kc\nfrom kazoo import client\n"
              "from kazoo.recipe.queue import LockingQueue\n"
              "def f():\n    from kazoo.exceptions import NoNodeError\n"
              "    class C:\n        def g(self):\n            import kazoo.retry\n"
              "import importlib\nimportlib.import_module('kazoo.client')\n"
              "from . import kazoo\nimport kazoolike\nfrom kazoos import x\n")
    assert kazoo_imports(ast.parse(source)) == [2, 3, 4, 5, 7, 10, 12]


def test_no_module_outside_zkcrawl_zk_imports_kazoo() -> None:
    found = [f"{_relative(path)}:{line}"
             for path in FILES if not path.is_relative_to(ZK)
             for line in kazoo_imports(ast.parse(path.read_text(encoding="utf-8"),
                                                 filename=str(path)))]
    assert found == [], ("kazoo imported outside zkcrawl/zk (put it behind a zkcrawl.zk "
                         "module): " + ", ".join(found))
