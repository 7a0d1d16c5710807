"""Typed, frozen settings with one precedence rule for every command.

Each command declares a frozen dataclass whose fields carry their flag, help and
default through :func:`opt`. :func:`add_options` turns the dataclass into
argparse options and :func:`resolve` builds the instance with the precedence
SPEC §4 fixes: **flag > environment > TOML file (``--config``, key = flag name,
dashes or underscores) > default**. Environment names cannot collide across
commands: the flags every command shares are ``ZKCRAWL_<FLAG>`` (``ZKCRAWL_ZK``),
a command's own are ``ZKCRAWL_<COMMAND>_<FLAG>`` (``ZKCRAWL_CONSUMER_TIMEOUT``;
:func:`env_name`); the daemons still read the old ``ZKCRAWL_<FLAG>`` with a
deprecation line. ``--print-config`` shows each value and its :class:`Source`.

Help: ``opt(group=...)`` files a flag under a heading; the command's own groups
come first, the shared ones (:data:`SHARED_GROUPS`) after, then ``general`` and
the command's examples (:func:`add_options`).

Repeatable flags (``--start``, ``--field``...) take a newline-separated list
from the environment and a TOML array (or string) from the file; the first
source that sets them wins as a whole (they are not merged across sources).

Guarantee: whatever the flags, the environment and the file hold (any bytes,
any TOML type, NaN, 1e400, 5000-digit numbers, NUL, lone surrogates, nesting
deep enough to exhaust the stack), :func:`resolve` and :func:`parse` return
settings or raise :class:`UsageError` (exit 2), nothing else (``--print-config``
given: SystemExit(0) after printing, as argparse's ``--help``).  Settings they
return hold only finite floats of magnitude <= :data:`MAX_FLOAT`, integers of
magnitude <= :data:`MAX_INT`, strings without NUL, and a ``--root`` ZooKeeper
accepts (property-tested in tests/test_props_web.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import re
import sys
import textwrap
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from zkcrawl.errors import UsageError
from zkcrawl.zk.security import (
    ZkAuth,
    ZkTls,
    parse_auth,
    read_auth_file,
    world_readable_warning,
)

T = TypeVar("T")

_LIST_TYPES = (tuple, list)
#: No count, size or port needs more; beyond 2**53 floats and C APIs start to lose digits.
MAX_INT = 2**53
#: Every float setting is seconds or a rate: 1e9 s is 31 years, while threading and sleeps
#: refuse timeouts above threading.TIMEOUT_MAX (~9.2e9 s) with OverflowError.
MAX_FLOAT = 1e9
# Characters ZooKeeper refuses in a znode path (PathUtils.validatePath).
_ZK_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")


#: Help groups, in the order ``--help`` shows them: the command's own options first, the
#: flags every command shares (:data:`SHARED_GROUPS`) after them. A field names its group
#: with ``opt(..., group=...)``; without one it lands in the command's ``options`` group
#: (with the options ``configure()`` adds), which comes first of all.
INPUT = "input"
FILTERING = "link filtering"
DEDUP = "de-duplication"
QUEUE = "queue"
WORKERS = "workers"
FETCHING = "fetching"
POLITENESS = "politeness"
OUTPUT = "output"
DELIVERY = "delivery"
OPERATIONS = "operations"
ZOOKEEPER = "ZooKeeper"
ZK_SECURITY = "ZooKeeper security"
LOGGING = "logging"
CONFIGURATION = "configuration"
GROUP_ORDER = (INPUT, FILTERING, DEDUP, QUEUE, WORKERS, FETCHING, POLITENESS, OUTPUT, DELIVERY,
               OPERATIONS)
SHARED_GROUPS = (ZOOKEEPER, ZK_SECURITY, LOGGING, CONFIGURATION)


def opt(default: Any, help: str, *, group: str | None = None, repeat: bool = False,
        choices: Sequence[str] | None = None, negatable: bool = False,
        metavar: str | None = None, short: str | None = None, secret: bool = False) -> Any:
    """A settings field: its default and how it appears on the command line. ``group`` is
    its heading in ``--help`` (e.g. :data:`OUTPUT`; a new name makes a new heading).
    A ``secret`` one is left out of the dataclass's repr and shown as ``***`` by
    :func:`redacted`."""
    meta = {"help": help, "group": group, "repeat": repeat, "choices": choices,
            "negatable": negatable, "metavar": metavar, "short": short, "secret": secret}
    if repeat:
        return dataclasses.field(default=tuple(default), metadata=meta, repr=not secret)
    return dataclasses.field(default=default, metadata=meta, repr=not secret)


def redacted(settings: Any) -> dict[str, Any]:
    """The settings as a dict for display (logs, status nodes): secret fields ``***``."""
    return {f.name: ("***" if f.metadata.get("secret") and getattr(settings, f.name)
                     else getattr(settings, f.name))
            for f in dataclasses.fields(settings)}


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
                      "creator = ALL for that identity + READ for anyone; open = anyone "
                      "may do anything", choices=("creator", "open"), group=ZK_SECURITY)
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
    #: one is unset. Admin commands never read them (a consumer's ZKCRAWL_TIMEOUT made the
    #: demo give up after 2 s).
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
        self.zk_credentials()
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
        tls = self.zk_tls_settings()
        if tls is not None and tls.key is not None:
            warning = world_readable_warning(tls.key, "--zk-tls-key")
            if warning:
                out.append(warning)
        return out


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as an HTTP header value (``--user-agent``), or None: a
    CR or LF would end the header (and inject others), other controls are refused by
    servers, and an empty agent matches no robots.txt group by name."""
    if not value.strip():
        return "it is empty"
    if len(value) > 1000:
        return f"{len(value)} characters (at most 1000)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "control character (CR, LF, TAB...)"
    if not value.isascii():
        return "non-ASCII character"
    return None


def zk_hosts_problem(hosts: str) -> str | None:
    """Why ``hosts`` is not a ZooKeeper connect string kazoo can use, or ``None``."""
    servers, slash, chroot = hosts.strip().partition("/")
    if slash and (problem := znode_path_problem("/" + chroot)):
        return f"bad chroot ({problem})"
    if not servers:
        return "no server"
    for server in servers.split(","):
        host, port = _split_port(server.strip())
        if not host or not _HOST.match(host):
            return f"bad host {server.strip()[:60]!r}"
        if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
            return f"bad port {port[:20]!r}"
    return None


def _split_port(server: str) -> tuple[str, str | None]:
    """``host:port`` / ``[v6]:port`` / ``host`` -> (host, port or None)."""
    if server.startswith("["):
        host, _, rest = server.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else (rest or None)
    host, colon, port = server.rpartition(":")
    return (host, port) if colon else (server, None)


def znode_path_problem(path: str) -> str | None:
    """Why ZooKeeper would refuse ``path`` as a znode path, or ``None`` if it would not."""
    if not path.startswith("/"):
        return "it must start with '/'"
    if path == "/":
        return None
    if _ZK_BAD_CHARS.search(path):
        return "control, surrogate or private-use character"
    if any(seg in ("", ".", "..") for seg in path.split("/")[1:]):
        return "empty, '.' or '..' segment"
    return None


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str, command: str = "", shared: bool = False) -> str:
    """The environment variable of ``field``: ``ZKCRAWL_<FLAG>`` for the flags every command
    shares, ``ZKCRAWL_<COMMAND>_<FLAG>`` for a command's own (``--timeout`` of
    ``zkcrawl-consumer``: ``ZKCRAWL_CONSUMER_TIMEOUT``), so no two commands read one name
    with two meanings. ``command`` is the program (``zkcrawl-consumer``, ``zkcrawl demo``);
    none: the old unprefixed name."""
    prefix = "" if shared else command_prefix(command)
    return "ZKCRAWL_" + (prefix + "_" if prefix else "") + field.upper()


def command_prefix(command: str) -> str:
    """``zkcrawl-consumer`` -> ``CONSUMER``; ``zkcrawl local-zk`` -> ``LOCAL_ZK``."""
    rest = command.removeprefix("zkcrawl").strip(" -")
    return re.sub(r"[^A-Za-z0-9]+", "_", rest).upper()


def is_shared(cls: type, name: str) -> bool:
    """True for a flag every command shares with one meaning (``--zk``, ``--root``,
    ``--zk-*``, ``--log-*``, ``--session-timeout``): a field of :class:`CommonSettings` the
    command does not redefine, except ``--config`` (each command has its own file)."""
    common = {f.name: f for f in dataclasses.fields(CommonSettings)}
    if name not in common or name == "config":
        return False
    own = {f.name: f for f in dataclasses.fields(cls)}
    return own.get(name) is common[name]


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def _base_type(tp: Any) -> Any:
    """``float | None`` -> float; ``tuple[str, ...]`` -> tuple."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    return origin or tp


def add_options(parser: argparse.ArgumentParser, cls: type, examples: str = "") -> None:
    """Add one option per field of ``cls`` under its help group (the command's own groups
    first, :data:`SHARED_GROUPS` last); unset options stay absent from the namespace.
    ``examples`` (default: ``cls.examples``) becomes the help's Examples section. The
    parser's ``prog`` names the command's environment variables (:func:`env_name`)."""
    fields = _fields(cls)
    parser.set_defaults(**{_PROG: parser.prog})
    for field, tp in sorted(fields, key=lambda ft: _group_rank(_group_of(ft[0]))):
        meta = field.metadata
        names = [flag_name(field.name)] + ([meta["short"]] if meta.get("short") else [])
        kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS,
                                  "help": _help(field, env_name(field.name, parser.prog,
                                                                is_shared(cls, field.name)))}
        base = _base_type(tp)
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            if meta.get("repeat"):
                kwargs["action"] = "append"
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            if meta.get("metavar"):
                kwargs["metavar"] = meta["metavar"]
        option_group(parser, _group_of(field)).add_argument(*names, **kwargs)
    text = examples or getattr(cls, "examples", "")
    if text:
        parser.epilog = "examples:\n" + textwrap.indent(textwrap.dedent(text).strip("\n"), "  ")


def option_group(parser: argparse.ArgumentParser, title: str | None) -> Any:
    """The help group called ``title`` (made on first use); None: the command's own
    ``options`` group, shown first."""
    if title is None:
        return parser._optionals
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


_COMMON_GROUPS: dict[str, str | None] = {}


def _group_of(field: dataclasses.Field[Any]) -> str | None:
    """A field's help group: its own, else that of the shared field it redefines."""
    group = field.metadata.get("group")
    if group is None and not _COMMON_GROUPS:
        _COMMON_GROUPS.update({f.name: f.metadata.get("group")
                               for f in dataclasses.fields(CommonSettings)})
    return group if group is not None else _COMMON_GROUPS.get(field.name)


def _group_rank(group: str | None) -> int:
    """Where a group's options go: own ungrouped, known groups, new groups, shared ones."""
    if group is None:
        return 0
    if group in SHARED_GROUPS:
        return 100 + SHARED_GROUPS.index(group)
    return 1 + GROUP_ORDER.index(group) if group in GROUP_ORDER else 50


def _help(field: dataclasses.Field[Any], env_var: str) -> str:
    default = field.default
    shown = "" if default in (None, (), "") else f" (default: {_shown_default(default)})"
    return f"{field.metadata['help']}{shown} [env {env_var}]"


def _shown_default(default: Any) -> str:
    if isinstance(default, tuple):
        return " ".join(str(v) for v in default)
    return str(default).replace("%", "%%")  # argparse formats help with %


def _convert(name: str, tp: Any, raw: Any, source: str) -> Any:
    base = _base_type(tp)
    convert = _CONVERTERS.get(base)
    if convert is None:
        return raw
    try:
        return convert(raw)
    # OverflowError: int(inf), float(10**400); RecursionError: str() of deeply nested TOML.
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise UsageError(f"{flag_name(name)} from {source}: {exc}") from None


def _kind(raw: Any) -> str:
    """What a value is, for messages: never the repr of a (possibly huge) container."""
    if isinstance(raw, str):
        return repr(raw) if len(raw) <= 40 else repr(raw[:40]) + "..."
    if isinstance(raw, float) or (isinstance(raw, int) and abs(raw) < 10**40):
        return repr(raw)
    return f"a value of type {type(raw).__name__}"


def _to_str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {_kind(raw)}")
    if "\x00" in raw:
        raise ValueError("a NUL character is not allowed")
    return raw


def _to_list(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [line.strip() for line in raw.splitlines() if line.strip()]
    if not isinstance(raw, _LIST_TYPES):
        raise ValueError(f"expected a list of strings, got {_kind(raw)}")
    return tuple(_to_str(v) for v in raw)


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {_kind(raw)}")


def _to_int(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"not an integer: {_kind(raw)}")
    if isinstance(raw, float) and not raw.is_integer():
        raise ValueError(f"not an integer: {_kind(raw)}")
    if isinstance(raw, str) and len(raw) > 64:  # int() refuses 4300 digits in its own words
        raise ValueError(f"out of range: {_kind(raw)}")
    value = int(raw)
    if abs(value) > MAX_INT:
        raise ValueError(f"out of range: magnitude above 2**53 ({_kind(raw)})")
    return value


def _to_float(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"not a number: {_kind(raw)}")
    value = float(raw)
    if not math.isfinite(value) or abs(value) > MAX_FLOAT:
        raise ValueError(f"out of range: not a finite number of magnitude <= {MAX_FLOAT:g} "
                         f"({_kind(raw)})")
    return value


_CONVERTERS: dict[Any, Any] = {tuple: _to_list, list: _to_list, bool: _to_bool, int: _to_int,
                               float: _to_float, str: _to_str}


def _check_file_name(path: str) -> None:
    try:
        if b"\x00" not in os.fsencode(path):
            return
    except UnicodeEncodeError:  # a lone surrogate that surrogateescape cannot map to a byte
        pass
    raise UsageError(f"--config: not a usable file name: {path!r}")


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML settings file; any problem is one clear :class:`UsageError`."""
    _check_file_name(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"--config: no such file: {path}") from None
    except OSError as exc:
        raise UsageError(f"--config: cannot read {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError, UnicodeDecodeError (not UTF-8), ValueError (an integer of more than
        # 4300 digits), RecursionError (arrays or tables nested too deep)...
        raise UsageError(f"--config: {path} is not valid TOML: {exc}") from None
    return {key.replace("-", "_"): value for key, value in data.items()}


_PROG = "zkcrawl_prog"  # namespace key: the program whose options add_options added


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a setting's value came from, for ``--print-config`` and error lines."""

    kind: str  # flag | env | file | default
    where: str = ""  # the variable's or the file's name
    note: str = ""  # e.g. a deprecated variable's replacement

    def __str__(self) -> str:
        return " ".join(p for p in (self.kind, self.where) if p) + (
            f" ({self.note})" if self.note else "")


def _from_env(cls: type, name: str, command: str, env: Mapping[str, str]
              ) -> tuple[Any, Source] | None:
    """The value of ``name`` from the environment, and which variable held it. A daemon
    (``legacy_env_names``) still reads the old unprefixed name when the new one is unset."""
    shared = is_shared(cls, name)
    new = env_name(name, command, shared)
    if new in env:
        return env[new], Source("env", new)
    old = env_name(name)
    if old != new and old in env and getattr(cls, "legacy_env_names", False):
        return env[old], Source("env", old, f"deprecated name: use {new}")
    return None


def resolve(cls: type[T], ns: argparse.Namespace, env: Mapping[str, str]) -> T:
    """Build ``cls`` from parsed flags, the environment and the config file. With
    ``--print-config``: print each effective value and its source, then exit 0 (or 2 if a
    value is invalid) without connecting anywhere."""
    given = vars(ns)
    command = given.get(_PROG) or ""
    values, sources = _gather(cls, given, command, env)
    for source in sources.values():
        if source.note:  # one line per deprecated variable actually used
            print(f"{command or 'zkcrawl'}: warning: ${source.where} is deprecated (other "
                  f"commands read it too): {source.note.split(': ', 1)[1]}", file=sys.stderr)
    obj = cls(**values)
    if given.get("print_config"):
        sys.stdout.write(render_config(obj, sources, command))
        sys.stdout.flush()
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except UsageError as exc:
            raise _with_source(exc, sources) from None
    if given.get("print_config"):
        raise SystemExit(0)
    return obj


def _with_source(exc: UsageError, sources: Mapping[str, Source]) -> UsageError:
    """``--threads must be at least 1, got 0`` + `` (from env ZKCRAWL_CONSUMER_THREADS)``
    when the flag the message starts with came from the environment or a file."""
    message = str(exc)
    flag = re.match(r"--([a-z0-9-]+)", message)
    source = sources.get(flag.group(1).replace("-", "_")) if flag else None
    if source is None or source.kind not in ("env", "file"):
        return exc
    new = UsageError(f"{message} (from {source.kind} {source.where})")
    new.__dict__.update(exc.__dict__)  # a prog set on the original
    return new


def _gather(cls: type, given: Mapping[str, Any], command: str, env: Mapping[str, str]
            ) -> tuple[dict[str, Any], dict[str, Source]]:
    config_env = _from_env(cls, "config", command, env)
    if given.get("config"):
        config_path: str | None = given["config"]
    else:
        config_path = config_env[0] if config_env else None
    file_values = load_toml(config_path) if config_path else {}
    known = {f.name for f, _ in _fields(cls)}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise UsageError(f"--config: unknown key {unknown[0]!r} in {config_path}")
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for field, tp in _fields(cls):
        name = field.name
        from_env = _from_env(cls, name, command, env)
        if name in given:
            raw: Any = given[name]
            source = Source("flag", flag_name(name))
        elif from_env is not None:
            raw, source = from_env
        elif name in file_values:
            raw, source = file_values[name], Source("file", str(config_path))
        else:
            sources[name] = Source("default")
            continue
        shown = {"flag": "the command line", "env": f"${source.where}"}.get(source.kind,
                                                                          source.where)
        value = _convert(name, tp, raw, shown)
        choices = field.metadata.get("choices")
        if choices and value not in choices:
            raise UsageError(f"{flag_name(name)} from {shown}: {value!r} is not one of "
                             f"{', '.join(choices)}")
        values[name] = value
        sources[name] = source
    return values, sources


def render_config(settings: Any, sources: Mapping[str, Source], command: str = "") -> str:
    """``--print-config``: one ``key = value  # source`` line per setting in help order,
    TOML a ``--config`` file accepts (unset ones commented out), secrets as ``***``."""
    shown = redacted(settings)
    fields = sorted(_fields(type(settings)), key=lambda ft: _group_rank(_group_of(ft[0])))
    rows = []
    for field, _tp in fields:
        value = shown[field.name]
        key = field.name.replace("_", "-")
        text = f"# {key} = (not set)" if value is None else f"{key} = {_toml(value)}"
        rows.append((text, str(sources.get(field.name, Source("default")))))
    width = min(max(len(t) for t, _ in rows), 60)
    head = (f"# {command or 'zkcrawl'}: effective settings and their sources "
            "(flag > env > file > default)\n")
    return head + "".join(f"{t.ljust(width)}  # {src}\n" for t, src in rows)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):  # an inline table ([processors] of the consumer)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def version() -> str:
    """The installed zkcrawl's version."""
    try:
        return importlib.metadata.version("zkcrawl")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class HelpFormatter(argparse.HelpFormatter):
    """Fills prose paragraphs to the terminal's width and keeps indented lines (commands in
    Examples, lists) exactly as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line[:1].isspace() for line in lines[1:]):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(super()._fill_text(para, width, indent))
        return "\n\n".join(out)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing usage and exiting, takes
    no abbreviated flags (``--star`` is not ``--start``), answers ``--version``, keeps the
    description and Examples as written, and lists its own options before the shared
    groups and ``general`` (help, version) last."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("add_help", False)
        super().__init__(*args, **kwargs)
        self._general = self.add_argument_group("general")
        self._general.add_argument("-h", "--help", action="help",
                                   help="show this help and exit")
        self._general.add_argument("--print-config", action="store_true",
                                   default=argparse.SUPPRESS,
                                   help="print each effective setting and where it comes "
                                   "from (flag, env, file, default), then exit without "
                                   "connecting")
        self._general.add_argument("--version", action="version",
                                   version=f"%(prog)s {version()}",
                                   help="print the version and exit")

    def format_help(self) -> str:
        groups, usage = self._action_groups, self.usage
        self._action_groups = [g for g in groups if g is not self._general] + [self._general]
        self.usage = usage or self._short_usage()
        try:
            return super().format_help()
        finally:
            self._action_groups, self.usage = groups, usage

    def _short_usage(self) -> str:
        """``zkcrawl dead [options] {list,requeue,purge} [ID ...]``: the options are listed
        below, grouped; spelling all of them out here put the shared ones first."""
        fmt = self._get_formatter()
        positionals = [fmt._format_args(a, fmt._get_default_metavar_for_positional(a))
                       for a in self._get_positional_actions()]
        return " ".join(["%(prog)s", "[options]", *positionals])

    def error(self, message: str) -> typing.NoReturn:
        exc = UsageError(message)
        exc.prog = self.prog  # type: ignore[attr-defined]  # "zkcrawl status", for the one line
        raise exc


def parse(cls: type[T], parser: argparse.ArgumentParser, argv: Sequence[str],
          env: Mapping[str, str] | None = None) -> tuple[T, argparse.Namespace]:
    """Parse ``argv`` with ``parser`` (already holding ``cls``'s options) and resolve."""
    ns = parser.parse_args(list(argv))
    return resolve(cls, ns, os.environ if env is None else env), ns
