"""Issue #27 item 1, the gap left: the daemons' start check reads every partition node.

Before, a consumer or producer started with credentials read the ACL of ``<root>`` and of
the containers under it, ``<root>/partitions`` included, but not of the partition nodes
``<root>/partitions/<p>`` below it: a partition left world-open (made before credentials
were used, or opened by another client) let anyone add batches to it. Now each partition
node is read too, in one pipelined round within ``--zk-timeout`` (256 here), and an open
one is refused in one line naming it and ``zkcrawl acl fix`` (exit 2, as for a container),
or repaired (with what is below it) under ``--zk-acl fix``. Real ZooKeeper, credentials.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.errors import ExitStatus
from zkcrawl.producer.main import main as producer_main
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import NoAuthError
from zkcrawl.zk.acls import guarded_nodes, partition_nodes
from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.security import OPEN_ACL, creator_acl, parse_auth

AUTH = f"digest:crawler:pw-{uuid.uuid4().hex}"
ENV = {"ZKCRAWL_ZK_AUTH": AUTH}
PARTITIONS = 256
OPENED = (7, 200)  # the partitions another client made world-open


def owner(hosts: str) -> ZkClient:
    return ZkClient(hosts, zk_timeout=8, auth=parse_auth(AUTH)).connect()


def anonymous(hosts: str) -> ZkClient:
    return ZkClient(hosts, zk_timeout=8).connect()


def run(capsys: pytest.CaptureFixture[str], main, argv: list[str]) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    capsys.readouterr()
    rc = int(main(argv, dict(ENV)))
    return rc, capsys.readouterr().err


def consumer_args(hosts: str, root: str, out: Path) -> list[str]:
    return ["--zk", hosts, "--root", root, "--zk-timeout", "8", "--log-format", "json",
            "--out", str(out), "--exit-when-idle", "1", "--allow-private-addresses",
            "--no-robots", "--domain-delay", "0", "--id", "c1"]


def closed_root_with_partitions(hosts: str, root: str) -> None:
    """A root set up with credentials (every node closed), 256 partition nodes, two of
    which another client then made world-open (``setAcl ... world:anyone:cdrwa``)."""
    layout = Layout.of(root)
    with owner(hosts) as zk:
        for path in layout.containers():
            zk.ensure_path(path)
        zk.ensure_path(layout.partitions)
        tx = zk.transaction()
        for p in range(PARTITIONS):
            tx.create(layout.partition(p), b"")
        tx.commit()
    with owner(hosts) as other_client:
        for p in OPENED:
            other_client.set_acl(layout.partition(p), [OPEN_ACL])


def test_a_world_open_partition_node_is_refused_in_one_line_then_fixed(zk_hosts, zk_root,
                                                                       tmp_path, capsys):
    closed_root_with_partitions(zk_hosts, zk_root)
    layout = Layout.of(zk_root)
    opened = [layout.partition(p) for p in OPENED]
    with anonymous(zk_hosts) as attacker:  # the exposure: anyone may add a batch there
        attacker.create(f"{opened[0]}/planted", b"anything")  # (not a batch name)
        with pytest.raises(NoAuthError):
            attacker.create(f"{layout.partition(8)}/qn-", b"", sequence=True)

    out = tmp_path / "records.jsonl"
    rc, err = run(capsys, consumer_main, consumer_args(zk_hosts, zk_root, out))
    assert rc == ExitStatus.USAGE, err
    (line,) = err.strip().splitlines()
    assert line.startswith("zkcrawl-consumer: error: refusing to work under "), line
    assert f"{opened[0]}, {opened[1]}: anyone who reaches ZooKeeper may write it" in line
    assert f"`zkcrawl acl fix --zk {zk_hosts} --root {zk_root}`" in line, line
    assert layout.partition(8) not in line.split(": anyone")[0]  # only the open ones
    assert AUTH.rsplit(":", 1)[1] not in err
    urls = tmp_path / "urls.txt"
    urls.write_text("http://127.0.0.1:9/x\n")
    rc, err = run(capsys, producer_main, ["--zk", zk_hosts, "--root", zk_root,
                                          "--from-file", str(urls),
                                          "--allow-private-addresses"])
    (line,) = err.strip().splitlines()
    assert rc == ExitStatus.USAGE and opened[0] in line and "zkcrawl acl fix" in line, err

    rc, err = run(capsys, consumer_main,
                  [*consumer_args(zk_hosts, zk_root, out), "--zk-acl", "fix"])
    assert rc == 0, err
    assert "zk.acl_fixed" in err
    with owner(zk_hosts) as zk, anonymous(zk_hosts) as attacker:
        mine = creator_acl(zk.auth)  # type: ignore[arg-type]
        planted = zk.get_children(opened[0])
        for path in (*opened, *(f"{opened[0]}/{n}" for n in planted)):
            assert zk.get_acl(path) == mine, path  # below the partition too
        for path in opened:
            with pytest.raises(NoAuthError):
                attacker.create(f"{path}/qn-", b"", sequence=True)
    rc, err = run(capsys, consumer_main, consumer_args(zk_hosts, zk_root, out))
    assert rc == 0, err  # nothing open left: starts without --zk-acl fix


def test_the_partition_nodes_are_read_in_one_bounded_round(zk_hosts, zk_root):
    closed_root_with_partitions(zk_hosts, zk_root)
    layout = Layout.of(zk_root)
    with owner(zk_hosts) as zk:
        zk.create(f"{layout.partitions}/not-a-partition", b"")
        zk.create(f"{layout.partitions}/007", b"")  # not how a partition is named
        started = time.monotonic()
        nodes = guarded_nodes(zk, layout)
        assert time.monotonic() - started < zk.zk_timeout
        parts = partition_nodes(zk, layout.partitions)
        assert partition_nodes(zk, f"{zk_root}/no-such") == []
    assert parts == [layout.partition(p) for p in range(PARTITIONS)]  # by number
    assert nodes[0] == zk_root and nodes[-PARTITIONS:] == parts
    assert layout.partitions in nodes and f"{zk_root}/fetched" in nodes
