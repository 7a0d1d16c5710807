"""zkcrawl claims no top-level name but ``zkcrawl`` (issue #28): ``producer/`` and
``consumer/`` stay at the repository's top and install as ``zkcrawl.producer`` and
``zkcrawl.consumer`` (pyproject.toml's ``package-dir``). A user's own module named
``consumer`` (or package named ``producer``) beside an installed zkcrawl is the user's; the
console scripts run; the package list is the tree's; a wheel ships ``zkcrawl/`` alone; and no
module of the tree imports or runs the former top-level names.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
FORMER = ("producer", "consumer")
BIN = Path(sys.executable).parent
#: A git checkout has the symlinks zkcrawl/producer and zkcrawl/consumer; an unpacked sdist
#: (its tests/ included) has not: setuptools reads the directories, never the links.
CHECKOUT = (ROOT / ".git").exists()


def _installed_env() -> dict[str, str]:
    """The environment without PYTHONPATH: what the install (editable or not) gives."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _zkcrawl_installed() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import zkcrawl.consumer.main"], cwd="/",
                           env=_installed_env(), capture_output=True, check=False, timeout=60)
    return probe.returncode == 0


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A user's project: a module ``consumer`` and a package ``producer`` of its own."""
    (tmp_path / "consumer.py").write_text('WHO = "the user\'s consumer"\n', encoding="utf-8")
    (tmp_path / "producer").mkdir()
    (tmp_path / "producer" / "__init__.py").write_text('WHO = "the user\'s producer"\n',
                                                      encoding="utf-8")
    return tmp_path


PROBE = """
import sys
import zkcrawl.cli, zkcrawl.consumer.main, zkcrawl.producer.main, zkcrawl.admin.exporter
import zkcrawl.admin.commands.try_
former = sorted(m for m in sys.modules if m.split(".")[0] in ("consumer", "producer"))
assert not former, f"zkcrawl imported top-level modules: {former}"
import consumer, producer
print(consumer.WHO)
print(producer.WHO)
print(zkcrawl.consumer.main.__name__, zkcrawl.consumer.main.run.__module__)
"""


def _probe(user_dir: Path, env: dict[str, str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=user_dir, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


WANT = ["the user's consumer", "the user's producer",
        "zkcrawl.consumer.main zkcrawl.consumer.main"]


def test_a_users_consumer_module_beside_the_installed_zkcrawl(user_dir: Path) -> None:
    if not _zkcrawl_installed():
        pytest.skip("zkcrawl is not installed in this interpreter (PYTHONPATH only)")
    assert _probe(user_dir, _installed_env()) == WANT


@pytest.mark.skipif(not CHECKOUT, reason="not a git checkout (no zkcrawl/consumer link)")
def test_a_users_consumer_module_beside_a_checkout_on_pythonpath(user_dir: Path) -> None:
    # How the tests start processes (PYTHONPATH=<checkout>): zkcrawl/consumer, the symlink to
    # consumer/, makes zkcrawl.consumer of the checkout; the user's directory still comes first.
    assert _probe(user_dir, {**_installed_env(), "PYTHONPATH": str(ROOT)}) == WANT


@pytest.mark.parametrize("command", ["zkcrawl", "zkcrawl-producer", "zkcrawl-consumer"])
def test_the_console_scripts_run_beside_a_users_modules(user_dir: Path, command: str) -> None:
    script = BIN / command
    if not script.exists():
        pytest.skip(f"{command} is not installed beside {sys.executable}")
    proc = subprocess.run([str(script), "--help"], cwd=user_dir, env=_installed_env(),
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"usage: {command}")


@pytest.mark.parametrize("module", ["zkcrawl.producer.main", "zkcrawl.consumer.main"])
def test_python_m_runs_the_installed_names_beside_a_users_modules(user_dir: Path,
                                                                   module: str) -> None:
    if _zkcrawl_installed():
        env = _installed_env()
    elif CHECKOUT:
        env = {**_installed_env(), "PYTHONPATH": str(ROOT)}
    else:
        pytest.skip("zkcrawl is neither installed nor a checkout here")
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=user_dir, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: zkcrawl-")


def test_the_entry_points_name_the_installed_modules() -> None:
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts == {"zkcrawl": "zkcrawl.cli:run",
                       "zkcrawl-producer": "zkcrawl.producer.main:run",
                       "zkcrawl-consumer": "zkcrawl.consumer.main:run"}


def _tree_packages() -> set[str]:
    """Every package of the tree, named as installed (symlinks not followed)."""
    found = set()
    for top, installed in (("zkcrawl", "zkcrawl"), ("producer", "zkcrawl.producer"),
                           ("consumer", "zkcrawl.consumer")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((installed, *rel)))
    return found


def test_the_package_list_is_the_tree() -> None:
    # An explicit list (packages.find cannot reach a mapped directory): a new subpackage
    # must be added to pyproject.toml's [tool.setuptools] packages, or the wheel lacks it.
    assert set(SETUPTOOLS["packages"]) == _tree_packages()
    assert SETUPTOOLS["package-dir"] == {"zkcrawl.producer": "producer",
                                         "zkcrawl.consumer": "consumer"}
    assert all(p == "zkcrawl" or p.startswith("zkcrawl.") for p in SETUPTOOLS["packages"])


@pytest.mark.skipif(not CHECKOUT, reason="not a git checkout (no zkcrawl/consumer link)")
def test_the_checkout_links_the_installed_names_to_the_directories() -> None:
    for name in FORMER:
        link = ROOT / "zkcrawl" / name
        assert link.is_symlink() and os.readlink(link) == f"../{name}"
        assert link.resolve() == (ROOT / name).resolve()


def _references(path: Path, tree: ast.Module, modules: dict[str, set[str]]) -> list[str]:
    """Imports of a former top-level name, and strings running or naming one of its modules
    (a ``-m`` argument, an entry point ``module:function``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in FORMER:
                found.append(f"{path}:{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Import):
            found += [f"{path}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in FORMER]
        elif isinstance(node, ast.List | ast.Tuple):
            for a, b in zip(node.elts, node.elts[1:], strict=False):
                if isinstance(a, ast.Constant) and a.value == "-m" and \
                        isinstance(b, ast.Constant) and isinstance(b.value, str):
                    top, _, sub = b.value.partition(".")
                    if top in FORMER and sub.split(".")[0] in modules[top]:
                        found.append(f"{path}:{b.lineno}: -m {b.value}")
    # Not every dotted string: log events and logger names may equal a module's path
    # ("producer.summary", structlog's "consumer.worker").
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = re.fullmatch(r"(producer|consumer)\.(\w+)[\w.]*:\w+", node.value)
            if m and m.group(2) in modules[m.group(1)]:
                found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def test_nothing_imports_or_runs_the_former_top_level_names() -> None:
    modules = {name: {p.stem for p in (ROOT / name).glob("*.py")} |
               {p.parent.name for p in (ROOT / name).glob("*/__init__.py")} for name in FORMER}
    found = []
    for top in ("zkcrawl", *FORMER, "tests", "examples", "scripts"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found += _references(path.relative_to(ROOT), tree, modules)
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_the_wheel_ships_zkcrawl_alone(tmp_path: Path) -> None:
    """A real build (pip's isolated setuptools, ~10 s): zkcrawl/producer and zkcrawl/consumer
    inside, no top-level producer or consumer, each module of the tree once."""
    # From a copy: a build in the checkout leaves build/ behind, whose stale modules the
    # next build would ship.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "site", "*.egg-info", "__pycache__", ".*_cache",
        ".hypothesis"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(tmp_path), str(src)], capture_output=True, text=True,
                          check=False, timeout=600)
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        pytest.skip("no pip in this interpreter")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("zkcrawl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"zkcrawl"}
    dist_info = next(t for t in tops if t.endswith(".dist-info"))
    with zipfile.ZipFile(wheel) as zf:
        top_level = f"{dist_info}/top_level.txt"
        if top_level in names:
            assert zf.read(top_level).decode().split() == ["zkcrawl"]
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert "zkcrawl-consumer = zkcrawl.consumer.main:run" in entry_points
    assert "zkcrawl-producer = zkcrawl.producer.main:run" in entry_points
    shipped = {n for n in names if n.endswith(".py")}
    expected = set()
    for top, installed in (("zkcrawl", "zkcrawl"), ("producer", "zkcrawl/producer"),
                           ("consumer", "zkcrawl/consumer")):
        expected |= {f"{installed}/{p.relative_to(ROOT / top).as_posix()}"
                     for p in (ROOT / top).rglob("*.py")}
    assert shipped == expected
    assert len(names) == len(set(names))
    assert "zkcrawl/py.typed" in names
