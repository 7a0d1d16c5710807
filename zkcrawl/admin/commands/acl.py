"""``zkcrawl acl check|fix``: the ACLs of a crawl root (SPEC §4 "Security flags").

* ``check``: each node a crawl relies on (the root and the nodes
  :class:`~zkcrawl.queue.layout.Layout` names under it) with its ACL and a verdict: ``ok``,
  ``OPEN`` (others may write it), ``denied`` (another identity's) or ``missing``; exit 1 on
  OPEN or denied.
* ``fix``: with credentials, every node of the root whose ACL lets others write gets this
  identity's creator ACL (other named identities kept); exit 1 naming a node it could not
  fix.

Consumers and producers with credentials refuse an open root in one line naming this
command (``--zk-acl fix`` repairs at start). Shown names and ACLs are escaped
(:func:`printable`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Mapping

from zkcrawl.admin.cluster import session
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.queue.layout import Layout
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings
from zkcrawl.textsafe import printable
from zkcrawl.zk import ZkClient
from zkcrawl.zk.acls import check_acls, fix_acls
from zkcrawl.zk.security import describe_acl, open_writers, relied_on

NAME = "acl"
_FAILED_SHOWN = 20
HELP = "check or fix the ACLs of a crawl root (nodes others may write)"
EXAMPLES = """
    zkcrawl acl check --zk-auth-file /etc/zkcrawl/zk-auth
    zkcrawl acl fix --zk-auth-file /etc/zkcrawl/zk-auth --root /crawl
"""


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    pass


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("check", "fix"),
                        help="check: show each node's ACL; fix: give the nodes others may "
                        "write this identity's creator ACL")


def _session(settings: Settings) -> contextlib.AbstractContextManager[ZkClient]:
    return session(settings, guard=False)


def check(settings: Settings) -> ExitStatus:
    """Print each node with its ACL and verdict; exit 1 if one is open to others."""
    with _session(settings) as zk:
        result = check_acls(zk, relied_on(Layout.of(settings.root)))
    rows = []
    for path, acl in result.acls.items():
        if acl is None:
            rows.append((path, "-", "missing"))
            continue
        writers = open_writers(acl)
        rows.append((path, describe_acl(acl), f"OPEN: {writers} may write it" if writers
                     else "denied: this identity may not write it" if path in result.denied
                     else "ok"))
    shown = [(printable(p), printable(a), printable(v)) for p, a, v in rows]
    widths = [max(len(r[i]) for r in shown) for i in (0, 1)]
    for path, acl_text, verdict in shown:
        print(f"{path.ljust(widths[0])}  {acl_text.ljust(widths[1])}  {verdict}")
    for warning in result.warnings:
        print(f"zkcrawl acl: warning: {printable(warning)}", file=sys.stderr)
    if result.open:
        fix = "zkcrawl acl fix" if zk.auth is not None else (
            "zkcrawl acl fix --zk-auth-file FILE (credentials needed)")
        print(f"{len(result.open)} node(s) others may write: run `{fix}`")
    if result.denied:
        print(f"{len(result.denied)} node(s) this identity may not write: remove them as their "
              "owner or ZooKeeper's superuser")
    return ExitStatus.FAILURE if result.open or result.denied else ExitStatus.OK


def fix(settings: Settings) -> ExitStatus:
    """Repair the whole root; exit 1 if a node could not be fixed."""
    if settings.zk_credentials() is None:
        raise UsageError("acl fix needs credentials (--zk-auth or --zk-auth-file): the ACL it "
                         "sets grants ALL to that identity")
    if settings.zk_acl == "open":
        raise UsageError("acl fix with --zk-acl open: nothing to fix (open is what that asks for)")
    with _session(settings) as zk:
        root = Layout.of(settings.root).root or "/"
        done = fix_acls(zk, [root])
        identity = zk.auth.describe() if zk.auth is not None else "?"
    for path, why in done.failed[:_FAILED_SHOWN]:
        print(f"zkcrawl acl: error: {printable(path)} not fixed: {printable(why)}",
              file=sys.stderr)
    if len(done.failed) > _FAILED_SHOWN:
        print(f"zkcrawl acl: error: ... and {len(done.failed) - _FAILED_SHOWN} more not fixed",
              file=sys.stderr)
    shown = ", ".join(printable(p) for p in done.fixed[:5])
    more = f" and {len(done.fixed) - 5} more" if len(done.fixed) > 5 else ""
    print(f"checked {done.checked} node(s) under {printable(root)}; fixed {len(done.fixed)}"
          + (f" ({shown}{more})" if done.fixed else "")
          + f": ALL for {identity}, READ for anyone")
    return ExitStatus.FAILURE if done.failed else ExitStatus.OK


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    setup_logging(settings)
    return check(settings) if ns.action == "check" else fix(settings)
