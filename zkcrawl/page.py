"""The extension API's types: what a page processor gets and returns, what a result pipeline is.

A **page processor** is any callable ``(Page) -> PageResult`` (:class:`Processor`); it runs in
the consumer's worker thread with the page, once the page was fetched (2xx, or a page cut at
``--max-bytes``). A **result pipeline** (:class:`ResultPipeline`) sees each record before the
durable sink: ``open()``, ``process(record) -> record | None`` (None drops it), ``close()``.

Guarantees of :class:`Page`: every attribute is computed from data already in memory, nothing
here makes a request; :attr:`Page.text` and :attr:`Page.tree` are built on first use and at
most once (a processor that only reads the title pays for a few hundred bytes of parsing, one
that uses XPath for one parse); decoding and parsing never raise on any body
(:mod:`zkcrawl.web.decode`, :mod:`zkcrawl.web.extract`); :meth:`Page.article` raises only
``ArticleError``, whose message is the record's reason. :attr:`Page.meta` is the item's
``meta`` as a read-only mapping: it came from ZooKeeper, so it is untrusted data.

Selectors as Scrapy users reach for them: :meth:`Page.css` (``::text`` and ``::attr(NAME)``
included, :mod:`zkcrawl.web.css`) returns a :class:`Selected` list whose ``get()`` is the
first value (or a default) and ``getall()`` every value, as text (an element as its HTML);
``page.get(CSS)`` and ``page.getall(CSS)`` are the short forms. A selector that does not
compile raises ``ValueError`` with the reason (your code's error, recorded with its line).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar, overload, runtime_checkable

import lxml.etree
import lxml.html

from zkcrawl.web import article as _article
from zkcrawl.web.css import css_to_xpath
from zkcrawl.web.decode import decode_html, html_encoding
from zkcrawl.web.extract import parse_html, record_from_doc

__all__ = ["Page", "PageResult", "Processor", "ResultPipeline", "Selected"]

_TITLE_END = re.compile(rb"</title\s*>", re.IGNORECASE)
_TITLE_SCAN = 64 * 1024
T = TypeVar("T")


class lazy(Generic[T]):  # lower case: a decorator, as cached_property
    """``functools.cached_property`` without its lock. Before Python 3.12 that lock is one
    per property, shared by every instance: the consumer's worker threads, each parsing its
    own page (lxml releases the GIL), would take turns -- measured with ``zkcrawl bench
    crawl``: 10-20 % fewer pages/s at the same CPU per page. Two threads racing on one page
    compute the value twice, which is harmless (pure)."""

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> lazy[T]: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> T: ...

    def __get__(self, obj: object | None, objtype: type | None = None) -> T | lazy[T]:
        if obj is None:
            return self
        value = self.func(obj)
        obj.__dict__[self.name] = value  # found first from now on: a non-data descriptor
        return value


@dataclass(frozen=True, eq=False)
class Page:
    """One fetched page, as a processor sees it.

    ``url`` is the item's URL, ``final_url`` the one after redirects (relative links resolve
    against it), ``headers`` the response's headers with lower-case names, ``body`` the raw
    bytes (at most ``--max-bytes``), ``meta`` the item's ``meta`` (``source``, ``depth``...).
    """

    url: str
    final_url: str
    status: int | None
    headers: Mapping[str, str]
    body: bytes
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")

    @lazy
    def text(self) -> str:
        """The body decoded (BOM, header charset, ``<meta>``, detection; never raises)."""
        return decode_html(self.body, self.content_type)[0]

    @lazy
    def tree(self) -> lxml.html.HtmlElement:
        """The page parsed by lxml (``base_url`` = :attr:`final_url`), built on first use."""
        return parse_html(self.body, self.final_url, self.content_type)

    def xpath(self, expr: str) -> list[Any]:
        """``self.tree.xpath(expr)`` as a list (a scalar result is wrapped)."""
        result = self.tree.xpath(expr)
        return result if isinstance(result, list) else [result]

    def css(self, selector: str) -> Selected:
        """What the CSS ``selector`` matches, in document order: elements, or strings for
        ``::text`` / ``::attr(NAME)`` (``page.css("h2 a::attr(href)").getall()``)."""
        return Selected(self.xpath(css_to_xpath(selector)))

    def get(self, selector: str, default: str | None = None) -> str | None:
        """``self.css(selector).get(default)``: the first match as text."""
        return self.css(selector).get(default)

    def getall(self, selector: str) -> list[str]:
        """``self.css(selector).getall()``: every match as text."""
        return self.css(selector).getall()

    @lazy
    def title(self) -> str | None:
        """Text of the first ``<title>``, whitespace collapsed; None without one. Parses only
        up to ``</title>`` unless :attr:`tree` was built already (the fast path the default
        processor has always had)."""
        if not self.body:
            return None
        if "tree" not in self.__dict__:
            end = _TITLE_END.search(self.body, 0, _TITLE_SCAN)
            if end is not None:
                # The encoding is decided on the whole body (detection needs it), the parse is
                # done on the prefix only.
                encoding, _ = html_encoding(self.body, self.content_type)
                doc = parse_html(self.body[:end.end()], self.final_url,
                                 f"text/html; charset={encoding}")
                title = record_from_doc(doc).title
                if title is not None:
                    return title
        return record_from_doc(self.tree).title

    def article(self) -> dict[str, Any]:
        """The article in the page (``--extract article``'s fields, SPEC §4): ``text``,
        ``author``, ``date`` (ISO 8601), ``language``, ``canonical``, ``tags``,
        ``description``, ``jsonld``, each None when the page has none; computed once (in the
        consumer's extraction processes while ``--extract-workers`` > 0). Raises only
        :class:`zkcrawl.web.article.ArticleError` (``extract: too-large``, ``extract:
        timeout``...); a processor lets it propagate, and the record gets that reason."""
        cached: dict[str, Any] | None = self.__dict__.get("_article")
        if cached is None:
            cached = self.__dict__["_article"] = _article.article(
                self.body, self.final_url or self.url, self.content_type)
        return dict(cached)


class Selected(list[Any]):
    """Matches of :meth:`Page.css` (a list: index, iterate, ``len``), with Scrapy's
    ``get()``/``getall()``: strings as they are, elements as their HTML."""

    def get(self, default: str | None = None) -> str | None:
        """The first match as text, ``default`` when nothing matched."""
        return _as_text(self[0]) if self else default

    def getall(self) -> list[str]:
        """Every match as text."""
        return [_as_text(v) for v in self]


def _as_text(value: Any) -> str:
    if isinstance(value, lxml.html.HtmlElement | lxml.etree._Element):
        text: str = lxml.html.tostring(value, encoding="unicode", with_tail=False)
        return text  # encoding="unicode": a str (lxml declares no types)
    return str(value)


@dataclass(frozen=True)
class PageResult:
    """What a processor returns.

    ``fields`` become the record's ``fields`` (JSON-serializable values); ``title`` overrides
    the page's ``<title>`` (None: the page's own); ``skip`` records nothing for this page (the
    item is completed, as WebMagic's skip flag) -- its ``links`` are still followed; ``links``
    are new URLs for the frontier (absolute or relative to the final URL), handed to a
    producer run with ``--follow`` through ``<root>/discovered/``.
    """

    fields: Mapping[str, Any] = field(default_factory=dict)
    title: str | None = None
    skip: bool = False
    links: Sequence[str] = ()


@runtime_checkable
class Processor(Protocol):
    """``module:callable`` given to ``--processor``: a function, or a class instantiated once
    without arguments whose instances are called. Runs in several worker threads at once."""

    def __call__(self, page: Page, /) -> PageResult: ...


@runtime_checkable
class ResultPipeline(Protocol):
    """``module:Class`` given to ``--pipeline``: instantiated once without arguments, called by
    the committer thread only (one call at a time) with each record about to be written."""

    def open(self) -> None: ...

    def process(self, record: dict[str, Any], /) -> dict[str, Any] | None: ...

    def close(self) -> None: ...
