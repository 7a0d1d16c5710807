"""Contract tests of the ZooKeeper core (zkcrawl.zk) against a real ZooKeeper.

zkcrawl/zk/wire.py serializes multi and multiRead requests by hand, on kazoo's private
API; each must give what kazoo's own public API gives on the same nodes: the same bytes
as kazoo's ``Transaction.serialize()``, the same results as ``transaction().commit()``
and ``get()``. This file drives a raw KazooClient on purpose (pyproject's ruff
per-file-ignores name it).
"""

from __future__ import annotations

import ast
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import kazoo.exceptions
import kazoo.handlers.threading
import pytest
from kazoo.client import KazooClient
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    GetData,
    SetData,
    Transaction,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.security import OPEN_ACL_UNSAFE

from tests.conftest import wait_for
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.zk import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    ZkClient,
    errors,
)
from zkcrawl.zk.client import gather
from zkcrawl.zk.wire import CreateMany, MultiRead


@pytest.fixture
def raw(zk_hosts: str) -> Iterator[KazooClient]:
    """kazoo's own client on the same server: the reference."""
    client = KazooClient(hosts=zk_hosts, timeout=10)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


def _norm(results: Sequence[Any], base: str) -> list[Any]:
    """Results comparable across two subtrees: paths relative to ``base``, errors by type,
    stats as ``"stat"`` (their zxids differ)."""
    out: list[Any] = []
    for r in results:
        if isinstance(r, Exception):
            out.append(type(r))
        elif isinstance(r, str):
            assert r.startswith(base), r
            out.append(r[len(base):])
        elif isinstance(r, ZnodeStat):
            out.append("stat")
        else:
            out.append(r)
    return out


def _both(zk: ZkClient, raw: KazooClient, root: str,
          build: Callable[[Any, str], None]) -> tuple[list[Any], list[Any], str, str]:
    """The same ops on two identical subtrees: ours through ZkClient.transaction(), the
    reference through kazoo's transaction(). Returns both results and both bases."""
    ours_base, ref_base = f"{root}/ours", f"{root}/kazoo"
    ours = zk.transaction()
    build(ours, ours_base)
    ref = raw.transaction()
    build(ref, ref_base)
    return ours.commit(), ref.commit(), ours_base, ref_base


def _tree(raw: KazooClient, base: str) -> None:
    raw.create(f"{base}/q/gone", b"x", makepath=True)
    raw.create(f"{base}/q/keep", b"k")
    raw.create(f"{base}/q/taken", b"t")


# -- errors ----------------------------------------------------------------------------
def test_errors_are_kazoos_classes_with_the_declared_hierarchy() -> None:
    source = Path(errors.__file__).read_text(encoding="utf-8")
    declared: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            base = node.bases[0]
            assert isinstance(base, ast.Name)
            declared[node.name] = base.id
    assert sorted(declared) == sorted(errors.__all__)  # every export is typed
    for name, base in declared.items():
        cls = getattr(errors, name)
        home = kazoo.handlers.threading if name == "KazooTimeoutError" else kazoo.exceptions
        assert cls is getattr(home, name)  # at run time: kazoo's own class
        assert cls.__bases__[0].__name__ == base, name  # for mypy: the same hierarchy


# -- bytes -----------------------------------------------------------------------------
def test_multi_serializes_like_kazoos_transaction(zk: ZkClient) -> None:
    tx = zk.transaction()
    tx.create("/a/plain", "é".encode())
    tx.create("/a/seq-", b"s", sequence=True)
    tx.create("/a/eph", b"", ephemeral=True)
    tx.create("/a/both-", b"b", ephemeral=True, sequence=True)
    tx.delete("/a/gone")
    tx.delete("/a/v", version=7)
    tx.set_data("/a/plain", b"new", version=3)
    tx.set_data("/a/any", b"")
    tx.check("/a/fence", 4)
    acl = OPEN_ACL_UNSAFE
    ref = Transaction([Create("/a/plain", "é".encode(), acl, 0), Create("/a/seq-", b"s", acl, 2),
                       Create("/a/eph", b"", acl, 1), Create("/a/both-", b"b", acl, 3),
                       Delete("/a/gone", -1), Delete("/a/v", 7),
                       SetData("/a/plain", b"new", 3), SetData("/a/any", b"", -1),
                       CheckVersion("/a/fence", 4)])
    assert tx.serialize() == bytes(ref.serialize())


def test_create_many_and_multiread_serialize_like_kazoo(zk: ZkClient) -> None:
    datas = [b"one", b"", "ü".encode() * 100]
    many = CreateMany("/o/tok", "/q/qn-", datas, zk._wire.acl)
    acl = OPEN_ACL_UNSAFE
    ref = Transaction([Create("/o/tok", b"", acl, 1),
                       *(Create("/q/qn-", d, acl, 2) for d in datas)])
    assert bytes(many.serialize()) == bytes(ref.serialize())
    paths = ["/q/a", "/q/é"]
    head = b"".join(bytes(Transaction([GetData(p, False)]).serialize())[:-9] for p in paths)
    assert MultiRead(paths).serialize() == head + bytes(Transaction([]).serialize())


# -- multi: results --------------------------------------------------------------------
def test_multi_commit_gives_kazoos_results(zk: ZkClient, raw: KazooClient,
                                           zk_root: str) -> None:
    for base in (f"{zk_root}/ours", f"{zk_root}/kazoo"):
        _tree(raw, base)

    def build(tx: Any, base: str) -> None:
        tx.create(f"{base}/q/plain", "é".encode())
        tx.create(f"{base}/q/seq-", b"s", sequence=True)
        tx.create(f"{base}/q/eph", b"", ephemeral=True)
        tx.delete(f"{base}/q/gone")
        tx.set_data(f"{base}/q/keep", b"k2", version=0)
        tx.check(f"{base}/q/taken", 0)

    ours, ref, ours_base, ref_base = _both(zk, raw, zk_root, build)
    assert _norm(ours, ours_base) == _norm(ref, ref_base)
    plain, seq, eph, deleted, stat, checked = _norm(ours, ours_base)
    assert checked is True
    assert (plain, eph, deleted, stat) == ("/q/plain", "/q/eph", True, "stat")
    assert seq.startswith("/q/seq-") and seq[-10:].isdigit()
    assert ours[4] == raw.exists(f"{ours_base}/q/keep")  # setData's result: the new stat
    assert ref[4] == raw.exists(f"{ref_base}/q/keep")
    for base, owner in ((ours_base, zk.session_id), (ref_base, raw.client_id[0])):
        assert raw.get(f"{base}/q/plain")[0] == "é".encode()
        assert raw.get(f"{base}/q/keep")[0] == b"k2"
        assert raw.get(f"{base}/q/eph")[1].ephemeralOwner == owner
        assert raw.get(f"{base}/q/plain")[1].ephemeralOwner == 0
        assert raw.exists(f"{base}/q/gone") is None


def test_an_empty_transaction_is_answered_at_once(zk: ZkClient) -> None:
    """The server left an empty multi unanswered (the call waited out its timeout: the
    partitioned queue's ingress mover met it when every node it listed was gone)."""
    started = time.monotonic()
    assert zk.transaction().commit() == []
    assert time.monotonic() - started < zk.zk_timeout  # a bound, not a speed figure


@pytest.mark.parametrize("failing", [
    "create_existing", "delete_missing", "delete_bad_version", "set_bad_version",
    "set_missing", "create_no_parent", "check_bad_version"])
def test_a_failing_op_rolls_back_like_kazoos(zk: ZkClient, raw: KazooClient, zk_root: str,
                                            failing: str) -> None:
    for base in (f"{zk_root}/ours", f"{zk_root}/kazoo"):
        _tree(raw, base)

    def build(tx: Any, base: str) -> None:
        tx.create(f"{base}/q/new", b"n")  # would succeed: rolled back
        tx.delete(f"{base}/q/gone")  # would succeed: rolled back
        {"create_existing": lambda: tx.create(f"{base}/q/taken", b""),
         "delete_missing": lambda: tx.delete(f"{base}/q/missing"),
         "delete_bad_version": lambda: tx.delete(f"{base}/q/keep", version=5),
         "set_bad_version": lambda: tx.set_data(f"{base}/q/keep", b"", version=5),
         "set_missing": lambda: tx.set_data(f"{base}/q/missing", b""),
         "create_no_parent": lambda: tx.create(f"{base}/nowhere/x", b""),
         "check_bad_version": lambda: tx.check(f"{base}/q/keep", 5),
         }[failing]()
        tx.set_data(f"{base}/q/keep", b"not tried")
        tx.create(f"{base}/q/never-", b"", sequence=True)

    ours, ref, ours_base, ref_base = _both(zk, raw, zk_root, build)
    expected = {"create_existing": NodeExistsError, "delete_missing": NoNodeError,
                "delete_bad_version": BadVersionError, "set_bad_version": BadVersionError,
                "set_missing": NoNodeError, "create_no_parent": NoNodeError,
                "check_bad_version": BadVersionError}[failing]
    assert _norm(ours, ours_base) == _norm(ref, ref_base) == [
        RolledBackError, RolledBackError, expected, RuntimeInconsistency, RuntimeInconsistency]
    for base in (ours_base, ref_base):  # nothing happened
        assert raw.exists(f"{base}/q/new") is None
        assert raw.exists(f"{base}/q/gone") is not None
        assert raw.get(f"{base}/q/keep")[0] == b"k"
    tx = zk.transaction()
    tx.delete(f"{ours_base}/q/missing")
    (only,) = tx.commit()
    assert isinstance(only, NoNodeError)  # a one-op failure: the error, nothing rolled back


def test_multi_and_multiread_under_a_chroot(zk: ZkClient, zk_root: str, zk_hosts: str,
                                            raw: KazooClient,
                                            zk_factory: Callable[..., ZkClient]) -> None:
    zk.ensure_path(f"{zk_root}/ours")
    zk.ensure_path(f"{zk_root}/kazoo")
    rooted = zk_factory(f"{zk_hosts}{zk_root}/ours")
    raw_rooted = KazooClient(hosts=f"{zk_hosts}{zk_root}/kazoo", timeout=10)
    raw_rooted.start(timeout=15)
    try:
        results = []
        for tx in (rooted.transaction(), raw_rooted.transaction()):
            tx.create("/a", b"1")
            tx.create("/b-", b"2", sequence=True)
            tx.delete("/a")
            tx.create("/a", b"1")
            results.append(tx.commit())
        assert results[0] == results[1] == ["/a", "/b-0000000001", True, "/a"]  # un-chrooted
    finally:
        raw_rooted.stop()
        raw_rooted.close()
    assert raw.get(f"{zk_root}/ours/a")[0] == b"1"
    (got_a, stat_a), (got_b, _), missing = rooted.get_many(["/a", "/b-0000000001", "/nope"])
    assert (got_a, got_b) == (b"1", b"2")
    assert stat_a == raw.get(f"{zk_root}/ours/a")[1]
    assert isinstance(missing, NoNodeError)


def test_multi_rejects_non_bytes(zk: ZkClient, zk_root: str) -> None:
    with pytest.raises(TypeError):
        zk.transaction().create(f"{zk_root}/x", "text")  # type: ignore[arg-type]


# -- multiRead -------------------------------------------------------------------------
def test_multiread_gives_what_get_gives(zk: ZkClient, raw: KazooClient, zk_root: str) -> None:
    values = {"one": b"1", "empty": b"", "text": "é∂".encode() * 50, "big": b"x" * 300_000,
              "null": None}
    for name, value in values.items():
        raw.create(f"{zk_root}/{name}", value, makepath=True)
    raw.set(f"{zk_root}/one", b"11")  # a version > 0
    paths = [f"{zk_root}/{n}" for n in values] + [f"{zk_root}/missing", f"{zk_root}/one"]
    got = zk.get_many(paths)
    assert len(got) == len(paths)
    for path, res in zip(paths, got, strict=True):
        try:
            data, stat = raw.get(path)
        except NoNodeError:
            assert isinstance(res, NoNodeError)
            continue
        assert not isinstance(res, Exception)
        assert res == (data or b"", stat)  # a node without data reads b"", like ZkClient.get
        assert res == zk.get(path)
        assert type(res[1]) is ZnodeStat
    assert zk.get_many([]) == []


def test_multiread_falls_back_to_pipelined_gets(zk: ZkClient, raw: KazooClient,
                                                zk_root: str) -> None:
    raw.create(f"{zk_root}/a", b"1", makepath=True)
    raw.create(f"{zk_root}/null", None)
    expected = zk.get_many([f"{zk_root}/a", f"{zk_root}/null", f"{zk_root}/missing"])
    zk._multiread = False  # what a server < 3.6 (UnimplementedError) leads to
    got = zk.get_many([f"{zk_root}/a", f"{zk_root}/null", f"{zk_root}/missing"])
    assert got[:2] == expected[:2] and isinstance(got[2], NoNodeError)


# -- CreateMany ------------------------------------------------------------------------
def _offer_both(zk: ZkClient, raw: KazooClient, root: str, marker: str, parent: str,
                datas: list[bytes]) -> tuple[list[Any], list[Any]]:
    """One offer batch on each subtree: ours with CreateMany, the reference with kazoo's
    transaction of the same creates; both results, relative to their subtree."""
    out = []
    for base in (f"{root}/ours", f"{root}/kazoo"):
        if base.endswith("/ours"):
            res = zk.create_many_async(f"{base}/{marker}", f"{base}/{parent}/qn-", datas).get()
        else:
            tx = raw.transaction()
            tx.create(f"{base}/{marker}", b"", ephemeral=True)
            for d in datas:
                tx.create(f"{base}/{parent}/qn-", d, sequence=True)
            res = tx.commit()
        out.append(_norm(res, base))
    return out[0], out[1]


def test_create_many_gives_kazoos_transaction_results(zk: ZkClient, raw: KazooClient,
                                                      zk_root: str) -> None:
    datas = [b"a", b"", "ü".encode()]
    for base in (f"{zk_root}/ours", f"{zk_root}/kazoo"):
        raw.ensure_path(f"{base}/offers")
        raw.ensure_path(f"{base}/queue")
    ours, ref = _offer_both(zk, raw, zk_root, "offers/t", "queue", datas)
    assert ours == ref == [
        "/offers/t", "/queue/qn-0000000000", "/queue/qn-0000000001", "/queue/qn-0000000002"]
    for base in (f"{zk_root}/ours", f"{zk_root}/kazoo"):
        names = sorted(raw.get_children(f"{base}/queue"))
        assert [raw.get(f"{base}/queue/{n}")[0] for n in names] == datas
        assert raw.exists(f"{base}/offers/t").ephemeralOwner != 0
    # The marker exists now: the same failure from both, nothing created.
    ours, ref = _offer_both(zk, raw, zk_root, "offers/t", "queue", datas)
    assert ours == ref == [NodeExistsError, *[RuntimeInconsistency] * 3]
    # No parent for the items: the marker is rolled back.
    ours, ref = _offer_both(zk, raw, zk_root, "offers/u", "gone", datas)
    assert ours == ref == [RolledBackError, NoNodeError, *[RuntimeInconsistency] * 2]
    for base in (f"{zk_root}/ours", f"{zk_root}/kazoo"):
        assert len(raw.get_children(f"{base}/queue")) == 3
        assert raw.get_children(f"{base}/offers") == ["t"]


# -- the typed API ---------------------------------------------------------------------
def test_pipelined_calls_and_conditional_writes(zk: ZkClient, zk_root: str) -> None:
    zk.create(f"{zk_root}/n", b"v", makepath=True)
    assert zk.exists_async(f"{zk_root}/n").get() == zk.exists(f"{zk_root}/n")
    assert zk.exists_async(f"{zk_root}/none").get() is None
    assert zk.get_async(f"{zk_root}/n").get() == zk.get(f"{zk_root}/n")
    assert zk.get_children_async(zk_root).get() == ["n"]
    with pytest.raises(BadVersionError):
        zk.set(f"{zk_root}/n", b"w", version=3)
    stat = zk.set(f"{zk_root}/n", b"w", version=0)
    assert stat.version == 1 and zk.get(f"{zk_root}/n") == (b"w", stat)
    with pytest.raises(BadVersionError):
        zk.delete_async(f"{zk_root}/n", version=0).get()
    assert zk.delete_async(f"{zk_root}/n", version=1).get() is True
    with pytest.raises(NoNodeError):
        zk.delete_async(f"{zk_root}/n").get()
    assert zk.client_id is not None and zk.client_id[0] == zk.session_id


def test_data_and_children_watches(zk: ZkClient, zk_factory: Callable[..., ZkClient],
                                   zk_root: str) -> None:
    other = zk_factory()
    zk.ensure_path(zk_root)
    seen: list[tuple[bytes | None, int | None]] = []
    kids: list[list[str]] = []
    lock = threading.Lock()

    def on_data(data: bytes | None, stat: Any) -> bool | None:
        with lock:
            seen.append((data, None if stat is None else stat.version))
        return False if data == b"stop" else None

    def on_children(children: list[str]) -> None:
        with lock:
            kids.append(sorted(children))

    zk.watch_data(f"{zk_root}/c", on_data)
    zk.watch_children(zk_root, on_children)
    other.create(f"{zk_root}/c", b"1")
    wait_for(lambda: (b"1", 0) in seen, what="data watch: create")
    wait_for(lambda: ["c"] in kids, what="children watch: create")
    other.set(f"{zk_root}/c", b"stop")
    wait_for(lambda: (b"stop", 1) in seen, what="data watch: change")
    other.set(f"{zk_root}/c", b"after")  # the watch stopped (on_data returned False)
    other.delete(f"{zk_root}/c")
    wait_for(lambda: kids and kids[-1] == [], what="children watch: delete")
    assert seen[0] == (None, None)  # called at once: no node yet
    assert (b"after", 2) not in seen
    assert [] in kids and ["c"] in kids


def test_gather_with_a_timeout_is_bounded_while_zookeeper_is_frozen(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """kazoo keeps a request until the server answers or the connection drops; with a
    timeout, gather() gives up and raises ConnectionLoss (admin reads, the exporter)."""
    server = ZkServer(tmp_path_factory.mktemp("frozen"), quick_jit=True).start(wait=60)
    client = ZkClient(server.hosts, zk_timeout=1.0, session_timeout=30.0).connect()
    try:
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(ConnectionLoss, match=r"within 0\.5 s"):
                gather([client.get_async("/"), client.get_async("/zookeeper")], 0.5)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert gather([client.get_async("/")], 10.0)[0] is not None  # unfrozen: answers
    finally:
        client.close()
        server.stop()


def test_many_threads_asking_silent_for_at_once_start_one_pause_watch(zk_hosts: str) -> None:
    """``silent_for`` starts the client's pause watch on first use: a consumer's pool threads
    all ask at once, and each started a watch of its own before (16 threads ticking 10 times
    a second, 15 of them never stopped by ``close``)."""
    def watches() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "zk-pause-watch")

    client = ZkClient(zk_hosts, session_timeout=10).connect()
    try:
        before = watches()
        barrier = threading.Barrier(16)

        def ask() -> None:
            barrier.wait(5)
            client.silent_for()

        threads = [threading.Thread(target=ask) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert watches() == before + 1
    finally:
        client.close()
    wait_for(lambda: watches() == before, timeout=5)  # close stops it
