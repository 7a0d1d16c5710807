"""A real, throwaway ZooKeeper on loopback: for ``zkcrawl local-zk``, the demo and tests
(:class:`ZkServer`, standalone or a quorum on loopback ports).

* It runs an installed ZooKeeper's JVM directly (``$ZOOKEEPER_HOME`` or Debian's
  ``zookeeper`` package) with a config bound to 127.0.0.1.
* For the security tests: ``require_auth`` (digest; ``sasl_users`` for SASL DIGEST-MD5) and
  ``tls`` (a TLS client port, keys made by :func:`make_pki` with ``openssl``, nothing
  prebuilt).
* Files are private whatever the umask: data directories 0700, config, JAAS, log and PID
  files 0600.
* :func:`stop_pid` signals only the process the PID file names *and* that runs ZooKeeper on
  this directory's ``zoo.cfg`` and started then: an unrelated process is left alone.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from zkcrawl.errors import LocalZkError

DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
# Netty (the TLS client port) needs these beside what zookeeper.jar's manifest names.
DEBIAN_NETTY_EXTRA = ("netty-codec", "netty-resolver", "netty-transport-native-unix-common")
INSTALL_HINT = ("no ZooKeeper installation found: install one with "
                "`apt-get install zookeeper` (Debian/Ubuntu) or set ZOOKEEPER_HOME")


@dataclass(frozen=True)
class ZkInstall:
    java: str
    classpath: str


def find_install(env: Mapping[str, str] | None = None) -> ZkInstall:
    """Locate java and ZooKeeper's jars, or raise :class:`LocalZkError` with the fix."""
    env = os.environ if env is None else env
    java = shutil.which("java") or (f"{env['JAVA_HOME']}/bin/java"
                                    if env.get("JAVA_HOME") else None)
    jars: list[str] = []
    home = env.get("ZOOKEEPER_HOME")
    if home:
        jars = sorted(glob.glob(f"{home}/lib/*.jar") + glob.glob(f"{home}/*.jar"))
    elif os.path.exists(DEBIAN_JAR):
        jars = [DEBIAN_JAR]  # its manifest's Class-Path names the dependencies
        # slf4j-simple so the server log says something (the package ships slf4j-nop).
        jars += [j for j in ("/usr/share/java/slf4j-simple.jar",
                             *(f"/usr/share/java/{n}.jar" for n in DEBIAN_NETTY_EXTRA))
                 if os.path.exists(j)]
    if not jars:
        raise LocalZkError(INSTALL_HINT)
    if not java or not os.path.exists(java):
        raise LocalZkError("ZooKeeper needs Java: install one (`apt-get install "
                           "default-jre-headless`) or set JAVA_HOME")
    return ZkInstall(java=java, classpath=os.pathsep.join(jars))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_problem(port: int) -> str | None:
    """Why a server could not listen on 127.0.0.1:``port`` now (``Address already in use``,
    ``Permission denied``), or None. SO_REUSEADDR as the JVM sets it, so a port left in
    TIME_WAIT by a stopped server is free."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command; '' when the server does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class ServerTls:
    """The TLS client port's stores (PEM, as :func:`make_pki` writes them)."""

    keystore: Path  # the server's private key and certificate
    truststore: Path  # the CA certificates a client certificate must chain to
    client_auth: str = "need"  # need (mutual TLS) | want | none


@dataclass(frozen=True)
class Pki:
    """A throwaway certificate authority and the certificates the TLS tests use, as PEM
    files in ``directory``: the CA, a server certificate for 127.0.0.1 / localhost and a
    client certificate, all signed by the CA (keys unencrypted, mode 0600)."""

    directory: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    server_pem: Path  # key + certificate in one file: ZooKeeper's PEM key store
    client_cert: Path
    client_key: Path

    def server_tls(self, client_auth: str = "need") -> ServerTls:
        return ServerTls(self.server_pem, self.ca_cert, client_auth)


def make_pki(directory: str | os.PathLike[str], days: int = 2) -> Pki:
    """Generate a CA, a server and a client certificate with ``openssl`` (EC P-256)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise LocalZkError("generating test certificates needs `openssl` (apt-get install "
                           "openssl)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        proc = subprocess.run([openssl, *args], cwd=d, capture_output=True, text=True,
                              check=False)
        if proc.returncode:
            raise LocalZkError(f"openssl {args[0]} failed: {proc.stderr.strip()[:500]}")

    def key(name: str) -> None:
        run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", f"{name}.key")
        (d / f"{name}.key").chmod(0o600)

    key("ca")
    run("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", str(days),
        "-subj", "/CN=zkcrawl test CA", "-out", "ca.crt")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                 "extendedKeyUsage=serverAuth,clientAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        key(name)
        run("req", "-new", "-key", f"{name}.key", "-subj", f"/CN=zkcrawl-{name}",
            "-out", f"{name}.csr")
        (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", str(days), "-sha256", "-extfile", f"{name}.ext",
            "-out", f"{name}.crt")
    pem = d / "server.pem"
    pem.write_bytes((d / "server.key").read_bytes() + (d / "server.crt").read_bytes())
    pem.chmod(0o600)
    return Pki(d, d / "ca.crt", d / "server.crt", d / "server.key", pem,
               d / "client.crt", d / "client.key")


class ZkServer:
    """One ZooKeeper server process (standalone, or one member of a quorum)."""

    def __init__(self, data_dir: str | os.PathLike[str], port: int = 0, *,
                 server_id: int | None = None, peers: dict[int, tuple[int, int]] | None = None,
                 tick_ms: int = 500, heap_mb: int = 256, quick_jit: bool = False,
                 require_auth: bool = False, sasl_users: Mapping[str, str] | None = None,
                 tls: ServerTls | None = None) -> None:
        # Absolute: the server's command line names its zoo.cfg, which identifies it later.
        self.data_dir = Path(data_dir).absolute()
        self.port = port or free_port()
        #: Every request needs an authenticated session (digest, or SASL with sasl_users):
        #: ``enforce.auth.enabled`` (ZooKeeper >= 3.7). Clients without one are refused.
        self.require_auth = require_auth
        #: SASL DIGEST-MD5 users (name -> password), through a JAAS file.
        self.sasl_users = dict(sasl_users or {})
        #: A TLS client port beside the plain one (which the readiness probe uses).
        self.tls = tls
        self.secure_port = free_port() if tls else 0
        self.server_id = server_id
        self.peers = peers or {}
        self.tick_ms = tick_ms
        self.heap_mb = heap_mb
        # C1 only: starts and warms up faster, uses less CPU; for tests, not for benchmarks.
        self.quick_jit = quick_jit
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "zookeeper.pid"

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def tls_hosts(self) -> str:
        """The TLS client port's connect string ('' without ``tls``)."""
        return f"127.0.0.1:{self.secure_port}" if self.tls else ""

    def _write_config(self) -> Path:
        private_dir(self.data_dir)
        lines = [f"tickTime={self.tick_ms}", f"dataDir={self.data_dir / 'data'}",
                 f"clientPort={self.port}", "clientPortAddress=127.0.0.1",
                 "admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,mntr,stat",
                 "initLimit=20", "syncLimit=10", "minSessionTimeout=1000",
                 "maxSessionTimeout=60000", "maxClientCnxns=0",
                 "autopurge.purgeInterval=1", "jute.maxbuffer=1048575"]
        private_dir(self.data_dir / "data")  # snapshots and transaction logs: digests, data
        lines += self._security_config()
        if self.peers:
            for sid, (quorum, election) in sorted(self.peers.items()):
                lines.append(f"server.{sid}=127.0.0.1:{quorum}:{election}")
            private_file(self.data_dir / "data" / "myid", f"{self.server_id}\n")
        cfg = self.data_dir / "zoo.cfg"
        private_file(cfg, "\n".join(lines) + "\n")
        return cfg

    def _security_config(self) -> list[str]:
        lines: list[str] = []
        schemes = ["digest"]
        if self.sasl_users:
            lines.append("authProvider.sasl="
                         "org.apache.zookeeper.server.auth.SASLAuthenticationProvider")
            schemes.append("sasl")
            users = "".join(f'\n    user_{name}="{password}"'
                            for name, password in sorted(self.sasl_users.items()))
            private_file(self.data_dir / "jaas.conf",
                         "Server {\n    org.apache.zookeeper.server.auth.DigestLoginModule "
                         f"required{users};\n}};\n")
        if self.require_auth:
            lines += ["authProvider.digest="
                      "org.apache.zookeeper.server.auth.DigestAuthenticationProvider",
                      "enforce.auth.enabled=true", f"enforce.auth.schemes={','.join(schemes)}"]
        if self.tls:
            lines += [f"secureClientPort={self.secure_port}",
                      "secureClientPortAddress=127.0.0.1",
                      "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                      "authProvider.x509="
                      "org.apache.zookeeper.server.auth.X509AuthenticationProvider",
                      f"ssl.keyStore.location={self.tls.keystore}", "ssl.keyStore.type=PEM",
                      f"ssl.trustStore.location={self.tls.truststore}",
                      "ssl.trustStore.type=PEM", f"ssl.clientAuth={self.tls.client_auth}"]
        return lines

    def start(self, wait: float = 30.0, detach: bool = False) -> ZkServer:
        """Start the JVM; with ``wait`` > 0 return once it serves (raise if it does not).
        A client port another process holds is refused at once, naming the port and why."""
        install = find_install()
        busy = port_problem(self.port)
        if busy:
            raise LocalZkError(f"cannot listen on 127.0.0.1:{self.port}: {busy} (another "
                               "process holds the port; choose a free one with --port)")
        cfg = self._write_config()
        main = ("org.apache.zookeeper.server.quorum.QuorumPeerMain" if self.peers
                else "org.apache.zookeeper.server.ZooKeeperServerMain")
        jit = ["-XX:TieredStopAtLevel=1"] if self.quick_jit else []
        cmd = [install.java, f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", *jit,
               "-Dzookeeper.jmx.log4j.disable=true",
               "-Dorg.slf4j.simpleLogger.showDateTime=true",
               f"-Dzookeeper.log.dir={self.data_dir}", *self._jvm_security_options(),
               "-cp", install.classpath, main, str(cfg)]
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(fd, "ab") as log:
            os.fchmod(fd, 0o600)  # one made by an older version may be world-readable
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=detach)
        # The PID and its start time: `local-zk stop` signals that process only.
        private_file(self.pid_path, f"{self.proc.pid} {process_start(self.proc.pid) or 0}\n")
        if wait > 0 and not self.peers:
            self.wait_serving(wait)
        return self

    def _jvm_security_options(self) -> list[str]:
        if not self.sasl_users:
            return []
        return [f"-Djava.security.auth.login.config={self.data_dir / 'jaas.conf'}"]

    def serving(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return False
        reply = four_letter(self.port, "srvr")
        return "Mode:" in reply

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.serving():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise LocalZkError(f"ZooKeeper on port {self.port} exited with status "
                                   f"{self.proc.returncode} before serving: "
                                   f"{self.failure_cause()}; see {self.log_path}")
            time.sleep(0.1)  # the server exposes no readiness event; bounded by timeout
        raise LocalZkError(f"ZooKeeper on port {self.port} did not start within "
                           f"{timeout:g}s; see {self.log_path}:\n{self.log_tail()}")

    def failure_cause(self) -> str:
        """The exception the server's log names last (``java.net.BindException: Address
        already in use``), else its last line."""
        lines = [line.strip() for line in self.log_tail(60).splitlines() if line.strip()]
        causes = [line for line in lines if "Exception" in line and not line.startswith("at ")]
        return (causes or lines or ["no log"])[-1][:300]

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop this server's process (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None
        self.pid_path.unlink(missing_ok=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


class Ensemble:
    """``n`` ZooKeeper servers forming a quorum on loopback ports."""

    def __init__(self, base_dir: str | os.PathLike[str], n: int = 3) -> None:
        peers = {i: (free_port(), free_port()) for i in range(1, n + 1)}
        self.servers = [ZkServer(Path(base_dir) / f"zk{i}", server_id=i, peers=peers,
                                 quick_jit=True)
                        for i in range(1, n + 1)]

    @property
    def hosts(self) -> str:
        return ",".join(s.hosts for s in self.servers)

    def start(self, wait: float = 60.0) -> Ensemble:
        for s in self.servers:
            s.start(wait=0)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if all(s.serving() for s in self.servers if s.proc is not None):
                return self
            time.sleep(0.2)  # quorum election has no event to wait on; bounded
        raise LocalZkError("ensemble did not form within "
                           f"{wait:g}s:\n" + "\n".join(s.log_tail(10) for s in self.servers))

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def leader(self) -> ZkServer | None:
        for s in self.servers:
            if "Mode: leader" in four_letter(s.port, "srvr"):
                return s
        return None


def private_dir(path: Path) -> None:
    """Make ``path`` (and its parents) and keep it 0700: only its owner may list or enter it
    (ZooKeeper's transaction log holds every znode's data and each digest ACL's unsalted
    SHA-1 of ``user:password``)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` created 0600 (an existing file is made 0600 first)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fd, 0o600)
        fh.write(text)


_MAINS = ("org.apache.zookeeper.server.ZooKeeperServerMain",
          "org.apache.zookeeper.server.quorum.QuorumPeerMain")


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22): with the
    PID, it names one process for good (a PID is reused, a PID with its start time is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def is_server_of(pid: int, data_dir: Path, start: int | None) -> bool:
    """True when ``pid`` is the ZooKeeper started for ``data_dir``: its command line runs a
    ZooKeeper main class on ``data_dir/zoo.cfg`` and (when recorded) it started at
    ``start``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
    except OSError:
        return False
    cfg = os.fsencode(Path(data_dir).absolute() / "zoo.cfg")
    if cfg not in args or not any(m.encode() in args for m in _MAINS):
        return False
    return not start or process_start(pid) == start


def server_pid(data_dir: Path) -> tuple[int | None, str]:
    """The local server of ``data_dir`` from its PID file: ``(pid, "running")``; ``(pid,
    "other")`` when that PID is now another process (or gone: pid None is "none" then);
    ``(None, "none")`` without a usable PID file."""
    try:
        words = (data_dir / "zookeeper.pid").read_text(encoding="ascii")[:100].split()
        pid = int(words[0])
        start = int(words[1]) if len(words) > 1 else None
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None, "none"
    if pid <= 1:
        return None, "none"
    if not pid_alive(pid):
        return None, "none"
    return (pid, "running") if is_server_of(pid, data_dir, start) else (pid, "other")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def read_pid(data_dir: Path) -> int | None:
    """The PID the PID file names (whatever process that is now: see :func:`server_pid`)."""
    try:
        return int((data_dir / "zookeeper.pid").read_text(encoding="ascii")[:100].split()[0])
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def stop_pid(data_dir: Path, timeout: float = 10.0) -> bool:
    """Stop the server recorded in ``data_dir`` -- that process only: the PID file's PID is
    signalled only while its command line and start time are those of the server started
    there (checked through a pidfd, which pins the process, where the kernel has them).
    False if none ran; a PID file naming another process is removed, that process left
    alone."""
    pid, state = server_pid(data_dir)
    if state != "running" or pid is None:
        (data_dir / "zookeeper.pid").unlink(missing_ok=True)
        return False
    with _pinned(pid) as send:
        if not is_server_of(pid, data_dir, server_start(data_dir)):
            return False  # it ended and its PID was reused between the two checks
        send(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)  # not our child: no wait() available; bounded
        if pid_alive(pid):
            send(signal.SIGKILL)
    (data_dir / "zookeeper.pid").unlink(missing_ok=True)
    return True


def server_start(data_dir: Path) -> int | None:
    try:
        words = (data_dir / "zookeeper.pid").read_text(encoding="ascii")[:100].split()
        return int(words[1]) if len(words) > 1 else None
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


@contextlib.contextmanager
def _pinned(pid: int) -> Iterator[Callable[[int], None]]:
    """A way to signal ``pid`` that cannot reach another process once it has been checked:
    a pidfd (Linux >= 5.3) pins the process; without one, ``os.kill``."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        yield lambda sig: _kill(pid, sig)
        return
    try:
        yield lambda sig: _pidfd_signal(fd, sig)
    finally:
        os.close(fd)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _pidfd_signal(fd: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(fd, sig)
