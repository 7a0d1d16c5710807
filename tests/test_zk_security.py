"""ZooKeeper authentication, ACLs and TLS (SPEC §4 "Security flags") against real servers:

* a server that **requires authentication** (``enforce.auth.enabled``, digest and SASL
  DIGEST-MD5 through a JAAS file): zkcrawl's znodes get the creator ACL, another identity
  can read but not write, a session without credentials is refused, a wrong password is one
  line and exit 2, ``--zk-acl open`` opts out; real producer, consumer and admin processes
  with credentials from a file and from the environment never show the password (stderr,
  status znodes, /metrics, their command line);
* a server with a **TLS client port** (mutual TLS; CA, server and client certificates made
  here with openssl): a crawl over TLS; a wrong CA is one line and exit 2, at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import _SERVERS, wait_for
from tests.httpd import TestServer, html
from zkcrawl.admin.localzk import Pki, ZkServer, free_port, make_pki
from zkcrawl.cli import main as zkcrawl_main
from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.producer.main import main as producer_main
from zkcrawl.settings import CommonSettings, redacted
from zkcrawl.zk import NoAuthError
from zkcrawl.zk.client import ZkAccessDenied, ZkClient
from zkcrawl.zk.security import ZkSecurityError, parse_auth, sasl_available

REPO = Path(__file__).resolve().parent.parent
USER = "crawler"
PASSWORD = f"pw-{uuid.uuid4().hex}:with:colons"  # unique: grep-able anywhere it could leak
AUTH = f"digest:{USER}:{PASSWORD}"
WRONG = f"wrong-{uuid.uuid4().hex}"
SASL_USER, SASL_PASSWORD = "sam", f"sasl-{uuid.uuid4().hex}"
SECRETS = (PASSWORD, WRONG, SASL_PASSWORD)


def _start(server: ZkServer) -> ZkServer:
    server.start(wait=60)
    _SERVERS.append(server)  # its log is shown when a test fails
    return server


@pytest.fixture(scope="module")
def auth_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    server = _start(ZkServer(tmp_path_factory.mktemp("zk-auth"), quick_jit=True,
                             require_auth=True, sasl_users={SASL_USER: SASL_PASSWORD}))
    yield server
    server.stop()
    _SERVERS.remove(server)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_zk(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ZkServer]:
    server = _start(ZkServer(tmp_path_factory.mktemp("zk-tls"), quick_jit=True,
                             tls=pki.server_tls("need")))
    yield server
    server.stop()
    _SERVERS.remove(server)


@pytest.fixture
def auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "zk-auth"
    path.write_text(AUTH + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def site() -> Iterator[TestServer]:
    routes = {f"/a/{i}": html(f"<title>article {i}</title>") for i in range(6)}
    with TestServer(routes) as srv:
        yield srv


def cli(capsys: pytest.CaptureFixture[str], *argv: str, env: Mapping[str, str] | None = None
        ) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = zkcrawl_main(list(argv), dict(env or {}))
    out, err = capsys.readouterr()
    return int(rc), out, err


def common(hosts: str, root: str) -> list[str]:
    return ["--zk", hosts, "--root", root, "--zk-timeout", "8", "--log-format", "json"]


def assert_no_secret(*texts: str | bytes) -> None:
    for text in texts:
        data = text.encode() if isinstance(text, str) else text
        for secret in SECRETS:
            assert secret.encode() not in data, f"secret leaked: {data[:2000]!r}"


def one_line(rc: int, err: str, *words: str, status: int = ExitStatus.USAGE) -> None:
    assert rc == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], err
    assert_no_secret(err)


def client(hosts: str, auth: str | None = None, **kw: object) -> ZkClient:
    return ZkClient(hosts, zk_timeout=8, auth=parse_auth(auth) if auth else None,
                    **kw).connect()  # type: ignore[arg-type]


def proc_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


# -- settings: parsing, validation, redaction ----------------------------------------
def test_settings_redact_the_credentials(auth_file: Path) -> None:
    s = CommonSettings(zk_auth=AUTH)
    s.validate()
    assert_no_secret(repr(s), str(s), json.dumps(redacted(s), default=str))
    assert redacted(s)["zk_auth"] == "***" and redacted(s)["zk_acl"] == "creator"
    auth = s.zk_credentials()
    assert auth is not None and (auth.scheme, auth.user, auth.password) == ("digest", USER,
                                                                            PASSWORD)
    assert_no_secret(repr(auth), str(auth), auth.redacted(), repr(dataclasses.astuple(
        CommonSettings(zk_auth_file=str(auth_file)))))
    assert CommonSettings(zk_auth_file=str(auth_file)).zk_credentials() == auth
    sasl = parse_auth(f"sasl:digest-md5:{SASL_USER}:{SASL_PASSWORD}")
    assert (sasl.scheme, sasl.mechanism, sasl.user) == ("sasl", "DIGEST-MD5", SASL_USER)
    assert_no_secret(repr(sasl))


@pytest.mark.parametrize("argv, words", [
    (["--zk-auth", f"plain:{USER}:{PASSWORD}"], ["--zk-auth", "unknown scheme"]),
    (["--zk-auth", f"digest:{USER}"], ["--zk-auth", "digest:USER:PASSWORD"]),
    (["--zk-auth", f"digest:{USER}:"], ["user and password both non-empty"]),
    (["--zk-auth", f"sasl:GSSAPI:{USER}:{PASSWORD}"], ["SASL mechanism 'GSSAPI'"]),
    (["--zk-auth", AUTH, "--zk-auth-file", "/etc/hostname"], ["not both"]),
    (["--zk-auth-file", "/nonexistent/zk-auth"], ["--zk-auth-file: no such file"]),
    (["--zk-acl", "closed"], ["--zk-acl"]),
    (["--zk-tls-ca", "/nonexistent/ca.pem"], ["--zk-tls-ca: no such file"]),
    (["--zk-tls-ca", "/etc/hostname"], ["--zk-tls-ca", "no usable PEM"]),
    (["--zk-tls-cert", "/etc/hostname"], ["--zk-tls-cert and --zk-tls-key go together"]),
])
def test_bad_security_flags_are_one_line_exit_2(capsys, argv, words) -> None:
    rc, out, err = cli(capsys, "status", *argv, "--zk", "127.0.0.1:1", "--zk-timeout", "1")
    one_line(rc, err, *words)
    assert out == ""


def test_auth_from_env_and_bad_files_are_usage_errors(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    rc, _, err = cli(capsys, "status", "--zk", "127.0.0.1:1",
                     env={"ZKCRAWL_ZK_AUTH_FILE": str(empty)})
    one_line(rc, err, "empty credentials")
    rc, _, err = cli(capsys, "status", "--zk", "127.0.0.1:1",
                     env={"ZKCRAWL_ZK_AUTH": f"digest:{USER}"})
    one_line(rc, err, "$ZKCRAWL_ZK_AUTH" if "$ZKCRAWL" in err else "--zk-auth")
    with pytest.raises(UsageError):
        CommonSettings(zk_tls_cert="/etc/hostname", zk_tls_key="/etc/hostname").validate()


# -- a server that requires authentication -----------------------------------------------
def test_no_credentials_and_wrong_passwords_are_one_line_exit_2(auth_zk, auth_file, capsys
                                                               ) -> None:
    root = f"/t-{uuid.uuid4().hex[:10]}"
    args = common(auth_zk.hosts, root)
    rc, _, err = cli(capsys, "pause", *args, env={"ZKCRAWL_ZK_AUTH_FILE": str(auth_file)})
    assert rc == 0, err
    rc, _, err = cli(capsys, "status", *args)
    one_line(rc, err, "requires authentication", "--zk-auth")
    started = time.monotonic()
    rc, _, err = cli(capsys, "status", *args, "--zk-auth", f"digest:{USER}:{WRONG}")
    one_line(rc, err, "wrong password", f"digest user '{USER}'", root)
    assert time.monotonic() - started < 5
    rc, _, err = cli(capsys, "resume", *args, env={"ZKCRAWL_ZK_AUTH": f"digest:{USER}:{WRONG}"})
    one_line(rc, err, "wrong password")
    with client(auth_zk.hosts, AUTH) as zk:
        assert json.loads(zk.get(f"{root}/control")[0])["state"] == "paused"
    # The daemons too: one line, exit 2, before any work.
    urls = auth_file.parent / "urls.txt"
    urls.write_text("http://127.0.0.1:9/x\n")
    wrong = {"ZKCRAWL_ZK_AUTH": f"digest:{USER}:{WRONG}"}
    capsys.readouterr()
    assert producer_main([*args, "--from-file", str(urls)], wrong) == ExitStatus.USAGE
    one_line(ExitStatus.USAGE, capsys.readouterr().err, "zkcrawl-producer: error: wrong password")
    assert consumer_main([*args, "--out", str(auth_file.parent / "o.jsonl")], wrong) == 2
    one_line(ExitStatus.USAGE, capsys.readouterr().err, "zkcrawl-consumer: error: wrong password")


def test_creator_acl_lets_others_read_but_not_write(auth_zk, capsys) -> None:
    root = f"/t-{uuid.uuid4().hex[:10]}"
    rc, _, err = cli(capsys, "pause", *common(auth_zk.hosts, root), "--zk-auth", AUTH)
    assert rc == 0, err
    with client(auth_zk.hosts, AUTH) as owner:
        expected = [(31, "digest", owner.auth.acl_id[1]), (1, "world", "anyone")]  # type: ignore[union-attr]
        assert owner.acl == expected
        for path in (root, f"{root}/control"):
            assert owner.get_acl(path) == expected
        owner.ensure_path(f"{root}/queue")
        owner.create(f"{root}/queue/qn-", b"http://127.0.0.1/x", sequence=True)
        owner.transaction().create(f"{root}/queue/qn-", b"http://127.0.0.1/y", sequence=True)
        tx = owner.transaction()
        tx.create(f"{root}/queue/qn-", b"http://127.0.0.1/z", sequence=True)
        tx.commit()
        owner.create_many_async(f"{root}/m", f"{root}/queue/qn-", [b"http://127.0.0.1/w"]
                                ).get(timeout=5)
        for name in owner.get_children(f"{root}/queue"):
            assert owner.get_acl(f"{root}/queue/{name}") == expected  # multi creates too

    with client(auth_zk.hosts, f"digest:mallory:{WRONG}") as other:
        assert other.get(f"{root}/control")[0]  # world READ: admin views work
        items = other.get_children(f"{root}/queue")
        assert len(items) == 3
        with pytest.raises(ZkAccessDenied) as denied:
            other.create(f"{root}/queue/qn-", b"http://evil.test/", sequence=True)
        assert isinstance(denied.value, NoAuthError) and "digest user 'mallory'" in str(
            denied.value)
        assert_no_secret(str(denied.value))
        with pytest.raises(NoAuthError):
            other.set(f"{root}/control", b'{"state": "running"}')
        with pytest.raises(NoAuthError):
            other.delete(f"{root}/queue/{items[0]}")
        with pytest.raises(NoAuthError):
            other.ensure_path(f"{root}/dead")
        results = other.transaction()
        results.delete(f"{root}/queue/{items[1]}")
        assert isinstance(results.commit()[0], NoAuthError)
        # `zkcrawl status` as another identity: reads only, works.
    rc, out, err = cli(capsys, "status", "--json", *common(auth_zk.hosts, root),
                       "--zk-auth", f"digest:mallory:{WRONG}")
    assert rc == 0 and json.loads(out)["queue"]["depth"] == 3, err
    rc, out, err = cli(capsys, "resume", *common(auth_zk.hosts, root),
                       "--zk-auth", f"digest:mallory:{WRONG}")
    # A logged warning at connect, then the refused write: one error line, never a trace.
    warning, error = err.strip().splitlines()
    assert "does not let digest user 'mallory' write" in json.loads(warning)["problem"]
    assert rc != 0 and error.startswith("zkcrawl resume: error: "), err
    assert f"ZooKeeper denied create of {root}/control to digest user 'mallory' (ACL of " \
        f"{root}: digest:crawler=ALL, world:anyone=READ): NoAuth" in error, err
    assert_no_secret(out, err)


def test_zk_acl_open_creates_world_writable_nodes(auth_zk, capsys) -> None:
    root = f"/t-{uuid.uuid4().hex[:10]}"
    rc, _, err = cli(capsys, "pause", *common(auth_zk.hosts, root), "--zk-acl", "open",
                     env={"ZKCRAWL_ZK_AUTH": AUTH})
    assert rc == 0, err
    with client(auth_zk.hosts, f"digest:mallory:{WRONG}") as other:
        assert other.get_acl(f"{root}/control") == [(31, "world", "anyone")]
        other.set(f"{root}/control", b'{"state": "running"}')
    # Credentials with the default ACL on that open root: a warning, never the secret.
    rc, _, err = cli(capsys, "status", *common(auth_zk.hosts, root), "--zk-auth", AUTH)
    assert rc == 0 and "anyone who reaches ZooKeeper may write it" in err
    assert_no_secret(err)


@pytest.mark.skipif(not sasl_available(), reason="SASL needs the pure-sasl package")
def test_sasl_digest_md5(auth_zk, capsys) -> None:
    root = f"/t-{uuid.uuid4().hex[:10]}"
    sasl = f"sasl:DIGEST-MD5:{SASL_USER}:{SASL_PASSWORD}"
    rc, _, err = cli(capsys, "pause", *common(auth_zk.hosts, root), "--zk-auth", sasl,
                     "--log-level", "debug")
    assert rc == 0, err
    assert_no_secret(err)
    with client(auth_zk.hosts, sasl) as zk:
        assert zk.get_acl(f"{root}/control") == [(31, "sasl", SASL_USER),
                                                 (1, "world", "anyone")]
    started = time.monotonic()
    rc, _, err = cli(capsys, "status", *common(auth_zk.hosts, root),
                     "--zk-auth", f"sasl:DIGEST-MD5:{SASL_USER}:{WRONG}")
    one_line(rc, err, "refused the credentials", f"SASL DIGEST-MD5 user '{SASL_USER}'")
    assert time.monotonic() - started < 5


def _secret_free_process_args(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        args = fh.read()
    assert_no_secret(args)
    return args


def test_real_processes_with_credentials_never_show_the_password(auth_zk, auth_file, site,
                                                                 tmp_path, capsys) -> None:
    """Producer (credentials in a file) and consumer (in the environment) processes crawl
    through the auth-requiring server; their stderr, command lines, status znodes and
    /metrics never hold the password; then every admin command works with it."""
    root = f"/t-{uuid.uuid4().hex[:10]}"
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{site.url(f'/a/{i}')}\n" for i in range(6)))
    out = tmp_path / "records.jsonl"
    port = free_port()
    base = ["--zk", auth_zk.hosts, "--root", root, "--zk-timeout", "8",
            "--log-format", "json", "--log-level", "debug"]
    consumer = subprocess.Popen(
        [sys.executable, "-m", "zkcrawl.consumer.main", *base, "--id", "c1", "--threads", "2",
         "--out", str(out), "--exit-when-idle", "3", "--metrics-port", str(port),
         "--allow-private-addresses", "--no-robots", "--domain-delay", "0"],
        cwd=REPO, env=proc_env(ZKCRAWL_ZK_AUTH=AUTH), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    try:
        with client(auth_zk.hosts, AUTH) as zk:
            wait_for(lambda: zk.exists(f"{root}/consumers/c1"), 20, "consumer registered")
            status = zk.get(f"{root}/consumers/c1")[0]
            assert_no_secret(status)
            _secret_free_process_args(consumer.pid)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                assert_no_secret(r.read())
            producer = subprocess.run(
                [sys.executable, "-m", "zkcrawl.producer.main", *base, "--from-file", str(urls),
                 "--allow-private-addresses", "--zk-auth-file", str(auth_file)],
                cwd=REPO, env=proc_env(), capture_output=True, timeout=60)
            assert producer.returncode == 0, producer.stderr.decode()[-3000:]
            assert_no_secret(producer.stdout, producer.stderr)
            assert zk.get_acl(f"{root}/queue") == [(31, "digest", zk.auth.acl_id[1]),  # type: ignore[union-attr]
                                                   (1, "world", "anyone")]
        stdout, stderr = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 0, stderr.decode()[-3000:]
    assert_no_secret(stdout, stderr)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["title"] for r in records) == [f"article {i}" for i in range(6)]
    assert all(r["error"] is None for r in records)

    env = {"ZKCRAWL_ZK_AUTH_FILE": str(auth_file)}
    args = common(auth_zk.hosts, root)
    for argv in (["status", "--json"], ["pause"], ["resume"], ["dead", "list"],
                 ["queue", "list"]):
        rc, stdout_text, err = cli(capsys, *argv, *args, "--log-level", "debug", env=env)
        assert rc == 0, (argv, err)
        assert_no_secret(stdout_text, err)
    rc, stdout_text, _ = cli(capsys, "status", "--json", *args, env=env)
    doc = json.loads(stdout_text)
    assert doc["queue"]["depth"] == 0 and doc["control"] == "running"
    with client(auth_zk.hosts, AUTH) as zk:
        assert zk.get_acl(f"{root}/control")[0][1] == "digest"


# -- a server with a TLS client port -------------------------------------------------------
def tls_args(pki: Pki) -> list[str]:
    return ["--zk-tls", "--zk-tls-ca", str(pki.ca_cert), "--zk-tls-cert", str(pki.client_cert),
            "--zk-tls-key", str(pki.client_key)]


def test_crawl_over_tls(tls_zk, pki, site, tmp_path, capsys) -> None:
    root = f"/t-{uuid.uuid4().hex[:10]}"
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{site.url(f'/a/{i}')}\n" for i in range(3)))
    out = tmp_path / "records.jsonl"
    base = ["--zk", tls_zk.tls_hosts, "--root", root, "--zk-timeout", "8",
            "--log-format", "json"]
    producer = subprocess.run(
        [sys.executable, "-m", "zkcrawl.producer.main", *base, *tls_args(pki), "--from-file",
         str(urls), "--allow-private-addresses"],
        cwd=REPO, env=proc_env(), capture_output=True, timeout=60)
    assert producer.returncode == 0, producer.stderr.decode()[-3000:]
    rc, stdout_text, err = cli(capsys, "status", "--json", *common(tls_zk.tls_hosts, root),
                               *tls_args(pki))
    assert rc == 0 and json.loads(stdout_text)["queue"]["depth"] == 3, err
    consumer = subprocess.run(
        [sys.executable, "-m", "zkcrawl.consumer.main", *base, "--id", "tls1", "--out", str(out),
         "--exit-when-idle", "1", "--allow-private-addresses", "--no-robots",
         "--domain-delay", "0"],
        cwd=REPO, capture_output=True, timeout=60,
        env=proc_env(ZKCRAWL_ZK_TLS="1", ZKCRAWL_ZK_TLS_CA=str(pki.ca_cert),
                     ZKCRAWL_ZK_TLS_CERT=str(pki.client_cert),
                     ZKCRAWL_ZK_TLS_KEY=str(pki.client_key)))
    assert consumer.returncode == 0, consumer.stderr.decode()[-3000:]
    titles = sorted(json.loads(line)["title"] for line in out.read_text().splitlines())
    assert titles == [f"article {i}" for i in range(3)]


def test_tls_with_a_wrong_ca_is_one_line_exit_2_at_once(tls_zk, pki, tmp_path, capsys
                                                       ) -> None:
    other = make_pki(tmp_path / "other")
    args = common(tls_zk.tls_hosts, "/zkcrawl")
    started = time.monotonic()
    rc, _, err = cli(capsys, "status", *args, "--zk-tls-ca", str(other.ca_cert),
                     "--zk-tls-cert", str(pki.client_cert), "--zk-tls-key",
                     str(pki.client_key))
    one_line(rc, err, "TLS handshake with ZooKeeper", "failed", "CERTIFICATE_VERIFY_FAILED")
    assert time.monotonic() - started < 5  # not the 8 s --zk-timeout: a configuration error
    # The server's CA but a client certificate it does not trust (mutual TLS).
    rc, _, err = cli(capsys, "status", *args, "--zk-tls-ca", str(pki.ca_cert),
                     "--zk-tls-cert", str(other.client_cert), "--zk-tls-key",
                     str(other.client_key))
    one_line(rc, err, "TLS handshake with ZooKeeper")


def test_zk_client_refuses_tls_failures_with_a_security_error(tls_zk, pki) -> None:
    from zkcrawl.zk.security import ZkTls

    with pytest.raises(ZkSecurityError, match="TLS handshake"):
        ZkClient(tls_zk.tls_hosts, zk_timeout=8,
                 tls=ZkTls(str(make_pki(pki.directory / "x").ca_cert), str(pki.client_cert),
                           str(pki.client_key))).connect()
    with ZkClient(tls_zk.tls_hosts, zk_timeout=8,
                  tls=ZkTls(str(pki.ca_cert), str(pki.client_cert), str(pki.client_key))
                  ) as zk:
        zk.ensure_path("/tls-ok")
        assert zk.get_acl("/tls-ok") == [(31, "world", "anyone")]


def test_tls_and_plain_ports_mixed_up_are_one_clear_line(tls_zk, pki, capsys) -> None:
    rc, _, err = cli(capsys, "status", *common(tls_zk.hosts, "/zkcrawl"), *tls_args(pki))
    one_line(rc, err, "TLS handshake with ZooKeeper", "secureClientPort")  # TLS to plain
    rc, _, err = cli(capsys, "status", "--zk", tls_zk.tls_hosts, "--zk-timeout", "2")
    # plain to the TLS port: to the client, an unreachable ZooKeeper (exit 75), with the hint
    one_line(rc, err, "cannot reach ZooKeeper", "add --zk-tls", status=75)


def test_secrets_others_may_read_are_warned_about(auth_zk, auth_file, capsys) -> None:
    auth_file.chmod(0o644)
    rc, _, err = cli(capsys, "status", *common(auth_zk.hosts, "/zkcrawl"),
                     "--zk-auth-file", str(auth_file))
    assert rc == 0 and "readable or writable by group or others (mode 0644)" in err, err
    settings = CommonSettings(zk_auth=AUTH)
    assert "visible to every local user" in settings.zk_security_warnings(
        ["status", "--zk-auth", AUTH])[0]
    assert settings.zk_security_warnings(["status"]) == []
    assert_no_secret(err)
