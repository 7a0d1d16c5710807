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
from zkcrawl.politeness.cluster import ClusterPoliteness
from zkcrawl.queue.registry import Registration

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
            "paused": doc["control"] == "paused", "held_back": doc["hosts"]["held_back"],
            "tracked": doc["hosts"]["tracked"]}


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
            "paused": one("zkcrawl_cluster_paused") == 1,
            "held_back": one("zkcrawl_cluster_hosts_held_back"),
            "tracked": one("zkcrawl_cluster_hosts_tracked")}


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


def test_exporter_figures_match_status_json_while_a_crawl_runs(zk, zk_hosts, zk_root,
                                                                tmp_path, capsys):
    gate = threading.Event()

    def held(h):  # type: ignore[no-untyped-def]
        gate.wait(30)  # bounded: released by the test, or the fetch times out
        return 200, {"Content-Type": "text/html"}, f"<title>T{h.path}</title>".encode()

    outs = [tmp_path / "c1.jsonl", tmp_path / "c2.jsonl"]
    with TestServer({"/a/*": held}) as srv:
        urls = [srv.url(f"/a/{i}") for i in range(12)]
        zk.ensure_path(f"{zk_root}/queue")
        zk.create(f"{zk_root}/queue/qn-", b"\x00not an item", sequence=True)  # -> dead
        offer(zk, zk_root, urls)
        # A host held back for two minutes (what a Retry-After: 120 leaves behind).
        ClusterPoliteness(zk, zk_root, 0.01).back_off("busy.example:80", 120)
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
                                     "1", "--id", f"c{i}"))
                for i, out in enumerate(outs, 1)]
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

            wait_for(matches, timeout=30, what="exporter figures == status --json")
            doc = status_json(capsys, zk_hosts, zk_root)
            m = scrape(exporter.port)
            got = figures_of_exporter(m, zk_root)
            with capsys.disabled():  # side by side, for the record (pytest -s)
                print("\nstatus --json:", figures_of_status(doc), "\nexporter:     ", got)
            assert got["dead"] == 1 and got["consumers"] == 4 and got["held_back"] == 1
            evil = [labels for (name, labels) in m
                    if name == "zkcrawl_cluster_consumer_heartbeat_age_seconds"
                    and dict(labels)["consumer"].startswith('x"}')]
            assert len(evil) == 1 and len(dict(evil[0])["consumer"]) <= 128
            assert got["producers"] == 1
            assert got["depth"] == 12 and got["leases"] == {"c1": 3, "c2": 3}
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
            wait_for(lambda: len(records(*outs)) == 13, timeout=60,
                     what="12 records and the dead letter's")
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
           "control_pending": [], "hosts": {"tracked": 0, "held_back": 0}}

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
           "consumers": [], "producers": [], "control": "running", "control_pending": [],
           "hosts": {"tracked": 0, "held_back": 0}}
    (fam,) = [f for f in cluster_families(doc, "/r") if f.name == "zkcrawl_cluster_leases"]
    assert len(fam.samples) == MAX_CONSUMER_SERIES + 1
    assert {s.labels["consumer"]: s.value for s in fam.samples}["_other"] == 50
