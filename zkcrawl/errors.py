"""One exception root for zkcrawl, and the process exit statuses.

Every error an operator can meet derives from :class:`ZkCrawlError`; the CLI
entry points turn it into exactly one line on stderr and an :class:`ExitStatus`.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """Process exit codes (SPEC §4)."""

    OK = 0
    FAILURE = 1  # runtime failure: the work could not be completed
    USAGE = 2  # bad usage or configuration: a supervisor must not restart it
    TEMPFAIL = 75  # EX_TEMPFAIL (sysexits.h): ZooKeeper unreachable; worth a restart


class ZkCrawlError(Exception):
    """Root of every error zkcrawl raises on purpose."""

    exit_status: ExitStatus = ExitStatus.FAILURE
    prog: str | None = None  # the command its line names; None: the process's own name


class UsageError(ZkCrawlError):
    """Bad flags, bad configuration file, invalid XPath/regex...: exit 2."""

    exit_status = ExitStatus.USAGE


class ZkUnavailable(ZkCrawlError):
    """ZooKeeper could not be reached within the timeout: exit 75, EX_TEMPFAIL (SPEC §4).
    Temporary, unlike a bad configuration (2): a supervisor restarts the process."""

    exit_status = ExitStatus.TEMPFAIL


class LocalZkError(ZkCrawlError):
    """A local ZooKeeper could not be found or started."""

    exit_status = ExitStatus.USAGE


class SinkError(ZkCrawlError):
    """The result sink could not be written: stop claiming, release, exit 1."""

