"""Sitemaps as a producer source (SPEC §4 ``--sitemap``, ``--sitemaps-from-robots``,
``--since``): :func:`decode` reads one sitemap file, :class:`SitemapWalk` walks indexes.

* A sitemap is hostile input: :func:`decode` never raises (a fault ends with ``error`` set,
  the entries before it kept) and is bounded by the caps, not the input -- gzip inflated to
  at most :data:`MAX_DECODED` bytes, XML parsed incrementally with no entity substituted,
  no DTD and no network, at most :data:`MAX_ENTRIES` entries; a bad ``<loc>`` is no entry,
  a bad or far-future ``<lastmod>`` is ignored.
* Formats: ``<urlset>``, ``<sitemapindex>`` (any namespace), gzip (by its magic bytes) and
  plain text.
* :class:`SitemapWalk` fetches through the producer's :class:`~zkcrawl.web.fetch.Fetcher`
  (guard, robots.txt, politeness), follows indexes depth first, each once, at most
  :data:`MAX_INDEX_DEPTH` deep and :data:`MAX_FILES` files a pass; with ``since``, entries
  and child sitemaps dated before it are skipped (undated ones kept).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import lxml.etree
import structlog
from protego import Protego

from zkcrawl.politeness.local import Politeness
from zkcrawl.web.fetch import ROBOTS_MAX_BYTES, Fetcher, FetchResult, FetchSettings
from zkcrawl.web.robots import robots_url
from zkcrawl.web.urls import MAX_URL_BYTES, normalize_url

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()

#: The protocol's limits per file: 50,000 entries, 50 MB (52,428,800 bytes) uncompressed.
MAX_ENTRIES = 50_000
MAX_DECODED = 52_428_800
#: Bytes fetched of one sitemap file (compressed or not): the fetcher's cap.
MAX_FETCHED = MAX_DECODED
#: Index levels followed below a root sitemap (the protocol allows 1; real sites nest).
MAX_INDEX_DEPTH = 3
#: Sitemap files read in one pass, whatever the indexes say.
MAX_FILES = 1000
#: A ``<lastmod>`` later than now plus this (seconds) is ignored (``lastmod-future``).
FUTURE_SLACK = 86_400.0
_SLICE = 256 * 1024  # bytes fed to the parser at a time, inflated or not
_GZIP_MAGIC = b"\x1f\x8b"
_W3C = re.compile(
    r"(\d{4})(?:-(\d\d)(?:-(\d\d)(?:[Tt ](\d\d):(\d\d)(?::(\d\d)(?:[.,]\d{1,9})?)?"
    r"\s*([Zz]|[+-]\d\d:?\d\d)?)?)?)?")
_KINDS = {"urlset": "urlset", "sitemapindex": "index"}
_ENTRY_TAGS = {"url", "sitemap"}
_TAGS = ("{*}urlset", "{*}sitemapindex", "{*}url", "{*}sitemap")


@dataclass(frozen=True)
class SitemapEntry:
    """One ``<url>`` (or ``<sitemap>`` of an index): its ``<loc>`` as written (stripped) and
    its ``<lastmod>`` as a Unix time, ``None`` when absent or unusable."""

    loc: str
    lastmod: float | None = None


@dataclass
class Decoded:
    """What :func:`decode` found besides the entries: the kind of file, a fatal error (the
    entries before it are still good), and counted problems of single entries."""

    kind: str | None = None  # "urlset", "index", "text"
    error: str | None = None
    problems: Counter[str] = field(default_factory=Counter)
    entries: int = 0
    decoded_bytes: int = 0


def parse_lastmod(text: str | None, now: float) -> tuple[float | None, str | None]:
    """``(Unix time, None)`` for a W3C datetime at most :data:`FUTURE_SLACK` ahead of ``now``;
    ``(None, reason)`` otherwise (``lastmod-invalid``, ``lastmod-future``); ``(None, None)``
    when there is none. A time without a zone is UTC. Never raises."""
    if text is None or not text.strip():
        return None, None
    text = text.strip()[:64]
    if len(text) >= 10:
        with contextlib.suppress(ValueError):  # the common full forms, in C
            when = datetime.fromisoformat(text)
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            try:
                stamp = when.timestamp()
            except (OverflowError, ValueError):
                return None, "lastmod-invalid"
            return (None, "lastmod-future") if stamp > now + FUTURE_SLACK else (stamp, None)
    match = _W3C.fullmatch(text)
    if match is None:
        return None, "lastmod-invalid"
    year, month, day, hour, minute, second, zone = match.groups()
    try:
        when = datetime(int(year), int(month or 1), int(day or 1), int(hour or 0),
                        int(minute or 0), int(second or 0), tzinfo=UTC)
        if zone and zone not in "Zz":
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            if offset > timedelta(hours=14):
                return None, "lastmod-invalid"
            when -= sign * offset
        stamp = when.timestamp()
    except (ValueError, OverflowError):  # 2024-02-30, 25:00, year 0, 9999-12-31T23:59-01:00
        return None, "lastmod-invalid"
    if stamp > now + FUTURE_SLACK:
        return None, "lastmod-future"
    return stamp, None


def _inflate(body: bytes, out: Decoded) -> Iterator[bytes]:
    """The body in slices, gunzipped when it starts with gzip's magic (every member of a
    multi-member file); never more than :data:`MAX_DECODED` bytes in all (then
    ``too-large``)."""
    if not body.startswith(_GZIP_MAGIC):
        if len(body) > MAX_DECODED:
            out.error = "too-large"
        for i in range(0, min(len(body), MAX_DECODED), _SLICE):
            out.decoded_bytes += min(_SLICE, len(body) - i)
            yield body[i:i + _SLICE]
        return
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = body
    while data or inflater.unconsumed_tail:
        try:
            piece = inflater.decompress(data, _SLICE)
        except zlib.error:
            out.error = "bad-gzip"
            return
        data = inflater.unconsumed_tail
        if piece:
            if out.decoded_bytes + len(piece) > MAX_DECODED:
                out.error = "too-large"
                return
            out.decoded_bytes += len(piece)
            yield piece
        if inflater.eof:
            data = inflater.unused_data
            if not data.startswith(_GZIP_MAGIC):
                return  # the end (trailing garbage after gzip's end is ignored)
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # a further gzip member
            continue
        if not piece and not data:
            break
    out.error = "bad-gzip"  # the stream ended before gzip's end: a cut body


def decode(body: bytes, now: float, out: Decoded) -> Iterator[SitemapEntry]:
    """The entries of one sitemap file, in order; see the module docstring. ``out`` receives
    the kind, the error and the problems. Never raises."""
    slices = _inflate(body, out)
    first = b""
    for piece in slices:
        first = piece
        break
    if not first:
        out.error = out.error or "empty"
        return
    head = first.lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"<"):
        yield from _decode_xml(first, slices, now, out)
    elif head[:8].lower().startswith((b"http://", b"https://")):
        yield from _decode_text(first, slices, out)
    else:  # binary, HTML without markup, JSON...: no form of sitemap
        out.error = out.error or "not-a-sitemap"


def _decode_text(first: bytes, slices: Iterator[bytes], out: Decoded) -> Iterator[SitemapEntry]:
    out.kind = "text"
    rest = b""
    first = first.removeprefix(b"\xef\xbb\xbf")
    for piece in _chain(first, slices):
        lines = (rest + piece).split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_URL_BYTES + 2:  # a "line" longer than any URL: not a URL list
            out.problems["too-long"] += 1
            rest = b""
        for raw in lines:
            if not _text_entry(raw, out):
                continue
            if out.entries >= MAX_ENTRIES:
                out.problems["too-many-urls"] += 1
                return
            out.entries += 1
            yield SitemapEntry(raw.strip().decode("utf-8"))
    if _text_entry(rest, out) and out.entries < MAX_ENTRIES:
        out.entries += 1
        yield SitemapEntry(rest.strip().decode("utf-8"))


def _text_entry(raw: bytes, out: Decoded) -> bool:
    line = raw.strip()
    if not line:
        return False
    if len(line) > MAX_URL_BYTES:
        out.problems["too-long"] += 1
        return False
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        out.problems["not-utf8"] += 1
        return False
    return True


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def _parser() -> lxml.etree.XMLPullParser:
    # No entity substitution (a "billion laughs" stays a reference), no DTD, no network;
    # huge_tree off keeps libxml2's own limits on depth and text size. Only the elements
    # that matter raise events (in any namespace, or none).
    return lxml.etree.XMLPullParser(
        events=("start", "end"), tag=_TAGS, resolve_entities=False, load_dtd=False,
        no_network=True, huge_tree=False, remove_comments=True, remove_pis=True,
        recover=False)


def _decode_xml(first: bytes, slices: Iterator[bytes], now: float, out: Decoded
                ) -> Iterator[SitemapEntry]:
    parser = _parser()
    try:
        for piece in _chain(first, slices):
            parser.feed(piece)
            for entry in _events(parser, now, out):
                if out.entries >= MAX_ENTRIES:
                    out.problems["too-many-urls"] += 1
                    return
                out.entries += 1
                yield entry
            if out.error:
                return
        if out.error is None:
            parser.close()
            yield from _events(parser, now, out)
    except lxml.etree.XMLSyntaxError:
        out.error = out.error or "xml-error"
    except (ValueError, TypeError, MemoryError):  # lxml on bytes it cannot take at all
        out.error = out.error or "xml-error"
    if out.kind is None and out.error is None:
        out.error = "not-a-sitemap"


def _localname(el: lxml.etree._Element) -> str:
    tag = el.tag
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _events(parser: lxml.etree.XMLPullParser, now: float, out: Decoded) -> Iterator[SitemapEntry]:
    for event, el in parser.read_events():
        if event == "start":
            if out.kind is None:  # the root element
                out.kind = _KINDS.get(_localname(el))
                if out.kind is None:
                    out.error = "not-a-sitemap"
                    return
            continue
        if out.kind is None or _localname(el) not in _ENTRY_TAGS:
            continue  # the root's own end
        entry = _entry(el, now, out)
        _free(el)
        if entry is not None:
            yield entry


def _entry(el: lxml.etree._Element, now: float, out: Decoded) -> SitemapEntry | None:
    loc_el = el.find("{*}loc")
    if loc_el is not None and len(loc_el):  # holds an entity reference left unsubstituted
        out.problems["entity"] += 1
        return None
    loc = (loc_el.text or "").strip() if loc_el is not None else ""
    if not loc:
        out.problems["no-loc"] += 1
        return None
    if len(loc) > MAX_URL_BYTES // 4 and len(loc.encode("utf-8", "replace")) > MAX_URL_BYTES:
        out.problems["too-long"] += 1
        return None
    stamp, problem = parse_lastmod(el.findtext("{*}lastmod"), now)
    if problem:
        out.problems[problem] += 1
    return SitemapEntry(loc, stamp)


def _free(el: lxml.etree._Element) -> None:
    """Drop an entry element and what came before it: memory stays one entry deep."""
    el.clear(keep_tail=False)
    parent = el.getparent()
    if parent is not None:
        while el.getprevious() is not None:
            del parent[0]


# -- fetching ----------------------------------------------------------------------------


@dataclass
class SitemapFile:
    """One sitemap file of a walk: where it came from and what it gave."""

    url: str
    depth: int
    status: int | None = None
    error: str | None = None  # fetch error (http-404, connection...) or decode error
    kind: str | None = None
    urls: list[SitemapEntry] = field(default_factory=list)  # page entries kept (after --since)
    children: int = 0  # sitemaps an index named that are followed
    older: int = 0  # entries (and child sitemaps) dated before --since
    problems: Counter[str] = field(default_factory=Counter)
    elapsed_ms: float = 0.0

    @property
    def failed(self) -> bool:
        """No entry could be taken: the fetch failed or the file is no sitemap at all."""
        return self.error is not None and not self.urls and not self.children


class SitemapWalk:
    """Read root sitemaps and the sitemaps their indexes name; yields one
    :class:`SitemapFile` per file tried (see the module docstring for the bounds).

    ``known`` (child sitemap URL -> the ``<lastmod>`` an index gave it when it was last read
    whole) lets a watching producer skip a child whose date has not changed since its
    previous pass; the walk updates it."""

    def __init__(self, fetcher: Fetcher, stop: threading.Event, *,
                 since: float | None = None, now: float | None = None,
                 max_files: int = MAX_FILES, max_depth: int = MAX_INDEX_DEPTH,
                 known: dict[str, float] | None = None) -> None:
        self.fetcher = fetcher
        self.stop = stop
        self.since = since
        self.now = now
        self.max_files = max_files
        self.max_depth = max_depth
        self.known = known if known is not None else {}
        self.read = 0
        self.unchanged = 0
        self._visited: set[str] = set()

    def walk(self, roots: Sequence[str]) -> Iterator[SitemapFile]:
        stack: list[tuple[str, int, float | None]] = [(u, 0, None) for u in reversed(roots)]
        while stack and not self.stop.is_set():
            url, depth, lastmod = stack.pop()
            key = normalize_url(url) or url
            if key in self._visited:
                log.info("sitemap.loop", url=url, hint="already read in this pass")
                continue
            if lastmod is not None and self.known.get(key) == lastmod:
                self.unchanged += 1  # its index dates it as when we last read it
                continue
            if self.read >= self.max_files:
                log.warning("sitemap.max_files", max_files=self.max_files, left=len(stack) + 1)
                return
            self._visited.add(key)
            self.read += 1
            sm, children = self.read_file(url, depth)
            if lastmod is not None and sm.error is None:
                self.known[key] = lastmod
            if len(self.known) > MAX_FILES * 10:  # a site that renames its files every pass
                self.known.clear()
            yield sm
            stack.extend(reversed(children))

    def read_file(self, url: str, depth: int
                  ) -> tuple[SitemapFile, list[tuple[str, int, float | None]]]:
        """Fetch and decode one file; the child sitemaps to read next (an index's)."""
        res = self.fetcher.fetch(url)
        sm = SitemapFile(url, depth, status=res.status, elapsed_ms=res.elapsed_ms)
        if res.error is not None and res.error != "too-large":
            sm.error = res.error
            return sm, []
        if res.error == "too-large":
            sm.problems["too-large"] += 1  # the first MAX_FETCHED bytes are still read
        return sm, self._take(sm, res)

    def _take(self, sm: SitemapFile, res: FetchResult) -> list[tuple[str, int, float | None]]:
        out = Decoded()
        now = time.time() if self.now is None else self.now
        children: list[tuple[str, int, float | None]] = []
        base = res.final_url or sm.url
        for entry in decode(res.body, now, out):
            if self.since is not None and entry.lastmod is not None \
                    and entry.lastmod < self.since:
                sm.older += 1
                continue
            if out.kind != "index":
                sm.urls.append(entry)
            elif sm.depth >= self.max_depth:
                out.problems["too-deep"] += 1
            else:
                child = normalize_url(entry.loc, base)
                if child is None:
                    out.problems["bad-sitemap-url"] += 1
                    continue
                children.append((child, sm.depth + 1, entry.lastmod))
        sm.kind, sm.children = out.kind, len(children)
        sm.problems.update(out.problems)
        if out.error is not None:
            sm.error = out.error
        return children


class SitemapSource:
    """The producer's sitemap input: ``--sitemap`` URLs and those the robots.txt of each
    ``--sitemaps-from-robots`` host names, read again on every :meth:`walk` (a watching
    producer's pass). Fetches through its own :class:`Fetcher` -- the listing fetcher's
    settings and politeness, any media type, :data:`MAX_FETCHED` bytes at most -- and, for
    robots.txt itself, one that does not ask robots.txt first."""

    def __init__(self, sitemaps: Sequence[str], from_robots: Sequence[str],
                 settings: FetchSettings, politeness: Politeness | None, http: str,
                 since: float | None = None, since_age: float | None = None) -> None:
        self.sitemaps = tuple(sitemaps)
        self.from_robots = tuple(from_robots)
        self.since = since
        self.since_age = since_age  # --since 7d: counted back from each pass, not the start
        self.fetcher = Fetcher(dataclasses.replace(settings, accept_types=(),
                                                   max_bytes=MAX_FETCHED),
                               politeness=politeness, http=http)
        self.robots_fetcher = Fetcher(dataclasses.replace(
            settings, accept_types=(), robots=False, max_bytes=ROBOTS_MAX_BYTES),
            politeness=politeness, http=http) if self.from_robots else None
        self.known: dict[str, float] = {}
        self.last: SitemapWalk | None = None

    def roots(self) -> tuple[list[str], list[SitemapFile]]:
        """The root sitemaps of this pass, and a failed file per unreadable robots.txt."""
        roots, failed = list(self.sitemaps), []
        for url in self.from_robots:
            assert self.robots_fetcher is not None
            found, error = sitemaps_from_robots(self.robots_fetcher, url)
            if error is not None:
                failed.append(SitemapFile(robots_url(url) or url, 0, error=error))
            elif not found:
                log.warning("sitemap.none_in_robots", url=robots_url(url),
                            hint="robots.txt has no Sitemap: line")
            roots += found
        return list(dict.fromkeys(roots)), failed

    def walk(self, stop: threading.Event) -> Iterator[SitemapFile]:
        roots, failed = self.roots()
        yield from failed
        if self.since_age is not None:
            self.since = time.time() - self.since_age
        self.last = SitemapWalk(self.fetcher, stop, since=self.since, known=self.known)
        yield from self.last.walk(roots)

    def close(self) -> None:
        self.fetcher.close()
        if self.robots_fetcher is not None:
            self.robots_fetcher.close()


def sitemaps_from_robots(fetcher: Fetcher, url: str) -> tuple[list[str], str | None]:
    """The ``Sitemap:`` lines of the robots.txt of ``url``'s host, through ``fetcher``
    (which must not check robots.txt itself); ``([], reason)`` when it cannot be read."""
    target = robots_url(url)
    if target is None:
        return [], "bad-url"
    res = fetcher.fetch(target)
    if res.error is not None and res.error != "too-large":
        return [], res.error
    try:
        rules = Protego.parse(res.body.decode("utf-8", errors="replace"))
        found = [s.strip() for s in rules.sitemaps if isinstance(s, str)]
    except Exception:  # protego on a robots.txt it cannot parse: no Sitemap lines
        log.warning("sitemap.robots_unparsable", robots_url=target, exc_info=True)
        return [], "robots-unparsable"
    urls = [u for u in (normalize_url(s, target) for s in found[:MAX_FILES]) if u]
    return list(dict.fromkeys(urls)), None
