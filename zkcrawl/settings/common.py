"""The flags every command takes (SPEC §4): ZooKeeper, its security, logging, ``--config``.

:class:`CommonSettings` is the base of every command's settings. Its ``validate()`` refuses
what no command can work with; its credentials are read only when asked for, and its repr
leaves the secret fields out. :func:`is_shared` tells which of its flags keep one
environment name (``ZKCRAWL_<FLAG>``) for every command.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

from zkcrawl.errors import UsageError
from zkcrawl.settings.config_file import load_toml
from zkcrawl.settings.options import (
    CONFIGURATION,
    LOGGING,
    ZK_SECURITY,
    ZOOKEEPER,
    Field,
    flag_name,
    is_secret,
    opt,
)
from zkcrawl.settings.validate import zk_hosts_problem, znode_path_problem
from zkcrawl.zk.security import (
    ACL_MODES,
    ZkAuth,
    ZkTls,
    parse_auth,
    read_auth_file,
    world_readable_warning,
)


@dataclasses.dataclass(frozen=True)
class CommonSettings:
    """Flags every command takes (SPEC §4)."""

    zk: str = opt("127.0.0.1:2181", "ZooKeeper connect string, e.g. zk1:2181,zk2:2181,zk3:2181",
                  metavar="HOSTS", group=ZOOKEEPER)
    root: str = opt("/zkcrawl", "root znode of this crawl", group=ZOOKEEPER)
    config: str | None = opt(None, "TOML file with settings (keys named like the flags)",
                             metavar="FILE.toml", group=CONFIGURATION)
    log_format: str = opt("auto", "log format (auto: console on a TTY, JSON otherwise)",
                          choices=("auto", "json", "console"), group=LOGGING)
    log_level: str = opt("info", "log level",
                         choices=("debug", "info", "warning", "error"), group=LOGGING)
    zk_timeout: float = opt(10.0, "seconds to wait for ZooKeeper before giving up (exit 75)",
                            metavar="S", group=ZOOKEEPER)
    session_timeout: float = opt(10.0, "ZooKeeper session timeout in seconds: how fast the "
                                 "leases of a dead process are released", metavar="S",
                                 group=ZOOKEEPER)
    zk_auth: str | None = opt(None, "ZooKeeper credentials: digest:USER:PASSWORD or "
                              "sasl:DIGEST-MD5:USER:PASSWORD (prefer --zk-auth-file or the "
                              "environment: a command line is visible in ps)",
                              metavar="SCHEME:CREDENTIALS", secret=True, group=ZK_SECURITY)
    zk_auth_file: str | None = opt(None, "file whose first line holds the --zk-auth "
                                   "credentials (mode 600)", metavar="PATH",
                                   group=ZK_SECURITY)
    zk_acl: str = opt("creator", "ACL of the znodes zkcrawl creates, with credentials: "
                      "creator = ALL for that identity + READ for anyone (a consumer or "
                      "producer refuses a root whose nodes others may write); fix = "
                      "creator, and such nodes get it at start; open = anyone may do "
                      "anything", choices=ACL_MODES, group=ZK_SECURITY)
    zk_tls: bool = opt(False, "connect to ZooKeeper over TLS (its secureClientPort); any "
                       "--zk-tls-* file turns it on", group=ZK_SECURITY)
    zk_tls_ca: str | None = opt(None, "PEM CA bundle the server certificate must chain to "
                                "(default: the system's)", metavar="PATH",
                                group=ZK_SECURITY)
    zk_tls_cert: str | None = opt(None, "PEM client certificate (mutual TLS; with "
                                  "--zk-tls-key)", metavar="PATH",
                                  group=ZK_SECURITY)
    zk_tls_key: str | None = opt(None, "PEM unencrypted private key of --zk-tls-cert",
                                 metavar="PATH", group=ZK_SECURITY)

    #: True for the daemons, whose deployments set ``ZKCRAWL_<FLAG>`` before each command had
    #: its own names: they still read such an old name (one deprecation line) when the new
    #: one is unset (:mod:`zkcrawl.settings.deprecated`). Admin commands never read them (a
    #: consumer's ZKCRAWL_TIMEOUT made the demo give up after 2 s).
    legacy_env_names: typing.ClassVar[bool] = False
    #: True where an empty ``--zk`` means something (bench: start a throwaway server).
    zk_optional: typing.ClassVar[bool] = False

    def validate(self) -> None:
        """Raise :class:`UsageError` for values no command can work with."""
        problem = zk_hosts_problem(self.zk) if self.zk or not self.zk_optional else None
        if problem:
            raise UsageError(f"--zk: {problem} in {self.zk[:200]!r} "
                             "(expected HOST:PORT[,HOST:PORT...][/chroot])")
        problem = znode_path_problem(self.root)
        if problem:
            raise UsageError(f"--root must be an absolute znode path ({problem}), "
                             f"got {self.root!r}")
        if self.zk_timeout <= 0 or self.session_timeout <= 0:
            raise UsageError("--zk-timeout and --session-timeout must be positive")
        if self.zk_credentials() is None and self.zk_acl == "fix":
            raise UsageError("--zk-acl fix needs credentials (--zk-auth or --zk-auth-file): "
                             "without them every znode is open to anyone")
        tls = self.zk_tls_settings()
        if tls is not None:
            tls.check()

    def __str__(self) -> str:
        return repr(self)  # the dataclass repr leaves the secret fields out

    def zk_credentials(self) -> ZkAuth | None:
        """The identity of ``--zk-auth`` or ``--zk-auth-file`` (read now), or None."""
        if self.zk_auth is not None and self.zk_auth_file is not None:
            raise UsageError("give --zk-auth or --zk-auth-file, not both")
        if self.zk_auth_file is not None:
            return read_auth_file(self.zk_auth_file)
        if self.zk_auth is not None:
            return parse_auth(self.zk_auth)
        return None

    def zk_tls_settings(self) -> ZkTls | None:
        """TLS to ZooKeeper (``--zk-tls`` or any ``--zk-tls-*`` file), or None."""
        files = (self.zk_tls_ca, self.zk_tls_cert, self.zk_tls_key)
        if not self.zk_tls and all(f is None for f in files):
            return None
        return ZkTls(*files)

    def zk_security_warnings(self, argv: Sequence[str] = ()) -> list[str]:
        """Secrets others may read (logged once connected): credentials in ``argv`` (the
        process's command line, visible in ``ps``), a file readable by group or others."""
        out = []
        if self.zk_auth is not None and any(a == "--zk-auth" or a.startswith("--zk-auth=")
                                            for a in argv):
            out.append("--zk-auth on the command line is visible to every local user (ps, "
                       "/proc): use --zk-auth-file or $ZKCRAWL_ZK_AUTH")
        if self.zk_auth_file is not None:
            warning = world_readable_warning(self.zk_auth_file, "--zk-auth-file")
            if warning:
                out.append(warning)
        warning = self._config_secret_warning()
        if warning:
            out.append(warning)
        tls = self.zk_tls_settings()
        if tls is not None and tls.key is not None:
            warning = world_readable_warning(tls.key, "--zk-tls-key")
            if warning:
                out.append(warning)
        return out

    def _config_secret_warning(self) -> str | None:
        """A ``--config`` file that holds a secret (``zk-auth``) and that group or others
        may read or write."""
        if self.config is None or self.zk_auth is None:
            return None
        try:
            keys = set(load_toml(self.config))
        except UsageError:
            return None
        secrets = sorted(f.name for f in dataclasses.fields(self)
                         if is_secret(f) and f.name in keys)
        if not secrets:
            return None
        return world_readable_warning(
            self.config, f"--config (it holds {', '.join(flag_name(n)[2:] for n in secrets)})")


_COMMON = {f.name: f for f in dataclasses.fields(CommonSettings)}


def is_shared(cls: type, name: str) -> bool:
    """True for a flag every command shares with one meaning (``--zk``, ``--root``,
    ``--zk-*``, ``--log-*``, ``--session-timeout``): a field of :class:`CommonSettings` the
    command does not redefine, except ``--config`` (each command has its own file)."""
    if name not in _COMMON or name == "config":
        return False
    own = {f.name: f for f in dataclasses.fields(cls)}
    return own.get(name) is _COMMON[name]


def group_of(field: Field) -> str | None:
    """A field's help group: its own, else that of the shared field it redefines."""
    group: str | None = field.metadata.get("group")
    if group is None and field.name in _COMMON:
        group = _COMMON[field.name].metadata.get("group")
    return group
