"""Test processors: one per behaviour the consumer must handle (issue #17)."""

from __future__ import annotations

import threading
import time
from typing import Any

from zkcrawl import Page, PageResult

SLOW_S = 0.2  # the slow processor's own time: visible in extract_ms


def heading(page: Page) -> PageResult:
    """The first <h1> as a field; the page's title stays the record's."""
    return PageResult(fields={"h1": (page.xpath("string(//h1)") or [""])[0]})


def boom(page: Page) -> PageResult:
    raise ValueError(f"no date on {page.url}")


def slow(page: Page) -> PageResult:
    time.sleep(SLOW_S)  # the processor's own work, not synchronisation
    return PageResult(fields={"slow": True})


def links(page: Page) -> PageResult:
    """Every <a href> (relative ones too) as links, plus junk the consumer must drop."""
    hrefs = [str(h) for h in page.xpath("//a/@href")]
    return PageResult(fields={"n": len(hrefs)},
                      links=[*hrefs, "mailto:x@example.org", "javascript:void(0)", ""])


def skip(page: Page) -> PageResult:
    return PageResult(skip=True, links=["/found-by-skipped"])


def as_dict(page: Page) -> dict[str, Any]:
    return {"status": page.status, "type": page.headers.get("content-type"),
            "depth": page.meta.get("depth")}


def wrong_type(page: Page) -> object:
    return ["not", "a", "result"]


def not_json(page: Page) -> PageResult:
    return PageResult(fields={"when": object()})


class Counting:
    """A class processor: instantiated once, called from several threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0

    def __call__(self, page: Page) -> PageResult:
        with self.lock:
            self.calls += 1
        return PageResult(fields={"calls": self.calls})


class BrokenInit:
    def __init__(self) -> None:
        raise RuntimeError("cannot start")


NOT_CALLABLE = 42
