"""A throwaway local PostgreSQL server, for the tests (the ``pg_server`` fixture) and
``zkcrawl bench crawl``'s PostgreSQL cases: Debian's ``initdb`` + ``pg_ctl`` on a temporary
directory and a free port on 127.0.0.1 (``trust`` authentication, loopback only, no Unix
socket). PostgreSQL refuses to run as root: as root the cluster is made and run as
``nobody``. scripts/run.sh installs the ``postgresql`` package for the tests."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from zkcrawl.admin.localzk import free_port
from zkcrawl.errors import ZkCrawlError


class LocalPgError(ZkCrawlError):
    """A local PostgreSQL could not be found or started."""


USER = "postgres"  # the database superuser initdb creates
RUN_AS = "nobody"  # the system user the server runs as when the tests run as root


def pg_bin() -> Path:
    """The newest installed server's bin directory (Debian keeps it off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    if which:
        return Path(os.path.realpath(which)).parent
    raise RuntimeError("PostgreSQL server binaries not found: apt-get install postgresql "
                       "(bash scripts/run.sh test installs it)")


class PgServer:
    """One throwaway cluster: :meth:`start`, :meth:`stop` (also to simulate an outage:
    :meth:`start` again brings it back on the same port), :meth:`destroy`."""

    def __init__(self, durable: bool = False) -> None:
        self.durable = durable
        self.bin = pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="zkcrawl-pg-"))
        os.chmod(self.root, 0o755)  # nobody must reach the data directory inside
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam(RUN_AS)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        self.data.mkdir(mode=0o700)
        self.log.touch()
        if self._user:
            for path in (self.data, self.log):
                os.chown(path, self._user["user"], self._user["group"])
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust",
                  "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        proc = subprocess.run([str(self.bin / tool), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=self.root, check=False, **self._user)
        if proc.returncode != 0:
            raise LocalPgError(f"{tool} failed ({proc.returncode}): {proc.stderr.strip()}\n"
                               f"{self.log_tail()}")

    def start(self) -> PgServer:
        # Not durable (the tests): fsync off on a shared CI disk; the sink's rule is the
        # commit, which the tests observe through the server, not the disk. Durable (the
        # bench): the defaults, a commit waits for its WAL fsync like the JSONL sink's.
        opts = f"-p {self.port} -h 127.0.0.1 -k '' -c max_connections=60"
        if not self.durable:
            opts += " -c fsync=off -c full_page_writes=off"
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l",
                  str(self.log), "-o", opts)
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data))

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except (LocalPgError, subprocess.TimeoutExpired):
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, table: str | None = None, db: str = "postgres") -> str:
        """A ``--out`` URL; a fresh table name by default (tests never share rows)."""
        table = table or f"t_{uuid.uuid4().hex[:12]}"
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}?table={table}"

    def conninfo(self, db: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}"

    def query(self, text: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one statement with a connection of its own; its rows (if any)."""
        import psycopg

        with psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(text, args or None)
            return cur.fetchall() if cur.description else []

    def add_password_role(self, role: str, password: str, timeout: float = 30) -> None:
        """Create login ``role`` that must give ``password`` (scram-sha-256) over TCP, the
        other roles keeping ``trust``; returns once the server asks it for the password."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)))
            hba = self.data / "pg_hba.conf"
            rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
            hba.write_text(rule + hba.read_text())  # the first matching line wins
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the reload is asynchronous
            try:
                psycopg.connect(f"postgresql://{role}@127.0.0.1:{self.port}/postgres",
                                connect_timeout=5, password="", sslmode="disable").close()
            except psycopg.OperationalError:
                return
            time.sleep(0.05)
        raise LocalPgError(f"the server did not start asking {role} for a password")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
