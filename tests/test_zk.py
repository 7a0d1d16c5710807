"""The hand-written wire ops of the kazoo adapter (zkcrawl.zk.client), against a real ZooKeeper."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kazoo.exceptions import (
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from zkcrawl.zk.client import ZkClient


def test_multi_creates_and_deletes_in_one_commit(zk: ZkClient, zk_root: str) -> None:
    zk.ensure_path(f"{zk_root}/q")
    zk.kazoo.create(f"{zk_root}/q/gone", b"x")
    tx = zk.transaction()
    tx.create(f"{zk_root}/q/plain", "é".encode())
    tx.create(f"{zk_root}/q/seq-", b"s", sequence=True)
    tx.create(f"{zk_root}/q/eph", b"", ephemeral=True)
    tx.delete(f"{zk_root}/q/gone")
    assert len(tx) == 4
    plain, seq, eph, deleted = tx.commit()
    assert plain == f"{zk_root}/q/plain" and eph == f"{zk_root}/q/eph" and deleted is True
    assert seq.startswith(f"{zk_root}/q/seq-") and seq[-10:].isdigit()
    assert zk.kazoo.get(f"{zk_root}/q/plain")[0] == "é".encode()
    assert zk.kazoo.get(f"{zk_root}/q/eph")[1].ephemeralOwner == zk.session_id
    assert zk.kazoo.get(f"{zk_root}/q/plain")[1].ephemeralOwner == 0
    assert zk.kazoo.exists(f"{zk_root}/q/gone") is None


def test_multi_failure_rolls_back_and_names_the_failed_op(zk: ZkClient, zk_root: str) -> None:
    zk.ensure_path(f"{zk_root}/q/taken")
    tx = zk.transaction()
    tx.create(f"{zk_root}/q/new", b"")
    tx.create(f"{zk_root}/q/taken", b"")
    tx.delete(f"{zk_root}/q/missing")
    results = tx.commit()
    # The same results kazoo's own transaction gives: undone, the failure, not tried.
    assert [type(r) for r in results] == [RolledBackError, NodeExistsError, RuntimeInconsistency]
    assert zk.kazoo.exists(f"{zk_root}/q/new") is None  # rolled back
    tx = zk.transaction()
    tx.delete(f"{zk_root}/q/missing")
    (only,) = tx.commit()
    assert isinstance(only, NoNodeError)


def test_multi_and_multiread_under_a_chroot(zk: ZkClient, zk_root: str, zk_hosts: str,
                                            zk_factory: Callable[..., ZkClient]) -> None:
    zk.ensure_path(zk_root)
    rooted = zk_factory(f"{zk_hosts}{zk_root}")
    tx = rooted.transaction()
    tx.create("/a", b"1")
    tx.create("/b-", b"2", sequence=True)
    a, b = tx.commit()
    assert a == "/a" and b.startswith("/b-")  # paths come back without the chroot
    assert zk.kazoo.get(f"{zk_root}/a")[0] == b"1"
    (got_a, stat_a), (got_b, _), missing = rooted.get_many(["/a", b, "/nope"])
    assert (got_a, got_b) == (b"1", b"2") and stat_a.dataLength == 1
    assert isinstance(missing, NoNodeError)


def test_multi_rejects_non_bytes(zk: ZkClient, zk_root: str) -> None:
    with pytest.raises(TypeError):
        zk.transaction().create(f"{zk_root}/x", "text")  # type: ignore[arg-type]
