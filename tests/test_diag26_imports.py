"""The import hint of ``--processor`` / ``--pipeline`` (issue #26 review, gap 3), through the
real consumer and ``zkcrawl try`` run from the user's directory: a module that is found but
itself imports a package that is not installed says so -- which module, which package, the
line -- instead of pointing at a directory that would hold the package's ``.py``; a module
that is not found still says where it was looked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zkcrawl.errors import ExitStatus

ROOT = Path(__file__).resolve().parent.parent
BROKEN = '''"""A processor that needs a package this Python does not have."""
import json

import nosuchlib_zkcrawl_test


def parse(page):
    return None
'''
STAGE = '''from nosuchlib_zkcrawl_test.prices import normalize


class Prices:
    def process(self, record):
        return record
'''


def run(module: str, *argv: str, cwd: Path) -> tuple[int, str]:
    """``python -m module ARGV`` from ``cwd`` (the user's directory): (exit status, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd,
                          env={**env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "broken.py").write_text(BROKEN)
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "stages.py").write_text(STAGE)
    return tmp_path


@pytest.mark.parametrize(("flag", "spec", "module", "place"), [
    ("--processor", "broken:parse", "broken", "broken.py:4"),
    ("--pipeline", "shop.stages:Prices", "shop.stages", "stages.py:1"),
])
def test_a_module_that_imports_a_missing_package_says_so(project, flag, spec, module, place):
    rc, err = run("zkcrawl.consumer.main", "--zk", "127.0.0.1:1", flag, spec, cwd=project)
    assert rc == ExitStatus.USAGE
    [line] = err.strip().splitlines()  # one line, no traceback
    assert line == (
        f"zkcrawl-consumer: error: {flag}: cannot import {module!r}: module {module!r} "
        f"imports 'nosuchlib_zkcrawl_test' ({place}), which is not installed for this "
        f"Python ({sys.executable}): install the package that provides "
        "'nosuchlib_zkcrawl_test' there, or change the import"), line
    assert "directory that holds" not in line


def test_zkcrawl_try_says_the_same(project):
    rc, err = run("zkcrawl.cli", "try", "http://127.0.0.1:1/", "--processor", "broken:parse",
                  cwd=project)
    assert rc == ExitStatus.USAGE
    [line] = err.strip().splitlines()
    assert "module 'broken' imports 'nosuchlib_zkcrawl_test' (broken.py:4)" in line, line
    assert "not installed" in line and "directory that holds" not in line


def test_a_module_not_found_still_says_where_it_looked(project):
    rc, err = run("zkcrawl.consumer.main", "--zk", "127.0.0.1:1", "--processor", "brokn:parse",
                  cwd=project)
    assert rc == ExitStatus.USAGE
    [line] = err.strip().splitlines()
    assert "cannot import 'brokn': ModuleNotFoundError: No module named 'brokn'" in line
    assert f"working directory {project}" in line and "holds brokn.py" in line, line
