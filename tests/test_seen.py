"""Tests for zkcrawl.seen: persistence, atomic save, sizing, false positives."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import structlog.testing

from zkcrawl import seen as seen_mod
from zkcrawl.errors import UsageError
from zkcrawl.seen import EXACT_LIMIT, SeenSet

ROOT = Path(__file__).resolve().parents[1]


def urls(prefix: str, n: int) -> list[str]:
    return [f"http://example.test/{prefix}/{i}.html" for i in range(n)]


@pytest.mark.parametrize("expected", [1_000, 200_000], ids=["exact", "bloom"])
def test_add_and_contains(expected: int) -> None:
    s = SeenSet.open(None, expected=expected)
    assert s.mode == ("exact" if expected < EXACT_LIMIT else "bloom")
    assert s.add("http://a/1") is True
    assert s.add("http://a/1") is False
    assert "http://a/1" in s
    assert "http://a/2" not in s
    assert s.add_many(["http://a/2", "http://a/1", "http://a/2", "http://a/3"]) == [
        True, False, False, True]
    assert s.count == 3 and len(s) == 3
    s.close()  # in-memory: nothing to do, must not fail


@pytest.mark.parametrize("expected", [1_000, 200_000], ids=["exact", "bloom"])
def test_persistence_across_reopen(tmp_path: Path, expected: int) -> None:
    path = tmp_path / "seen.bin"
    batch = urls("p", 2_000)
    with SeenSet.open(path, expected=expected) as s:
        assert all(s.add_many(batch))
        assert s.dirty
    assert path.exists()
    # Different arguments on reopen: the stored sizing wins.
    s2 = SeenSet.open(path, expected=5, fp_rate=0.5)
    assert (s2.expected, s2.fp_rate, s2.count) == (expected, 0.001, 2_000)
    assert not any(s2.add_many(batch))
    assert not s2.dirty
    assert s2.add("http://example.test/new") is True


def test_persistence_in_other_process(tmp_path: Path) -> None:
    """Files written under one PYTHONHASHSEED are read correctly under another."""
    path = tmp_path / "seen.bin"
    script = textwrap.dedent("""
        import sys
        from zkcrawl.seen import SeenSet
        mode, path, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
        urls = [f"http://example.test/x/{i}" for i in range(5000)]
        s = SeenSet.open(path, expected=expected)
        if mode == "write":
            assert all(s.add_many(urls))
            s.close()
        else:
            assert not any(u_new for u_new in s.add_many(urls)), "lost URLs"
            print(s.count)
    """)
    for expected in (1_000, 200_000):
        for mode, seed in (("write", "1"), ("read", "2")):
            env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
            out = subprocess.run([sys.executable, "-c", script, mode, str(path), str(expected)],
                                 env=env, capture_output=True, text=True, timeout=20, check=False)
            assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "5000"
        path.unlink()


def test_atomic_save_failure_mid_write_keeps_old_file(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "seen.bin"
    s = SeenSet.open(path, expected=200_000)
    s.add_many(urls("old", 100))
    s.save()
    before = path.read_bytes()

    s.add_many(urls("new", 100))
    real_write = os.write
    calls = 0

    def failing_write(fd: int, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, data[: len(data) // 3])  # short writes: several calls

    monkeypatch.setattr(seen_mod.os, "write", failing_write)
    with pytest.raises(UsageError, match="No space left"):
        s.save()
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["seen.bin"], "temp file left behind"
    assert s.dirty
    old = SeenSet.open(path)
    assert not any(old.add_many(urls("old", 100)))
    assert old.count == 100


def test_crash_before_replace_keeps_old_file(tmp_path: Path) -> None:
    """A process killed after writing the temp file but before os.replace."""
    path = tmp_path / "seen.bin"
    with SeenSet.open(path, expected=1_000) as s:
        s.add("http://example.test/kept")
    script = textwrap.dedent("""
        import os, sys
        from zkcrawl import seen
        s = seen.SeenSet.open(sys.argv[1])
        s.add("http://example.test/lost")
        seen.os.replace = lambda *a: os._exit(9)   # die at the worst moment
        s.save()
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script, str(path)], env=env, timeout=20,
                         check=False)
    assert out.returncode == 9
    s = SeenSet.open(path)
    assert "http://example.test/kept" in s
    assert "http://example.test/lost" not in s


def test_false_positive_rate() -> None:
    s = SeenSet.open(None, expected=100_000, fp_rate=0.001)
    s.add_many(urls("in", 100_000))
    assert not any(s.add_many(urls("in", 100_000)))  # never a false negative
    probes = urls("out", 200_000)
    fp = sum(1 for u in probes if u in s)
    assert fp / len(probes) <= 0.002, fp


def test_bytes_per_url() -> None:
    s = SeenSet.open(None, expected=1_000_000, fp_rate=0.001)
    assert s.mode == "bloom"
    assert s.nbytes / 1_000_000 <= 4.0
    assert s.nbytes / 1_000_000 > 1.0  # sanity: it is a real filter


def test_saturation_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fresh proxy: an in-process command of an earlier test (logs.configure caches each
    # logger on first use) may have bound the module's logger past capture_logs' reach
    monkeypatch.setattr(seen_mod, "log", structlog.get_logger("zkcrawl.seen"))
    s = SeenSet.open(None, expected=EXACT_LIMIT, fp_rate=0.01)
    with structlog.testing.capture_logs() as logs:
        s.add_many(urls("s", EXACT_LIMIT + 5_000))  # some are false positives: not counted
        assert s.count > s.expected
        s.add_many(urls("t", 1_000))
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert warnings == ["seen.saturated"]


def test_exact_set_upgrades_to_bloom(tmp_path: Path) -> None:
    path = tmp_path / "seen.bin"
    s = SeenSet.open(path, expected=10)
    batch = urls("u", EXACT_LIMIT + 10)
    assert all(s.add_many(batch))
    assert s.mode == "bloom" and s.expected >= 1_000_000
    s.close()
    s2 = SeenSet.open(path)
    assert s2.mode == "bloom" and s2.count == len(batch)
    assert not any(s2.add_many(batch))


@pytest.mark.parametrize("damage", ["empty", "garbage", "truncated", "flipped", "version"])
def test_corrupt_file_is_usage_error(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "seen.bin"
    with SeenSet.open(path, expected=200_000) as s:
        s.add("http://example.test/")
    data = bytearray(path.read_bytes())
    if damage == "empty":
        data = bytearray()
    elif damage == "garbage":
        data = bytearray(b"http://example.test/\n" * 10)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[-100] ^= 0xFF
    elif damage == "version":
        data[8] = 99
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError) as info:
        SeenSet.open(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "corrupt" in msg


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        SeenSet.open(None, expected=0)
    with pytest.raises(UsageError):
        SeenSet.open(None, fp_rate=1.5)
    with pytest.raises(UsageError, match="does not exist"):
        SeenSet.open(tmp_path / "nope" / "seen.bin")


def test_a_symlink_planted_at_the_seen_path_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    path = tmp_path / "seen.state"
    path.symlink_to(victim)
    s = SeenSet._fresh(path, 100, 0.01)  # the planted link is not read, only replaced
    s.add("http://a.test/1")
    s.save()
    assert victim.read_bytes() == b"precious"
    assert not path.is_symlink() and (path.stat().st_mode & 0o777) == 0o600
