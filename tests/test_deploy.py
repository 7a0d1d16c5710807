"""Static checks of the deployment files under deploy/ (systemd, Kubernetes, container).

Fast and offline: the files are parsed and their key properties asserted against the
SPEC's stable surface (commands, flags, exit codes, SIGTERM grace, /healthz) and the
network exposure (NetworkPolicy, IPAddressDeny=, the SSRF guard left on).  External
tools are used when present and skipped otherwise: ``systemd-analyze verify`` and
``systemd-analyze security --offline`` for the units, ``kubectl kustomize`` to render the
Kubernetes base and the overlays.  PyYAML is needed for the Kubernetes checks, and
kubernetes-validate (the test extra) for the strict schema validation of every manifest
and of each rendered overlay (skipped without them).
"""

from __future__ import annotations

import configparser
import ipaddress
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from zkcrawl.settings import command_prefix

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
SYSTEMD = DEPLOY / "systemd"
K8S_ROOT = DEPLOY / "kubernetes"
K8S = K8S_ROOT / "base"
ZOOKEEPER = K8S_ROOT / "zookeeper"
OVERLAYS = K8S_ROOT / "overlays"
KUBERNETES_VERSION = "1.27"  # the oldest the README supports; also checked: the newest
CONTAINERFILE = DEPLOY / "container" / "Containerfile"

# --- the SPEC's stable surface (SPEC §4) ---------------------------------------------
# Flags every command takes.
COMMON_FLAGS = frozenset({"zk", "root", "config", "log-format", "log-level", "zk-timeout"})
CONSUMER_FLAGS = frozenset({
    "id", "threads", "backlog", "out", "field", "timeout", "max-attempts", "domain-delay",
    "robots", "no-robots", "user-agent", "max-bytes", "delivery", "exit-when-idle",
    "metrics-port", "metrics-host", "allow-private-addresses", "grace",
})
# Ours, beyond the SPEC (documented in the README): allowed in the examples.
CONSUMER_EXTRA_FLAGS = frozenset({"politeness"})
PRODUCER_FLAGS = frozenset({
    "start", "pages", "page-range", "links", "links-css", "next", "max-pages", "allow",
    "deny", "same-host", "from-file", "seen", "max-depth", "batch", "delay", "robots",
    "no-robots",
})
# The producer's sources that keep a crawl current (SPEC §4): sitemaps, --watch.
PRODUCER_WATCH_FLAGS = frozenset({"sitemap", "sitemaps-from-robots", "since", "watch",
                                  "watch-depth"})
# ...and re-crawls of what was offered before (SPEC §4): the store goes next to --seen.
PRODUCER_RECRAWL_FLAGS = frozenset({"recrawl", "recrawl-min", "recrawl-max"})
DEFAULT_GRACE = 30  # --grace default, seconds
DEFAULT_ZK_TIMEOUT = 10  # --zk-timeout default, seconds
# A stop may take --grace, plus --zk-timeout while ZooKeeper is unreachable (SPEC §4), plus
# this for closing the session: TimeoutStopSec / terminationGracePeriodSeconds >= the sum.
STOP_MARGIN = 10
EX_TEMPFAIL = 75  # unreachable ZooKeeper (SPEC §4): temporary, a supervisor restarts it
METRICS_PORT = 9100
CONTAINER_UID = 10001

# --- network exposure ----------------------------------------------------------------
IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
# What neither the NetworkPolicy's web rule nor the systemd units may let through:
# cloud metadata, link-local, private (RFC 1918), shared (CGNAT), loopback, IPv6 ULA.
FORBIDDEN_V4 = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
                "100.64.0.0/10", "127.0.0.0/8")
FORBIDDEN_V6 = ("fc00::/7", "fe80::/10", "::1/128")
METADATA = ("169.254.169.254", "fd00:ec2::254")
# Addresses a crawler must not reach (samples inside the ranges above).
FORBIDDEN_SAMPLES = (*METADATA, "10.0.0.1", "10.96.0.10", "172.16.0.1", "172.31.255.254",
                     "192.168.1.1", "100.64.0.1", "127.0.0.1", "fe80::1", "::1",
                     "fd12:3456::1")
PUBLIC_SAMPLES = ("93.184.215.14", "1.1.1.1", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")
# The flag that switches the consumer's SSRF guard off: never in a shipped config.
GUARD_OFF = re.compile(r"allow[-_]private[-_]addresses", re.IGNORECASE)


def _within(inner: IPNet, outer: IPNet) -> bool:
    """inner is a subnet of outer (False across IPv4/IPv6)."""
    if isinstance(inner, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return inner.subnet_of(outer)
    if isinstance(inner, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return inner.subnet_of(outer)
    return False


def _env_to_flag(name: str, command: str = "") -> str:
    """The flag a variable sets for ``command`` (``zkcrawl-consumer``): its own
    ZKCRAWL_<COMMAND>_<FLAG> names, or a shared ZKCRAWL_<FLAG>; anything else (an old,
    deprecated name) maps to no flag."""
    own = f"ZKCRAWL_{command_prefix(command)}_" if command else None
    if own and name.startswith(own):
        return name[len(own):].lower().replace("_", "-")
    assert name.startswith("ZKCRAWL_"), name
    flag = name[len("ZKCRAWL_"):].lower().replace("_", "-")
    return flag if flag in COMMON_FLAGS - {"config"} else f"(not a shared name: {name})"


def _toml_key_to_flag(key: str) -> str:
    return key.replace("_", "-")


def _console_scripts() -> dict[str, str]:
    with (REPO / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)["project"]["scripts"]


def _flags_in(args: list[str]) -> list[str]:
    """Flag names (without dashes or =value) in an argument list."""
    return [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]


def _seconds(text: str) -> float:
    """A systemd time span ("45", "45s", "1min 30s", "2h") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600,
             "ms": 0.001, "d": 86400}
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    assert parts, f"not a time span: {text!r}"
    for number, unit in parts:
        total += float(number) * units[unit]
    return total


def _find_spec() -> Path | None:
    for candidate in (REPO.parent / "shared" / "SPEC.md", Path("/work/shared/SPEC.md")):
        if candidate.is_file():
            return candidate
    return None


def test_flag_lists_match_the_spec() -> None:
    """The lists above are the SPEC's: every flag named here appears in SPEC §4."""
    spec = _find_spec()
    if spec is None:
        pytest.skip("SPEC.md not found beside the repository")
    text = spec.read_text(encoding="utf-8")
    section = text.split("## 4.", 1)[1].split("\n## ", 1)[0]
    spec_flags = set(re.findall(r"--([a-z][a-z-]*[a-z])", section))
    missing = (COMMON_FLAGS | CONSUMER_FLAGS | PRODUCER_FLAGS | PRODUCER_WATCH_FLAGS
               | PRODUCER_RECRAWL_FLAGS) - spec_flags
    assert not missing, f"flags not in SPEC §4: {sorted(missing)}"


# =====================================================================================
# systemd
# =====================================================================================

def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values...]}}: repeated keys keep every value."""
    # It must parse as INI at all (configparser merges repeated keys, hence our own
    # reader below for the values).
    parser = configparser.RawConfigParser(strict=False, interpolation=None,
                                          comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: setting outside a section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    assert set(sections) == set(parser.sections())
    return sections


def _one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = unit.get(section, {}).get(key)
    assert values, f"[{section}] {key}= missing"
    return values[-1]


def _all(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> list[str]:
    """Every value of a list setting, split on whitespace; an empty value resets."""
    out: list[str] = []
    for value in unit.get(section, {}).get(key, []):
        out = [] if not value else [*out, *value.split()]
    return out


def _environment(unit: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in unit["Service"].get("Environment", []):
        for item in shlex.split(value):
            name, _, val = item.partition("=")
            env[name] = val
    return env


UNITS = {
    "consumer": SYSTEMD / "zkcrawl-consumer@.service",
    "producer": SYSTEMD / "zkcrawl-producer.service",
    "timer": SYSTEMD / "zkcrawl-producer.timer",
    "exporter": SYSTEMD / "zkcrawl-exporter.service",
    "watch": SYSTEMD / "zkcrawl-producer-watch.service",
}
HARDENING = {
    "ProtectSystem": "strict",
    "NoNewPrivileges": "yes",
    "PrivateTmp": "yes",
    "ProtectHome": "yes",
}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_unit_files_exist_and_parse(name: str) -> None:
    unit = _unit(UNITS[name])
    assert "Unit" in unit and "Description" in unit["Unit"]


def test_consumer_unit_runs_the_console_script_with_an_instance_id() -> None:
    unit = _unit(UNITS["consumer"])
    argv = shlex.split(_one(unit, "Service", "ExecStart"))
    assert argv[0] == "/opt/zkcrawl/venv/bin/zkcrawl-consumer"
    assert Path(argv[0]).name in _console_scripts()
    assert argv[argv.index("--id") + 1] == "%H-%i"
    assert set(_flags_in(argv[1:])) <= COMMON_FLAGS | CONSUMER_FLAGS


def test_consumer_unit_configuration_sources() -> None:
    unit = _unit(UNITS["consumer"])
    env_files = unit["Service"]["EnvironmentFile"]
    assert "/etc/zkcrawl/zkcrawl.env" in env_files  # mandatory: no leading "-"
    env = _environment(unit)
    assert env["ZKCRAWL_CONSUMER_CONFIG"] == "/etc/zkcrawl/consumer.toml"
    assert env["ZKCRAWL_LOG_FORMAT"] == "json"
    # One output file per instance, inside the state directory.
    out = env["ZKCRAWL_CONSUMER_OUT"]
    assert "%i" in out and out.startswith("/var/lib/zkcrawl/")
    for name in env:
        if name.startswith("ZKCRAWL_"):
            assert _env_to_flag(name, "zkcrawl-consumer") in COMMON_FLAGS | CONSUMER_FLAGS, name


def test_consumer_unit_drains_on_sigterm_within_the_stop_timeout() -> None:
    unit = _unit(UNITS["consumer"])
    assert _one(unit, "Service", "KillSignal") == "SIGTERM"
    grace = float(_environment(unit).get("ZKCRAWL_CONSUMER_GRACE", DEFAULT_GRACE))
    zk_timeout = float(_environment(unit).get("ZKCRAWL_ZK_TIMEOUT", DEFAULT_ZK_TIMEOUT))
    stop = _seconds(_one(unit, "Service", "TimeoutStopSec"))
    assert stop > DEFAULT_GRACE
    # The rule stated in the unit and in deploy/systemd/README.md.
    assert stop >= grace + zk_timeout + STOP_MARGIN, \
        "TimeoutStopSec = grace + zk-timeout (a drain while ZooKeeper is away) + margin"
    text = UNITS["consumer"].read_text(encoding="utf-8")
    assert "TimeoutStopSec = ZKCRAWL_CONSUMER_GRACE + ZKCRAWL_ZK_TIMEOUT + 10" in text
    readme = (SYSTEMD / "README.md").read_text(encoding="utf-8")
    assert "TimeoutStopSec = grace + zk-timeout + 10 s" in readme


def test_consumer_unit_restart_policy() -> None:
    unit = _unit(UNITS["consumer"])
    assert _one(unit, "Service", "Restart") == "on-failure"
    # Exit 2 = bad usage or configuration (SPEC §4): restarting would only loop. Exit 75
    # (unreachable ZooKeeper, EX_TEMPFAIL) is temporary: it must restart.
    assert _all(unit, "Service", "RestartPreventExitStatus") == ["2"]
    assert str(EX_TEMPFAIL) not in _all(unit, "Service", "SuccessExitStatus")
    # During an outage each start takes --zk-timeout + RestartSec: the start limit must not
    # turn an outage into a failed unit.
    zk_timeout = float(_environment(unit).get("ZKCRAWL_ZK_TIMEOUT", DEFAULT_ZK_TIMEOUT))
    per_start = zk_timeout + _seconds(_one(unit, "Service", "RestartSec"))
    interval = _seconds(_one(unit, "Unit", "StartLimitIntervalSec"))
    assert interval / per_start < float(_one(unit, "Unit", "StartLimitBurst"))


def test_consumer_unit_reload_reopens_the_output() -> None:
    """systemctl reload = SIGHUP = reopen --out (logrotate's postrotate, no copytruncate)."""
    unit = _unit(UNITS["consumer"])
    assert shlex.split(_one(unit, "Service", "ExecReload")) == ["/bin/kill", "-HUP",
                                                                "$MAINPID"]
    readme = (SYSTEMD / "README.md").read_text(encoding="utf-8")
    assert "postrotate" in readme and "systemctl reload" in readme
    assert "copytruncate`, or" not in readme  # no longer the advice


def test_consumer_unit_hardening_and_state() -> None:
    unit = _unit(UNITS["consumer"])
    svc = unit["Service"]
    assert svc.get("User") or _one(unit, "Service", "DynamicUser") == "yes"
    assert svc.get("User", [""])[-1] != "root"
    for key, value in HARDENING.items():
        assert _one(unit, "Service", key) == value, key
    assert set(_all(unit, "Service", "RestrictAddressFamilies")) == {
        "AF_INET", "AF_INET6", "AF_UNIX"}
    assert "/var/lib/zkcrawl" in _all(unit, "Service", "ReadWritePaths")
    assert "zkcrawl" in _all(unit, "Service", "StateDirectory")
    assert _one(unit, "Service", "MemoryMax")
    assert _all(unit, "Service", "CapabilityBoundingSet") == []
    assert _one(unit, "Service", "StandardError") == "journal"
    assert _one(unit, "Install", "WantedBy") == "multi-user.target"


def test_producer_unit_and_timer() -> None:
    unit = _unit(UNITS["producer"])
    assert _one(unit, "Service", "Type") == "oneshot"
    argv = shlex.split(_one(unit, "Service", "ExecStart"))
    assert argv[0] == "/opt/zkcrawl/venv/bin/zkcrawl-producer"
    assert Path(argv[0]).name in _console_scripts()
    assert set(_flags_in(argv[1:])) <= COMMON_FLAGS | PRODUCER_FLAGS
    assert argv[argv.index("--seen") + 1].startswith("/var/lib/zkcrawl/")
    assert "/etc/zkcrawl/zkcrawl.env" in unit["Service"]["EnvironmentFile"]
    env = _environment(unit)
    assert env["ZKCRAWL_PRODUCER_CONFIG"] == "/etc/zkcrawl/producer.toml"
    assert all(_env_to_flag(n, "zkcrawl-producer") in COMMON_FLAGS | PRODUCER_FLAGS
               for n in env if n.startswith("ZKCRAWL_"))
    for key, value in HARDENING.items():
        assert _one(unit, "Service", key) == value, key
    assert "Install" not in unit, "the timer is enabled, not the service"
    # SIGTERM waits for offers in flight (each <= --zk-timeout) and saves --seen.
    zk_timeout = float(env.get("ZKCRAWL_ZK_TIMEOUT", 10))
    assert _seconds(_one(unit, "Service", "TimeoutStopSec")) >= zk_timeout + 10

    timer = _unit(UNITS["timer"])
    assert _one(timer, "Timer", "OnCalendar") == "hourly"
    assert (SYSTEMD / _one(timer, "Timer", "Unit")).is_file()
    assert _one(timer, "Install", "WantedBy") == "timers.target"


def test_watching_producer_unit() -> None:
    """zkcrawl-producer --watch --recrawl as a long-running service: flags the real CLI
    parses, its own --seen file with the re-crawl store beside it in a writable state
    directory, restarted unless the configuration is wrong, a stop timeout that covers a
    pass cut short, the producer's sandbox."""
    from zkcrawl.producer.recrawl import store_path

    unit = _unit(UNITS["watch"])
    assert _one(unit, "Service", "Type") == "exec"
    argv = shlex.split(_one(unit, "Service", "ExecStart"))
    assert argv[0] == "/opt/zkcrawl/venv/bin/zkcrawl-producer"
    assert set(_flags_in(argv[1:])) <= COMMON_FLAGS | PRODUCER_FLAGS | PRODUCER_WATCH_FLAGS \
        | PRODUCER_RECRAWL_FLAGS
    env = _environment(unit)
    assert env["ZKCRAWL_PRODUCER_CONFIG"] == "/etc/zkcrawl/producer.toml"
    settings = _program_settings("zkcrawl-producer", [*argv[1:], "--start",
                                                      "https://blog.example.com/"], {})
    assert settings.watch == "10m" and settings.watch_depth >= 1
    seen = settings.seen
    timer_argv = shlex.split(_one(_unit(UNITS["producer"]), "Service", "ExecStart"))
    assert seen.startswith("/var/lib/zkcrawl/") and seen not in timer_argv
    # edits to old articles are seen: re-crawls, the store (and SQLite's -wal, -shm)
    # next to --seen, in the state directory that ProtectSystem=strict leaves writable
    assert settings.recrawl and settings.recrawl_store is None
    store = Path(store_path(settings.seen, settings.recrawl_store) or "")
    assert store == Path(f"{seen}.recrawl") and store.parent == Path("/var/lib/zkcrawl")
    assert f"/var/lib/{_one(unit, 'Service', 'StateDirectory')}" == str(store.parent)
    assert str(store.parent) in _all(unit, "Service", "ReadWritePaths")
    assert _one(unit, "Service", "Restart") == "on-failure"
    assert _all(unit, "Service", "RestartPreventExitStatus") == ["2"]
    assert str(EX_TEMPFAIL) not in _all(unit, "Service", "SuccessExitStatus")
    zk_timeout = float(env.get("ZKCRAWL_ZK_TIMEOUT", DEFAULT_ZK_TIMEOUT))
    per_start = zk_timeout + _seconds(_one(unit, "Service", "RestartSec"))
    interval = _seconds(_one(unit, "Unit", "StartLimitIntervalSec"))
    assert interval / per_start < float(_one(unit, "Unit", "StartLimitBurst"))
    assert _one(unit, "Service", "KillSignal") == "SIGTERM"
    # a stop: the fetch running (<= 2 x --timeout), the offers in flight, --seen saved
    assert _seconds(_one(unit, "Service", "TimeoutStopSec")) >= \
        zk_timeout + 2 * settings.timeout + STOP_MARGIN
    for key, value in HARDENING.items():
        assert _one(unit, "Service", key) == value, key
    assert "/var/lib/zkcrawl" in _all(unit, "Service", "ReadWritePaths")
    assert _one(unit, "Install", "WantedBy") == "multi-user.target"
    readme = (SYSTEMD / "README.md").read_text(encoding="utf-8")
    assert "zkcrawl-producer-watch.service" in readme
    assert "zkcrawl-producer-watch.service.d" in NETWORK_DROPIN.read_text(encoding="utf-8")


def test_exporter_unit() -> None:
    """``zkcrawl exporter`` as a service: the admin console script, flags the real CLI
    parses, 127.0.0.1 by default, restarted unless the configuration is wrong, the
    consumer's sandbox, nothing writable."""
    from zkcrawl.cli import build_parser as admin_parser
    from zkcrawl.settings import resolve

    unit = _unit(UNITS["exporter"])
    argv = shlex.split(_one(unit, "Service", "ExecStart"))
    assert argv[0] == "/opt/zkcrawl/venv/bin/zkcrawl" and argv[1] == "exporter"
    assert Path(argv[0]).name in _console_scripts()
    parser, modules = admin_parser()
    env = {**_environment(unit), **_env_file(SYSTEMD / "zkcrawl.env.example")}
    settings = resolve(modules["exporter"].Settings, parser.parse_args(argv[1:]), env)
    assert settings.metrics_host == "127.0.0.1" and settings.metrics_port == 9101
    assert _one(unit, "Service", "Restart") == "on-failure"
    assert _all(unit, "Service", "RestartPreventExitStatus") == ["2"]
    for key, value in HARDENING.items():
        assert _one(unit, "Service", key) == value, key
    assert not _all(unit, "Service", "ReadWritePaths"), "it writes no file"
    assert _one(unit, "Service", "StandardError") == "journal"
    assert _one(unit, "Install", "WantedBy") == "multi-user.target"


# systemd's keywords for IPAddressAllow= / IPAddressDeny=.
SYSTEMD_IP_KEYWORDS = {
    "any": ("0.0.0.0/0", "::/0"),
    "localhost": ("127.0.0.0/8", "::1/128"),
    "link-local": ("169.254.0.0/16", "fe80::/64"),
    "multicast": ("224.0.0.0/4", "ff00::/8"),
}
NETWORK_DROPIN = SYSTEMD / "network.conf.example"


def _ip_list(unit: dict[str, dict[str, list[str]]], key: str) -> list[IPNet]:
    nets: list[IPNet] = []
    for word in _all(unit, "Service", key):
        for text in SYSTEMD_IP_KEYWORDS.get(word, (word,)):
            nets.append(ipaddress.ip_network(text, strict=False))
    return nets


def _systemd_lets_through(allow: list[IPNet], deny: list[IPNet], address: str) -> bool:
    """systemd's rule: an allowed prefix wins; otherwise a denied prefix drops."""
    addr = ipaddress.ip_address(address)
    if any(addr in net for net in allow):
        return True
    return not any(addr in net for net in deny)


@pytest.mark.parametrize("name", ["consumer", "producer", "exporter", "watch"])
def test_units_deny_metadata_and_private_addresses(name: str) -> None:
    """IPAddressDeny= (BPF on the unit's cgroup) backs up the consumer's SSRF guard."""
    unit = _unit(UNITS[name])
    allow = _ip_list(unit, "IPAddressAllow")
    deny = _ip_list(unit, "IPAddressDeny")
    assert deny, "IPAddressDeny= missing"
    # Shipped: loopback only (local ZooKeeper, metrics scrape, stub resolver).  The
    # ensemble's addresses come from the operator's drop-in (network.conf.example).
    assert allow and all(net.is_loopback for net in allow), allow
    for text in (*FORBIDDEN_V4, *FORBIDDEN_V6):
        net = ipaddress.ip_network(text)
        if not net.is_loopback:
            assert any(_within(net, d) for d in deny), text
    for address in FORBIDDEN_SAMPLES:
        if not ipaddress.ip_address(address).is_loopback:
            assert not _systemd_lets_through(allow, deny, address), address
    for address in PUBLIC_SAMPLES:
        assert _systemd_lets_through(allow, deny, address), address
    assert _one(unit, "Service", "MemoryDenyWriteExecute") == "yes"


def test_network_dropin_example_opens_single_hosts_only() -> None:
    dropin = _unit(NETWORK_DROPIN)
    assert set(dropin) == {"Service"}
    # Resetting the deny list (IPAddressDeny= empty) would undo the units' protection.
    assert "IPAddressDeny" not in dropin["Service"]
    allowed = _ip_list(dropin, "IPAddressAllow")
    assert allowed, "show the ZooKeeper servers"
    for net in allowed:
        assert net.num_addresses == 1, f"{net}: a host, not a subnet (no port filter)"
        assert str(net.network_address) not in METADATA
    text = NETWORK_DROPIN.read_text(encoding="utf-8")
    for unit_name in ("zkcrawl-consumer@.service.d", "zkcrawl-producer.service.d"):
        assert unit_name in text, f"say where to install it: {unit_name}"


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd's own parser: unknown keys and bad values are errors here."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    # verify checks that ExecStart= is executable: point it at stubs.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for script in _console_scripts():
        stub = bindir / script
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    names = []
    for path in UNITS.values():
        text = path.read_text(encoding="utf-8").replace("/opt/zkcrawl/venv/bin/",
                                                        f"{bindir}/")
        name = path.name.replace("@.service", "@1.service")
        (tmp_path / name).write_text(text)
        names.append(f"./{name}")
        if name.endswith(".service"):  # with the operator's drop-in, as installed
            dropin = tmp_path / f"{name}.d" / "network.conf"
            dropin.parent.mkdir()
            dropin.write_text(NETWORK_DROPIN.read_text(encoding="utf-8"))
    proc = subprocess.run([tool, "verify", "--man=no", *names], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    output = (proc.stdout + proc.stderr).strip()
    ours = [line for line in output.splitlines()
            if str(tmp_path) in line or "zkcrawl" in line]
    assert not ours, output
    if proc.returncode != 0:
        pytest.skip(f"systemd-analyze cannot run here: {output[:300]}")


def _stated_exposure() -> tuple[str | None, dict[str, float]]:
    """deploy/systemd/README.md's exposure table: (systemd version, {unit: after})."""
    text = (SYSTEMD / "README.md").read_text(encoding="utf-8")
    version = re.search(r"security --offline=yes` \(systemd (\d+)\)", text)
    rows = re.findall(r"^\|\s*`([\w@.-]+\.service)`\s*\|\s*(\d+(?:\.\d+)?)\s*\|"
                      r"\s*(\d+(?:\.\d+)?)\s*\|", text, re.M)
    return (version.group(1) if version else None), {u: float(after) for u, _, after in rows}


def test_systemd_security_exposure(tmp_path: Path) -> None:
    """systemd's own hardening score: at most the "after" value that
    deploy/systemd/README.md states, and in any case in the "OK" band (<= 2.0 of 10).
    The weights change between systemd versions, so the stated values bind on the
    version they were measured with (named in the README)."""
    measured_on, stated = _stated_exposure()
    assert measured_on, "README: name the systemd version the scores come from"
    assert set(stated) == {"zkcrawl-consumer@1.service", "zkcrawl-producer.service",
                           "zkcrawl-exporter.service", "zkcrawl-producer-watch.service"}
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    about = subprocess.run([tool, "--version"], capture_output=True, text=True,
                           timeout=60, check=False).stdout
    running = re.match(r"systemd (\d+)", about)
    names = []
    for key in ("consumer", "producer", "exporter", "watch"):
        path = UNITS[key]
        name = path.name.replace("@.service", "@1.service")
        (tmp_path / name).write_text(path.read_text(encoding="utf-8"))
        names.append(f"./{name}")
    proc = subprocess.run([tool, "security", "--offline=yes", "--no-pager", *names],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    levels = re.findall(r"Overall exposure level for (\S+): (\d+(?:\.\d+)?)", proc.stdout)
    if len(levels) != len(names):
        pytest.skip(f"systemd-analyze security --offline unsupported: {proc.stderr[:300]}")
    for name, level in levels:
        assert float(level) <= 2.0, f"{name}: exposure {level}\n{proc.stdout}"
        if running and running.group(1) == measured_on:
            assert float(level) <= stated[name], (
                f"{name}: exposure {level} > {stated[name]} stated in "
                f"deploy/systemd/README.md\n{proc.stdout}")


def _env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=value: {line}"
            env[name] = value
    return env


def test_env_example() -> None:
    env = _env_file(SYSTEMD / "zkcrawl.env.example")
    assert env["ZKCRAWL_ZK"].count(":2181") >= 3, "list the whole ensemble"
    for name in env:
        # Shared by every command on the host: only common flags.
        assert _env_to_flag(name) in COMMON_FLAGS, name
    for per_unit in ("ZKCRAWL_CONSUMER_CONFIG", "ZKCRAWL_CONSUMER_OUT",
                     "ZKCRAWL_CONSUMER_METRICS_PORT", "ZKCRAWL_CONSUMER_GRACE"):
        assert per_unit not in env


def test_toml_examples_use_only_flag_names() -> None:
    with (SYSTEMD / "consumer.toml.example").open("rb") as fh:
        consumer = {_toml_key_to_flag(k) for k in tomllib.load(fh)}
    allowed = (CONSUMER_FLAGS | CONSUMER_EXTRA_FLAGS) - {"no-robots"}
    assert consumer <= allowed, consumer - allowed
    assert {"threads", "backlog", "domain-delay"} <= consumer
    # Per-instance settings must not be shared by every instance.
    assert not consumer & {"id", "out", "metrics-port", "grace"}
    text = (SYSTEMD / "consumer.toml.example").read_text(encoding="utf-8")
    for documented in ("out", "metrics-port"):
        assert re.search(rf"^#\s+{documented}\b", text, re.M), documented

    with (SYSTEMD / "producer.toml.example").open("rb") as fh:
        producer = {_toml_key_to_flag(k) for k in tomllib.load(fh)}
    assert producer <= PRODUCER_FLAGS - {"no-robots"}, producer - PRODUCER_FLAGS
    assert "start" in producer


# =====================================================================================
# Kubernetes
# =====================================================================================

K8S_FILES = sorted(K8S.glob("*.yaml"))


@pytest.fixture(scope="module")
def yaml_mod() -> Any:
    return pytest.importorskip("yaml")


@pytest.fixture(scope="module")
def manifests(yaml_mod: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes object under deploy/kubernetes, by (kind, name)."""
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in K8S_FILES:
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml_mod.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is None:
                continue
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objects, f"duplicate {key}"
            objects[key] = doc
    return objects


def _container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return container


def _quantity(text: str | int | float) -> float:
    text = str(text)
    suffixes = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6,
                "G": 1e9}
    for suffix, factor in suffixes.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def _arg_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _check_pod_security(pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    pod_sc = pod_spec.get("securityContext", {})
    sc = container.get("securityContext", {})
    assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True
    assert sc.get("runAsUser", pod_sc.get("runAsUser")) == CONTAINER_UID
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
    assert seccomp.get("type") == "RuntimeDefault"
    assert pod_spec.get("automountServiceAccountToken") is False
    volumes = {v["name"] for v in pod_spec.get("volumes", [])}
    mounts = container.get("volumeMounts", [])
    assert {m["name"] for m in mounts} <= volumes
    assert "/tmp" in {m["mountPath"] for m in mounts}, "writable /tmp on a read-only root"


def _under_mount(path: str, container: dict[str, Any]) -> bool:
    return any(path.startswith(m["mountPath"].rstrip("/") + "/")
               for m in container.get("volumeMounts", []))


def test_yaml_files_parse_and_are_namespaced(
        manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    assert K8S_FILES, "no manifests"
    for (kind, name), obj in manifests.items():
        assert obj.get("apiVersion"), (kind, name)
        if kind != "Namespace":
            assert obj["metadata"].get("namespace") == "zkcrawl", (kind, name)
    assert ("Namespace", "zkcrawl") in manifests


def test_kustomization_lists_the_manifests(yaml_mod: Any) -> None:
    text = (K8S / "kustomization.yaml").read_text(encoding="utf-8")
    kust = yaml_mod.safe_load(text)
    listed = set(kust["resources"])
    for name in listed:
        assert (K8S / name).is_file(), name
    expected = {p.name for p in K8S_FILES} - {"kustomization.yaml"}
    assert listed >= expected, expected - listed
    assert kust["namespace"] == "zkcrawl"
    assert any(i["name"] == "zkcrawl" for i in kust["images"])


def test_configmaps_set_known_flags_as_strings(
        manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    common = manifests[("ConfigMap", "zkcrawl-common")]["data"]
    consumer = manifests[("ConfigMap", "zkcrawl-consumer")]["data"]
    for data, command, allowed in ((common, "", COMMON_FLAGS),
                                   (consumer, "zkcrawl-consumer", CONSUMER_FLAGS)):
        for key, value in data.items():
            assert _env_to_flag(key, command) in allowed, key
            assert isinstance(value, str), f"{key}: ConfigMap values must be strings"
    assert common["ZKCRAWL_ZK"].count(":2181") >= 3
    assert common["ZKCRAWL_ROOT"].startswith("/")
    assert common["ZKCRAWL_LOG_FORMAT"] == "json"
    # Set as args, where they must agree with the pod spec.
    assert not {_env_to_flag(k, "zkcrawl-consumer") for k in consumer} & {
        "id", "out", "metrics-port", "metrics-host", "grace"}


def test_consumer_deployment(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    dep = manifests[("Deployment", "zkcrawl-consumer")]
    assert dep["apiVersion"] == "apps/v1"
    assert dep["spec"]["replicas"] == 4
    template = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= template["metadata"][
        "labels"].items()
    pod = template["spec"]
    container = _container(pod, "consumer")
    assert "command" not in container, "the image's ENTRYPOINT is zkcrawl-consumer"
    args = [str(a) for a in container["args"]]
    assert set(_flags_in(args)) <= COMMON_FLAGS | CONSUMER_FLAGS

    # Id from the downward API.
    assert _arg_value(args, "--id") == "$(POD_NAME)"
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    # SIGTERM grace: --grace + --zk-timeout (a drain while ZooKeeper is away) + margin.
    grace = float(_arg_value(args, "--grace") or DEFAULT_GRACE)
    common = manifests[("ConfigMap", "zkcrawl-common")]["data"]
    zk_timeout = float(_arg_value(args, "--zk-timeout")
                       or common.get("ZKCRAWL_ZK_TIMEOUT", DEFAULT_ZK_TIMEOUT))
    assert pod["terminationGracePeriodSeconds"] > DEFAULT_GRACE
    assert pod["terminationGracePeriodSeconds"] >= grace + zk_timeout + STOP_MARGIN

    # Metrics port, probes there: liveness never depends on ZooKeeper (/livez), readiness
    # does (/readyz), so a ZooKeeper outage makes pods unready, never restarts them.
    assert _arg_value(args, "--metrics-port") == str(METRICS_PORT)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    paths = {"readinessProbe": "/readyz", "livenessProbe": "/livez", "startupProbe": "/livez"}
    for probe, path in paths.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert ports.get(get["port"], get["port"]) == METRICS_PORT, probe
    notes = template["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(METRICS_PORT)

    # Resources: requests and limits, limits >= requests.
    res = container["resources"]
    for kind in ("cpu", "memory"):
        assert _quantity(res["limits"][kind]) >= _quantity(res["requests"][kind]) > 0

    # Configuration from the ConfigMaps.
    for ref in container["envFrom"]:
        assert ("ConfigMap", ref["configMapRef"]["name"]) in manifests

    # Security, and --out on a writable volume.
    _check_pod_security(pod, container)
    out = _arg_value(args, "--out")
    assert out and "$(POD_NAME)" in out and _under_mount(out, container)
    for vol in pod["volumes"]:
        claim = vol.get("persistentVolumeClaim", {}).get("claimName")
        if claim:
            assert ("PersistentVolumeClaim", claim) in manifests


def test_consumer_pdb(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    labels = manifests[("Deployment", "zkcrawl-consumer")]["spec"]["template"]["metadata"][
        "labels"]
    pdb = manifests[("PodDisruptionBudget", "zkcrawl-consumer")]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"]


def test_keda_scales_the_consumers_on_the_queue_not_cpu(
        yaml_mod: Any, manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    """KEDA ScaledObject in place of the CPU HPA: a Prometheus trigger on the claimable
    items (plus those in flight), the threshold one pod's capacity (threads + backlog)."""
    assert not list(K8S_ROOT.rglob("*hpa*.yaml")), "the CPU HPA is gone"
    so = yaml_mod.safe_load((K8S_ROOT / "keda" / "scaledobject.yaml").read_text("utf-8"))
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert so["spec"]["scaleTargetRef"]["name"] == "zkcrawl-consumer"
    assert 1 <= so["spec"]["minReplicaCount"] < so["spec"]["maxReplicaCount"]
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    assert "zkcrawl_cluster_queue_claimable" in query and "zkcrawl_cluster_leases" in query
    root = manifests[("ConfigMap", "zkcrawl-common")]["data"]["ZKCRAWL_ROOT"]
    assert f'root="{root}"' in query
    consumer = manifests[("ConfigMap", "zkcrawl-consumer")]["data"]
    capacity = int(consumer["ZKCRAWL_CONSUMER_THREADS"]) + int(consumer["ZKCRAWL_CONSUMER_BACKLOG"])
    assert float(trigger["metadata"]["threshold"]) == capacity
    readme = (K8S_ROOT / "README.md").read_text(encoding="utf-8")
    assert "ScaledObject" in readme and "politeness" in readme.lower()


def test_producer_cronjob(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    cron = manifests[("CronJob", "zkcrawl-producer")]
    assert cron["apiVersion"] == "batch/v1"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    container = _container(pod, "producer")
    assert container["command"] == ["zkcrawl-producer"]
    assert container["command"][0] in _console_scripts()
    args = [str(a) for a in container["args"]]
    assert set(_flags_in(args)) <= COMMON_FLAGS | PRODUCER_FLAGS
    assert _arg_value(args, "--start")
    seen = _arg_value(args, "--seen")
    assert seen == "/state/seen.bloom" and _under_mount(seen, container)
    mount = next(m for m in container["volumeMounts"] if seen.startswith(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in manifests
    _check_pod_security(pod, container)
    # Exit 2 (bad configuration) fails the Job instead of retrying.
    rules = job.get("podFailurePolicy", {}).get("rules", [])
    assert any(r["action"] == "FailJob" and 2 in r["onExitCodes"]["values"]
               for r in rules if "onExitCodes" in r)


WATCH = K8S_ROOT / "watch"


def test_watching_producer_deployment(yaml_mod: Any,
                                      manifests: dict[tuple[str, str], dict[str, Any]]
                                      ) -> None:
    """deploy/kubernetes/watch: one pod, Recreate (a ReadWriteOnce --seen volume), args
    the real CLI parses with --watch and --recrawl, the CronJob's --seen state with the
    re-crawl store beside it on the same writable claim, the producer's NetworkPolicy (by
    its labels) and pod security."""
    from zkcrawl.producer.recrawl import store_path

    (deploy,) = _yaml_docs(yaml_mod, (WATCH / "deployment.yaml").read_text("utf-8"))
    assert deploy["kind"] == "Deployment" and deploy["metadata"]["namespace"] == "zkcrawl"
    spec = deploy["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    container = _container(pod, "producer")
    assert container["command"] == ["zkcrawl-producer"]
    args = [str(a) for a in container["args"]]
    assert set(_flags_in(args)) <= COMMON_FLAGS | PRODUCER_FLAGS | PRODUCER_WATCH_FLAGS \
        | PRODUCER_RECRAWL_FLAGS
    env = dict(manifests[("ConfigMap", "zkcrawl-common")]["data"])
    settings = _program_settings("zkcrawl-producer", args, env)
    assert settings.watch and settings.sitemaps_from_robots
    cron = manifests[("CronJob", "zkcrawl-producer")]
    cron_args = [str(a) for a in _container(
        cron["spec"]["jobTemplate"]["spec"]["template"]["spec"], "producer")["args"]]
    assert settings.seen == _arg_value(cron_args, "--seen") and _under_mount(settings.seen,
                                                                             container)
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"zkcrawl-seen"} and ("PersistentVolumeClaim", "zkcrawl-seen") in manifests
    # edits to old articles are seen: re-crawls, the store (and SQLite's -wal, -shm) in
    # --seen's directory, on the claim's mount, writable (not readOnly; fsGroup owns it)
    assert settings.recrawl and settings.recrawl_store is None
    store = store_path(settings.seen, settings.recrawl_store) or ""
    assert store == f"{settings.seen}.recrawl"
    mount = next(m for m in container["volumeMounts"]
                 if store.startswith(m["mountPath"].rstrip("/") + "/"))
    assert Path(store).parent == Path(settings.seen).parent == Path(mount["mountPath"])
    assert not mount.get("readOnly") and not mount.get("subPath")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "zkcrawl-seen"
    assert not volume["persistentVolumeClaim"].get("readOnly")
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    _check_pod_security(pod, container)
    policy = manifests[("NetworkPolicy", "zkcrawl-producer")]["spec"]["podSelector"]
    assert policy["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    consumer = manifests[("Deployment", "zkcrawl-consumer")]["spec"]["selector"]
    assert not consumer["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= float(env["ZKCRAWL_ZK_TIMEOUT"]) + 2 * settings.timeout + STOP_MARGIN


def test_watch_component_renders_instead_of_the_cronjob(yaml_mod: Any, tmp_path: Path
                                                         ) -> None:
    """The Component added to an overlay: the Deployment is there, the CronJob suspended,
    and the result validates strictly."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    import os

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAYS / "dev", overlay)],
        "components": [os.path.relpath(WATCH, overlay)],
        "images": [{"name": "zkcrawl", "newName": "registry.example.com/zkcrawl",
                    "newTag": "0.1.0"}]}))
    proc = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    objects = _yaml_docs(yaml_mod, proc.stdout)
    _validate_strict(objects, "dev + watch")
    kinds = _by_kind(objects)
    assert kinds["CronJob"]["zkcrawl-producer"]["spec"]["suspend"] is True
    watch = kinds["Deployment"]["zkcrawl-producer-watch"]
    assert _pod_containers(watch)[0]["image"] == "registry.example.com/zkcrawl:0.1.0"
    assert "--recrawl" in _pod_containers(watch)[0]["args"]


def test_consumer_metrics_listen_on_the_pod_address(
        manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The consumer's default --metrics-host is 127.0.0.1: unreachable for the kubelet's
    probes and for Prometheus.  The Deployment says 0.0.0.0; the NetworkPolicy limits
    who may connect."""
    pod = manifests[("Deployment", "zkcrawl-consumer")]["spec"]["template"]["spec"]
    container = _container(pod, "consumer")
    args = [str(a) for a in container["args"]]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    host = _arg_value(args, "--metrics-host") or env.get("ZKCRAWL_CONSUMER_METRICS_HOST")
    assert host == "0.0.0.0"


# NetworkPolicy name -> the workload whose pods it selects.
POLICIES = {
    "zkcrawl-consumer": ("Deployment", "zkcrawl-consumer"),
    "zkcrawl-producer": ("CronJob", "zkcrawl-producer"),
}


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["metadata"]["labels"]


def _ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    for port in rule.get("ports", []):
        assert "endPort" not in port, "single ports only"
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule.get("ports", [])}


def _ipblock_lets_through(block: dict[str, Any], address: str) -> bool:
    addr = ipaddress.ip_address(address)
    return addr in ipaddress.ip_network(block["cidr"]) and not any(
        addr in ipaddress.ip_network(e) for e in block.get("except", []))


def test_networkpolicy_is_applied(yaml_mod: Any,
                                  manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    kust = yaml_mod.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    assert "networkpolicy.yaml" in kust["resources"]
    for name in POLICIES:
        assert manifests[("NetworkPolicy", name)]["apiVersion"] == "networking.k8s.io/v1"


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_networkpolicy_egress(manifests: dict[tuple[str, str], dict[str, Any]],
                              name: str) -> None:
    """Egress: ZooKeeper, DNS, and public addresses on 80/443 -- never the cloud
    metadata service or a private, shared, link-local or loopback address."""
    spec = manifests[("NetworkPolicy", name)]["spec"]
    selector = spec["podSelector"]["matchLabels"]
    workload = manifests[POLICIES[name]]
    assert selector and selector.items() <= _pod_labels(workload).items()
    for other in POLICIES.values():
        if other != POLICIES[name]:
            assert not selector.items() <= _pod_labels(manifests[other]).items()
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    rules = spec["egress"]
    for rule in rules:
        assert rule.get("to"), "a rule without 'to' allows every destination"
        assert _ports(rule), "a rule without 'ports' allows every port"

    # ZooKeeper: 2181 (2281 with TLS), to pods chosen by label.
    zk = [r for r in rules if ("TCP", 2181) in _ports(r)]
    assert zk and all(_ports(r) == {("TCP", 2181), ("TCP", 2281)} for r in zk)
    for rule in zk:
        for peer in rule["to"]:
            assert "ipBlock" not in peer
            assert peer["podSelector"]["matchLabels"], "ZooKeeper pods, not every pod"

    # DNS: 53 over UDP and TCP, to kube-dns only.
    dns = [r for r in rules if ("UDP", 53) in _ports(r)]
    assert dns and all(_ports(r) == {("UDP", 53), ("TCP", 53)} for r in dns)
    for rule in dns:
        for peer in rule["to"]:
            assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
            assert peer["namespaceSelector"]["matchLabels"] == {
                "kubernetes.io/metadata.name": "kube-system"}

    # The web: 80 and 443 only, through ipBlocks that except the internal ranges.
    web = [r for r in rules if any("ipBlock" in peer for peer in r["to"])]
    assert web and all(_ports(r) == {("TCP", 80), ("TCP", 443)} for r in web)
    blocks = [peer["ipBlock"] for r in rules for peer in r["to"] if "ipBlock" in peer]
    for block in blocks:
        cidr = ipaddress.ip_network(block["cidr"])
        for text in block.get("except", []):
            excepted = ipaddress.ip_network(text)  # valid, and a strict subset (API rule)
            assert _within(excepted, cidr) and excepted != cidr, (block["cidr"], text)
    for everything, required in (("0.0.0.0/0", FORBIDDEN_V4), ("::/0", FORBIDDEN_V6)):
        (block,) = [b for b in blocks if b["cidr"] == everything]
        excepts = [ipaddress.ip_network(e) for e in block["except"]]
        for text in required:
            net = ipaddress.ip_network(text)
            assert any(_within(net, e) for e in excepts), f"{everything}: except {text}"
    for address in FORBIDDEN_SAMPLES:
        assert not any(_ipblock_lets_through(b, address) for b in blocks), address
    for address in PUBLIC_SAMPLES:
        assert any(_ipblock_lets_through(b, address) for b in blocks), address


def test_networkpolicy_ingress(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Only the metrics scrape reaches a consumer, from the monitoring pods; nothing
    reaches the producer.  (The kubelet's probes come from the node: always allowed.)"""
    consumer = manifests[("NetworkPolicy", "zkcrawl-consumer")]["spec"]
    (rule,) = consumer["ingress"]
    assert _ports(rule) == {("TCP", METRICS_PORT)}
    for peer in rule["from"]:
        assert "ipBlock" not in peer
        assert peer["namespaceSelector"]["matchLabels"], "a monitoring namespace"
        assert peer["podSelector"]["matchLabels"], "the monitoring pods in it"
    producer = manifests[("NetworkPolicy", "zkcrawl-producer")]["spec"]
    assert "Ingress" in producer["policyTypes"] and not producer.get("ingress")


def test_kubernetes_readme_covers_operations() -> None:
    text = (K8S_ROOT / "README.md").read_text(encoding="utf-8")
    for needle in ("zkcrawl pause", "kubectl apply -k", "ZooKeeper", "/healthz",
                   "## Network exposure", "169.254.169.254", "monitoring"):
        assert needle in text, needle


def test_kustomize_renders() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    proc = subprocess.run([kubectl, "kustomize", str(K8S_ROOT)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "image: registry.example.com/zkcrawl:" in proc.stdout
    assert proc.stdout.count("kind: NetworkPolicy") == len(POLICIES)


# =====================================================================================
# The SSRF guard
# =====================================================================================

def test_no_shipped_config_switches_the_ssrf_guard_off() -> None:
    """--allow-private-addresses (ZKCRAWL_ALLOW_PRIVATE_ADDRESSES, allow-private-addresses
    in TOML) is for tests on 127.0.0.1: no unit, example, manifest or Containerfile sets
    it.  Every line of every file under deploy/ except whole-line comments (and the
    READMEs, which explain it) is checked."""
    offenders = []
    for path in sorted(DEPLOY.rglob("*")):
        if not path.is_file() or path.suffix == ".md":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip().startswith("#") and GUARD_OFF.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
    for name in ("consumer.toml.example", "producer.toml.example"):
        with (SYSTEMD / name).open("rb") as fh:
            assert not any(GUARD_OFF.fullmatch(key) for key in tomllib.load(fh)), name


# =====================================================================================
# Container image
# =====================================================================================

def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        line = pending + stripped
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line:
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages(path: Path) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instr in _instructions(path):
        if instr[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instr)
    return stages


def test_containerfile_builder_and_runtime_stages() -> None:
    instrs = _instructions(CONTAINERFILE)
    args = dict(a[1].split("=", 1) for a in instrs if a[0] == "ARG" and "=" in a[1])
    stages = _stages(CONTAINERFILE)
    assert len(stages) >= 2, "multi-stage"
    for stage in stages:
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert image.startswith("python:3.11-slim"), image
    builder, runtime = stages[0], stages[-1]
    builder_run = " ".join(a for i, a in builder if i == "RUN")
    assert "pip wheel" in builder_run and "/opt/venv" in builder_run
    # What the builder copies exists in the repository (globs may match nothing).
    for word, rest in builder:
        if word == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                if not any(c in src for c in "*?["):
                    assert (REPO / src).exists(), src
    # The runtime carries only the venv from the builder, and no ZooKeeper server.
    copies = [a for i, a in runtime if i == "COPY"]
    assert copies and all(c.startswith("--from=") for c in copies)
    assert any("/opt/venv" in c for c in copies)
    runtime_run = " ".join(a for i, a in runtime if i == "RUN").lower()
    assert "zookeeper" not in runtime_run and "java" not in runtime_run
    exposed = " ".join(a for i, a in runtime if i == "EXPOSE").split()
    assert "2181" not in exposed, "a client: no ZooKeeper port"
    env = " ".join(a for i, a in runtime if i == "ENV")
    assert "/opt/venv/bin" in env


def test_containerfile_runs_non_root_and_stops_with_sigterm() -> None:
    runtime = _stages(CONTAINERFILE)[-1]
    last = {word: rest for word, rest in runtime}  # the last of each instruction wins
    user = last["USER"].split(":")[0]
    assert user not in ("root", "0")
    assert user == str(CONTAINER_UID), "numeric, matching the Kubernetes runAsUser"
    assert last["STOPSIGNAL"] == "SIGTERM"
    entrypoint = json.loads(last["ENTRYPOINT"])  # exec form: signals reach the process
    assert entrypoint == ["zkcrawl-consumer"]
    assert entrypoint[0] in _console_scripts()
    assert str(METRICS_PORT) in last["EXPOSE"].split()


# =====================================================================================
# ZooKeeper in the manifests, the overlays, strict schema validation, container args
# =====================================================================================

# Kinds each overlay must render (kind -> names); a CRD kind is checked by structure only
# (kubernetes-validate has no schema for it).
CRD_GROUPS = ("keda.sh/", "monitoring.coreos.com/")
BASE_KINDS = {"Namespace": {"zkcrawl"}, "Deployment": {"zkcrawl-consumer"},
              "CronJob": {"zkcrawl-producer"}, "StatefulSet": {"zk"},
              "Service": {"zk-hs", "zk-cs"}, "PodDisruptionBudget": {"zkcrawl-consumer", "zk"},
              "NetworkPolicy": {"zkcrawl-consumer", "zkcrawl-producer", "zk"}}
OVERLAY_KINDS = {
    "dev": BASE_KINDS,
    "prod": {**BASE_KINDS, "Deployment": {"zkcrawl-consumer", "zkcrawl-exporter"},
             "NetworkPolicy": {*BASE_KINDS["NetworkPolicy"], "zkcrawl-exporter"},
             "ScaledObject": {"zkcrawl-consumer"}, "PodMonitor": {"zkcrawl"},
             "PrometheusRule": {"zkcrawl"}, "ConfigMap": {"zkcrawl-dashboard"}},
}
ABSENT_IN = {"dev": {"ScaledObject", "PodMonitor", "PrometheusRule"}, "prod": set()}


def _validate_strict(objects: list[dict[str, Any]], what: str) -> list[str]:
    """kubernetes-validate --strict (unknown fields are errors) on every object whose kind
    Kubernetes defines, against the oldest supported version and the newest; returns the
    CRD kinds it left to the structural checks."""
    kv = pytest.importorskip("kubernetes_validate")
    left = []
    for obj in objects:
        if obj["apiVersion"].startswith(CRD_GROUPS):
            left.append(obj["kind"])
            continue
        for version in (KUBERNETES_VERSION, kv.latest_version()):
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{what}: {obj['kind']}/{obj['metadata']['name']} "
                            f"(Kubernetes {version}): {exc.message} at "
                            f"{'/'.join(map(str, exc.path))}")
    return left


def _yaml_docs(yaml_mod: Any, text: str) -> list[dict[str, Any]]:
    return [d for d in yaml_mod.safe_load_all(text) if d]


def test_every_manifest_file_validates_strictly(yaml_mod: Any) -> None:
    """Each file on its own (no kubectl needed): the base, ZooKeeper, exporter, KEDA and
    monitoring objects."""
    files = [p for p in sorted(K8S_ROOT.rglob("*.yaml")) + sorted(
        (DEPLOY / "monitoring").glob("*.yaml"))
        if p.name != "kustomization.yaml" and p.name != "alerts.test.yaml"]
    crds = []
    for path in files:
        crds += _validate_strict(_yaml_docs(yaml_mod, path.read_text("utf-8")), path.name)
    assert sorted(crds) == ["PodMonitor", "PrometheusRule", "ScaledObject"]


@pytest.fixture(scope="module")
def overlays(yaml_mod: Any) -> dict[str, list[dict[str, Any]]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: overlays not rendered")
    out = {}
    for name in OVERLAY_KINDS:
        proc = subprocess.run([kubectl, "kustomize", str(OVERLAYS / name)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        out[name] = _yaml_docs(yaml_mod, proc.stdout)
    return out


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    kinds: dict[str, dict[str, dict[str, Any]]] = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    return kinds


@pytest.mark.parametrize("name", sorted(OVERLAY_KINDS))
def test_overlay_renders_validates_and_has_its_kinds(overlays: dict[str, Any],
                                                     name: str) -> None:
    objects = overlays[name]
    _validate_strict(objects, f"overlays/{name}")
    kinds = _by_kind(objects)
    for kind, names in OVERLAY_KINDS[name].items():
        assert names <= set(kinds.get(kind, {})), (kind, names - set(kinds.get(kind, {})))
    assert not ABSENT_IN[name] & set(kinds)
    for obj in objects:
        assert obj["metadata"].get("namespace", "zkcrawl") == "zkcrawl"
    zk = kinds["StatefulSet"]["zk"]
    consumer = kinds["Deployment"]["zkcrawl-consumer"]
    servers = kinds["ConfigMap"]["zkcrawl-common"]["data"]["ZKCRAWL_ZK"].split(",")
    replicas = zk["spec"]["replicas"]
    assert servers == [f"zk-{i}.zk-hs:2181" for i in range(replicas)], \
        "ZKCRAWL_ZK lists exactly the StatefulSet's servers"
    zoo_servers = {e["name"]: e.get("value") for e in
                   _container(zk["spec"]["template"]["spec"], "zookeeper")["env"]}["ZOO_SERVERS"]
    assert zoo_servers.split() == [f"server.{i + 1}=zk-{i}.zk-hs:2888:3888;2181"
                                   for i in range(replicas)]
    if name == "dev":
        assert replicas == 1 and consumer["spec"]["replicas"] == 1
    else:
        assert replicas == 3 and "replicas" not in consumer["spec"], "KEDA owns it"
        for obj in objects:
            for c in _pod_containers(obj):
                if c["image"].split(":")[0].endswith("/zkcrawl"):
                    assert c["image"] == "registry.example.com/zkcrawl:0.1.0"


def _pod_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return list(spec.get("template", {}).get("spec", {}).get("containers", []))


def _program_settings(program: str, args: list[str], env: dict[str, str]) -> Any:
    """Parse a container's command line with the real CLI (argparse and the settings'
    validation): a flag that does not exist or a bad value fails here."""
    from zkcrawl.settings import parse, resolve

    if program == "zkcrawl-consumer":
        from zkcrawl.consumer.main import build_parser as consumer_parser
        from zkcrawl.consumer.settings import ConsumerSettings
        return parse(ConsumerSettings, consumer_parser(), args, env)[0]
    if program == "zkcrawl-producer":
        from zkcrawl.producer.main import build_parser as producer_parser
        from zkcrawl.producer.settings import ProducerSettings
        return parse(ProducerSettings, producer_parser(), args, env)[0]
    assert program == "zkcrawl", program
    from zkcrawl.cli import build_parser as admin_parser
    parser, modules = admin_parser()
    ns = parser.parse_args(args)
    return resolve(modules[ns.command].Settings, ns, env)


@pytest.mark.parametrize("name", sorted(OVERLAY_KINDS))
def test_overlay_container_args_parse_with_the_real_cli(overlays: dict[str, Any],
                                                        name: str) -> None:
    objects = overlays[name]
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects
                  if o["kind"] == "ConfigMap"}
    parsed = {}
    for obj in objects:
        for c in _pod_containers(obj):
            if not c["image"].split(":")[0].endswith("/zkcrawl"):
                continue
            env = {k: v for ref in c.get("envFrom", [])
                   for k, v in configmaps[ref["configMapRef"]["name"]].items()}
            env.update({e["name"]: e.get("value", "pod-0") for e in c.get("env", [])})
            args = [re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], str(a))
                    for a in c.get("args", [])]
            program = (c.get("command") or ["zkcrawl-consumer"])[0]  # the image's ENTRYPOINT
            assert program in _console_scripts()
            parsed[obj["metadata"]["name"]] = _program_settings(program, args, env)
    assert {"zkcrawl-consumer", "zkcrawl-producer"} <= set(parsed)
    consumer = parsed["zkcrawl-consumer"]
    assert consumer.zk.startswith("zk-0.zk-hs:2181") and consumer.metrics_port == METRICS_PORT
    if name == "prod":
        exporter = parsed["zkcrawl-exporter"]
        assert exporter.metrics_host == "0.0.0.0" and exporter.root == consumer.root
        ports = {p["name"]: p["containerPort"] for p in _container(
            _by_kind(objects)["Deployment"]["zkcrawl-exporter"]["spec"]["template"]["spec"],
            "exporter")["ports"]}
        assert ports["metrics"] == exporter.metrics_port


def test_zookeeper_statefulset(yaml_mod: Any) -> None:
    """The official image, 3 servers one per node, restricted security context, readiness
    through a real four-letter-word check that the whitelist allows."""
    (sts,) = _yaml_docs(yaml_mod, (ZOOKEEPER / "statefulset.yaml").read_text("utf-8"))
    spec = sts["spec"]
    assert spec["replicas"] == 3 and spec["serviceName"] == "zk-hs"
    pod = spec["template"]["spec"]
    c = _container(pod, "zookeeper")
    assert re.fullmatch(r"zookeeper:3\.\d+\.\d+", c["image"]), "official image, pinned"
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["labelSelector"]["matchLabels"].items() <= spec["selector"][
        "matchLabels"].items()
    # Pod Security "restricted" (the namespace enforces it).
    psc, sc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/data", "/conf", "/tmp"} <= mounts
    env = {e["name"]: e["value"] for e in c["env"]}
    allowed = {w.strip() for w in env["ZOO_4LW_COMMANDS_WHITELIST"].split(",")}
    ready = " ".join(c["readinessProbe"]["exec"]["command"])
    live = " ".join(c["livenessProbe"]["exec"]["command"])
    assert "srvr" in ready and "Mode: " in ready and "srvr" in allowed
    assert "ruok" in live and "imok" in live and "ruok" in allowed
    assert env["ZOO_ADMINSERVER_ENABLED"] == "false"
    services = {s["metadata"]["name"]: s for s in
                _yaml_docs(yaml_mod, (ZOOKEEPER / "services.yaml").read_text("utf-8"))}
    assert services["zk-hs"]["spec"]["clusterIP"] == "None"
    assert services["zk-hs"]["spec"]["publishNotReadyAddresses"] is True
    assert {p["port"] for p in services["zk-hs"]["spec"]["ports"]} == {2181, 2888, 3888}
    assert [p["port"] for p in services["zk-cs"]["spec"]["ports"]] == [2181]
    (pdb,) = _yaml_docs(yaml_mod, (ZOOKEEPER / "pdb.yaml").read_text("utf-8"))
    assert pdb["spec"]["maxUnavailable"] == 1  # two of three keep the quorum
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_zookeeper_readiness_check_is_real(tmp_path: Path, yaml_mod: Any) -> None:
    """The probe's own command, run by bash against a real ZooKeeper: ready while it
    serves, not ready on a port where nothing answers ``srvr`` with a Mode."""
    import socket

    from zkcrawl.admin.localzk import ZkServer

    (sts,) = _yaml_docs(yaml_mod, (ZOOKEEPER / "statefulset.yaml").read_text("utf-8"))
    command = _container(sts["spec"]["template"]["spec"], "zookeeper")["readinessProbe"][
        "exec"]["command"]
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} not installed")
    server = ZkServer(tmp_path / "zk").start(wait=60)
    try:
        probe = [*command[:-1], command[-1].replace("2181", str(server.port))]
        assert subprocess.run(probe, timeout=30, check=False).returncode == 0
    finally:
        server.stop()
    with socket.socket() as quiet:  # listens, answers nothing: the probe must say no
        quiet.bind(("127.0.0.1", 0))
        quiet.listen()
        probe = [*command[:-1], command[-1].replace("2181", str(quiet.getsockname()[1]))]
        probe[-1] = f"timeout 3 bash -c {shlex.quote(probe[-1])}"
        assert subprocess.run(probe, timeout=30, check=False).returncode != 0
