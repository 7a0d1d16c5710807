"""Static checks of the deployment files under deploy/ (systemd, Kubernetes, container).

Fast and offline: the files are parsed and their key properties asserted against the
SPEC's stable surface (commands, flags, exit codes, SIGTERM grace, /healthz).  External
tools are used when present and skipped otherwise: ``systemd-analyze verify`` for the
units, ``kubectl kustomize`` to render the Kubernetes directory.  PyYAML is needed for
the Kubernetes checks (skipped without it).
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
SYSTEMD = DEPLOY / "systemd"
K8S = DEPLOY / "kubernetes"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"

# --- the SPEC's stable surface (SPEC §4) ---------------------------------------------
# Flags every command takes.
COMMON_FLAGS = frozenset({"zk", "root", "config", "log-format", "log-level", "zk-timeout"})
CONSUMER_FLAGS = frozenset({
    "id", "threads", "backlog", "out", "field", "timeout", "max-attempts", "domain-delay",
    "robots", "no-robots", "user-agent", "max-bytes", "delivery", "exit-when-idle",
    "metrics-port", "grace",
})
# Ours, beyond the SPEC (documented in the README): allowed in the examples.
CONSUMER_EXTRA_FLAGS = frozenset({"politeness"})
PRODUCER_FLAGS = frozenset({
    "start", "pages", "page-range", "links", "links-css", "next", "max-pages", "allow",
    "deny", "same-host", "from-file", "seen", "max-depth", "batch", "delay", "robots",
    "no-robots",
})
DEFAULT_GRACE = 30  # --grace default, seconds
METRICS_PORT = 9100
CONTAINER_UID = 10001


def _env_to_flag(name: str) -> str:
    assert name.startswith("ZKCRAWL_"), name
    return name[len("ZKCRAWL_"):].lower().replace("_", "-")


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
    missing = (COMMON_FLAGS | CONSUMER_FLAGS | PRODUCER_FLAGS) - spec_flags
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
    assert env["ZKCRAWL_CONFIG"] == "/etc/zkcrawl/consumer.toml"
    assert env["ZKCRAWL_LOG_FORMAT"] == "json"
    # One output file per instance, inside the state directory.
    assert "%i" in env["ZKCRAWL_OUT"] and env["ZKCRAWL_OUT"].startswith("/var/lib/zkcrawl/")
    for name in env:
        if name.startswith("ZKCRAWL_"):
            assert _env_to_flag(name) in COMMON_FLAGS | CONSUMER_FLAGS, name


def test_consumer_unit_drains_on_sigterm_within_the_stop_timeout() -> None:
    unit = _unit(UNITS["consumer"])
    assert _one(unit, "Service", "KillSignal") == "SIGTERM"
    grace = float(_environment(unit).get("ZKCRAWL_GRACE", DEFAULT_GRACE))
    stop = _seconds(_one(unit, "Service", "TimeoutStopSec"))
    assert stop > DEFAULT_GRACE
    assert stop >= grace + 10, "leave a margin after the drain to close the ZK session"


def test_consumer_unit_restart_policy() -> None:
    unit = _unit(UNITS["consumer"])
    assert _one(unit, "Service", "Restart") == "on-failure"
    # Exit 2 = bad usage or configuration (SPEC §4): restarting would only loop.
    assert "2" in _all(unit, "Service", "RestartPreventExitStatus")


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
    assert env["ZKCRAWL_CONFIG"] == "/etc/zkcrawl/producer.toml"
    assert all(_env_to_flag(n) in COMMON_FLAGS | PRODUCER_FLAGS
               for n in env if n.startswith("ZKCRAWL_"))
    for key, value in HARDENING.items():
        assert _one(unit, "Service", key) == value, key
    assert "Install" not in unit, "the timer is enabled, not the service"

    timer = _unit(UNITS["timer"])
    assert _one(timer, "Timer", "OnCalendar") == "hourly"
    assert (SYSTEMD / _one(timer, "Timer", "Unit")).is_file()
    assert _one(timer, "Install", "WantedBy") == "timers.target"


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
    proc = subprocess.run([tool, "verify", "--man=no", *names], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    output = (proc.stdout + proc.stderr).strip()
    ours = [line for line in output.splitlines()
            if str(tmp_path) in line or "zkcrawl" in line]
    assert not ours, output
    if proc.returncode != 0:
        pytest.skip(f"systemd-analyze cannot run here: {output[:300]}")


def test_systemd_security_exposure(tmp_path: Path) -> None:
    """systemd's own hardening score stays in its "OK" band (<= 2.0 of 10)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    names = []
    for key in ("consumer", "producer"):
        path = UNITS[key]
        name = path.name.replace("@.service", "@1.service")
        (tmp_path / name).write_text(path.read_text(encoding="utf-8"))
        names.append(f"./{name}")
    proc = subprocess.run([tool, "security", "--offline=true", "--no-pager", *names],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    levels = re.findall(r"Overall exposure level for (\S+): (\d+(?:\.\d+)?)", proc.stdout)
    if len(levels) != len(names):
        pytest.skip(f"systemd-analyze security --offline unsupported: {proc.stderr[:300]}")
    for name, level in levels:
        assert float(level) <= 2.0, f"{name}: exposure {level}\n{proc.stdout}"


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
    for per_unit in ("ZKCRAWL_CONFIG", "ZKCRAWL_OUT", "ZKCRAWL_METRICS_PORT", "ZKCRAWL_GRACE"):
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
    optional = {"consumer-hpa.yaml"}
    expected = {p.name for p in K8S_FILES} - {"kustomization.yaml"} - optional
    assert listed >= expected, expected - listed
    for name in optional - listed:
        assert name in text, f"mention the optional {name} in kustomization.yaml"
    assert kust["namespace"] == "zkcrawl"
    assert any(i["name"] == "zkcrawl" for i in kust["images"])


def test_configmaps_set_known_flags_as_strings(
        manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    common = manifests[("ConfigMap", "zkcrawl-common")]["data"]
    consumer = manifests[("ConfigMap", "zkcrawl-consumer")]["data"]
    for data, allowed in ((common, COMMON_FLAGS), (consumer, CONSUMER_FLAGS)):
        for key, value in data.items():
            assert _env_to_flag(key) in allowed, key
            assert isinstance(value, str), f"{key}: ConfigMap values must be strings"
    assert common["ZKCRAWL_ZK"].count(":2181") >= 3
    assert common["ZKCRAWL_ROOT"].startswith("/")
    assert common["ZKCRAWL_LOG_FORMAT"] == "json"
    # Set as args, where they must agree with the pod spec.
    assert not set(consumer) & {"ZKCRAWL_ID", "ZKCRAWL_OUT", "ZKCRAWL_METRICS_PORT",
                                "ZKCRAWL_GRACE"}


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

    # SIGTERM grace.
    grace = float(_arg_value(args, "--grace") or DEFAULT_GRACE)
    assert pod["terminationGracePeriodSeconds"] > DEFAULT_GRACE
    assert pod["terminationGracePeriodSeconds"] >= grace + 10

    # Metrics port, probes on /healthz there.
    assert _arg_value(args, "--metrics-port") == str(METRICS_PORT)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
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


def test_consumer_pdb_and_hpa(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    labels = manifests[("Deployment", "zkcrawl-consumer")]["spec"]["template"]["metadata"][
        "labels"]
    pdb = manifests[("PodDisruptionBudget", "zkcrawl-consumer")]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"]

    hpa = manifests[("HorizontalPodAutoscaler", "zkcrawl-consumer")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "zkcrawl-consumer"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 16)
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


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


def test_kubernetes_readme_covers_operations() -> None:
    text = (K8S / "README.md").read_text(encoding="utf-8")
    for needle in ("zkcrawl pause", "kubectl apply -k", "ZooKeeper", "/healthz"):
        assert needle in text, needle


def test_kustomize_renders() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    proc = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "image: registry.example.com/zkcrawl:" in proc.stdout


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
