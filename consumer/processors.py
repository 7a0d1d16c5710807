"""Page processors in the consumer: loading, routing, running one safely (issue #17).

``--processor [re:PATTERN ]module:callable`` (repeatable) and the TOML table ``[processors]``
(``PATTERN = "module:callable"``) name user code for pages (:class:`zkcrawl.page.Processor`).
Routing: the patterns are Python regexes searched in the item's URL (anchor with ``^``), tried
in order -- the command line's ``--processor`` first, then the table's entries in file order
-- and the **first match wins**; a ``--processor`` without ``re:`` matches every URL; a URL no
route matches gets the default processor, the built-in title + ``--field`` extraction
(:class:`FieldsProcessor`).

Guarantees:

* a bad spec (no ``:``, a module that does not import, a missing attribute, a class whose
  constructor raises, a bad regex) is a :class:`UsageError` at start-up: one line, exit 2;
* :meth:`Processors.run` never raises: an exception in a processor, a result of the wrong
  type or fields that are not JSON give a permanent error ``processor: <Type>: <message>``
  (the item gets a record with it and is completed, like a 404), never a crashed worker;
* its time is measured (``extract_ms``, part of ``process_ms``);
* links are bounded: at most :data:`MAX_LINKS` per page, each resolved against the final URL,
  an http(s) URL of at most ``URL_LIMIT`` bytes; the rest are counted and logged
  (``processor.links_dropped``), never silently lost.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import lxml.etree
import structlog

from zkcrawl.errors import UsageError
from zkcrawl.page import Page, PageResult, Processor
from zkcrawl.queue.untrusted import URL_LIMIT
from zkcrawl.web.extract import record_from_doc

__all__ = ["MAX_LINKS", "PROCESSOR_ERROR", "FieldsProcessor", "Processed", "Processors",
           "load_object", "parse_routes"]

log = structlog.get_logger(__name__)

MAX_LINKS = 1000  # links kept from one page (a hostile page must not flood the frontier)
ERROR_LIMIT = 200  # the record's error, as a dead letter's
PROCESSOR_ERROR = "processor:"  # how a processor's failure starts (record error, log)
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def load_object(spec: str, flag: str) -> Any:
    """``package.module:name`` (``name`` may be dotted: ``module:Class.method``) imported;
    every failure is one :class:`UsageError` line naming ``flag``."""
    if not _SPEC.match(spec):
        raise UsageError(f"{flag}: expected package.module:callable, got {spec!r}")
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module's own code failing
        raise UsageError(f"{flag}: cannot import {module_name!r}: "
                         f"{type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{flag}: {module_name!r} has no {attr!r}") from None
    return obj


def _processor(spec: str) -> Processor:
    obj = load_object(spec, "--processor")
    if isinstance(obj, type):  # a class: one instance, called for each page
        try:
            obj = obj()
        except Exception as exc:
            raise UsageError(f"--processor: {spec}() failed: {type(exc).__name__}: {exc}"
                             ) from None
    if not callable(obj):
        raise UsageError(f"--processor: {spec} is not callable")
    return obj  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Route:
    """A processor and the URLs it is for (``pattern`` None: every URL)."""

    pattern: re.Pattern[str] | None
    processor: Processor
    name: str


def _pattern(text: str, flag: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except (re.error, RecursionError, OverflowError) as exc:
        raise UsageError(f"{flag}: invalid regex {text!r}: {exc}") from None


def parse_routes(specs: Sequence[str], table: Mapping[str, Any] | None = None
                 ) -> tuple[Route, ...]:
    """``--processor`` values (``[re:PATTERN ]module:callable``), then the ``[processors]``
    table's ``PATTERN = "module:callable"`` entries, in order."""
    routes: list[Route] = []
    for spec in specs:
        spec = spec.strip()
        pattern = None
        if spec.startswith("re:"):
            # The target never holds whitespace, the pattern may: split at the last blank.
            text, _, spec = spec[3:].rpartition(" ")
            if not text.strip():
                raise UsageError("--processor: expected 're:PATTERN module:callable', got "
                                 f"{'re:' + text + ' ' + spec!r}")
            pattern = _pattern(text.strip(), "--processor")
        routes.append(Route(pattern, _processor(spec), spec))
    for text, target in (table or {}).items():
        if not isinstance(target, str):
            raise UsageError(f"[processors]: {text!r} must name a module:callable string")
        routes.append(Route(_pattern(text, "[processors]"), _processor(target), target))
    return tuple(routes)


class FieldsProcessor:
    """The default processor: the page's title and the ``--field NAME=XPATH`` values. With no
    field it parses only up to ``</title>`` (:attr:`zkcrawl.page.Page.title`)."""

    def __init__(self, fields: Mapping[str, lxml.etree.XPath]) -> None:
        self.fields = fields

    def __call__(self, page: Page) -> PageResult:
        if not self.fields:
            return PageResult(title=page.title)
        rec = record_from_doc(page.tree, self.fields)
        return PageResult(fields=rec.fields, title=rec.title)


@dataclass(slots=True)  # not frozen: built per page, frozen __init__ costs ~1 µs
class Processed:
    """What :meth:`Processors.run` made of one page: a result or an error, and its time."""

    result: PageResult | None
    error: str | None
    extract_ms: float
    links: tuple[str, ...] = ()


class Processors:
    """The routes plus the default; thread-safe as long as the user's processors are."""

    def __init__(self, routes: Sequence[Route], default: Processor) -> None:
        self.routes = tuple(routes)
        self.default = default

    @classmethod
    def default_only(cls, fields: Mapping[str, lxml.etree.XPath]) -> Processors:
        return cls((), FieldsProcessor(fields))

    def pick(self, url: str) -> Processor:
        """The first route whose pattern is found in ``url``, else the default."""
        for route in self.routes:
            if route.pattern is None or route.pattern.search(url):
                return route.processor
        return self.default

    def run(self, page: Page) -> Processed:
        """Run the page's processor; never raises (see the module docstring)."""
        processor = self.pick(page.url)
        started = time.perf_counter()
        try:
            result = _checked(processor(page), trusted=processor is self.default)
        except Exception as exc:
            ms = _ms(started)
            error = f"{PROCESSOR_ERROR} {type(exc).__name__}: {exc}"[:ERROR_LIMIT]
            log.warning("processor.failed", url=page.url, error=error)
            return Processed(None, error, ms)
        ms = _ms(started)
        links = _links(result.links, page) if result.links else ()
        return Processed(result, None, ms, links)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)


class ProcessorError(Exception):
    """A processor returned something the record cannot hold."""


def _checked(result: object, *, trusted: bool) -> PageResult:
    if trusted and type(result) is PageResult:
        return result  # the default processor's: the common case, kept cheap
    if isinstance(result, Mapping):
        result = PageResult(fields=dict(result))  # a plain dict: the fields
    if not isinstance(result, PageResult):
        raise ProcessorError(f"returned {type(result).__name__}, not a PageResult")
    if result.title is not None and not isinstance(result.title, str):
        raise ProcessorError(f"title is {type(result.title).__name__}, not str")
    if isinstance(result.links, str | bytes):
        raise ProcessorError("links must be a list of URLs, not one string")
    try:
        json.dumps(dict(result.fields), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProcessorError(f"fields are not JSON: {exc}") from None
    return result


def _links(raw: Sequence[Any], page: Page) -> tuple[str, ...]:
    kept: list[str] = []
    dropped = 0
    for link in raw:
        url = _absolute(link, page.final_url or page.url)
        if url is None or len(kept) >= MAX_LINKS:
            dropped += 1
            continue
        kept.append(url)
    if dropped:
        log.info("processor.links_dropped", url=page.url, dropped=dropped, kept=len(kept),
                    reason=f"not an http(s) URL of at most {URL_LIMIT} bytes, or past "
                    f"{MAX_LINKS} links per page")
    return tuple(kept)


def _absolute(link: object, base: str) -> str | None:
    if not isinstance(link, str) or not link.strip():
        return None
    try:
        url = urljoin(base, link.strip())
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        return None
    if scheme not in ("http", "https"):
        return None
    if len(url) * 4 > URL_LIMIT and len(url.encode("utf-8", "surrogatepass")) > URL_LIMIT:
        return None
    return url
