"""argparse for settings classes: one option per field, help in groups, errors as one line.

:func:`add_options` leaves an unset option out of the namespace, so the sources below it
can tell "not given" from "given the default". :class:`ArgumentParser` raises
:class:`~zkcrawl.errors.UsageError` (exit 2, with the nearest flag or choice suggested)
instead of printing usage, takes no abbreviated flags, and answers ``--help``,
``--version`` and ``--print-config``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import textwrap
import typing
from typing import Any

from zkcrawl.errors import UsageError
from zkcrawl.settings.common import group_of, is_shared
from zkcrawl.settings.options import Field, base_type, env_name, fields, flag_name, group_rank
from zkcrawl.settings.validate import did_you_mean

#: Namespace key: the program whose options :func:`add_options` added (it names the
#: command's environment variables).
PROG = "zkcrawl_prog"


def version() -> str:
    """The installed zkcrawl's version."""
    try:
        return importlib.metadata.version("zkcrawl")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def add_options(parser: argparse.ArgumentParser, cls: type, examples: str = "") -> None:
    """Add one option per field of ``cls`` under its help group (the command's own groups
    first, :data:`~zkcrawl.settings.options.SHARED_GROUPS` last); unset options stay absent
    from the namespace. ``examples`` (default: ``cls.examples``) becomes the help's Examples
    section. The parser's ``prog`` names the command's environment variables."""
    parser.set_defaults(**{PROG: parser.prog})
    for field, tp in sorted(fields(cls), key=lambda ft: group_rank(group_of(ft[0]))):
        _add_option(parser, cls, field, tp)
    text = examples or getattr(cls, "examples", "")
    if text:
        parser.epilog = "examples:\n" + textwrap.indent(textwrap.dedent(text).strip("\n"), "  ")


def _add_option(parser: argparse.ArgumentParser, cls: type, field: Field, tp: Any) -> None:
    meta = field.metadata
    names = [flag_name(field.name)] + ([meta["short"]] if meta.get("short") else [])
    variable = env_name(field.name, parser.prog, is_shared(cls, field.name))
    kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS,
                              "help": _help(field, variable)}
    if base_type(tp) is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        if meta.get("repeat"):
            kwargs["action"] = "append"
        if meta.get("choices"):
            kwargs["choices"] = meta["choices"]
        if meta.get("metavar"):
            kwargs["metavar"] = meta["metavar"]
    option_group(parser, group_of(field)).add_argument(*names, **kwargs)


def option_group(parser: argparse.ArgumentParser, title: str | None) -> Any:
    """The help group called ``title`` (made on first use); None: the command's own
    ``options`` group, shown first."""
    if title is None:
        return parser._optionals
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _help(field: Field, env_var: str) -> str:
    default = field.default
    shown = "" if default in (None, (), "") else f" (default: {_shown_default(default)})"
    return f"{field.metadata['help']}{shown} [env {env_var}]"


def _shown_default(default: Any) -> str:
    if isinstance(default, tuple):
        return " ".join(str(v) for v in default)
    return str(default).replace("%", "%%")  # argparse formats help with %


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
        exc = UsageError(message + self._suggestion(message))
        exc.prog = self.prog  # "zkcrawl status", for the one line
        raise exc

    def _suggestion(self, message: str) -> str:
        """``; did you mean --threads?`` for the first unknown flag of an "unrecognized
        arguments" message, or the nearest choice of an "invalid choice" one."""
        if message.startswith("unrecognized arguments: "):
            flags = [a.split("=", 1)[0] for a in message.split(": ", 1)[1].split()
                     if a.startswith("--")]
            known = [o for o in self._option_string_actions if o.startswith("--")]
            return did_you_mean(flags[0], known) if flags else ""
        choice = _INVALID_CHOICE.search(message)
        if choice:
            return did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        return ""


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
