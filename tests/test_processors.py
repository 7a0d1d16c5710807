"""Page processors (issue #17): loading by name, routing, and what the consumer's per-item
pipeline makes of each processor's behaviour -- against a real HTTP server on 127.0.0.1,
processors loaded from the test package tests/plugins as a user's package would be."""

from __future__ import annotations

import time
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.httpd import TestServer, html
from tests.plugins import procs
from zkcrawl import Page, PageResult, Processor
from zkcrawl.consumer.main import main
from zkcrawl.consumer.pipeline import COMPLETE, ItemHandler
from zkcrawl.consumer.processors import MAX_LINKS, FieldsProcessor, Processors, parse_routes
from zkcrawl.consumer.settings import CRAWL_DELAY_CAP, ConsumerSettings
from zkcrawl.consumer.timing import ItemTiming, Timings
from zkcrawl.errors import UsageError
from zkcrawl.politeness.gate import HostGate
from zkcrawl.politeness.local import LocalPoliteness
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.claims import Claimed
from zkcrawl.queue.untrusted import URL_LIMIT
from zkcrawl.settings import parse
from zkcrawl.web.extract import parse_field_specs
from zkcrawl.web.fetch import Fetcher

ARTICLE = ('<html><head><title> An  article </title></head><body><h1>Big news</h1>'
           '<a href="/next">next</a><a href="https://other.example/x">out</a></body></html>')
P = "tests.plugins.procs"


def make(*specs: str, table: dict[str, str] | None = None, field: tuple[str, ...] = ()
         ) -> ItemHandler:
    s = ConsumerSettings(domain_delay=0.0, robots=False, allow_private_addresses=True,
                         field=field)
    gate = HostGate(LocalPoliteness(0.0), 0.0, CRAWL_DELAY_CAP)
    fields = parse_field_specs(field)
    processors = Processors(parse_routes(specs, table), FieldsProcessor(fields))
    return ItemHandler(Fetcher(s.fetch_settings(), politeness=gate), gate, fields, "c-test",
                    s.max_attempts, processors)


def process(p: ItemHandler, url: str, meta: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    data = item_codec.Item(url=url, meta=meta or {}).encode()
    dec = item_codec.decode(data)
    c = Claimed(name="qn-0000000001", seq=1, data=data, item=dec.item, error=dec.error,
                ctime=time.time())
    t = ItemTiming(time.monotonic(), 0.0)
    t.submitted = t.started = time.monotonic()
    return p.process(c, t), t


@pytest.fixture(scope="module")
def site():  # type: ignore[no-untyped-def]
    with TestServer({"/a": html(ARTICLE), "/blog/1": html(ARTICLE), "/x": html(ARTICLE)}) as srv:
        yield srv


def page(url: str = "http://h/a") -> Page:
    return Page(url, url, 200, MappingProxyType({}), ARTICLE.encode())


# -- loading and routing (pure) --------------------------------------------------------------
def test_routes_are_tried_in_order_and_the_first_match_wins():
    routes = parse_routes([f"re:^http://h/blog/ {P}:boom", f"re:/blog/ {P}:slow", f"{P}:heading"])
    ps = Processors(routes, FieldsProcessor({}))
    assert ps.pick("http://h/blog/1") is procs.boom  # both blog patterns match: the first
    assert ps.pick("http://x/h/blog/") is procs.slow
    assert ps.pick("http://h/other") is procs.heading  # no re: matches every URL
    only_blog = Processors(parse_routes([f"re:/blog/ {P}:boom"]), FieldsProcessor({}))
    assert isinstance(only_blog.pick("http://h/a"), FieldsProcessor)  # the default


def test_the_toml_table_comes_after_the_flags_in_file_order(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[processors]\n"/blog/" = "{P}:boom"\n"." = "{P}:heading"\n')
    s, _ = parse(ConsumerSettings, _parser(), ["--config", str(cfg),
                                               "--processor", f"re:/blog/1 {P}:slow"], {})
    ps = Processors(parse_routes(s.processor, s.processors), FieldsProcessor({}))
    assert [r.name for r in ps.routes] == [f"{P}:slow", f"{P}:boom", f"{P}:heading"]
    assert ps.pick("http://h/blog/1") is procs.slow
    assert ps.pick("http://h/blog/2") is procs.boom


def _parser():  # type: ignore[no-untyped-def]
    from zkcrawl.consumer.main import build_parser
    return build_parser()


def test_a_class_is_instantiated_once_and_is_a_processor():
    (route,) = parse_routes([f"{P}:Counting"])
    assert isinstance(route.processor, procs.Counting)
    assert isinstance(route.processor, Processor)
    assert route.processor(page()).fields == {"calls": 1}


@pytest.mark.parametrize(("spec", "message"), [
    ("tests.plugins.procs", "expected package.module:callable"),
    ("tests.plugins.nope:f", "cannot import 'tests.plugins.nope': ModuleNotFoundError"),
    (f"{P}:missing", "has no 'missing'"),
    (f"{P}:NOT_CALLABLE", "is not callable"),
    (f"{P}:BrokenInit", "BrokenInit() failed: RuntimeError: cannot start"),
    (f"re:( {P}:boom", "invalid regex '('"),
    (f"re: {P}:boom", "expected 're:PATTERN module:callable'"),
])
def test_a_bad_processor_is_a_usage_error(spec: str, message: str):
    with pytest.raises(UsageError, match="--processor") as err:
        parse_routes([spec])
    assert message in str(err.value)


def test_a_bad_processor_is_one_line_and_exit_2_before_zookeeper(capsys):
    # --zk points nowhere: exit 2 (not 75) proves the processor is checked first.
    assert main(["--processor", "tests.plugins.nope:f", "--zk", "127.0.0.1:1"], {}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zkcrawl-consumer: error: --processor:")


def test_processors_on_the_command_line_must_be_a_table(capsys):
    assert main(["--processors", "x", "--zk", "127.0.0.1:1"], {}) == 2
    assert "TOML table" in capsys.readouterr().err


# -- what the consumer makes of a processor's result ---------------------------------------
def test_a_processor_gets_the_page_and_its_fields_become_the_record(site: TestServer):
    out, _ = process(make(f"{P}:heading"), site.url("/a"))
    assert out.kind == COMPLETE and out.error is None
    assert out.record["fields"] == {"h1": "Big news"}
    assert out.record["title"] == "An article"  # not given by the processor: the page's


def test_a_plain_dict_is_the_fields_and_the_page_has_headers_and_meta(site: TestServer):
    out, _ = process(make(f"{P}:as_dict"), site.url("/a"), {"depth": 3})
    assert out.record["fields"] == {"status": 200, "type": "text/html; charset=utf-8",
                                    "depth": 3}


def test_a_processor_that_raises_is_a_recorded_permanent_failure(site: TestServer):
    out, _ = process(make(f"re:/blog/ {P}:boom"), site.url("/blog/1"))
    assert out.kind == COMPLETE  # permanent: recorded and completed, never retried
    assert out.error == f"processor: ValueError: no date on {site.url('/blog/1')} (procs.py:20)"
    assert out.record["error"] == out.error and out.record["status"] == 200
    # Routing: another URL gets the default processor, which works.
    ok, _ = process(make(f"re:/blog/ {P}:boom"), site.url("/a"))
    assert ok.error is None and ok.record["title"] == "An article"


@pytest.mark.parametrize(("name", "message"), [
    ("wrong_type", "processor: ProcessorError: returned list, not a PageResult"),
    ("not_json", "processor: ProcessorError: fields are not JSON"),
])
def test_a_result_the_record_cannot_hold_is_a_recorded_failure(site: TestServer, name: str,
                                                               message: str):
    out, _ = process(make(f"{P}:{name}"), site.url("/a"))
    assert out.kind == COMPLETE and out.error is not None and out.error.startswith(message)


def test_a_slow_processor_shows_in_extract_ms_and_in_the_stats(site: TestServer):
    out, t = process(make(f"{P}:slow"), site.url("/a"))
    assert out.error is None
    assert t.extract_ms >= procs.SLOW_S * 1000
    assert t.process_ms >= t.extract_ms  # extract is part of process
    _, fast = process(make(), site.url("/a"))
    assert fast.extract_ms < procs.SLOW_S * 1000
    timings = Timings()
    timings.record(t.durations(), "ok", final=True, failed=False, extract=t.extract_ms)
    snap = timings.snapshot(0, 0, 0)
    assert snap["extract_p50_ms"] == round(t.extract_ms, 3)


def test_links_are_absolute_http_and_junk_is_dropped(site: TestServer):
    out, _ = process(make(f"{P}:links"), site.url("/a"))
    assert out.links == (site.url("/next"), "https://other.example/x")
    assert out.record["fields"] == {"n": 2}


def test_a_skipped_page_has_no_record_but_its_links(site: TestServer):
    out, _ = process(make(f"{P}:skip"), site.url("/a"))
    assert out.kind == COMPLETE and out.record is None and out.skipped and out.error is None
    assert out.links == (site.url("/found-by-skipped"),)


def test_links_per_page_are_bounded():
    many = PageResult(links=[f"/p{i}" for i in range(MAX_LINKS + 50)])
    ps = Processors((), lambda _page: many)
    done = ps.run(page())
    assert len(done.links) == MAX_LINKS and done.error is None


def test_the_default_processor_reads_only_the_title_unless_fields_are_asked(site: TestServer):
    p = page()
    assert FieldsProcessor({})(p).title == "An article"
    assert "tree" not in p.__dict__  # the fast path: no whole-page parse
    fields = parse_field_specs(["h1=//h1"])
    assert FieldsProcessor(fields)(page()) == PageResult(fields={"h1": "Big news"},
                                                          title="An article")


def test_print_config_shows_the_processors_table_as_toml_config_accepts(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[processors]\n"^https://x/blog/" = "{P}:boom"\n')
    assert main(["--config", str(cfg), "--print-config"], {}) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines()
               if ln.startswith("processors")]
    again = tmp_path / "again.toml"
    again.write_text(line.split("  #")[0] + "\n")
    s, _ = parse(ConsumerSettings, _parser(), ["--config", str(again)], {})
    assert s.processors == {"^https://x/blog/": f"{P}:boom"}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=60) | st.none() | st.integers() | st.binary(max_size=20),
                max_size=30),
       st.sampled_from(["http://h/a/b", "https://h:8443/x?y=1", "http://[::1]/p"]))
def test_any_links_a_processor_returns_are_bounded_absolute_http_urls(raw, base):
    done = Processors((), lambda _page: PageResult(links=raw)).run(page(base))
    assert done.error is None and len(done.links) <= len(raw)
    for link in done.links:
        assert link.split(":", 1)[0] in ("http", "https")
        assert len(link.encode("utf-8", "surrogatepass")) <= URL_LIMIT
