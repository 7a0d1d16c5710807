"""The consumer command's collector settings (:func:`zkcrawl.consumer.main.tune_gc`): start-up's
objects frozen out of collections and a larger young generation -- in the command's process
only (run in a child here: the test process keeps its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import gc, json
before = (gc.get_threshold(), gc.get_freeze_count())
from zkcrawl.consumer.main import GC_YOUNG, tune_gc
tune_gc()
print(json.dumps([before, [gc.get_threshold(), gc.get_freeze_count()], GC_YOUNG]))
"""


def test_tune_gc_freezes_start_up_and_widens_the_young_generation() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree, installed or not
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=60, check=True, env=env)
    before, after, young = json.loads(out.stdout)
    assert before[0][0] < young == after[0][0]
    assert after[1] > 1000  # the modules and objects imported so far are frozen
