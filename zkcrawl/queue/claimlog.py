"""Counting the claims whose holder died (SPEC §3: a holder's death is an attempt).

Layout::

    <root>/claims/<session>.<n>        persistent  JSON list of the item names leased
                                                   by one lease transaction
    <root>/claims/<session>.<n>.live   ephemeral   its twin: present while the holder lives

Guarantees
----------
* **Cheap**: two creates per *lease transaction* (one record and its ephemeral twin, in
  the lease transaction itself, so a record lists exactly the items that transaction
  leased), and two deletes once every item of the record is settled -- not one op per
  item. (Writing a counter into each item cost 20-25 % of the at-least-once rate.)
* **A death is counted before the item is claimed again.** A holder's session ends
  atomically: its leases and its twins vanish together. A claimer lists the leases, then
  ``claims/`` (one session, so in that order on the server); an item it sees unleased
  was freed by a session whose records it then sees twinless. :meth:`reap` runs before
  the claimer uses that listing: for every item of a twinless record that still exists,
  it raises the item's ``cversion`` by 2 (a child created and deleted) and deletes the
  record, in one transaction -- so two reapers never count one death twice.
* A claim reads ``deaths = cversion // 2`` in the item's stat (the multiRead right
  behind the lease). Items completed, retried or dead-lettered are gone and count
  nothing; released items are taken out of their record first (:meth:`released`).
* Records are untrusted input (SPEC §2): a malformed record is a warning, then deleted;
  at most ``_NAMES_MAX`` names of the ``qn-N`` form are acted on.

Status: used by :class:`zkcrawl.queue.leases.LeaseQueue` in at-least-once mode.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterable, Sequence

from zkcrawl.logs import get_logger
from zkcrawl.queue import untrusted
from zkcrawl.zk import Multi, NoNodeError, Stat, ZkClient, tx_ok

log = get_logger(__name__)

LIVE = ".live"
DEATH_CHILD = "d"  # created and deleted on an item by a reaper: cversion += 2
_NAMES_MAX = 10_000
_REAP_MAX = 50  # records reaped per listing (bounded work; the rest at the next one)
_ITEM_NAME = re.compile(r"^qn--?\d{1,10}$")


class ClaimLog:
    """The records of one queue's claims, and the reaping of dead holders' records."""

    def __init__(self, zk: ZkClient, path: str, queue_path: str) -> None:
        self.zk = zk
        self.path = path
        self.queue_path = queue_path
        self._n = itertools.count()
        self._lock = threading.Lock()
        self._names: dict[str, set[str]] = {}  # record -> its items not settled yet
        self._record_of: dict[str, str] = {}  # item -> the record of its latest lease
        zk.ensure_path(path)

    # -- the holder's side -------------------------------------------------------------
    def add_ops(self, tx: Multi, names: Sequence[str], session: int | None) -> str:
        """Add the record of ``names`` (and its twin) to lease transaction ``tx``."""
        record = f"{session or 0:016x}.{next(self._n)}"
        body = json.dumps(list(names), separators=(",", ":")).encode()
        tx.create(f"{self.path}/{record}", body)
        tx.create(f"{self.path}/{record}{LIVE}", ephemeral=True)
        return record

    def committed(self, record: str, names: Iterable[str]) -> None:
        """The lease transaction that carried ``record`` committed."""
        with self._lock:
            self._names[record] = set(names)
            for name in self._names[record]:
                self._record_of[name] = record

    def settled(self, names: Iterable[str]) -> None:
        """Items completed, retried, dead-lettered or lost: drop each record once empty."""
        emptied = self._take_out(names)
        for record in emptied:
            tx = self.zk.transaction()
            tx.delete(f"{self.path}/{record}{LIVE}")
            tx.delete(f"{self.path}/{record}")
            tx.commit_async()  # pipelined; a leftover is reaped as a death of nothing

    def released(self, names: Iterable[str]) -> None:
        """Items given back: out of their records *before* their leases go, so a death
        afterwards does not count them."""
        names = list(names)
        with self._lock:
            touched = {self._record_of[n] for n in names if n in self._record_of}
        emptied = set(self._take_out(names))
        tx = self.zk.transaction()
        for record in touched:
            if record in emptied:
                tx.delete(f"{self.path}/{record}{LIVE}")
                tx.delete(f"{self.path}/{record}")
            else:
                with self._lock:
                    left = sorted(self._names.get(record, ()))
                tx.set_data(f"{self.path}/{record}",
                            json.dumps(left, separators=(",", ":")).encode())
        if len(tx):
            tx.commit()

    def forget(self) -> None:
        """The session was lost: its records are the reapers' now."""
        with self._lock:
            self._names.clear()
            self._record_of.clear()

    def _take_out(self, names: Iterable[str]) -> list[str]:
        emptied: list[str] = []
        with self._lock:
            for name in names:
                record = self._record_of.pop(name, None)
                left = self._names.get(record) if record else None
                if left is None or record is None:
                    continue
                left.discard(name)
                if not left:
                    del self._names[record]
                    emptied.append(record)
        return emptied

    # -- the reaper's side -------------------------------------------------------------
    def reap(self, children: Sequence[str]) -> int:
        """Count the deaths of the twinless records in ``children`` (a listing of
        ``claims/`` made after the leases'); returns the items counted."""
        live = {c[:-len(LIVE)] for c in children if c.endswith(LIVE)}
        dead = [c for c in children if not c.endswith(LIVE) and c not in live]
        self._drop_strays(live)
        return sum(self._reap_one(record) for record in dead[:_REAP_MAX])

    def _drop_strays(self, live: set[str]) -> None:
        """Delete our own session's records that we no longer track: a :meth:`settled`
        whose pipelined delete failed (ConnectionLoss under a leader fail-over). Its twin is
        ours, so no reaper touches it while we live, and once we are gone nobody may list
        again: found left over after the last consumer of a crawl exited (tests/faults)."""
        session = self.zk.session_id
        if not session:
            return
        own = f"{session:016x}."
        with self._lock:  # a record leaves _names only once settled (or never committed)
            strays = sorted(r for r in live if r.startswith(own) and r not in self._names)
        for record in strays[:_REAP_MAX]:
            tx = self.zk.transaction()
            tx.delete(f"{self.path}/{record}{LIVE}")
            tx.delete(f"{self.path}/{record}")
            tx.commit_async()  # a failure: the next listing tries again

    def _reap_one(self, record: str) -> int:
        path = f"{self.path}/{record}"
        try:
            data, stat = self.zk.get(path)
        except NoNodeError:
            return 0  # reaped by another consumer
        names = self._decode(path, data, stat)
        if names is None:  # garbage in our namespace: warned about, then removed
            self.zk.delete_async(path, stat.version)
            return 0
        reads = self.zk.get_many([f"{self.queue_path}/{n}" for n in names])
        alive = [n for n, r in zip(names, reads, strict=True) if not isinstance(r, Exception)]
        tx = self.zk.transaction()
        for name in alive:
            tx.create(f"{self.queue_path}/{name}/{DEATH_CHILD}")
            tx.delete(f"{self.queue_path}/{name}/{DEATH_CHILD}")
        tx.delete(path, stat.version)
        if not tx_ok(tx.commit()):
            return 0  # reaped meanwhile, or an item settled meanwhile: the next listing
        if alive:
            log.warning("queue.holder_died", record=record, items=len(alive),
                        note="each counts as an attempt (SPEC §3)")
        return len(alive)

    @staticmethod
    def _decode(path: str, data: bytes, stat: Stat) -> list[str] | None:
        doc, why = untrusted.load_json(data, limit=_NAMES_MAX * 16)
        names = doc if isinstance(doc, list) else None
        if names is None or not all(isinstance(n, str) and _ITEM_NAME.match(n) for n in names):
            untrusted.MALFORMED.warn(path, untrusted.version_of(stat),
                                     why or "not a list of item names")
            return None
        return list(dict.fromkeys(names))[:_NAMES_MAX]
