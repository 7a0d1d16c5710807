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
from zkcrawl.settings import CommonSettings
from zkcrawl.zk.client import ZkClient

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


def connect(settings: CommonSettings) -> ZkClient:
    """Connect to ``--zk`` within ``--zk-timeout`` (ZkUnavailable -> exit 75), with the
    security flags: credentials (``--zk-auth``/``--zk-auth-file``), the ACL of created
    znodes (``--zk-acl``), TLS (``--zk-tls*``). A wrong password, a refused handshake or a
    server that requires credentials is one line and exit 2 (ZkSecurityError); so is a
    ``--root`` whose ACL names this user with another password. Warnings (a secret file
    others may read, a root anyone may write) are logged once, never with the secret."""
    log = logs.get_logger("zkcrawl.zk")
    for warning in settings.zk_security_warnings(sys.argv[1:]):
        log.warning("zk.security", problem=warning)
    zk = ZkClient(settings.zk, zk_timeout=settings.zk_timeout,
                  session_timeout=settings.session_timeout,
                  auth=settings.zk_credentials(), acl=settings.zk_acl,
                  tls=settings.zk_tls_settings()).connect()
    try:
        for warning in zk.check_access(settings.root):
            log.warning("zk.acl", problem=warning)
    except BaseException:
        zk.close()
        raise
    return zk


def entry(main: Main) -> Callable[[], None]:
    """Console-script wrapper: ``sys.exit(main(sys.argv[1:], os.environ))``."""

    def run() -> None:
        sys.exit(int(main(sys.argv[1:], os.environ)))

    return run
