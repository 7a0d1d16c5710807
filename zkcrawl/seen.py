"""The producer's persistent URL de-duplication state (``--seen PATH``): :class:`SeenSet`
answers "has this URL been offered before?" across restarts.

* Two representations, one file format: **exact** (a set of 16-byte BLAKE2b digests, no
  false positive) while small, turning itself into a **bloom** filter past
  :data:`EXACT_LIMIT` (about 1.8 bytes per URL, 0.1 % false positives: a new URL may be
  skipped, a seen one is never reported new).
* The hash is BLAKE2b-128 of the UTF-8 URL: a file is valid in any process.
* :meth:`SeenSet.save` is atomic (temporary file, fsync, ``os.replace``, directory fsync);
  saves run one at a time, so a later snapshot is never overwritten by an earlier one.
* A damaged or foreign file is a :class:`~zkcrawl.errors.UsageError`, never replaced by an
  empty set. Not guaranteed: two processes sharing one path (the last save wins).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Self

import rbloom
import structlog

from zkcrawl.errors import UsageError

log = structlog.get_logger(__name__)

#: Below this expected size the exact representation is used.
EXACT_LIMIT = 50_000

MAGIC = b"ZKCSEEN\x00"
VERSION = 1
MODE_BLOOM = 0
MODE_EXACT = 1
# _magic, version, mode, expected, fp_rate, count, payload length, BLAKE2b-16 of payload
_HEADER = struct.Struct("<8sHHQdQQ16s")
_DIGEST = 16
# rbloom's own serialisation starts with the number of hash functions (u64).
_BLOOM_PREFIX = 8


def url_hash(url: str) -> int:
    """Process-independent signed 128-bit hash of ``url`` (what rbloom expects)."""
    digest = hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=_DIGEST).digest()
    return int.from_bytes(digest, "big", signed=True)


def _digest(url: str) -> bytes:
    return hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=_DIGEST).digest()


def _new_bloom(expected: int, fp_rate: float) -> rbloom.Bloom:
    # hash_func=int: we hand rbloom the precomputed 128-bit hash, so each URL is
    # hashed once in Python even though we test and then add it.
    return rbloom.Bloom(expected, fp_rate, int)


class SeenSet:
    """A set of URLs that may be persisted to one file.  Thread-safe."""

    def __init__(
        self,
        path: Path | None,
        expected: int,
        fp_rate: float,
        *,
        exact: set[bytes] | None = None,
        bloom: rbloom.Bloom | None = None,
        count: int = 0,
    ) -> None:
        """Use :meth:`open`; this constructor does no validation or I/O."""
        self.path = path
        self.expected = expected
        self.fp_rate = fp_rate
        self.count = count
        self._exact = exact
        self._bloom = bloom
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()  # one save at a time: a newer file never loses
        self._dirty = False
        self._generation = 0  # additions so far; a save clears ``dirty`` only if none came
        self._warned_saturated = False

    # ----------------------------------------------------------------- open --
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None,
        expected: int = 1_000_000,
        fp_rate: float = 0.001,
    ) -> SeenSet:
        """Open the state at ``path`` (created on first save), or in memory if None.

        An existing file keeps the sizing stored in it; ``expected`` and
        ``fp_rate`` only size a new set.  Raises UsageError for bad sizing, a
        missing parent directory, an unreadable file or a corrupt one.
        """
        if not isinstance(expected, int) or expected <= 0:
            raise UsageError(f"seen set: expected size must be a positive integer, "
                             f"got {expected!r}")
        if not 0.0 < fp_rate < 1.0:
            raise UsageError(f"seen set: false-positive rate must be in (0, 1), got {fp_rate!r}")
        if path is None:
            return cls._fresh(None, expected, fp_rate)
        p = Path(path)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            if not p.parent.is_dir():
                raise UsageError(f"{p}: directory {p.parent} does not exist") from None
            return cls._fresh(p, expected, fp_rate)
        except OSError as exc:
            raise UsageError(f"{p}: cannot read seen-set file: {exc.strerror or exc}") from None
        seen = cls._decode(p, data)
        if (seen.expected, seen.fp_rate) != (expected, fp_rate):
            log.debug("seen.sizing_from_file", path=str(p), expected=seen.expected,
                      fp_rate=seen.fp_rate)
        log.info("seen.loaded", path=str(p), count=seen.count, mode=seen.mode)
        return seen

    @classmethod
    def _fresh(cls, path: Path | None, expected: int, fp_rate: float) -> SeenSet:
        if expected < EXACT_LIMIT:
            return cls(path, expected, fp_rate, exact=set())
        return cls(path, expected, fp_rate, bloom=_new_bloom(expected, fp_rate))

    @classmethod
    def _decode(cls, path: Path, data: bytes) -> SeenSet:
        def corrupt(why: str) -> UsageError:
            return UsageError(f"{path}: corrupt seen-set file ({why}); "
                              "move it away to start with an empty set")

        if len(data) < _HEADER.size or not data.startswith(MAGIC):
            raise corrupt("not a zkcrawl seen-set file")
        _, version, mode, expected, fp_rate, count, length, checksum = _HEADER.unpack_from(data)
        if version != VERSION:
            raise corrupt(f"unsupported version {version}")
        payload = data[_HEADER.size:]
        if len(payload) != length:
            raise corrupt(f"truncated: {len(payload)} of {length} payload bytes")
        if hashlib.blake2b(payload, digest_size=_DIGEST).digest() != checksum:
            raise corrupt("checksum mismatch")
        if expected <= 0 or not 0.0 < fp_rate < 1.0:
            raise corrupt("bad sizing in header")
        if mode == MODE_EXACT:
            if length % _DIGEST:
                raise corrupt("bad exact-set length")
            exact = {payload[i:i + _DIGEST] for i in range(0, length, _DIGEST)}
            return cls(path, expected, fp_rate, exact=exact, count=count)
        if mode != MODE_BLOOM:
            raise corrupt(f"unknown mode {mode}")
        # rbloom panics (an uncatchable-by-Exception error) on a wrong-sized
        # buffer, so check the size against a filter built with the same sizing.
        want = len(_new_bloom(expected, fp_rate).save_bytes())
        if length != want:
            raise corrupt(f"filter is {length} bytes, sizing says {want}")
        bloom = rbloom.Bloom.load_bytes(payload, int)
        return cls(path, expected, fp_rate, bloom=bloom, count=count)

    # ------------------------------------------------------------ queries --
    @property
    def mode(self) -> str:
        """``"exact"`` or ``"bloom"``."""
        return "exact" if self._exact is not None else "bloom"

    @property
    def nbytes(self) -> int:
        """Approximate memory held by the set, in bytes."""
        if self._bloom is not None:
            return self._bloom.size_in_bits // 8
        assert self._exact is not None
        return sys.getsizeof(self._exact) + len(self._exact) * sys.getsizeof(b"\0" * _DIGEST)

    @property
    def dirty(self) -> bool:
        """True when there are additions not yet saved."""
        return self._dirty

    def __len__(self) -> int:
        return self.count

    def __contains__(self, url: str) -> bool:
        """True if ``url`` was added (Bloom mode: or is a false positive)."""
        with self._lock:
            if self._exact is not None:
                return _digest(url) in self._exact
            assert self._bloom is not None
            return url_hash(url) in self._bloom

    def add(self, url: str) -> bool:
        """Record ``url``; return True if it was new (not seen before)."""
        with self._lock:
            return self._add_locked(url)

    def add_many(self, urls: Iterable[str]) -> list[bool]:
        """:meth:`add` for each URL, under one lock; same order as ``urls``."""
        with self._lock:
            return [self._add_locked(u) for u in urls]

    def _add_locked(self, url: str) -> bool:
        exact = self._exact
        if exact is not None:
            d = _digest(url)
            if d in exact:
                return False
            exact.add(d)
            self._new_item()
            return True
        bloom = self._bloom
        assert bloom is not None
        h = url_hash(url)
        if h in bloom:
            return False
        bloom.add(h)
        self._new_item()
        return True

    def _new_item(self) -> None:
        self.count += 1
        self._generation += 1
        self._dirty = True
        if self._exact is not None:
            if len(self._exact) >= EXACT_LIMIT:
                self._to_bloom()
        elif self.count > self.expected and not self._warned_saturated:
            self._warned_saturated = True
            log.warning("seen.saturated", path=str(self.path) if self.path else None,
                        count=self.count, expected=self.expected, fp_rate=self.fp_rate,
                        hint="false positives (skipped new URLs) now exceed the target rate; "
                             "start a new --seen file with a larger expected size")

    def _to_bloom(self) -> None:
        # The exact set outgrew its budget: move to a Bloom filter with room to
        # spare.  1M entries at the same rate costs ~1.8 MB, so be generous.
        assert self._exact is not None
        expected = max(self.expected * 20, 1_000_000)
        bloom = _new_bloom(expected, self.fp_rate)
        for d in self._exact:
            bloom.add(int.from_bytes(d, "big", signed=True))
        log.info("seen.upgraded", count=len(self._exact), expected=expected, fp_rate=self.fp_rate)
        self._bloom, self._exact, self.expected = bloom, None, expected

    # ------------------------------------------------------------ persist --
    def _encode(self) -> bytes:
        if self._exact is not None:
            mode, payload = MODE_EXACT, b"".join(self._exact)
        else:
            assert self._bloom is not None
            mode, payload = MODE_BLOOM, self._bloom.save_bytes()
        header = _HEADER.pack(MAGIC, VERSION, mode, self.expected, self.fp_rate, self.count,
                              len(payload), hashlib.blake2b(payload, digest_size=_DIGEST).digest())
        return header + payload

    def save(self) -> None:
        """Write the state to its file atomically (no-op for an in-memory set).

        Raises UsageError if the file cannot be written; the previous file, if
        any, is left intact and the set stays dirty.
        """
        if self.path is None:
            return
        with self._save_lock:
            with self._lock:  # only the snapshot holds up add_many, not the fsync
                data, generation = self._encode(), self._generation
            try:
                _atomic_write(self.path, data)
            except OSError as exc:
                raise UsageError(f"{self.path}: cannot save seen set: "
                                 f"{exc.strerror or exc}") from None
            with self._lock:
                self._dirty = self._generation != generation
        log.debug("seen.saved", path=str(self.path), count=self.count, bytes=len(data))

    def close(self) -> None:
        """Save if there are unsaved additions."""
        if self._dirty:
            self.save()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"SeenSet(path={str(self.path) if self.path else None!r}, mode={self.mode}, "
                f"count={self.count}, expected={self.expected}, fp_rate={self.fp_rate})")


def _write_all(fd: int, data: bytes) -> None:
    # Chunked so a failure can happen (and be tested) half way through a write.
    view = memoryview(data)
    while view:
        n = os.write(fd, view[: 1 << 20])
        view = view[n:]


def _atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file."""
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # Includes KeyboardInterrupt: never leave a half-written temp file behind.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if os.name == "posix":
        # The rename is durable only once the directory entry is on disk.
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
