"""The docs' command reference (docs/reference/commands.md) is the real ``--help`` of every
command: this test fails when they differ. ``python -m tests.test_command_reference`` rewrites
the generated part of that page (the one copy of the flags: the README links to it).

Each command shows its description, its own option groups and its examples verbatim; the
groups every command shares (ZooKeeper, security, logging, configuration, general) appear once,
from ``zkcrawl status``. Help is rendered 100 columns wide, whatever the terminal.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path
from unittest import mock

from zkcrawl.cli import COMMANDS, build_parser
from zkcrawl.cli import main as admin_main
from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.producer.main import main as producer_main
from zkcrawl.settings import SHARED_GROUPS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "commands.md"
START, END = "<!-- command-reference:start -->", "<!-- command-reference:end -->"
SHARED = (*SHARED_GROUPS, "general")


def help_text(main, argv: list[str]) -> str:
    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": "100"}), contextlib.redirect_stdout(out):
        assert main([*argv, "--help"], {}) == 0
    return out.getvalue()


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, block) in order; the first is ('', the description after the usage)."""
    parts: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        if line.endswith(":") and line[:1].strip() and not line.startswith("usage:"):
            parts.append((line[:-1], [line]))
        else:
            parts[-1][1].append(line)
    head = "\n".join(parts[0][1])
    description = head.split("\n\n", 1)[1] if "\n\n" in head else ""
    return [("", description.strip("\n"))] + [(t, "\n".join(b).rstrip("\n")) for t, b in parts[1:]]


def command_block(title: str, text: str, own: bool = True) -> str:
    keep = [b for t, b in sections(text) if (t not in SHARED) == own]
    return f"## `{title}`\n\n```text\n" + "\n\n".join(b for b in keep if b) + "\n```\n"


def commands() -> list[tuple[str, object, list[str]]]:
    _parser, modules = build_parser()
    admin = [(f"zkcrawl {name}", admin_main, [name]) for name in modules]
    assert len(admin) == len(COMMANDS)
    return [("zkcrawl-consumer", consumer_main, []), ("zkcrawl-producer", producer_main, []),
            *admin]


def render() -> str:
    blocks = [command_block(title, help_text(main, argv)) for title, main, argv in commands()]
    shared = help_text(admin_main, ["status"])
    keep = [b for t, b in sections(shared) if t in SHARED]
    blocks.append("## Flags every command takes\n\n```text\n" + "\n\n".join(keep) + "\n```\n")
    return "\n".join(blocks)


def page_section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(re.escape(START) + r"\n(.*?)" + re.escape(END), text, re.S)
    assert match, f"{PAGE} has no {START} ... {END} section"
    return match.group(1)


def test_command_reference_is_the_real_help():
    expected = render()
    if page_section() != expected:
        import difflib

        diff = "\n".join(difflib.unified_diff(page_section().splitlines(),
                                              expected.splitlines(), "commands.md", "--help",
                                              lineterm="", n=1))
        raise AssertionError("docs/reference/commands.md differs from --help; run "
                             f"`python -m tests.test_command_reference`:\n{diff[:4000]}")


def test_every_command_is_in_the_reference():
    section = page_section()
    for title, _main, _argv in commands():
        assert f"## `{title}`" in section, title


if __name__ == "__main__":
    text = PAGE.read_text(encoding="utf-8")
    page_section()
    new = re.sub(re.escape(START) + r"\n.*?" + re.escape(END),
                 lambda _m: f"{START}\n{render()}{END}", text, flags=re.S)
    PAGE.write_text(new, encoding="utf-8")
    sys.stdout.write(f"{PAGE}: command reference rewritten\n")
