"""Page processors in the consumer: loading, routing and running one safely
(:class:`zkcrawl.page.Processor`; docs/guide/extending.md).

``--processor [re:PATTERN ]module:callable`` (repeatable) and ``[processors]`` route URLs to
user code: patterns are regexes searched in the URL, tried in order (the command line
first), the **first match wins**; no match gets the built-in :class:`FieldsProcessor`.

* A bad spec is a :class:`UsageError` at start-up: one line, exit 2 (modules are also looked
  for in the working directory).
* :meth:`Processors.run` never raises: a failure is the item's permanent error
  ``processor: <Type>: <message> (<file>:<line>)``, its traceback logged once per
  (callable, type, line) (:class:`FailureLog`, shared with the result pipelines).
* Links are bounded (:data:`MAX_LINKS` per page, http(s), at most ``URL_LIMIT`` bytes); the
  rest are counted and logged, never silently lost.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import lxml.etree
import structlog

from zkcrawl.errors import UsageError
from zkcrawl.page import Page, PageResult, Processor
from zkcrawl.queue.untrusted import URL_LIMIT, url_too_long
from zkcrawl.web.article import ArticleError, empty_fields
from zkcrawl.web.article import require as require_article
from zkcrawl.web.extract import record_from_doc

__all__ = ["EXTRACT_ERROR", "MAX_LINKS", "PROCESSOR_ERROR", "ArticleProcessor", "FailureLog",
           "FieldWatch", "FieldsProcessor", "Processed", "Processors", "failure_text",
           "load_object", "parse_routes", "place_of"]

log = structlog.get_logger(__name__)

MAX_LINKS = 1000  # links kept from one page (a hostile page must not flood the frontier)
ERROR_LIMIT = 200  # the record's error, as a dead letter's
PROCESSOR_ERROR = "processor:"  # how a processor's failure starts (record error, log)
EXTRACT_ERROR = "extract:"  # an article the extractor refused (zkcrawl.web.article)
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
TRACED_KEEP = 1000  # (callable, type, line) keys whose traceback was logged: bounded
#: The note of a logged traceback: the consumer's (once per key) and ``zkcrawl try``'s.
TRACED_ONCE = ("the traceback of your code, logged once per callable, exception type and "
               "line (records carry the error)")
TRACED_EVERY = ("the traceback of your code, logged each time it raises (zkcrawl try; the "
                "consumer logs it once per callable, exception type and line)")
# Frames of these directories are not "your code": the place is the innermost line outside.
_NOT_USER = tuple(sorted({os.path.join(os.path.realpath(d), "") for d in (
    *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib",
                                                   "platlib")),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/consumer",
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/zkcrawl") if d}))


def _cwd_importable() -> str:
    """The working directory on ``sys.path`` (appended: an installed module of the same name
    still wins); returns it."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return cwd


def _not_found(module_name: str, exc: ModuleNotFoundError, cwd: str) -> str:
    """Why ``module_name`` did not import, and what to do: the module (or its package) is
    not found -- where it was looked for; or it is found and imports a module that is not
    installed (``exc.name`` is neither it nor a package above it) -- which one, and where."""
    missing = exc.name
    if missing is not None and missing != module_name and not module_name.startswith(
            missing + "."):
        return (f"module {module_name!r} imports {missing!r}{_at(place_of(exc))}, which is "
                f"not installed for this Python ({sys.executable}): install the package "
                f"that provides {missing!r} there, or change the import")
    hint = ""
    if missing is not None and "." not in missing:  # the top-level name is not found
        hint = (f" (looked in the working directory {cwd} and on PYTHONPATH: run the "
                f"command from the directory that holds {missing}.py or the package "
                f"{missing}/, or set PYTHONPATH to that directory)")
    return f"{type(exc).__name__}: {exc}{hint}"


def _import(module_name: str, flag: str) -> Any:
    cwd = _cwd_importable()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UsageError(f"{flag}: cannot import {module_name!r}: "
                         f"{_not_found(module_name, exc, cwd)}") from None
    except Exception as exc:  # the module's own code failing
        raise UsageError(f"{flag}: cannot import {module_name!r}: "
                         f"{type(exc).__name__}: {exc}{_at(place_of(exc))}") from None


def load_object(spec: str, flag: str) -> Any:
    """``package.module:name`` (``name`` may be dotted: ``module:Class.method``) imported;
    every failure is one :class:`UsageError` line naming ``flag``."""
    if not _SPEC.match(spec):
        raise UsageError(f"{flag}: expected package.module:callable, got {spec!r}")
    module_name, _, attr = spec.partition(":")
    obj: Any = _import(module_name, flag)
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


class FieldWatch:
    """Counts, per stats window, the default processor's records and how many had each
    ``--field`` non-null; :meth:`check` (at each stats interval) warns once per field that
    was null on every record of a window that had records. Thread-safe."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.exprs = {name: str(getattr(x, "path", x)) for name, x in fields.items()}
        self._lock = threading.Lock()
        self._records = 0
        self._hits: dict[str, int] = dict.fromkeys(self.exprs, 0)
        self._warned: set[str] = set()

    def observe(self, values: Mapping[str, Any]) -> None:
        """One record's fields (a page the default processor extracted)."""
        if not self.exprs:
            return
        with self._lock:
            self._records += 1
            for name in self.exprs:
                if values.get(name) not in (None, "", []):
                    self._hits[name] += 1

    def check(self) -> list[str]:
        """Warn of the fields null on every record since the last check; start a window."""
        with self._lock:
            records, hits = self._records, self._hits
            self._records, self._hits = 0, dict.fromkeys(self.exprs, 0)
            empty = [n for n, h in hits.items() if records and not h and n not in self._warned]
            self._warned.update(empty)
        for name in empty:
            log.warning("field.always_null", field=name, xpath=self.exprs[name],
                        records=records, note=f"--field {name} matched nothing on any of "
                        f"the last {records} pages: check it with `zkcrawl try URL --field "
                        f"{name}=...` (said once)")
        return empty


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


class ArticleProcessor:
    """``--extract article``: the article fields (:meth:`zkcrawl.page.Page.article`: in the
    extraction processes when the consumer has them) plus the ``--field`` values. Made at
    start-up: without the ``article`` extra, a :class:`UsageError` (one line, exit 2)."""

    def __init__(self, fields: Mapping[str, lxml.etree.XPath]) -> None:
        require_article()
        self.fields = fields

    def __call__(self, page: Page) -> PageResult:
        values = page.article()
        if not self.fields:
            return PageResult(fields=values, title=page.title)
        rec = record_from_doc(page.tree, self.fields)
        return PageResult(fields={**values, **rec.fields}, title=rec.title)


@dataclass(slots=True)  # not frozen: built per page, frozen __init__ costs ~1 µs
class Processed:
    """What :meth:`Processors.run` made of one page: a result or an error, and its time."""

    result: PageResult | None
    error: str | None
    extract_ms: float
    links: tuple[str, ...] = ()


class Processors:
    """The routes plus the default; thread-safe as long as the user's processors are."""

    def __init__(self, routes: Sequence[Route], default: Processor, *,
                 trace_every: bool = False) -> None:
        self.routes = tuple(routes)
        self.default = default
        self.failures = FailureLog(trace_every)

    @classmethod
    def default_only(cls, fields: Mapping[str, lxml.etree.XPath]) -> Processors:
        return cls((), FieldsProcessor(fields))

    def pick(self, url: str) -> Processor:
        """The first route whose pattern is found in ``url``, else the default."""
        return self._route(url)[1]

    def _route(self, url: str) -> tuple[str, Processor]:
        for route in self.routes:
            if route.pattern is None or route.pattern.search(url):
                return route.name, route.processor
        return "default", self.default

    def run(self, page: Page) -> Processed:
        """Run the page's processor; never raises (see the module docstring)."""
        name, processor = self._route(page.url)
        started = time.perf_counter()
        try:
            result = _checked(processor(page), trusted=processor is self.default)
        except ArticleError as exc:  # a refused page: its reason, every field null
            log.info("extract.refused", url=page.url, error=str(exc))
            nulls = {**empty_fields(), **dict.fromkeys(getattr(processor, "fields", ()))}
            return Processed(PageResult(fields=nulls), str(exc)[:ERROR_LIMIT], _ms(started))
        except Exception as exc:
            ms = _ms(started)
            place = _definition(processor) if isinstance(exc, ProcessorError) else None
            error = failure_text(PROCESSOR_ERROR.rstrip(":"), exc, place)
            self.failures.report("processor.failed", name, exc, error, url=page.url)
            return Processed(None, error, ms)
        ms = _ms(started)
        links = _links(result.links, page) if result.links else ()
        return Processed(result, None, ms, links)


def place_of(exc: BaseException) -> tuple[str, int] | None:
    """``(file name, line)`` of the innermost frame of ``exc``'s traceback in the user's
    code (else the innermost frame at all); None without a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    user = [f for f in frames
            if not os.path.realpath(f.filename).startswith(_NOT_USER)]
    frame = (user or frames)[-1]
    return os.path.basename(frame.filename), frame.lineno or 0


def _definition(obj: object) -> tuple[str, int] | None:
    """Where a processor is defined (for a result it returned wrong: no line raised)."""
    target = obj if inspect.isroutine(obj) else type(obj)
    try:
        filename = inspect.getsourcefile(target)
        _, line = inspect.getsourcelines(target)
    except (OSError, TypeError):
        return None
    return (os.path.basename(filename), line) if filename else None


def _at(place: tuple[str, int] | None) -> str:
    return f" ({place[0]}:{place[1]})" if place else ""


def failure_text(prefix: str, exc: BaseException, place: tuple[str, int] | None = None
                 ) -> str:
    """``processor: ValueError: message (article.py:12)``, at most :data:`ERROR_LIMIT`
    characters: the message is cut, never the place."""
    at = _at(place or place_of(exc))
    head = f"{prefix}: {type(exc).__name__}: {exc}"
    return head[:max(40, ERROR_LIMIT - len(at))] + at


class FailureLog:
    """Tracebacks of the user's code, logged once per (callable, exception type, line) at
    warning (the rest at debug, without one); ``every``: each time (``zkcrawl try``).
    Thread-safe; remembers at most :data:`TRACED_KEEP` keys (then: debug only)."""

    def __init__(self, every: bool = False) -> None:
        self.every = every
        self._seen: set[tuple[str, str, str, int]] = set()
        self._lock = threading.Lock()

    def first(self, name: str, exc: BaseException) -> bool:
        """Is this (callable, type, line) new (its traceback to be logged)?"""
        if self.every:
            return True
        place = place_of(exc) or ("", 0)
        key = (name, type(exc).__name__, *place)
        with self._lock:
            if key in self._seen or len(self._seen) >= TRACED_KEEP:
                return False
            self._seen.add(key)
            return True

    def report(self, event: str, name: str, exc: BaseException, error: str,
               **context: Any) -> None:
        """``event`` at warning with the traceback the first time (``every``: each time),
        else at debug; its note says which."""
        if self.first(name, exc):
            log.warning(event, callable=name, error=error, **context, exc_info=exc,
                        note=TRACED_EVERY if self.every else TRACED_ONCE)
        else:
            log.debug(event, callable=name, error=error, **context)


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
    if url_too_long(url):
        return None
    return url
