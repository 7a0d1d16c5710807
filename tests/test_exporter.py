"""``zkcrawl exporter`` as a real process against the real test ZooKeeper, while a crawl runs:
its figures match ``zkcrawl status --json``; it re-reads on watches, not by polling; hostile
status nodes cannot break or blow up the scrape."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for
from tests.httpd import TestServer
from tests.test_consumer_support import Running, offer, records, settings_for
from zkcrawl.admin.exporter import MAX_CONSUMER_SERIES, cluster_families
from zkcrawl.admin.localzk import free_port
from zkcrawl.cli import main
from zkcrawl.errors import ExitStatus
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS, assign, partition_of
from zkcrawl.queue.registry import Registration
from zkcrawl.web.urls import host_key

ROOT = Path(__file__).resolve().parents[1]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of the exporter's /metrics as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def status_json(capsys: pytest.CaptureFixture[str], hosts: str, root: str) -> dict[str, Any]:
    capsys.readouterr()
    rc = main(["status", "--json", "--zk", hosts, "--root", root, "--zk-timeout", "5",
               "--log-format", "json"], {})
    out, err = capsys.readouterr()
    assert rc == 0, err
    return dict(json.loads(out))


def figures_of_status(doc: dict[str, Any]) -> dict[str, Any]:
    return {"depth": doc["queue"]["depth"], "claimable": doc["queue"]["claimable"],
            "leases": dict(doc["leases"]["by_consumer"]), "dead": doc["dead"]["count"],
            "consumers": len(doc["consumers"]), "producers": len(doc["producers"]),
            "paused": doc["control"] == "paused"}


def figures_of_exporter(m: Samples, root: str) -> dict[str, Any]:
    r = (("root", root),)

    def one(name: str) -> float:
        return m[(name, r)]

    return {"depth": one("zkcrawl_cluster_queue_depth"),
            "claimable": one("zkcrawl_cluster_queue_claimable"),
            "leases": {dict(labels)["consumer"]: v for (name, labels), v in m.items()
                       if name == "zkcrawl_cluster_leases"},
            "dead": one("zkcrawl_cluster_dead_letters"),
            "consumers": one("zkcrawl_cluster_consumers"),
            "producers": one("zkcrawl_cluster_producers"),
            "paused": one("zkcrawl_cluster_paused") == 1}


class Exporter:
    """``python -m zkcrawl.cli exporter`` as a real process."""

    def __init__(self, hosts: str, root: str, tmp: Path, *extra: str) -> None:
        self.port = free_port()
        self.stderr = tmp / "exporter.err"
        argv = [sys.executable, "-m", "zkcrawl.cli", "exporter", "--zk", hosts, "--root", root,
                "--metrics-port", str(self.port), "--log-format", "json", *extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        self.started = time.monotonic()

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz",
                                        timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise


def split_hosts(port: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two consumer ids and two host names of 127.0.0.1:``port``, the first host owned by
    the first id and the second by the second when both run (SPEC §3: a host's owner)."""
    hosts = (f"127.0.0.1:{port}", f"localhost:{port}")
    parts = [partition_of(host_key(f"http://{h}/"), DEFAULT_PARTITIONS) for h in hosts]
    for n in range(2, 100):
        ids = ("c1", f"c{n}")
        owned = assign(DEFAULT_PARTITIONS, ids)
        if parts[0] in owned[ids[0]] and parts[1] in owned[ids[1]]:
            return ids, hosts
        if parts[1] in owned[ids[0]] and parts[0] in owned[ids[1]]:
            return ids, (hosts[1], hosts[0])
    raise AssertionError("no pair of ids splits the two hosts")  # 1 in 2**98


def test_exporter_figures_match_status_json_while_a_crawl_runs(zk, zk_hosts, zk_root,
                                                                tmp_path, capsys):
    gate = threading.Event()

    def held(h):  # type: ignore[no-untyped-def]
        gate.wait(30)  # bounded: released by the test, or the fetch times out
        return 200, {"Content-Type": "text/html"}, f"<title>T{h.path}</title>".encode()

    outs = [tmp_path / "c1.jsonl", tmp_path / "c2.jsonl"]
    with TestServer({"/a/*": held}) as srv:
        # Hosts have owners: two names of the server, and two consumer ids that own one
        # each (rendezvous over the ids), so that both consumers hold items.
        ids, hosts = split_hosts(srv.url("/").split("/")[2].rsplit(":", 1)[1])
        urls = [f"http://{hosts[i % 2]}/a/{i}" for i in range(12)]
        zk.ensure_path(f"{zk_root}/queue")
        zk.create(f"{zk_root}/queue/qn-", b"\x00not an item", sequence=True)  # -> dead
        offer(zk, zk_root, urls)
        # Status nodes anyone could write (SPEC §2): not UTF-8, and an id and state made to
        # break an exposition (newlines, quotes, a label-sized flood, ANSI).
        zk.ensure_path(f"{zk_root}/consumers")
        zk.create(f"{zk_root}/consumers/garbage", b"\xff\xfe{", ephemeral=True)
        zk.create(f"{zk_root}/consumers/evil", json.dumps(
            {"id": 'x"}\n# TYPE x counter\nx 1\x1b[2J' + "y" * 5000,
             "state": "run\nning", "items_per_s": 1e300, "heartbeat_at": "soon"}).encode(),
            ephemeral=True)
        producer = Registration(zk, f"{zk_root}/producers/p1",
                                lambda: {"id": "p1", "state": "offering"}, interval=5).start()
        runs = [Running(settings_for(zk_hosts, zk_root, out, "--threads", "2", "--backlog",
                                     "1", "--id", ids[i]))
                for i, out in enumerate(outs)]
        exporter = Exporter(zk_hosts, zk_root, tmp_path, "--min-interval", "0.2",
                            "--refresh", "2")
        try:
            wait_for(exporter.ready, timeout=30, what="the exporter ready")
            srv.wait_for_requests(4, timeout=20)  # both consumers hold items in flight

            def matches() -> bool:
                before = figures_of_status(status_json(capsys, zk_hosts, zk_root))
                mine = figures_of_exporter(scrape(exporter.port), zk_root)
                after = figures_of_status(status_json(capsys, zk_hosts, zk_root))
                return before == after == mine  # a steady state, read alike by both

            def held_published() -> bool:  # each owner's status node says it holds 3
                doc = status_json(capsys, zk_hosts, zk_root)
                return dict(doc["leases"]["by_consumer"]) == {ids[0]: 3, ids[1]: 3}

            wait_for(held_published, timeout=30, what="both owners publishing what they hold")
            wait_for(matches, timeout=30, what="exporter figures == status --json")
            doc = status_json(capsys, zk_hosts, zk_root)
            m = scrape(exporter.port)
            got = figures_of_exporter(m, zk_root)
            with capsys.disabled():  # side by side, for the record (pytest -s)
                print("\nstatus --json:", figures_of_status(doc), "\nexporter:     ", got)
            assert got["dead"] == 1 and got["consumers"] == 4
            evil = [labels for (name, labels) in m
                    if name == "zkcrawl_cluster_consumer_heartbeat_age_seconds"
                    and dict(labels)["consumer"].startswith('x"}')]
            assert len(evil) == 1 and len(dict(evil[0])["consumer"]) <= 128
            assert got["producers"] == 1
            # 12 queued in the partitions' batches, 3 held by each owner (2 threads, a
            # backlog of 1), as the consumers' status nodes say.
            assert got["depth"] == 12 and got["leases"] == {ids[0]: 3, ids[1]: 3}
            assert got["claimable"] == 6 and not got["paused"]
            age = m[("zkcrawl_cluster_queue_oldest_age_seconds", (("root", zk_root),))]
            assert abs(age - doc["queue"]["oldest_age_s"]) <= 2 + 1  # --refresh + margin
            assert m[("zkcrawl_build_info", (("component", "exporter"),
                                             ("python", sys.version.split()[0]),
                                             ("version", build_version())))] == 1
            assert any(name == "process_cpu_seconds_total" for name, _ in m)

            # A pause reaches the exporter through its watch on the control node.
            assert main(["pause", "--zk", zk_hosts, "--root", zk_root], {}) == ExitStatus.OK
            wait_for(lambda: figures_of_exporter(scrape(exporter.port), zk_root)["paused"],
                     what="paused in the exporter")
            pending = ("zkcrawl_cluster_control_pending", (("root", zk_root),))
            # The two real consumers acknowledge; the two forged status nodes never do.
            wait_for(lambda: scrape(exporter.port)[pending] == 2, what="2 pending")
            assert main(["resume", "--zk", zk_hosts, "--root", zk_root], {}) == ExitStatus.OK
            gate.set()
            # The malformed ingress node is a dead letter at the move (no record: the mover
            # has no sink; counted in ``dead`` above).
            wait_for(lambda: len(records(*outs)) == 12, timeout=60, what="12 records")
            wait_for(lambda: figures_of_exporter(scrape(exporter.port), zk_root)["depth"] == 0,
                     what="an empty queue in the exporter")
            wait_for(matches, timeout=30, what="exporter figures == status --json, drained")
        finally:
            gate.set()
            for run in runs:
                run.stop()
            producer.stop(delete=True)
            rc = exporter.stop()
        elapsed = time.monotonic() - exporter.started
        m_reads = [line for line in exporter.stderr.read_text().splitlines()
                   if '"exporter.stopped"' in line]
    assert rc == 0
    err = exporter.stderr.read_text()
    assert "Traceback" not in err
    (stopped,) = m_reads
    reads = json.loads(stopped)["reads"]
    # Watches, not a polling storm: at most one read per --min-interval (0.2 s), however
    # often the crawl fired them; and some did fire (the pause, the completions).
    assert 2 <= reads <= elapsed / 0.2 + 2, (reads, elapsed)


def test_exporter_rides_out_a_zookeeper_outage(tmp_path):
    """ZooKeeper stops: the exporter keeps serving the last figures with
    zkcrawl_cluster_up 0 and /readyz 503, stays alive (/livez 200), and reads again when
    the server is back."""
    from zkcrawl.admin.localzk import ZkServer
    from zkcrawl.zk.client import ZkClient

    servers = [ZkServer(tmp_path / "zk").start(wait=60)]
    hosts, root = servers[0].hosts, "/outage"
    exporter = Exporter(hosts, root, tmp_path, "--min-interval", "0.2", "--refresh", "1",
                        "--zk-timeout", "5", "--session-timeout", "30")
    up = ("zkcrawl_cluster_up", (("root", root),))
    depth = ("zkcrawl_cluster_queue_depth", (("root", root),))
    try:
        wait_for(exporter.ready, timeout=30, what="the exporter ready")
        with ZkClient(hosts).connect() as zk:
            offer(zk, root, ["http://a.example/1", "http://a.example/2"])
        wait_for(lambda: scrape(exporter.port).get(depth) == 2, timeout=30, what="depth 2")
        servers[0].stop()
        wait_for(lambda: scrape(exporter.port)[up] == 0, timeout=30, what="up 0")
        m = scrape(exporter.port)
        assert m[depth] == 2  # the last figures, marked stale
        assert m[("zkcrawl_exporter_read_errors_total", (("root", root),))] >= 1
        assert get_status(exporter.port, "/readyz") == 503
        assert get_status(exporter.port, "/livez") == 200
        servers.append(ZkServer(tmp_path / "zk", port=servers[0].port).start(wait=60))
        wait_for(lambda: scrape(exporter.port)[up] == 1, timeout=60, what="up again")
        wait_for(exporter.ready, timeout=30, what="ready again")
    finally:
        rc = exporter.stop()
        servers[-1].stop()
    assert rc == 0 and "Traceback" not in exporter.stderr.read_text()


def get_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def build_version() -> str:
    from zkcrawl.settings import version
    return version()


def test_exporter_bad_usage_and_unreachable_zookeeper(zk_hosts, capsys):
    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        rc = main(["exporter", *argv], {})
        return int(rc), capsys.readouterr().err

    rc, err = run("--zk", zk_hosts, "--min-interval", "5", "--refresh", "1")
    assert rc == ExitStatus.USAGE and err.count("\n") == 1 and "--refresh" in err
    with socket_taken() as port:
        rc, err = run("--zk", zk_hosts, "--metrics-port", str(port))
        assert rc == ExitStatus.USAGE and err.count("\n") == 1 and "cannot listen" in err
    rc, err = run("--zk", f"127.0.0.1:{free_port()}", "--zk-timeout", "1",
                  "--metrics-port", str(free_port()))
    assert rc == 75 and err.count("\n") == 1 and "Traceback" not in err


class socket_taken:
    """A port something already listens on."""

    def __enter__(self) -> int:
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# ------------------------------------------------------------------ hostile input --
_text = st.text(st.characters(codec="utf-8"), max_size=600)
_consumer = st.fixed_dictionaries({
    "id": _text, "state": _text,
    "heartbeat_age_s": st.one_of(st.floats(allow_nan=True), st.integers(), st.none(), _text),
    "items_per_s": st.one_of(st.floats(allow_nan=True), st.integers(-10**20, 10**20),
                             st.none(), st.booleans()),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(consumers=st.lists(_consumer, max_size=20),
       leases=st.dictionaries(_text, st.integers(0, 10**6), max_size=20),
       control=st.sampled_from(["running", "paused"]))
def test_any_status_document_makes_a_parsable_bounded_scrape(consumers, leases, control):
    """Whatever consumers published (ids and states are untrusted text), the exposition
    parses, and every label is printable and bounded."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    doc = {"queue": {"depth": 3, "claimable": 1, "oldest_age_s": None},
           "leases": {"count": sum(leases.values()), "by_consumer": leases},
           "dead": {"count": 0}, "consumers": consumers, "producers": [], "control": control,
           "control_pending": []}

    class One(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return cluster_families(doc, "/zkcrawl")

    reg = CollectorRegistry()
    reg.register(One())
    text = generate_latest(reg).decode()
    families = list(text_string_to_metric_families(text))
    leased = [s for f in families for s in f.samples if s.name == "zkcrawl_cluster_leases"]
    assert sum(s.value for s in leased) == sum(leases.values())
    for f in families:
        for s in f.samples:
            for value in s.labels.values():
                assert len(value) <= 128 and value.isprintable(), value


def test_per_consumer_series_are_capped():
    leases = {f"c{i}": 1 for i in range(MAX_CONSUMER_SERIES + 50)}
    doc = {"queue": {"depth": 0, "claimable": 0, "oldest_age_s": 0.0},
           "leases": {"count": len(leases), "by_consumer": leases}, "dead": {"count": 0},
           "consumers": [], "producers": [], "control": "running", "control_pending": []}
    (fam,) = [f for f in cluster_families(doc, "/r") if f.name == "zkcrawl_cluster_leases"]
    assert len(fam.samples) == MAX_CONSUMER_SERIES + 1
    assert {s.labels["consumer"]: s.value for s in fam.samples}["_other"] == 50


def _partition_figures(m: Samples, root: str) -> dict[str, Any]:
    r = (("root", root),)
    per = {name: {dict(labels)["partition"]: v for (n, labels), v in m.items()
                  if n == name and dict(labels).get("root") == root}
           for name in ("zkcrawl_partition_batches", "zkcrawl_partition_items")}
    return {"count": m.get(("zkcrawl_partitions", r)),
            "owned": m.get(("zkcrawl_partitions_owned", r)),
            "unowned_with_items": m.get(("zkcrawl_partitions_unowned_with_items", r)),
            "unverified": m.get(("zkcrawl_partitions_owner_unverified", r)),
            "batches": per["zkcrawl_partition_batches"],
            "items": per["zkcrawl_partition_items"]}


def _partition_figures_of_status(doc: dict[str, Any]) -> dict[str, Any]:
    s = doc["partitions"]
    full = [x for x in s["list"] if x["batches"]]
    return {"count": s["count"], "owned": s["owned"],
            "unowned_with_items": s["unowned_with_items"], "unverified": len(s["unverified"]),
            "batches": {str(x["partition"]): x["batches"] for x in full},
            "items": {str(x["partition"]): x["depth"] for x in full}}


def test_exporter_partition_gauges_follow_owners_and_batches(zk_factory, zk_hosts, zk_root,
                                                             tmp_path, capsys):
    """The partitions (hosts have owners) as gauges, equal to status --json: an owner leaving a
    partition that holds items shows as unowned within --refresh; only partitions holding
    batches have series; a garbage batch is counted, not a failed read."""
    from zkcrawl.queue.items import Item
    from zkcrawl.queue.layout import Layout
    from zkcrawl.queue.partition_queue import PartitionQueue

    zk, holder = zk_factory(), zk_factory()
    zk.ensure_path(zk_root)
    zk.set(zk_root, b'{"partitions": 64}')
    pq = PartitionQueue(holder, zk_root, 64, consumer="c1")
    pq.offer([Item(url=f"http://h{i}.example/") for i in range(12)])
    layout = Layout.of(zk_root)
    full = sorted(int(p) for p in zk.get_children(layout.partitions))
    garbage = min(set(range(64)) - set(full))  # a partition that holds a garbage batch only
    zk.create(f"{layout.partition(garbage)}/qn-", b"garbage", sequence=True, makepath=True)
    full = sorted([*full, garbage])
    owned = [pq.take(p) for p in full[:2]]
    assert all(owned)
    exporter = Exporter(zk_hosts, zk_root, tmp_path, "--min-interval", "0.2", "--refresh", "1")
    try:
        wait_for(exporter.ready, timeout=30, what="the exporter ready")

        def matches() -> bool:
            want = _partition_figures_of_status(status_json(capsys, zk_hosts, zk_root))
            return _partition_figures(scrape(exporter.port), zk_root) == want

        wait_for(matches, timeout=20, what="exporter partition figures == status --json")
        got = _partition_figures(scrape(exporter.port), zk_root)
        assert got["count"] == 64 and got["owned"] == 2 and got["unverified"] == 2
        assert got["unowned_with_items"] == len(full) - 2
        assert sum(got["items"].values()) == 12 and got["items"][str(garbage)] == 0
        assert set(got["batches"]) == {str(p) for p in full}  # no idle series
        age = scrape(exporter.port)[("zkcrawl_partition_oldest_age_seconds",
                                     (("root", zk_root),))]
        assert age >= 0
        assert pq.release(owned[0])  # an owner lets go of a partition that holds items
        wait_for(lambda: _partition_figures(scrape(exporter.port), zk_root)[
            "unowned_with_items"] == len(full) - 1, timeout=10, what="one more unowned")
        for p in full:  # the partitions emptied: their series go
            for child in zk.get_children(layout.partition(p)):
                if child.startswith("qn-"):
                    zk.delete(f"{layout.partition(p)}/{child}")
        wait_for(lambda: not _partition_figures(scrape(exporter.port), zk_root)["batches"],
                 timeout=10, what="no per-partition series")
        assert _partition_figures(scrape(exporter.port), zk_root)["unowned_with_items"] == 0
    finally:
        rc = exporter.stop()
    assert rc == 0 and "Traceback" not in exporter.stderr.read_text()


def test_exporter_reads_partitions_once_per_refresh_not_per_watch(zk, zk_root):
    """A watch-triggered read keeps the last partitions section (a busy ingress fires watches
    every second; listing every partition each time would load ZooKeeper); the refresh
    reads it again."""
    from zkcrawl.admin.exporter import ClusterView

    zk.create(f"{zk_root}/partitions/3/qn-", b'{"v":1,"items":["http://a.example/"]}',
              sequence=True, makepath=True)
    view = ClusterView(zk, zk_root, refresh=3600)
    assert view.read_now("start")
    assert view.snapshot()[0]["partitions"]["batches"] == 1
    zk.create(f"{zk_root}/partitions/3/qn-", b'{"v":1,"items":["http://b.example/"]}',
              sequence=True)
    assert view.read_now("watch")
    assert view.snapshot()[0]["partitions"]["batches"] == 1  # not re-read on a watch
    assert view.read_now("refresh")
    assert view.snapshot()[0]["partitions"]["items"] == 2


def test_partition_host_gauges_only_for_partitions_that_have_some():
    """The owners' host figures as gauges: the sums, and a per-partition series only where a
    partition has active or backed-off hosts (no P idle series; null figures: none)."""
    from zkcrawl.admin.exporter import partition_families

    row = {"batches": 0, "depth": None}
    section = {"count": 4, "owned": 3, "unverified": [], "unowned_with_items": 0,
               "oldest_age_s": None, "hosts_active": 5, "hosts_backed_off": 2,
               "list": [{**row, "partition": 0, "hosts_active": 5, "hosts_backed_off": 2},
                        {**row, "partition": 1, "hosts_active": 0, "hosts_backed_off": 0},
                        {**row, "partition": 2, "hosts_active": None,
                         "hosts_backed_off": None}]}
    fams = {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in partition_families(section, "/r")}
    assert fams["zkcrawl_partitions_hosts_active"] == {(("root", "/r"),): 5.0}
    assert fams["zkcrawl_partitions_hosts_backed_off"] == {(("root", "/r"),): 2.0}
    assert fams["zkcrawl_partition_hosts_active"] == {
        (("partition", "0"), ("root", "/r")): 5.0}
    assert fams["zkcrawl_partition_hosts_backed_off"] == {
        (("partition", "0"), ("root", "/r")): 2.0}
    empty = {f.name: f.samples for f in partition_families(None, "/r")}
    assert empty["zkcrawl_partitions_hosts_active"] == []  # the family, no sample


def _owners_of_exporter(m: Samples, root: str) -> dict[str, tuple[str, str]]:
    """{partition: (owner label, verified label)} of zkcrawl_partition_owner."""
    out = {}
    for (name, labels), v in m.items():
        d = dict(labels)
        if name == "zkcrawl_partition_owner" and d["root"] == root:
            assert v == 1 and d["partition"] not in out
            out[d["partition"]] = (d["owner"], d["verified"])
    return out


def test_exporter_partition_owners_and_ages_with_forged_owner_nodes(zk_factory, zk_hosts,
                                                                     zk_root, tmp_path,
                                                                     capsys):
    """Per partition that holds items: its owner (an info-style series) and its oldest
    batch's age, equal to status --json. Forged owner nodes -- a persistent one whose id is
    made to break an exposition, an ephemeral one of a session that is no consumer, one too
    big to read -- are ``verified="false"``, their ids cleaned and cut, and counted in
    zkcrawl_partitions_unverified_with_items (the ZkcrawlPartitionOwnerUnverified alert);
    partitions without items have no series, a forged owner there included."""
    from tests.test_status_partitions import _urls_in
    from zkcrawl.admin.exporter import LABEL_LIMIT, label
    from zkcrawl.queue.items import Item
    from zkcrawl.queue.layout import Layout
    from zkcrawl.queue.partition_queue import OWNER_LIMIT, PartitionQueue

    holder, forger = zk_factory(), zk_factory()
    holder.ensure_path(zk_root)
    holder.set(zk_root, b'{"partitions": 8}')
    layout = Layout.of(zk_root)
    pq = PartitionQueue(holder, zk_root, 8, consumer="c1")
    for p in (0, 1, 2, 3, 5):
        pq.offer([Item(url=u) for u in _urls_in(pq, p, 2)])
    # c1 is a live consumer (its status node, the owner's session): partition 0 verified.
    status = Registration(holder, f"{zk_root}/consumers/c1",
                          lambda: {"id": "c1", "state": "running"}, interval=5).start()
    assert pq.take(0) is not None
    evil = 'x"}\n# TYPE x counter\nx 1\x1b[2J\u202e\x00' + "y" * 600  # fits OWNER_LIMIT
    holder.create(layout.partition_owner(1), json.dumps({"consumer": evil}).encode())
    forger.create(layout.partition_owner(2), b'{"consumer": "c1", "epoch": 7}', ephemeral=True)
    # partition 3: items, no owner node
    forger.create(layout.partition_owner(4), b'{"consumer": "c9"}', makepath=True)  # empty
    holder.create(layout.partition_owner(5), b'{"consumer": "' + b"z" * OWNER_LIMIT + b'"}')
    exporter = Exporter(zk_hosts, zk_root, tmp_path, "--min-interval", "0.2", "--refresh", "1")
    r = (("root", zk_root),)
    try:
        wait_for(exporter.ready, timeout=30, what="the exporter ready")
        cleaned = label(evil)
        want = {"0": ("c1", "true"), "1": (cleaned, "false"), "2": ("c1", "false"),
                "3": ("", "false"), "5": ("?", "false")}
        wait_for(lambda: _owners_of_exporter(scrape(exporter.port), zk_root) == want,
                 timeout=20, what="the owners of the 5 partitions holding items")
        m = scrape(exporter.port)
        assert len(cleaned) == LABEL_LIMIT and cleaned.isprintable()
        assert cleaned.startswith('x"}') and "\n" not in cleaned and "\x1b" not in cleaned
        assert m[("zkcrawl_partitions_unverified_with_items", r)] == 3  # 1, 2, 5
        assert m[("zkcrawl_partitions_unowned_with_items", r)] == 1  # 3
        assert m[("zkcrawl_partitions_owner_unverified", r)] == 4  # 4 too: holds nothing
        ages = {dict(labels)["partition"]: v for (name, labels), v in m.items()
                if name == "zkcrawl_partition_oldest_batch_age_seconds"
                and dict(labels)["root"] == zk_root}
        assert set(ages) == set(want) and all(a >= 0 for a in ages.values())
        assert max(ages.values()) == m[("zkcrawl_partition_oldest_age_seconds", r)]

        def as_status() -> dict[str, Any]:
            doc = status_json(capsys, zk_hosts, zk_root)["partitions"]
            return {str(x["partition"]): ("" if x["owner"] is None else label(x["owner"]),
                                          "true" if x["verified"] else "false")
                    for x in doc["list"] if x["batches"]}

        assert as_status() == want  # status --json says the same, cleaned alike
        # The fix the alert asks for: delete the forged node; the partition is then unowned
        # (here: no consumer runs to take it) and no longer counted as unverified.
        holder.delete(layout.partition_owner(1))
        wait_for(lambda: scrape(exporter.port)[("zkcrawl_partitions_unverified_with_items",
                                                r)] == 2, timeout=10, what="2 unverified")
        assert _owners_of_exporter(scrape(exporter.port), zk_root)["1"] == ("", "false")
    finally:
        rc = exporter.stop()
        status.stop(delete=True)
    assert rc == 0 and "Traceback" not in exporter.stderr.read_text()


@settings(max_examples=60, deadline=None)
@given(owners=st.lists(st.one_of(st.none(), _text), min_size=1, max_size=20),
       verified=st.lists(st.booleans(), min_size=20, max_size=20))
def test_any_owner_id_makes_a_parsable_bounded_scrape(owners, verified):
    """Whatever owner nodes name (untrusted text), the partition families parse, with one
    owner series per partition holding batches, every label printable and bounded."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    from zkcrawl.admin.exporter import partition_families

    rows = [{"partition": p, "owner": o, "verified": None if o is None else verified[p],
             "batches": p % 3, "depth": p, "oldest_age_s": float(p), "hosts_active": None,
             "hosts_backed_off": None} for p, o in enumerate(owners)]
    section = {"count": 20, "owned": 0, "unverified": [], "unowned_with_items": 0,
               "oldest_age_s": None, "list": rows}

    class One(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return partition_families(section, "/zkcrawl")

    reg = CollectorRegistry()
    reg.register(One())
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(reg).decode())}
    full = [x for x in rows if x["batches"]]
    owner = families["zkcrawl_partition_owner"].samples
    assert sorted(int(s.labels["partition"]) for s in owner) == [x["partition"] for x in full]
    assert families["zkcrawl_partitions_unverified_with_items"].samples[0].value == sum(
        1 for x in full if x["owner"] is not None and not x["verified"])
    for f in families.values():
        for s in f.samples:
            for value in s.labels.values():
                assert len(value) <= 128 and value.isprintable(), value
