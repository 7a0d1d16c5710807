"""Extraction from HTML with lxml (pure: bytes in, Python values out, no network).

Guarantees: parsing never raises on any body (malformed, empty, binary junk, NUL bytes, an XML
declaration); user-supplied XPath/CSS is validated once, up front, by :func:`compile_xpath` /
:func:`compile_css` / :func:`parse_field_specs`, which raise :class:`UsageError` so the CLI can
exit 2 before any work starts.  An expression that is valid but fails on one particular page
(rare: e.g. a type error only some documents trigger) yields "no result" for that page, never an
exception.

The ``*_from_doc`` variants take an already parsed document so a caller that needs links *and*
a record from the same page parses it once.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import cssselect
import lxml.etree
import lxml.html
import structlog

from zkcrawl.errors import UsageError
from zkcrawl.web.css import CssError, css_to_xpath
from zkcrawl.web.decode import decode_html

__all__ = [
    "DEFAULT_LINKS_XPATH",
    "Record",
    "compile_css",
    "compile_xpath",
    "extract_links",
    "extract_next",
    "extract_record",
    "links_from_doc",
    "parse_field_specs",
    "parse_html",
    "record_from_doc",
]

log = structlog.get_logger(__name__)

DEFAULT_LINKS_XPATH = "//a/@href"
# EXSLT regular expressions, so users can write //a[re:test(@href, '/item/\d+')] (as in parsel).
_NAMESPACES = {"re": "http://exslt.org/regular-expressions"}
_FIELD_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_XPath = lxml.etree.XPath


def _empty_doc(url: str | None) -> lxml.html.HtmlElement:
    return lxml.html.document_fromstring("<html><head></head><body></body></html>", base_url=url)


_LOCAL = threading.local()


def _parser() -> lxml.html.HTMLParser:
    # A parser is reusable but not shareable between threads (lxml's rule): one per thread
    # spares building one per page.
    parser: lxml.html.HTMLParser | None = getattr(_LOCAL, "parser", None)
    if parser is None:
        parser = _LOCAL.parser = lxml.html.HTMLParser(encoding="utf-8", remove_blank_text=False)
    return parser


def parse_html(body: bytes, url: str, content_type: str | None = None) -> lxml.html.HtmlElement:
    """Parse an HTML body into an ``<html>`` element whose ``base_url`` is ``url``.

    The body is decoded with :func:`zkcrawl.web.decode.decode_html` (header, BOM, meta, detection)
    and handed to libxml2 as UTF-8, so lxml never second-guesses the encoding.  An empty or
    content-free body gives an empty ``<html><head/><body/></html>``.  Never raises.
    """
    if not body or not body.strip():
        return _empty_doc(url)
    text, _encoding = decode_html(body, content_type)
    parser = _parser()
    try:
        doc = lxml.html.document_fromstring(
            text.encode("utf-8", "surrogatepass"), parser=parser, base_url=url
        )
    except (lxml.etree.LxmlError, ValueError):  # "Document is empty": only comments, etc.
        return _empty_doc(url)
    return doc if doc is not None else _empty_doc(url)


def _check(expr: lxml.etree.XPath) -> None:
    # Undefined functions and namespace prefixes only surface at evaluation: evaluate once on
    # a tiny document so such mistakes are usage errors now, not silent misses later.
    expr(_empty_doc(None))


@functools.lru_cache(maxsize=256)
def compile_xpath(expr: str, flag: str) -> lxml.etree.XPath:
    """Compile and validate an XPath 1.0 expression (EXSLT ``re:`` available).

    Raises ``UsageError("<flag>: invalid XPath '<expr>': <reason>")``.
    """
    try:
        compiled = _XPath(expr, namespaces=_NAMESPACES, smart_strings=False)
        _check(compiled)
    except (lxml.etree.XPathError, ValueError, TypeError) as exc:
        raise UsageError(f"{flag}: invalid XPath '{expr}': {exc}") from None
    return compiled


@functools.lru_cache(maxsize=256)
def compile_css(selector: str, flag: str) -> lxml.etree.XPath:
    """Compile a CSS selector (via cssselect) to an XPath that selects *elements*.

    Used for links, each selected element contributes its ``href`` (see :func:`links_from_doc`).
    Raises ``UsageError("<flag>: invalid CSS selector '<selector>': <reason>")``.
    """
    try:
        xpath = cssselect.HTMLTranslator().css_to_xpath(selector)
    except (cssselect.SelectorError, ValueError, TypeError) as exc:
        raise UsageError(f"{flag}: invalid CSS selector '{selector}': {exc}") from None
    return compile_xpath(xpath, flag)


def _as_xpath(expr: str | lxml.etree.XPath | None, default: str, flag: str) -> lxml.etree.XPath:
    if expr is None:
        return compile_xpath(default, flag)
    if isinstance(expr, str):
        return compile_xpath(expr, flag)
    return expr


def _evaluate(expr: lxml.etree.XPath, doc: lxml.html.HtmlElement) -> Any:
    try:
        return expr(doc)
    except (lxml.etree.XPathError, ValueError, TypeError) as exc:
        log.warning("extract.xpath_failed", xpath=expr.path, error=str(exc))
        return []


def _base_of(doc: lxml.html.HtmlElement, url: str) -> str:
    """The first http(s) ``<base href>`` (resolved against the page URL), else the page URL."""
    for href in doc.xpath("//base/@href"):
        candidate = str(href).strip()
        if not candidate:
            continue
        try:
            resolved = urljoin(url, candidate)
            if urlsplit(resolved).scheme.lower() in ("http", "https"):
                return resolved
        except ValueError:
            continue
    return url


def _link_strings(result: Any) -> Iterable[str]:
    if isinstance(result, str):
        yield result
        return
    if not isinstance(result, list):
        return
    for item in result:
        if isinstance(item, str):
            yield item
        elif isinstance(item, lxml.etree._Element):
            # An element was selected (CSS selectors, or XPath without /@href): use its href.
            href = item.get("href")
            if href is None:
                href = item.get("src")
            if href is not None:
                yield href


def links_from_doc(
    doc: lxml.html.HtmlElement, url: str, xpath: str | lxml.etree.XPath | None = None
) -> list[str]:
    """Links selected by ``xpath`` in a parsed ``doc``; see :func:`extract_links`."""
    expr = _as_xpath(xpath, DEFAULT_LINKS_XPATH, "--links")
    base = _base_of(doc, url)
    links: list[str] = []
    for raw in _link_strings(_evaluate(expr, doc)):
        raw = raw.strip()
        if not raw:
            continue
        try:
            links.append(urljoin(base, raw))
        except ValueError:  # e.g. "http://[broken": left for the caller's normalizer to drop
            links.append(raw)
    return links


def extract_links(
    body: bytes,
    url: str,
    *,
    xpath: str | lxml.etree.XPath | None = None,
    css: str | None = None,
    content_type: str | None = None,
) -> list[str]:
    """Link strings of a page, in document order, duplicates kept, absolute but NOT normalized.

    ``xpath`` (default ``//a/@href``) may select attributes/strings or elements (whose ``href``,
    else ``src``, is used); ``css`` selects elements.  Relative links resolve against the first
    http(s) ``<base href>`` if any, else ``url``.  Empty links are skipped; ``javascript:`` and
    the like are returned as-is for the caller's filter to count and drop.
    """
    doc = parse_html(body, url, content_type)
    expr = compile_css(css, "--links-css") if css is not None else xpath
    return links_from_doc(doc, url, expr)


def extract_next(
    body: bytes,
    url: str,
    xpath: str | lxml.etree.XPath,
    content_type: str | None = None,
) -> str | None:
    """The first link matched by ``xpath`` that resolves to an http(s) URL, else ``None``.

    Skipping ``javascript:``/``#`` style matches means a "next" button implemented in script
    does not send the producer back to a non-page.
    """
    doc = parse_html(body, url, content_type)
    return first_http_link(links_from_doc(doc, url,
                                          _as_xpath(xpath, DEFAULT_LINKS_XPATH, "--next")))


def first_http_link(links: Iterable[str]) -> str | None:
    """The first link with an http(s) scheme, else ``None``."""
    for link in links:
        try:
            if urlsplit(link).scheme.lower() in ("http", "https"):
                return link
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class Record:
    """What the consumer stores for a page: its title and the ``--field`` values."""

    title: str | None
    fields: dict[str, str | list[str] | None] = field(default_factory=dict)


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _to_text(item: Any) -> str:
    if isinstance(item, lxml.etree._Element):
        if not isinstance(item.tag, str):  # comment or processing instruction
            return _collapse(item.text or "")
        text = lxml.etree.tostring(item, method="text", encoding="unicode", with_tail=False)
        return _collapse(text)
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, float):
        return str(int(item)) if item.is_integer() else repr(item)
    return _collapse(str(item))


def _field_value(result: Any) -> str | list[str] | None:
    if isinstance(result, list):
        values = [_to_text(item) for item in result]
        if not values:
            return None
        return values[0] if len(values) == 1 else values
    return _to_text(result)  # string(), count(), boolean() results


def _title(doc: lxml.html.HtmlElement) -> str | None:
    # The first <title> in document order: the head's, else one a malformed page put in
    # <body> (//title[1], without the cost of an XPath evaluation).
    node = next(doc.iter("title"), None)
    return None if node is None else _to_text(node)


def record_from_doc(
    doc: lxml.html.HtmlElement, fields: Mapping[str, str | lxml.etree.XPath] = {}
) -> Record:
    """Title and fields of a parsed ``doc``; see :func:`extract_record`."""
    values: dict[str, str | list[str] | None] = {}
    for name, expr in fields.items():
        values[name] = _field_value(_evaluate(_as_xpath(expr, ".", "--field"), doc))
    return Record(title=_title(doc), fields=values)


def extract_record(
    body: bytes,
    url: str,
    fields: Mapping[str, str | lxml.etree.XPath] = {},
    content_type: str | None = None,
) -> Record:
    """Title and ``--field`` values of a page.

    ``title``: text of ``<title>`` with whitespace collapsed; ``None`` when there is no
    ``<title>`` (``""`` when it is empty).  Each field: the XPath result as text (an element's
    text content, or the attribute/string value), whitespace-collapsed; several matches give a
    list, none gives ``None``; number/boolean results are rendered as XPath would print them.
    """
    return record_from_doc(parse_html(body, url, content_type), fields)


def parse_field_specs(specs: Iterable[str]) -> dict[str, lxml.etree.XPath]:
    """Parse repeated ``--field NAME=XPATH`` (or ``NAME=css:SELECTOR``) options (split at
    the first ``=``).

    Raises :class:`UsageError` on a missing ``=``, a bad or repeated name, or a bad XPath.
    """
    fields: dict[str, lxml.etree.XPath] = {}
    for spec in specs:
        name, eq, expr = spec.partition("=")
        name, expr = name.strip(), expr.strip()
        if not eq or not expr or not _FIELD_NAME_RE.fullmatch(name):
            raise UsageError(f"--field: expected NAME=XPATH, got '{spec}'")
        if name in fields:
            raise UsageError(f"--field: field '{name}' given twice")
        if expr.startswith("css:"):  # NAME=css:SELECTOR (::text, ::attr(NAME) too)
            try:
                expr = css_to_xpath(expr[4:].strip())
            except CssError as exc:
                raise UsageError(f"--field {name}: {exc}") from None
        fields[name] = compile_xpath(expr, "--field")
    return fields
