"""Article extraction (``--extract article``, SPEC §4): :func:`extract_article` turns a fetched
body into the record's ``fields`` -- ``text``, ``author``, ``date``, ``language``,
``canonical``, ``tags``, ``description``, ``jsonld`` -- each None when the page has none.
The main text and fallback metadata come from trafilatura; JSON-LD, the canonical link, the
language and the tags are read here from the parsed tree.

Guarantees (the body is hostile):

* decoded as every page is (:mod:`zkcrawl.web.decode`);
* nothing but :class:`ArticleError` is raised, its message the record's reason
  (``extract: too-large``, ``not-text``, ``failed: <Type>``);
* every value is JSON (no NaN) and bounded (:data:`MAX_TAGS`, :data:`MAX_TAG`,
  :data:`MAX_JSONLD`); a ``canonical`` is an absolute http(s) URL of at most ``URL_LIMIT``;
* the work is linear in the capped body; :mod:`zkcrawl.consumer.extract_pool` adds a time cap.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

import lxml.etree
import lxml.html

from zkcrawl.errors import UsageError
from zkcrawl.queue.untrusted import URL_LIMIT
from zkcrawl.web.decode import decode_html
from zkcrawl.web.extract import parse_html

__all__ = ["ARTICLE_FIELDS", "MAX_BYTES", "MAX_ELEMENTS", "ArticleError", "Runner", "article",
           "empty_fields", "extract_article", "require", "set_runner"]

ARTICLE_FIELDS = ("text", "author", "date", "language", "canonical", "tags", "description",
                  "jsonld")
MAX_BYTES = 2_000_000  # a blog post without inline images is < 500 KB; past this: too-large
MAX_ELEMENTS = 15_000  # elements of the tree; trafilatura's cost grows faster than it
MAX_TAGS = 50
MAX_TAG = 100
MAX_JSONLD = 65_536  # bytes of the chosen JSON-LD object, serialized
MAX_SCRIPT = 1_000_000  # characters of one ld+json script parsed at most
MAX_SHORT = 2_000  # author, description: characters kept
_BINARY_SCAN = 65_536
_BINARY_SHARE = 0.05  # NUL, C0 controls other than whitespace, U+FFFD
_ARTICLE_TYPES = frozenset({"article", "blogposting", "newsarticle", "techarticle",
                            "scholarlyarticle", "report", "socialmediaposting",
                            "liveblogposting", "opinionnewsarticle", "reportagenewsarticle",
                            "analysisnewsarticle", "posting", "discussionforumposting"})
_LANG = re.compile(r"[A-Za-z]{2,3}(?:-[A-Za-z0-9]{1,8}){0,4}")
_TAG_SPLIT = re.compile("[,;\uff0c\uff1b\u3001]")  # and the full-width , ; and 、
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\ufffd]")


class ArticleError(Exception):
    """A page the extractor refuses; ``str(exc)`` is the record's reason (``extract: ...``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason if reason.startswith("extract: ") else f"extract: {reason}")


Runner = Callable[[bytes, str, "str | None"], dict[str, Any]]
_runner: Runner | None = None


def set_runner(runner: Runner | None) -> None:
    """Where :func:`article` sends pages: the consumer's process pool
    (:mod:`zkcrawl.consumer.extract_pool`) while it runs; None: in the calling thread."""
    global _runner
    _runner = runner


def article(body: bytes, url: str, content_type: str | None = None) -> dict[str, Any]:
    """:func:`extract_article` through the runner set (what ``Page.article()`` calls)."""
    if len(body) > MAX_BYTES:  # refused here: 10 MB are not sent to a process to be refused
        raise ArticleError("too-large")
    runner = _runner
    return (runner or extract_article)(body, url, content_type)


def require() -> None:
    """A :class:`UsageError` (exit 2) unless the ``article`` extra is installed."""
    try:
        import trafilatura  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--extract article needs {exc.name}: pip install "
                         "'zkcrawl[article]'") from None


def empty_fields() -> dict[str, Any]:
    """Every article field, null."""
    return dict.fromkeys(ARTICLE_FIELDS)


def extract_article(body: bytes, url: str, content_type: str | None = None
                    ) -> dict[str, Any]:
    """The article fields of ``body`` fetched from ``url`` (the final URL: relative links
    resolve against it); raises only :class:`ArticleError` (see the module docstring)."""
    if len(body) > MAX_BYTES:
        raise ArticleError("too-large")
    if _looks_binary(body, content_type):
        raise ArticleError("not-text")
    doc = parse_html(body, url, content_type)
    if _too_many_elements(doc):
        raise ArticleError("too-large")
    try:
        return _fields(doc, url)
    except ArticleError:
        raise
    except (RecursionError, MemoryError) as exc:
        raise ArticleError(f"failed: {type(exc).__name__}") from None
    except Exception as exc:  # a library's bug on one page must not fail the worker
        raise ArticleError(f"failed: {type(exc).__name__}") from None


def _looks_binary(body: bytes, content_type: str | None) -> bool:
    text = decode_html(body[:_BINARY_SCAN], content_type)[0]
    if not text:
        return False
    return len(_CONTROLS.findall(text)) > _BINARY_SHARE * len(text)


def _too_many_elements(doc: lxml.html.HtmlElement) -> bool:
    return any(count > MAX_ELEMENTS for count, _ in enumerate(doc.iter(), 1))


def _fields(doc: lxml.html.HtmlElement, url: str) -> dict[str, Any]:
    meta = _meta(doc)
    jsonld = _jsonld(doc)
    # Read before trafilatura: it prunes the tree it is given.
    own = {"language": _language(doc, meta, jsonld), "canonical": _canonical(doc, meta, url),
           "tags": _tags(meta, jsonld), "description": _description(meta, jsonld),
           "author": _jsonld_author(jsonld) or _meta_author(meta),
           "date": _jsonld_date(jsonld)}
    markup_author = _markup_author(doc)
    found = _trafilatura(doc, url)
    fields = empty_fields()
    fields.update(own)
    fields["jsonld"] = jsonld
    fields["text"] = found.get("text") or None
    fields["author"] = _author(fields["author"] or markup_author or found.get("author"))
    fields["description"] = fields["description"] or _short(found.get("description"))
    fields["date"] = fields["date"] or _iso_date(found.get("date"))
    if fields["tags"] is None:
        fields["tags"] = _clean_tags(_split_tags(found.get("tags") or ()))
    return fields


def _trafilatura(doc: lxml.html.HtmlElement, url: str) -> dict[str, Any]:
    import trafilatura  # imported on first use: the title-only path never pays for it

    _quiet()
    result = trafilatura.bare_extraction(
        doc, url=url, with_metadata=True, include_comments=False, include_tables=True)
    if result is None:
        return {}
    found = result.as_dict() if hasattr(result, "as_dict") else result
    return found if isinstance(found, dict) else {}


_AUTHOR_META = ("author", "article:author", "dc.creator", "dcterms.creator", "byl",
                "parsely-author", "sailthru.author")
# Visible bylines of the common blog engines, in order of trust (microdata, rel=author,
# hCard, Medium's test ids, cnblogs' "posted @ DATE AUTHOR").
_AUTHOR_XPATHS = [lxml.etree.XPath(x) for x in (
    "//*[@itemprop='author']//*[@itemprop='name']", "//*[@itemprop='author']",
    "//a[@rel='author']", "//*[contains(concat(' ', @class, ' '), ' author ')]"
    "//*[contains(concat(' ', @class, ' '), ' fn ')]",
    "//*[@data-testid='authorName']", "//*[contains(concat(' ', @class, ' '), ' postDesc ')]/a",
    "//*[contains(concat(' ', @class, ' '), ' author-name ')]")]
_BY = re.compile("^(?:by|posted by|written by|author|\u4f5c\u8005|\u6587|\u64b0\u6587)"
                 "\\s*[:/|\uff1a]?\\s*", re.IGNORECASE)  # 作者 文 撰文, full-width colon
MAX_AUTHOR = 100


def _meta_author(meta: dict[str, list[str]]) -> str | None:
    value = _first(meta, *_AUTHOR_META)
    return None if value is None or _http_url(value, "") else value  # a profile URL is no name


def _markup_author(doc: lxml.html.HtmlElement) -> str | None:
    for xpath in _AUTHOR_XPATHS:
        for el in xpath(doc)[:3]:
            if isinstance(el, lxml.html.HtmlElement) and (name := _author(el.text_content())):
                return name
    return None


def _author(value: object) -> str | None:
    """A name: whitespace collapsed, a leading "By"/"作者" taken off, at most 100 chars."""
    if not isinstance(value, str):
        return None
    name = _BY.sub("", " ".join(value.split())).strip()
    return name if 0 < len(name) <= MAX_AUTHOR else None


@functools.cache
def _quiet() -> None:
    # Their per-page warnings ("discarding data", unparsable dates) are not the crawl's
    # events: a refused page gets its reason in the record instead.
    for name in ("trafilatura", "htmldate", "courlan", "justext"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _meta(doc: lxml.html.HtmlElement) -> dict[str, list[str]]:
    """``<meta name|property|http-equiv=K content=V>``, keys lower-cased, values in order."""
    found: dict[str, list[str]] = {}
    for el in doc.iter("meta"):
        key = el.get("name") or el.get("property") or el.get("http-equiv") or el.get("itemprop")
        value = el.get("content")
        if key and value and value.strip():
            found.setdefault(key.strip().lower(), []).append(value.strip())
    return found


def _first(meta: dict[str, list[str]], *keys: str) -> str | None:
    for key in keys:
        if meta.get(key):
            return meta[key][0]
    return None


def _short(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    value = " ".join(value.split())
    return value[:MAX_SHORT] or None


# --- JSON-LD -------------------------------------------------------------------------------

def _jsonld(doc: lxml.html.HtmlElement) -> dict[str, Any] | None:
    """The first ``Article``-like object of the page's ``ld+json`` scripts (``@graph`` and
    lists searched), if it serializes to at most :data:`MAX_JSONLD` bytes."""
    for script in doc.iter("script"):
        if (script.get("type") or "").strip().lower() != "application/ld+json":
            continue
        for obj in _objects(_load(script.text or "")):
            if _is_article(obj):
                text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
                return obj if len(text.encode("utf-8")) <= MAX_JSONLD else None
    return None


def _load(text: str) -> Any:
    if len(text) > MAX_SCRIPT:
        return None
    try:  # NaN/Infinity refused: the record is strict JSON
        return json.loads(text.strip().removeprefix("<!--").removesuffix("-->"),
                          parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None


def _refuse(name: str) -> Any:
    raise ValueError(name)


def _objects(value: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    if depth > 3:
        return
    if isinstance(value, list):
        for item in value[:100]:
            yield from _objects(item, depth + 1)
    elif isinstance(value, dict):
        yield value
        yield from _objects(value.get("@graph"), depth + 1)


def _is_article(obj: dict[str, Any]) -> bool:
    kinds = obj.get("@type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return any(isinstance(k, str) and k.rsplit("/", 1)[-1].lower() in _ARTICLE_TYPES
               for k in kinds)


def _names(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        yield from _names(value.get("name"))
    elif isinstance(value, list):
        for item in value[:20]:
            yield from _names(item)


def _jsonld_author(obj: dict[str, Any] | None) -> str | None:
    if obj is None:
        return None
    names = [n for n in (_short(x) for x in _names(obj.get("author"))) if n]
    return _short("; ".join(dict.fromkeys(names)))


def _jsonld_date(obj: dict[str, Any] | None) -> str | None:
    if obj is None:
        return None
    for key in ("datePublished", "dateCreated", "uploadDate"):
        if date := _iso_date(obj.get(key)):
            return date
    return None


def _iso_date(value: object) -> str | None:
    """``value`` as ISO 8601 (``YYYY-MM-DD`` or a full timestamp), or None."""
    if not isinstance(value, str) or not 8 <= len(value.strip()) <= 40:
        return None
    text = value.strip().replace("Z", "+00:00").replace(" ", "T", 1)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if not 1990 <= parsed.year <= 2100:
        return None
    if len(text) <= 10:
        return parsed.date().isoformat()
    return parsed.isoformat()


# --- head metadata -------------------------------------------------------------------------

def _language(doc: lxml.html.HtmlElement, meta: dict[str, list[str]],
              obj: dict[str, Any] | None) -> str | None:
    candidates = [doc.get("lang"), doc.get("xml:lang"), _first(meta, "content-language"),
                  _first(meta, "og:locale"), obj.get("inLanguage") if obj else None]
    for value in candidates:
        if isinstance(value, str) and (
                m := _LANG.fullmatch(value.split(",")[0].strip().replace("_", "-"))):
            return m.group(0)
    return None


def _canonical(doc: lxml.html.HtmlElement, meta: dict[str, list[str]], url: str
               ) -> str | None:
    hrefs = [el.get("href") for el in doc.iter("link")
             if "canonical" in (el.get("rel") or "").lower().split()]
    for href in [*hrefs, _first(meta, "og:url")]:
        if href and (absolute := _http_url(href, url)):
            return absolute
    return None


def _http_url(href: str, base: str) -> str | None:
    try:
        absolute = urljoin(base, href.strip())
        scheme = urlsplit(absolute).scheme.lower()
    except ValueError:
        return None
    if scheme not in ("http", "https") or len(absolute.encode("utf-8", "replace")) > URL_LIMIT:
        return None
    return absolute


def _description(meta: dict[str, list[str]], obj: dict[str, Any] | None) -> str | None:
    value = _first(meta, "description", "og:description", "twitter:description")
    return _short(value) or _short(obj.get("description") if obj else None)


def _split_tags(values: Iterable[Any]) -> list[str]:
    tags: list[str] = []
    for value in values:
        if isinstance(value, str):
            tags.extend(_TAG_SPLIT.split(value))
    return tags


def _clean_tags(tags: Iterable[str]) -> list[str] | None:
    kept: dict[str, None] = {}
    for tag in tags:
        tag = " ".join(tag.split())[:MAX_TAG]
        if tag and len(kept) < MAX_TAGS:
            kept[tag] = None
    return list(kept) or None


def _tags(meta: dict[str, list[str]], obj: dict[str, Any] | None) -> list[str] | None:
    raw: list[Any] = list(meta.get("article:tag", []))
    if obj is not None:
        keywords = obj.get("keywords")
        raw.extend(keywords[:MAX_TAGS] if isinstance(keywords, list) else [keywords])
    raw.extend(meta.get("keywords", []))
    return _clean_tags(_split_tags(raw))


def fields_json_safe(fields: dict[str, Any]) -> bool:
    """True when ``fields`` serialize as strict JSON (what the record needs)."""
    try:
        json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True

