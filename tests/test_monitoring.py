"""deploy/monitoring and the logs an operator reads: the alert rules (``promtool check rules``
and ``promtool test rules`` where promtool is installed -- Debian's ``prometheus`` package,
which scripts/run.sh installs for the tests), the dashboard's and the alerts' queries against
the metric names a real consumer and a real exporter serve, and the journald priority prefix
of log lines under systemd."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import wait_for
from tests.httpd import TestServer
from tests.test_consumer_support import Running, offer, records, settings_for
from zkcrawl.admin.exporter import ClusterView, ExporterMetrics
from zkcrawl.admin.localzk import free_port
from zkcrawl.logs import journald_stream

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
RULE_TESTS = MONITORING / "alerts.test.yaml"
DASHBOARD = MONITORING / "dashboard.json"
SCALEDOBJECT = REPO / "deploy" / "kubernetes" / "keda" / "scaledobject.yaml"
# Metric names in a query: ours and the standard collectors' (what the code exports).
OUR_METRIC = re.compile(r"\b(?:zkcrawl|process|python)_[a-z0-9_]+\b")
ALERTS = {"ZkcrawlQueueNotDraining", "ZkcrawlNoLiveConsumers", "ZkcrawlDeadLettersGrowing",
          "ZkcrawlConsumerNotReady", "ZkcrawlZooKeeperSessionLost",
          "ZkcrawlZooKeeperUnreachable", "ZkcrawlPartitionWithoutOwner",
          "ZkcrawlPartitionOwnerUnverified"}


@pytest.fixture(scope="module")
def yaml_mod() -> Any:
    return pytest.importorskip("yaml")


def rule_groups(yaml_mod: Any) -> list[dict[str, Any]]:
    doc = yaml_mod.safe_load(RULES.read_text(encoding="utf-8"))
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    return list(doc["spec"]["groups"])


def test_the_alerts_the_issue_names_exist(yaml_mod):
    alerts = {r["alert"] for g in rule_groups(yaml_mod) for r in g["rules"] if "alert" in r}
    assert alerts >= ALERTS, ALERTS - alerts
    for group in rule_groups(yaml_mod):
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_monitoring_says_ownership_is_always_on():
    """``--politeness`` is accepted for compatibility only (consumer.politeness_replaced):
    nothing in deploy/monitoring tells an operator to set it."""
    for path in sorted(MONITORING.iterdir()):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"politeness[ =`]*owner", text), path.name


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; "
                    "scripts/run.sh test installs it)")
    return tool


def test_promtool_checks_and_unit_tests_every_alert(yaml_mod, tmp_path):
    tool = _promtool()
    (tmp_path / "rules.yaml").write_text(yaml_mod.safe_dump({"groups": rule_groups(yaml_mod)}))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    check = subprocess.run([tool, "check", "rules", "rules.yaml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([tool, "test", "rules", RULE_TESTS.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    # Every alert is exercised, and fires in at least one case (exp_alerts not empty).
    tests = yaml_mod.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])
             if case["exp_alerts"]}
    alerts = {r["alert"] for g in rule_groups(yaml_mod) for r in g["rules"] if "alert" in r}
    assert fired == alerts, alerts ^ fired
    # The KEDA trigger's query is evaluated there too, as written in the ScaledObject.
    exprs = {case["expr"] for t in tests for case in t.get("promql_expr_test", [])}
    assert set(_scaler_exprs(yaml_mod)) <= exprs


def test_promtool_test_rules_fails_on_a_wrong_expectation(yaml_mod, tmp_path):
    """The unit tests can fail: a firing alert expected silent is reported."""
    tool = _promtool()
    (tmp_path / "rules.yaml").write_text(yaml_mod.safe_dump({"groups": rule_groups(yaml_mod)}))
    tests = yaml_mod.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    case = next(c for t in tests["tests"] for c in t["alert_rule_test"] if c["exp_alerts"])
    case["exp_alerts"] = []
    (tmp_path / "t.yaml").write_text(yaml_mod.safe_dump(tests))
    unit = subprocess.run([tool, "test", "rules", "t.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert unit.returncode != 0 and case["alertname"] in unit.stdout + unit.stderr


# ------------------------------------------------- queries against exported names --
def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def _rule_exprs(yaml_mod: Any) -> list[str]:
    return [r["expr"] for g in rule_groups(yaml_mod) for r in g["rules"]]


def _scaler_exprs(yaml_mod: Any) -> list[str]:
    doc = yaml_mod.safe_load(SCALEDOBJECT.read_text(encoding="utf-8"))
    return [t["metadata"]["query"] for t in doc["spec"]["triggers"]]


def names_in(exprs: list[str]) -> set[str]:
    return {m for e in exprs for m in OUR_METRIC.findall(e)}


def exported_names(text: str) -> set[str]:
    """Every sample name (``_total``, ``_bucket``...) and family name of an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def missing(exprs: list[str], exported: set[str]) -> set[str]:
    return names_in(exprs) - exported


@pytest.fixture(scope="module")
def exported(zk_hosts, tmp_path_factory) -> set[str]:
    """The names a real consumer (after a crawl with an ok and a failed item) and a real
    exporter (one read of that cluster) serve."""
    import urllib.request

    from zkcrawl.zk.client import ZkClient

    tmp = tmp_path_factory.mktemp("names")
    root = "/test-monitoring-names"
    out = tmp / "out.jsonl"
    port = free_port()
    page = (200, {"Content-Type": "text/html"}, b"<title>t</title>")
    with TestServer({"/ok": page, "/missing": (404, {"Content-Type": "text/html"}, b"no")}
                    ) as srv, ZkClient(zk_hosts).connect() as zk:
        offer(zk, root, [srv.url("/ok"), srv.url("/missing")])
        # a small cluster-wide gap: the politeness counters are exported too
        run = Running(settings_for(zk_hosts, root, out, "--metrics-port", str(port),
                                   "--domain-delay", "0.01", "--politeness", "cluster"))
        try:
            def scrape() -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as r:
                    return str(r.read().decode())

            wait_for(lambda: len(records(out)) == 2, what="2 records")
            wait_for(lambda: 'reason="http-404"} 1.0' in scrape() and 'reason=""} 1.0'
                     in scrape(), what="both items counted")
            consumer = scrape()
            view = ClusterView(zk, root)
            assert view.read_now("start")
            exporter = ExporterMetrics(view).exposition().decode()
        finally:
            run.stop()
    return exported_names(consumer) | exported_names(exporter)


def test_dashboard_alerts_and_scaler_name_only_exported_metrics(yaml_mod, exported):
    for what, exprs in (("dashboard.json", _dashboard_exprs()),
                        ("prometheusrule.yaml", _rule_exprs(yaml_mod)),
                        ("keda/scaledobject.yaml", _scaler_exprs(yaml_mod))):
        assert names_in(exprs), what
        assert not missing(exprs, exported), f"{what} names metrics nobody exports: " \
                                             f"{sorted(missing(exprs, exported))}"
    # The check bites: a renamed metric is caught.
    assert missing(["rate(zkcrawl_consumer_fetch_seconds_bucket[5m])"], exported) == {
        "zkcrawl_consumer_fetch_seconds_bucket"}


def test_dashboard_covers_what_an_operator_looks_at():
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dash["uid"] == "zkcrawl" and dash["schemaVersion"] >= 36
    exprs = " ".join(_dashboard_exprs())
    for needle in ("zkcrawl_consumer_items_total", "by (outcome", "reason",
                   "zkcrawl_consumer_queue_seconds_bucket", "zkcrawl_consumer_dispatch_seconds",
                   "zkcrawl_consumer_wait_seconds", "zkcrawl_consumer_process_seconds",
                   "zkcrawl_cluster_queue_depth", "zkcrawl_cluster_queue_oldest_age_seconds",
                   "zkcrawl_cluster_leases", "zkcrawl_cluster_dead_letters",
                   "zkcrawl_consumer_handovers_total", "zkcrawl_consumer_rebalances_total",
                   "zkcrawl_partitions_hosts_backed_off", "zkcrawl_partitions_owned",
                   "zkcrawl_partitions_unowned_with_items", "zkcrawl_partition_items",
                   "zkcrawl_partitions_unverified_with_items", "zkcrawl_partition_owner{",
                   "zkcrawl_partition_oldest_batch_age_seconds"):
        assert needle in exprs, needle
    # Per partition (issue #22): its owner, items and oldest batch side by side in a table.
    (owners,) = [p for p in dash["panels"] if p["type"] == "table"
                 and any("zkcrawl_partition_owner{" in t["expr"] for t in p["targets"])]
    assert {t["format"] for t in owners["targets"]} == {"table"}
    assert owners["transformations"][0]["id"] == "merge"
    assert "--politeness" not in json.dumps(dash)  # ownership is always on
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    assert any(r.get("repeat") == "pod" for r in rows), "per-consumer rows"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p[
            "gridPos"]["w"] <= 24
    boxes = [(p["id"], p["gridPos"]) for p in dash["panels"]]
    for i, (a, g) in enumerate(boxes):  # no panel covers another
        for b, h in boxes[i + 1:]:
            assert not (g["x"] < h["x"] + h["w"] and h["x"] < g["x"] + g["w"]
                        and g["y"] < h["y"] + h["h"] and h["y"] < g["y"] + g["h"]), (a, b)


def test_podmonitor_scrapes_consumers_and_exporter(yaml_mod):
    pm = yaml_mod.safe_load((MONITORING / "podmonitor.yaml").read_text(encoding="utf-8"))
    assert pm["kind"] == "PodMonitor"
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/part-of": "zkcrawl"}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"


# ------------------------------------------------------------------ journald --
_LOGGING = """
import logging, sys
from zkcrawl import logs
logs.configure(sys.argv[1], "debug")
log = logs.get_logger("t")
log.debug("a.debug"); log.info("a.info"); log.warning("a.warning"); log.error("a.error")
logging.getLogger("kazoo.client").warning("from the standard library")
logs.flush()
"""


def _log_lines(tmp_path: Path, fmt: str, journal: str | None) -> list[str]:
    err = tmp_path / f"err-{fmt}-{journal is not None}"
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    env["PYTHONPATH"] = str(REPO)
    with open(err, "wb") as fh:
        st = os.fstat(fh.fileno())
        if journal is not None:
            env["JOURNAL_STREAM"] = journal or f"{st.st_dev}:{st.st_ino}"
        subprocess.run([sys.executable, "-c", _LOGGING, fmt], stdout=subprocess.DEVNULL,
                       stderr=fh, env=env, timeout=60, check=True)
    return err.read_text(encoding="utf-8").splitlines()


def test_log_lines_carry_the_journald_priority_under_systemd(tmp_path):
    """JOURNAL_STREAM naming our stderr: ``<N>`` prefixes (journald's SyslogLevelPrefix), so
    ``journalctl -p warning`` finds the warnings; the rest of the line is the JSON."""
    lines = _log_lines(tmp_path, "json", "")
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<4>"], lines
    events = [json.loads(line[3:]) for line in lines]
    assert [e["level"] for e in events] == ["debug", "info", "warning", "error", "warning"]
    console = _log_lines(tmp_path, "console", "")
    assert [line[:3] for line in console] == ["<7>", "<6>", "<4>", "<3>", "<4>"], console
    assert "\x1b[" not in "".join(console)


@pytest.mark.parametrize("journal", [None, "1:2", "garbage"])
def test_no_priority_prefix_elsewhere(tmp_path, journal):
    """No JOURNAL_STREAM, or one inherited that names another file: plain JSON lines."""
    lines = _log_lines(tmp_path, "json", journal)
    assert len(lines) == 5 and all(json.loads(line) for line in lines)


@given(st.text(max_size=60))
def test_any_journal_stream_value_is_decoded_without_error(value):
    """JOURNAL_STREAM comes from the environment: whatever it holds, the answer is a bool,
    True only for the exact DEVICE:INODE of the stream."""
    import io
    import tempfile

    with tempfile.TemporaryFile("w") as fh:
        st_ = os.fstat(fh.fileno())
        exact = f"{st_.st_dev}:{st_.st_ino}"
        same = re.fullmatch(r"[0-9]+:[0-9]+", value) is not None and tuple(
            map(int, value.split(":"))) == (st_.st_dev, st_.st_ino)
        assert journald_stream(fh, {"JOURNAL_STREAM": value}) is same
        assert journald_stream(fh, {"JOURNAL_STREAM": "0" + exact}) is True  # same numbers
        assert journald_stream(fh, {"JOURNAL_STREAM": exact}) is True
    assert journald_stream(io.StringIO(), {"JOURNAL_STREAM": value}) is False
