"""Issue 27, item 1: every node a crawl relies on is checked, not only the root.

Against a real ZooKeeper, as an attacker on the same machine sees it: nodes created
world-open before the first authenticated run (a queue anyone may add to, a ``dead`` an
attacker deleted and re-created open under an open root) make an authenticated consumer
or producer refuse to start in one line naming them and ``zkcrawl acl fix``; the fix (the
command, or ``--zk-acl fix`` at start) closes them, below them too; a container that
vanished is re-created with the creator ACL; ``ip:0.0.0.0/0`` is "anyone may write".
The ACL decoders are property-tested with any scheme, id and permission bits.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import _SERVERS
from tests.httpd import TestServer, html
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.cli import main as zkcrawl_main
from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.errors import ExitStatus
from zkcrawl.producer.main import main as producer_main
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import NoAuthError
from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.security import (
    ALL,
    READ_ACL,
    ZkSecurityError,
    access_warning,
    creator_acl,
    open_writers,
    parse_auth,
    relied_on,
    repaired_acl,
)

AUTH = f"digest:crawler:pw-{uuid.uuid4().hex}"
MALLORY = f"digest:mallory:{uuid.uuid4().hex}"
ENV = {"ZKCRAWL_ZK_AUTH": AUTH}


@pytest.fixture
def site() -> Iterator[TestServer]:
    with TestServer({"/ok": html("<title>ok</title>"),
                     "/evil": html("<title>planted</title>")}) as srv:
        yield srv


def owner(hosts: str) -> ZkClient:
    return ZkClient(hosts, zk_timeout=8, auth=parse_auth(AUTH)).connect()


def anonymous(hosts: str) -> ZkClient:
    return ZkClient(hosts, zk_timeout=8).connect()


def run(capsys: pytest.CaptureFixture[str], main, argv: list[str], env=ENV
        ) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = int(main(argv, dict(env)))
    out, err = capsys.readouterr()
    return rc, out, err


def consumer_args(hosts: str, root: str, out: Path) -> list[str]:
    return ["--zk", hosts, "--root", root, "--zk-timeout", "8", "--log-format", "json",
            "--out", str(out), "--exit-when-idle", "1", "--allow-private-addresses",
            "--no-robots", "--domain-delay", "0", "--id", "c1"]


def plant_open_root(hosts: str, root: str, url: str) -> None:
    """A root used without credentials first (everything world-open), then the attacker's
    item, added without credentials."""
    with anonymous(hosts) as zk:
        for path in Layout.of(root).containers():
            zk.ensure_path(path)
        zk.create(Layout.of(root).item_prefix, json.dumps({"url": url}).encode(),
                  sequence=True)


def test_world_open_queue_is_refused_in_one_line_then_fixed(zk_hosts, zk_root, site, tmp_path,
                                                           capsys) -> None:
    """The issue's reproduction: before, the authenticated consumer crawled the item an
    unauthenticated client added to a queue created world-open earlier."""
    plant_open_root(zk_hosts, zk_root, site.url("/evil"))
    out = tmp_path / "records.jsonl"
    rc, _, err = run(capsys, consumer_main, consumer_args(zk_hosts, zk_root, out))
    assert rc == ExitStatus.USAGE, err
    (line,) = err.strip().splitlines()
    assert line.startswith("zkcrawl-consumer: error: ") and f"{zk_root}/queue" in line, line
    assert "anyone who reaches ZooKeeper may write it" in line and "zkcrawl acl fix" in line
    assert AUTH.rsplit(":", 1)[1] not in err
    assert not site.requests_for("/evil") and not (out.exists() and out.read_text())
    # The producer refuses it too, before offering anything.
    urls = tmp_path / "urls.txt"
    urls.write_text(site.url("/ok") + "\n")
    rc, _, err = run(capsys, producer_main, ["--zk", zk_hosts, "--root", zk_root,
                                             "--from-file", str(urls),
                                             "--allow-private-addresses"])
    assert rc == ExitStatus.USAGE and "zkcrawl acl fix" in err.strip().splitlines()[-1], err

    rc, text, err = run(capsys, zkcrawl_main, ["acl", "check", "--zk", zk_hosts,
                                              "--root", zk_root])
    assert rc == 1 and f"{zk_root}/queue" in text and "OPEN" in text, (text, err)
    rc, text, err = run(capsys, zkcrawl_main, ["acl", "fix", "--zk", zk_hosts,
                                              "--root", zk_root])
    assert rc == 0 and "fixed 5" in text, (text, err)  # root, 3 containers, the item
    with anonymous(zk_hosts) as attacker, owner(zk_hosts) as zk:
        mine = creator_acl(zk.auth)  # type: ignore[arg-type]
        planted = zk.get_children(f"{zk_root}/queue")[0]
        for path in (zk_root, f"{zk_root}/queue", f"{zk_root}/queue/{planted}"):
            assert zk.get_acl(path) == mine
        with pytest.raises(NoAuthError):
            attacker.create(Layout.of(zk_root).item_prefix, b"http://127.0.0.1:9/x",
                            sequence=True)
        with pytest.raises(NoAuthError):
            attacker.set(f"{zk_root}/queue/{planted}", b"http://127.0.0.1:9/y")
        with pytest.raises(NoAuthError):
            attacker.delete(f"{zk_root}/dead")
    rc, text, _ = run(capsys, zkcrawl_main, ["acl", "check", "--zk", zk_hosts,
                                            "--root", zk_root])
    assert rc == 0 and "OPEN" not in text, text


@pytest.fixture(scope="module")
def auth_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path_factory.mktemp("zk-auth"), quick_jit=True,
                      require_auth=True).start(wait=60)
    _SERVERS.append(server)
    yield server
    server.stop()
    _SERVERS.remove(server)


def test_on_a_server_requiring_authentication_another_identity_cannot_plant_items(
        auth_zk, site, tmp_path, capsys) -> None:
    """The same with enforce.auth.enabled: the attacker holds some identity (any digest
    user is one); a root first set up with --zk-acl open lets it add items."""
    root = f"/t-{uuid.uuid4().hex[:10]}"
    rc, _, err = run(capsys, zkcrawl_main, ["pause", "--zk", auth_zk.hosts, "--root", root,
                                           "--zk-acl", "open"])
    assert rc == 0, err
    mallory = ZkClient(auth_zk.hosts, zk_timeout=8, auth=parse_auth(MALLORY)).connect()
    with mallory:
        mallory.ensure_path(f"{root}/queue")
        mallory.create(Layout.of(root).item_prefix,
                       json.dumps({"url": site.url("/evil")}).encode(), sequence=True)
    out = tmp_path / "records.jsonl"
    rc, _, err = run(capsys, consumer_main, consumer_args(auth_zk.hosts, root, out))
    (line,) = err.strip().splitlines()
    assert rc == ExitStatus.USAGE and f"{root}/queue" in line and "acl fix" in line, line
    assert not site.requests_for("/evil")
    # The root and control are fixed; mallory's queue cannot be (not this identity's).
    rc, _, err = run(capsys, zkcrawl_main, ["acl", "fix", "--zk", auth_zk.hosts,
                                           "--root", root])
    assert rc == 1 and f"{root}/queue not fixed: another identity's" in err, err
    rc, text, _ = run(capsys, zkcrawl_main, ["acl", "check", "--zk", auth_zk.hosts,
                                            "--root", root])
    assert rc == 1 and "denied: this identity may not write it" in text and "OPEN" not in text
    with ZkClient(auth_zk.hosts, zk_timeout=8, auth=parse_auth(MALLORY)).connect() as mallory:
        with pytest.raises(NoAuthError):
            mallory.set(f"{root}/control", b'{"state": "running"}')
        with pytest.raises(NoAuthError):
            mallory.create(f"{root}/leases", b"")
    rc, _, err = run(capsys, consumer_main, consumer_args(auth_zk.hosts, root, out))
    (line,) = err.strip().splitlines()
    assert rc == ExitStatus.USAGE and f"{root}/queue: its ACL (digest:mallory=ALL" in line, line
    assert "does not let this identity write" in line and not site.requests_for("/evil")


def test_containers_an_attacker_recreated_under_an_open_root_are_refused(
        zk_hosts, zk_root, tmp_path, capsys) -> None:
    with anonymous(zk_hosts) as zk:
        zk.ensure_path(zk_root)  # the root of an earlier run without credentials
    with owner(zk_hosts) as zk:
        for path in Layout.of(zk_root).containers():
            zk.ensure_path(path)  # protected...
    with anonymous(zk_hosts) as attacker:  # ...but the root lets anyone delete them
        attacker.delete(f"{zk_root}/dead")
        attacker.ensure_path(f"{zk_root}/dead")
    rc, _, err = run(capsys, consumer_main, consumer_args(zk_hosts, zk_root,
                                                          tmp_path / "o.jsonl"))
    (line,) = err.strip().splitlines()
    assert rc == ExitStatus.USAGE and f"{zk_root}, {zk_root}/dead" in line, line


def test_zk_acl_fix_repairs_at_start_and_a_vanished_container_comes_back_closed(
        zk_hosts, zk_root, site, tmp_path, capsys) -> None:
    plant_open_root(zk_hosts, zk_root, site.url("/ok"))
    out = tmp_path / "records.jsonl"
    rc, _, err = run(capsys, consumer_main,
                     [*consumer_args(zk_hosts, zk_root, out), "--zk-acl", "fix"])
    assert rc == 0, err
    assert "zk.acl_fixed" in err
    with owner(zk_hosts) as zk:
        mine = creator_acl(zk.auth)  # type: ignore[arg-type]
        for path in relied_on(Layout.of(zk_root)):
            if zk.exists(path):
                assert zk.get_acl(path) == mine, path
        zk.delete(f"{zk_root}/dead")  # empty: its owner may delete it
    rc, _, err = run(capsys, consumer_main, consumer_args(zk_hosts, zk_root, out))
    assert rc == 0, err
    with owner(zk_hosts) as zk:
        assert zk.get_acl(f"{zk_root}/dead") == mine  # re-created closed, never open


def test_ip_everyone_acl_is_anyone_may_write_not_writes_will_fail(zk_hosts, zk_root, capsys
                                                                  ) -> None:
    with anonymous(zk_hosts) as zk:
        zk.ensure_path(zk_root)
        zk.set_acl(zk_root, [(ALL, "ip", "0.0.0.0/0")])
    rc, _, err = run(capsys, zkcrawl_main, ["status", "--zk", zk_hosts, "--root", zk_root,
                                           "--log-format", "json"])
    assert rc == 0, err
    assert "anyone who reaches ZooKeeper may write it" in err and "writes will fail" not in err
    rc, text, _ = run(capsys, zkcrawl_main, ["acl", "check", "--zk", zk_hosts,
                                            "--root", zk_root])
    assert rc == 1 and "ip:0.0.0.0/0=ALL" in text, text
    rc, text, err = run(capsys, zkcrawl_main, ["acl", "fix", "--zk", zk_hosts,
                                              "--root", zk_root])
    assert rc == 0 and "fixed 1" in text, err


def test_acl_fix_needs_credentials(zk_hosts, capsys) -> None:
    rc, _, err = run(capsys, zkcrawl_main, ["acl", "fix", "--zk", zk_hosts], env={})
    assert rc == 2 and "needs credentials" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run(capsys, consumer_main, ["--zk", zk_hosts, "--zk-acl", "fix"], env={})
    assert rc == 2 and "--zk-acl fix needs credentials" in err


def test_relied_on_grows_with_the_layout() -> None:
    nodes = relied_on(Layout.of("/r"))
    assert nodes[0] == "/r"
    assert {f"/r/{n}" for n in ("queue", "leases", "dead", "offers", "consumers", "producers",
                                 "control", "hosts", "discovered")} <= set(nodes)
    assert all(n.count("/") == 2 for n in nodes[1:])  # not an item prefix

    class Grown(Layout):
        @property
        def fetched(self) -> str:
            return f"{self.root}/fetched"

    assert "/r/fetched" in relied_on(Grown("/r"))
    assert relied_on(Layout.of("/"))[:2] == ["/", "/consumers"]


# -- the decoders of hostile ACLs --------------------------------------------------------
ME = parse_auth("digest:crawler:secret")
entries = st.tuples(st.integers(min_value=-2**31, max_value=2**31 - 1),
                    st.sampled_from(["world", "ip", "digest", "sasl", "x509", "auth", ""])
                    | st.text(max_size=8),
                    st.sampled_from(["anyone", "0.0.0.0/0", "::/0", "127.0.0.1", "10.0.0.0/8",
                                     "crawler:x", ME.acl_id[1], "300.1.1.1/99"])
                    | st.text(max_size=80))


@given(st.lists(entries, max_size=8))
def test_acl_decoders_give_a_verdict_for_any_acl(acl) -> None:
    writers = open_writers(acl)
    assert writers is None or isinstance(writers, str)
    try:
        warning = access_warning(ME, acl, "/r")
    except ZkSecurityError as exc:
        assert "wrong password" in str(exc) and "secret" not in str(exc)
    else:
        assert warning is None or "secret" not in warning
    fixed = repaired_acl(acl, creator_acl(ME))
    assert open_writers(fixed) is None
    assert fixed[:2] == creator_acl(ME) and access_warning(ME, fixed, "/r") is None


@pytest.mark.parametrize("acl, writers", [
    ([(ALL, "world", "anyone")], "anyone who reaches ZooKeeper"),
    ([(2, "ip", "0.0.0.0/0")], "anyone who reaches ZooKeeper"),
    ([(4, "ip", "10.0.0.0/8")], "every client connecting from 10.0.0.0/8"),
    ([(16, "ip", "127.0.0.1")], "every client connecting from 127.0.0.1/32"),
    ([READ_ACL, (ALL, "digest", "ops:abc"), (1, "ip", "0.0.0.0/0")], None),
])
def test_who_may_write_without_credentials(acl, writers) -> None:
    assert open_writers(acl) == writers
