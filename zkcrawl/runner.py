"""What every entry point shares: parse, configure logging once, connect, and turn
errors into exactly one line on stderr and an exit status (httpie's
``main(argv, env) -> ExitStatus`` shape, so each command runs in-process in tests)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from zkcrawl import logs
from zkcrawl.errors import ExitStatus, ZkCrawlError
from zkcrawl.queue.layout import Layout
from zkcrawl.settings import CommonSettings
from zkcrawl.textsafe import printable
from zkcrawl.zk.acls import check_acls, fix_acls, guarded_nodes
from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.security import ZkSecurityError

Main = Callable[[Sequence[str], Mapping[str, str]], ExitStatus]


def guarded(prog: str, func: Callable[[], ExitStatus], stderr: IO[str] | None = None
            ) -> ExitStatus:
    """Run ``func``; a :class:`ZkCrawlError` becomes one line and its exit status."""
    err = stderr or sys.stderr
    try:
        return func()
    except ZkCrawlError as exc:
        logs.flush()  # the events logged before the failure come before its verdict
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"{getattr(exc, 'prog', None) or prog}: error: {message}", file=err)
        return exc.exit_status
    except SystemExit as exc:  # argparse's --help
        return ExitStatus.OK if exc.code in (0, None) else ExitStatus.USAGE
    except KeyboardInterrupt:
        logs.flush()
        print(f"{prog}: interrupted", file=err)
        return ExitStatus.FAILURE
    finally:
        logs.flush()


def setup_logging(settings: CommonSettings) -> None:
    logs.configure(settings.log_format, settings.log_level)


def connect(settings: CommonSettings, writes: bool = False, guard: bool = True,
            one_shot: bool = False) -> ZkClient:
    """Connect to ``--zk`` within ``--zk-timeout`` (ZkUnavailable -> exit 75). A refused
    loopback port fails at once for a ``one_shot`` command (every admin command, through
    :func:`zkcrawl.admin.cluster.session`: nothing waits for its ZooKeeper to start,
    whatever stderr is) and for a daemon on a TTY; a daemon without a TTY (consumer,
    producer, exporter under a supervisor, started before its local ZooKeeper) keeps
    trying for the timeout. On a TTY a slow connection prints a "connecting to ..." line
    first. With the security flags: credentials (``--zk-auth``/``--zk-auth-file``), the
    ACL of created znodes (``--zk-acl``), TLS (``--zk-tls*``). A wrong password, a refused
    handshake or a server that requires credentials is one line and exit 2
    (ZkSecurityError); so is a
    ``--root`` whose ACL names this user with another password. Warnings (a secret file
    others may read) are logged once, never with the secret. With credentials, the ACLs of
    the root and its containers are checked (:func:`guard_acls`): a process that
    ``writes`` (consumer, producer) refuses a root others may write, in one line; not
    ``guard``: no ACL check (``zkcrawl acl`` does its own)."""
    log = logs.get_logger("zkcrawl.zk")
    for warning in settings.zk_security_warnings(sys.argv[1:]):
        log.warning("zk.security", problem=warning)
    zk = ZkClient(settings.zk, zk_timeout=settings.zk_timeout,
                  session_timeout=settings.session_timeout,
                  auth=settings.zk_credentials(),
                  acl="creator" if settings.zk_acl == "fix" else settings.zk_acl,
                  tls=settings.zk_tls_settings()).connect(
        _connecting_notice(settings), refused_fails=one_shot or sys.stderr.isatty())
    try:
        if guard:
            guard_acls(zk, settings, writes)
    except BaseException:
        zk.close()
        raise
    return zk


def guard_acls(zk: ZkClient, settings: CommonSettings, writes: bool) -> None:
    """SPEC §4 "Security flags": with credentials, read the ACL of the root, of every
    node :class:`~zkcrawl.queue.layout.Layout` puts directly under it and of every
    partition node ``<root>/partitions/<p>`` (:func:`~zkcrawl.zk.acls.guarded_nodes`:
    pipelined, within ``--zk-timeout``). Nodes others may
    write (``world:anyone`` or ``ip:`` with a write permission): with ``--zk-acl fix``
    repaired (and every node below them); with ``--zk-acl open`` accepted; else refused in
    one line naming them and ``zkcrawl acl fix`` (ZkSecurityError, exit 2) when the
    process ``writes``, a logged warning otherwise (read-only admin commands). A process
    that ``writes`` also refuses nodes this identity may not write (another identity made
    them: it could plant items there); an admin command logs the root's warning."""
    if zk.auth is None:
        return
    log = logs.get_logger("zkcrawl.zk")
    check = check_acls(zk, guarded_nodes(zk, Layout.of(settings.root)))
    enforce = settings.zk_acl != "open"
    if enforce and settings.zk_acl == "fix" and check.open:
        _fix(zk, check.open)
        check.open = []
    if writes and enforce and (check.open or check.denied):
        raise ZkSecurityError(check.refusal(settings.zk, settings.root))
    for warning in check.warnings:
        log.warning("zk.acl", problem=warning)
    if enforce and check.open:
        log.warning("zk.acl", problem=check.refusal(settings.zk, settings.root))


def _fix(zk: ZkClient, paths: list[str]) -> None:
    """``--zk-acl fix``: repair ``paths`` and every node below them, or one line naming the
    first node that could not be fixed."""
    done = fix_acls(zk, paths)
    logs.get_logger("zkcrawl.zk").info("zk.acl_fixed", fixed=len(done.fixed),
                                       checked=done.checked, nodes=done.fixed[:10])
    if done.failed:
        path, why = done.failed[0]
        raise ZkSecurityError(f"--zk-acl fix: cannot fix the ACL of {path}: {why} "
                              f"({len(done.failed)} node(s) not fixed)")


def _connecting_notice(settings: CommonSettings) -> Callable[[], None] | None:
    """On a TTY, a slow connection says what it waits for and how long it may take."""
    if not sys.stderr.isatty():
        return None

    def notice() -> None:
        print(f"connecting to ZooKeeper at {printable(settings.zk, 300)} "
              f"(up to {settings.zk_timeout:g} s)...", file=sys.stderr, flush=True)

    return notice


def entry(main: Main) -> Callable[[], None]:
    """Console-script wrapper: ``sys.exit(main(sys.argv[1:], os.environ))``."""

    def run() -> None:
        sys.exit(int(main(sys.argv[1:], os.environ)))

    return run
