"""``zkcrawl try URL``: fetch one page the way the crawl would, and show what each side would
do with it -- before a queue is filled with the wrong links. No ZooKeeper is needed and
nothing is written anywhere.

* **The fetch**: the crawler's own :class:`~zkcrawl.web.fetch.Fetcher` (robots.txt, the SSRF
  guard, limits, redirects), the consumer's user agent by default.
* **The producer's view**: the links ``--links``/``--links-css`` select, each kept
  (normalized) or dropped with the producer's reason, the ``--next`` page, and the page's
  most common ``<a>`` classes.
* **The consumer's view**: the record it would write, built by the consumer's own
  :func:`zkcrawl.consumer.pipeline.page_record`, and whether it would be recorded or retried; with
  ``--processor``, ``--extract article`` or ``--pipeline``, their results or failures (a
  ``--pipeline`` stage's side effects happen here too).

``--json`` prints one object. Exit status: 0 fetched, 1 not fetched (the reason printed),
2 a bad URL, selector, field or regex.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

import lxml.etree

from zkcrawl.consumer.pipeline import extract_page, page_record
from zkcrawl.consumer.processors import ArticleProcessor, FieldsProcessor, Processors, parse_routes
from zkcrawl.consumer.results import ResultChain
from zkcrawl.consumer.settings import DEFAULT_USER_AGENT
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.producer import listing
from zkcrawl.producer.main import classify_link
from zkcrawl.producer.settings import DEFAULT_STRIP
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, env_name, opt
from zkcrawl.textsafe import printable
from zkcrawl.web.extract import DEFAULT_LINKS_XPATH, parse_field_specs
from zkcrawl.web.fetch import Fetcher, FetchResult, FetchSettings
from zkcrawl.web.options import WebOptions
from zkcrawl.web.urls import LinkFilter, compile_patterns, normalize_url

NAME = "try"
HELP = ("fetch one page as the crawl would and show what the producer would offer and what "
        "the consumer would record (no ZooKeeper needed)")
EXAMPLES = """
    # the links a listing page gives, kept and dropped with reasons, and its next page
    zkcrawl try https://blog.example.com/ --links-css 'article h2 a' \\
        --next '//a[@rel="next"]/@href' --same-host
    # the record the consumer would write for one item page, with an extra field
    zkcrawl try https://shop.example.com/p/42 --field "price=//span[@class='price']/text()"
    zkcrawl try http://127.0.0.1:8000/ --allow-private-addresses --json
    # the article the consumer would record with --extract article (text, author, date...)
    zkcrawl try https://blog.example.com/2024/05/post/ --extract article
"""
DUPLICATE = "duplicate"  # a link already kept from this page: the producer skips it too
_CONSUMER_ID = "try"


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings, WebOptions):
    links: str | None = opt(None, f"XPath selecting item links (default {DEFAULT_LINKS_XPATH})",
                            metavar="XPATH")
    links_css: str | None = opt(None, "CSS selector of item link elements (instead of --links)",
                                metavar="SELECTOR")
    next: str | None = opt(None, "XPath of the next-page link", metavar="XPATH")
    field: tuple[str, ...] = opt((), "record field NAME=XPATH, as the consumer's (repeatable)",
                                 repeat=True, metavar="NAME=XPATH")
    extract: str = opt("title", "what the consumer's default processor records, as its "
                       "--extract: 'title' (title + --field) or 'article' (main text, "
                       "author, date, language, canonical, tags, description, JSON-LD)",
                       choices=("title", "article"))
    allow: tuple[str, ...] = opt((), "keep only links matching one of these regexes; "
                                 "repeatable", repeat=True, metavar="REGEX")
    deny: tuple[str, ...] = opt((), "drop links matching this regex; repeatable", repeat=True,
                                metavar="REGEX")
    same_host: bool = opt(False, "keep only links on the page's host[:port]")
    strip_param: tuple[str, ...] = opt(DEFAULT_STRIP, "query parameter to remove (glob); "
                                       "repeatable; replaces the default list", repeat=True,
                                       metavar="NAME")
    robots: bool = opt(True, "obey robots.txt")
    user_agent: str = opt(DEFAULT_USER_AGENT, "User-Agent header, also the robots.txt agent")
    timeout: float = opt(15.0, "read timeout of the fetch in seconds", metavar="S")
    max_bytes: int = opt(10_000_000, "read at most N bytes of the page", metavar="N")
    json: bool = opt(False, "print one JSON object instead of the text")
    processor: tuple[str, ...] = opt((), "page code, as the consumer's --processor "
                                     "(repeatable, first match wins)", repeat=True,
                                     metavar="[re:PATTERN ]module:callable")
    pipeline: tuple[str, ...] = opt((), "result pipeline class, as the consumer's "
                                    "(repeatable, a chain in order)", repeat=True,
                                    metavar="module:Class")

    def validate(self) -> None:
        super().validate()
        if self.links and self.links_css:
            raise UsageError("give either --links or --links-css, not both")
        if not math.isfinite(self.timeout) or self.timeout <= 0:
            raise UsageError(f"--timeout must be a positive number of seconds, got "
                             f"{self.timeout:g}")
        if self.max_bytes < 1:
            raise UsageError(f"--max-bytes must be at least 1, got {self.max_bytes}")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the page to fetch (http or https)")


@dataclasses.dataclass(frozen=True)
class TryPlan:
    """Everything compiled before the fetch: a bad expression is exit 2, nothing fetched."""

    url: str
    selectors: listing.Selectors
    fields: dict[str, lxml.etree.XPath]
    link_filter: LinkFilter
    processors: Processors
    results: ResultChain


def make_plan(s: Settings, url: str) -> TryPlan:
    if normalize_url(url) is None:
        raise UsageError(f"not an absolute http(s) URL: {printable(url, 200)!r}")
    link_filter = LinkFilter(allow=compile_patterns(s.allow, "--allow"),
                             deny=compile_patterns(s.deny, "--deny"), same_host=s.same_host,
                             strip_params=tuple(p for p in s.strip_param if p))
    fields = parse_field_specs(s.field)
    results = ResultChain.load(s.pipeline)
    results.failures.every = True  # zkcrawl try: every failure's traceback (issue #26)
    default = ArticleProcessor(fields) if s.extract == "article" else FieldsProcessor(fields)
    return TryPlan(url.strip(), listing.compile_selectors(s.links, s.links_css, s.next),
                fields, link_filter,
                Processors(parse_routes(s.processor), default, trace_every=True), results)


def producer_view(plan: TryPlan, res: FetchResult) -> dict[str, Any]:
    """What ``zkcrawl-producer`` would do with the page as a listing."""
    page = listing.page_from_result(plan.url, res, plan.selectors)
    view: dict[str, Any] = {"skipped": page.skipped, "error": page.error,
                            "links_found": len(page.links), "offer": [], "drop": [],
                            "next": page.next_url, "anchors": page.anchors,
                            "anchor_classes": [[c, n] for c, n in page.anchor_classes]}
    kept: set[str] = set()
    for link in page.links:
        norm, reason = classify_link(plan.link_filter, link, page.final_url)
        if norm is not None and norm in kept:
            reason = DUPLICATE
        if norm is None or reason:
            view["drop"].append({"link": link, "reason": reason})
            continue
        kept.add(norm)
        view["offer"].append(norm)
    return view


def consumer_view(plan: TryPlan, res: FetchResult, started: float) -> dict[str, Any]:
    """What ``zkcrawl-consumer`` would write for the page as a first attempt (``started``:
    the fetch's monotonic start; ``process_ms`` is fetch + parse, as the consumer's)."""
    timing = {"queue_ms": 0.0, "dispatch_ms": 0.0, "wait_ms": 0.0, "polite_ms": 0.0,
              "process_ms": 0.0}
    ex = extract_page(plan.url, res, plan.fields, plan.processors)
    record = page_record(plan.url, res, plan.fields, item=None, attempt=0,
                         consumer=_CONSUMER_ID, timing=timing, extracted=ex)
    record["process_ms"] = round((time.monotonic() - started) * 1000, 3)
    # retry: back to the queue's tail, the host cooled down; recorded when attempts run out.
    outcome = "retry" if res.retryable else "record" if ex.error is None else "record-failed"
    view: dict[str, Any] = {"outcome": outcome, "record": record, "links": list(ex.links),
                            "extract_ms": ex.extract_ms}
    if ex.skipped:
        view.update(outcome="skip", record=None)
    elif plan.results and not res.retryable:
        plan.results.open()
        try:
            chained = plan.results.process(record)
        finally:
            plan.results.close()
        if chained.error is not None:
            view.update(outcome="retry", pipeline_error=chained.error)
        elif chained.record is None:
            view.update(outcome="dropped", dropped_by=chained.dropped_by)
        else:
            view["record"] = chained.record
    return view


def fetch_settings(s: Settings) -> FetchSettings:
    """The consumer's fetch (``ConsumerSettings.fetch_settings``) for these flags."""
    return FetchSettings(user_agent=s.user_agent, connect_timeout=min(5.0, s.timeout),
                         timeout=s.timeout, total_timeout=2 * s.timeout,
                         max_bytes=s.max_bytes, robots=s.robots, guard=s.address_guard())


def run(s: Settings, plan: TryPlan) -> dict[str, Any]:
    """Fetch once, then both views of the same response."""
    with Fetcher(fetch_settings(s), http=s.http) as fetcher:
        started = time.monotonic()
        res = fetcher.fetch(plan.url)
    fetch = {"url": plan.url, "final_url": res.final_url, "status": res.status,
             "content_type": res.content_type, "bytes": len(res.body), "error": res.error,
             "retryable": res.retryable, "redirects": res.redirects,
             "elapsed_ms": round(res.elapsed_ms, 3)}
    return {"fetch": fetch, "producer": producer_view(plan, res),
            "consumer": consumer_view(plan, res, started)}


def render_text(s: Settings, doc: Mapping[str, Any]) -> str:
    f, p, c = doc["fetch"], doc["producer"], doc["consumer"]
    out = [f"GET {_p(f['url'])}"]
    status = f"{f['status']}" if f["status"] is not None else "no response"
    line = f"  {status}, {f['bytes']} bytes, {_p(f['content_type'] or '-')}, " \
           f"{f['elapsed_ms']:.0f} ms"
    if f["redirects"]:
        line += f", {f['redirects']} redirect(s) to {_p(f['final_url'])}"
    out.append(line)
    if f["error"]:
        out.append(f"  error: {f['error']}" + _hint(s, f))
    selector = (f"--links-css {s.links_css}" if s.links_css
                else f"--links {s.links or DEFAULT_LINKS_XPATH}")
    out += ["", f"Producer (this page as a listing, {_p(selector)}):"]
    if p["skipped"] or p["error"]:
        why = p["skipped"] or p["error"]
        out.append(f"  not read as a listing: {why}")
    else:
        out.append(f"  {p['links_found']} links found: {len(p['offer'])} would be offered, "
                   f"{len(p['drop'])} dropped")
        classes = [(str(c), int(n)) for c, n in p["anchor_classes"]]
        out.append("  " + _p(listing.describe_anchors(p["anchors"], classes)))
        if not p["links_found"]:
            out.append(f"  the selector selects nothing{_selector_hint(classes)}")
        out += [f"  offer  {_p(u)}" for u in p["offer"]]
        width = max((len(d["reason"]) for d in p["drop"]), default=0)
        out += [f"  drop   {d['reason']:<{width}}  {_p(d['link'])}" for d in p["drop"]]
        if s.next:
            out.append(f"  next page: {_p(p['next']) if p['next'] else 'none found'}")
        else:
            out.append("  next page: not looked for (no --next)")
    out += ["", "Consumer (this page as an item, first attempt):"]
    rec = c["record"]
    links = [f"  link   {_p(u)}" for u in c["links"]]
    if c["outcome"] == "skip":
        out.append("  the processor skips it: completed without a record")
        return "\n".join(out + links) + "\n"
    if c["outcome"] == "dropped":
        out.append(f"  dropped by the pipeline {_p(c['dropped_by'])}: completed without a "
                   "record")
    if "pipeline_error" in c:
        out.append(f"  would retry later ({_p(c['pipeline_error'])}); after --max-attempts "
                   "it is recorded and dead-lettered")
    elif c["outcome"] == "retry":
        out.append(f"  would retry later ({rec['error']}): the item goes back to the queue "
                   "after a back-off; after --max-attempts it is recorded and dead-lettered")
    elif c["outcome"] == "record-failed":
        out.append(f"  would record the failure at once: error {rec['error']}"
                   + ("; and dead-letter it (`zkcrawl dead requeue --error blocked-address` "
                      "undoes it)" if rec["error"] == "blocked-address" else ""))
    out.append(f"  title: {_p(str(rec['title'])) if rec['title'] is not None else '(none)'}")
    for name, value in rec["fields"].items():
        out.append(f"  {name}: {_p(json.dumps(value, ensure_ascii=False))}")
    out.append("  record: " + _p(json.dumps(rec, ensure_ascii=False, sort_keys=False)))
    if links:
        out.append(f"  {len(links)} link(s) for --follow:")
    return "\n".join(out + links) + "\n"


def _selector_hint(classes: list[tuple[str, int]]) -> str:
    """``: --links-css 'a.post-link' would select 6`` from the most common class, if any."""
    if not classes:
        return ""
    name, count = classes[0]
    if not re.fullmatch(r"-?[A-Za-z_][A-Za-z0-9_-]*", name):
        return ""  # not a plain CSS identifier: no ready-made selector
    return f": --links-css 'a.{name}' would select {count}"


def _p(text: str) -> str:
    return printable(text, 2000)


def _hint(s: Settings, fetch: Mapping[str, Any]) -> str:
    if fetch["error"] == "blocked-address" and not s.allow_private_addresses:
        return " (a private or loopback address: --allow-private-addresses to fetch it)"
    if fetch["error"] in ("connection", "timeout") and fetch["status"] is None:
        return (" (no answer from the host: the crawl would retry it, leaving the host alone "
                "longer after each failure, up to 10 minutes)")
    if fetch["error"] == "robots" and s.robots:
        return " (robots.txt disallows it for this user agent; --no-robots to ignore)"
    return ""


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    if "log_level" not in ns and env_name("log_level") not in env:
        # The answer is on stdout; by default only trouble goes to stderr.
        settings = dataclasses.replace(settings, log_level="warning")
    setup_logging(settings)
    plan = make_plan(settings, ns.url)
    doc = run(settings, plan)
    if settings.json:
        print(json.dumps(doc, ensure_ascii=False, sort_keys=True))
    else:
        sys.stdout.write(render_text(settings, doc))
    fetched = doc["fetch"]["error"] in (None, "too-large")
    return ExitStatus.OK if fetched else ExitStatus.FAILURE
