"""Sitemaps as a producer source: the decoder (hypothesis and hostile files) and
``zkcrawl-producer --sitemap / --sitemaps-from-robots / --since`` end to end against a real
HTTP server on 127.0.0.1 and a real ZooKeeper."""

from __future__ import annotations

import gzip
import time
import tracemalloc
from typing import Any
from xml.sax.saxutils import escape

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.httpd import TestServer, gzip_bomb
from tests.test_producer import _fresh_loggers, common, queue_items, summary  # noqa: F401
from zkcrawl.producer import sitemaps
from zkcrawl.producer.main import main
from zkcrawl.producer.sitemaps import MAX_DECODED, MAX_ENTRIES, Decoded, decode, parse_lastmod

NOW = time.time()
NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def urlset(entries: list[tuple[str, str | None]]) -> bytes:
    rows = "".join(f"<url><loc>{escape(u)}</loc>"
                   + (f"<lastmod>{escape(m)}</lastmod>" if m is not None else "") + "</url>"
                   for u, m in entries)
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="{NS}">{rows}</urlset>'.encode()


def index(locs: list[str], lastmod: str | None = None) -> bytes:
    mod = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
    rows = "".join(f"<sitemap><loc>{escape(u)}</loc>{mod}</sitemap>" for u in locs)
    return f'<sitemapindex xmlns="{NS}">{rows}</sitemapindex>'.encode()


def run(body: bytes) -> tuple[list[sitemaps.SitemapEntry], Decoded]:
    out = Decoded()
    return list(decode(body, NOW, out)), out


def xml(body: bytes, ctype: str = "application/xml") -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": ctype}, body


# -- the decoder --------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096), st.booleans())
def test_decode_never_raises_on_any_bytes(body: bytes, zipped: bool) -> None:
    entries, out = run(gzip.compress(body) if zipped else body)
    assert len(entries) <= MAX_ENTRIES
    assert out.decoded_bytes <= MAX_DECODED
    assert all(e.loc and (e.lastmod is None or e.lastmod <= NOW + sitemaps.FUTURE_SLACK)
               for e in entries)


_locs = st.lists(st.from_regex(r"https?://[a-z]{1,10}\.example/[a-zA-Z0-9/&<>'\"?=_.-]{0,40}",
                               fullmatch=True), max_size=30)


@settings(max_examples=100, deadline=None)
@given(_locs, st.booleans())
def test_a_generated_sitemap_gives_back_its_urls_in_order(locs: list[str], zipped: bool
                                                          ) -> None:
    body = urlset([(u, "2024-05-06T07:08:09Z") for u in locs])
    entries, out = run(gzip.compress(body) if zipped else body)
    assert out.error is None and out.kind == "urlset"
    assert [e.loc for e in entries] == [u.strip() for u in locs]
    assert all(e.lastmod == 1714979289.0 for e in entries)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_parse_lastmod_never_raises(text: str) -> None:
    stamp, problem = parse_lastmod(text, NOW)
    assert (stamp is None) or (problem is None and stamp <= NOW + sitemaps.FUTURE_SLACK)


def test_lastmod_forms_and_the_year_9999() -> None:
    assert parse_lastmod("2024-01-01", NOW) == (1704067200.0, None)
    assert parse_lastmod("2024-01", NOW) == (1704067200.0, None)
    assert parse_lastmod("2024-01-01T10:00+02:00", NOW) == (1704096000.0, None)
    assert parse_lastmod("9999-12-31T23:59:59Z", NOW) == (None, "lastmod-future")
    assert parse_lastmod("2024-02-30", NOW) == (None, "lastmod-invalid")
    assert parse_lastmod("yesterday", NOW) == (None, "lastmod-invalid")
    entries, out = run(urlset([("http://a.example/1", "9999-01-01"), ("http://a.example/2", "x")]))
    assert [e.lastmod for e in entries] == [None, None]  # kept, as if it had no date
    assert out.problems == {"lastmod-future": 1, "lastmod-invalid": 1}


def test_an_entity_bomb_is_an_error_in_bounded_time_and_no_file_is_read() -> None:
    lol = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    bomb = (f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY l0 "lol">{lol}'
            '<!ENTITY ext SYSTEM "file:///etc/passwd">]>'
            f'<urlset xmlns="{NS}"><url><loc>http://a.example/&ext;</loc></url>'
            f'<url><loc>http://a.example/&l9;</loc></url></urlset>').encode()
    started = time.monotonic()
    entries, out = run(bomb)
    assert time.monotonic() - started < 5
    assert entries == [] and out.error == "xml-error"
    # without the bomb: the external entity stays a reference, the entry is refused
    entries, out = run(bomb.replace(b"&l9;", b"ok"))
    assert [e.loc for e in entries] == ["http://a.example/ok"]
    assert out.problems["entity"] == 1 and out.error is None


def test_a_gzip_bomb_stops_at_the_decoded_cap_with_bounded_memory() -> None:
    member = gzip_bomb(1 << 20)[2]  # 1 MiB of zeros in about 1 KB
    bomb = member * 1024  # 1 GiB in 1,024 gzip members
    head = gzip.compress(urlset([("http://a.example/1", None)])[:-len("</urlset>")])
    _, spaces = run(head + gzip.compress(b" " * (1 << 20)) * 100)  # 100 MB of blanks
    assert spaces.error in ("too-large", "xml-error") and spaces.decoded_bytes <= MAX_DECODED
    xml_bomb = gzip.compress(f'<urlset xmlns="{NS}"><url><loc>http://a.example/1</loc>'
                             f"</url><!--".encode() + bytes(200 << 20), 1)  # 200 MB comment
    tracemalloc.start()
    try:
        _, zeros = run(bomb)
        entries, comment = run(xml_bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert zeros.error == "not-a-sitemap" and zeros.decoded_bytes <= 1 << 20
    assert comment.error in ("xml-error", "too-large") and comment.decoded_bytes <= MAX_DECODED
    assert [e.loc for e in entries] == ["http://a.example/1"]  # what came before is kept
    assert peak < 20 << 20, peak
    # a well-formed sitemap inflating past 50 MB: cut at the cap, the entries before kept
    pad = "<extra>" + "x" * 2000 + "</extra>"
    padded = gzip.compress(  # 30,000 entries of 2 KB: past 50 MB before 50,000 entries
        f'<urlset xmlns="{NS}">'.encode()
        + b"".join(f"<url><loc>http://a.example/{i}</loc>{pad}</url>".encode()
                   for i in range(30_000)) + b"</urlset>", 1)
    entries, out = run(padded)
    assert out.error == "too-large" and out.decoded_bytes <= MAX_DECODED
    assert 20_000 < len(entries) < 30_000


def test_more_than_50000_urls_are_cut_at_50000() -> None:
    body = gzip.compress(urlset([(f"http://a.example/{i}", None) for i in range(50_010)]))
    entries, out = run(body)
    assert len(entries) == MAX_ENTRIES and out.problems["too-many-urls"] == 1
    assert entries[-1].loc == "http://a.example/49999"


def test_text_sitemaps_and_things_that_are_no_sitemap() -> None:
    entries, out = run(b"\xef\xbb\xbfhttp://a.example/1\r\n\nhttps://a.example/2\n\xff\xfe\n")
    assert [e.loc for e in entries] == ["http://a.example/1", "https://a.example/2"]
    assert out.kind == "text" and out.problems["not-utf8"] == 1
    assert run(b"<html><body>hi</body></html>")[1].error == "not-a-sitemap"
    assert run(b'{"urls": []}')[1].error == "not-a-sitemap"
    assert run(b"")[1].error == "empty"
    many = urlset([(f"http://a.example/{i * 7919}", None) for i in range(3000)])
    cut = gzip.compress(many)[:2000]
    entries, out = run(cut)
    assert out.error == "bad-gzip" and entries  # the entries before the cut are kept
    assert run(b"<urlset><url><loc>http://a.example/1</loc></url>")[1].error == "xml-error"


# -- the producer -------------------------------------------------------------------------

def sitemap_site() -> TestServer:
    srv = TestServer()
    base = srv.base_url
    srv.routes.update({
        "/robots.txt": (200, {"Content-Type": "text/plain"},
                        f"User-agent: *\nDisallow: /private/\nSitemap: {base}/index.xml\n"
                        .encode()),
        "/index.xml": xml(index([f"{base}/news.xml.gz", f"{base}/old.xml", f"{base}/loop.xml",
                                 f"{base}/index.xml", f"{base}/missing.xml"])),
        # an index naming the first one back: read once each
        "/loop.xml": xml(index([f"{base}/index.xml", f"{base}/deep.xml"])),
        "/deep.xml": xml(urlset([(f"{base}/post/deep", None)])),
        "/news.xml.gz": (200, {"Content-Type": "application/gzip"}, gzip.compress(urlset([
            (f"{base}/post/1?utm_source=x", "2026-03-01"),
            (f"{base}/post/2", "2026-03-02T10:00:00Z"),
            ("/post/3", "9999-01-01"),  # relative, a date in the year 9999: kept
            ("http://other.example/post/4", "2026-03-03"),  # another host (--same-host)
            (f"{base}/private/5", None),  # not the producer's to judge: offered
            (f"{base}/post/1", None),  # a duplicate after normalization
            (f"{base}/skip/6", None),  # --deny
        ]))),
        "/old.xml": xml(urlset([(f"{base}/post/old", "2019-05-05")])),
    })
    return srv.__enter__()


def test_sitemap_index_gz_loop_since_and_filters(zk, zk_hosts, zk_root, capsys) -> None:
    srv = sitemap_site()
    try:
        base = srv.base_url
        argv = common(zk_hosts, zk_root, "--sitemap", f"{base}/index.xml", "--same-host",
                      "--deny", "/skip/", "--since", "2020-01-01")
        assert main(argv, {}) == 1  # missing.xml: a sitemap that could not be read
        got = {i["url"] for i in queue_items(zk, zk_root)}
        assert got == {f"{base}/post/1", f"{base}/post/2", f"{base}/post/3",
                       f"{base}/private/5", f"{base}/post/deep"}
        assert len(srv.requests_for("/index.xml")) == 1  # the loop read it once
        out = summary(capsys.readouterr().err)
        assert out["dropped"]["older"] == 1 and out["dropped"]["other-host"] == 1
        assert out["pages_failed"] == 1 and "missing.xml" in out["failed"][0]
    finally:
        srv.close()


def test_sitemaps_from_robots_and_a_hostile_1gb_body(zk, zk_hosts, zk_root, capsys) -> None:
    srv = sitemap_site()
    chunk = b"<url><loc>http://x.example/a</loc></url>" * 1600  # 64 KB

    def endless(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(1 << 30))
        h.end_headers()
        h.wfile.write(f'<urlset xmlns="{NS}">'.encode())
        for _ in range((1 << 30) // len(chunk)):
            if srv.stopping:
                return
            try:
                h.wfile.write(chunk)
            except OSError:  # the producer stopped reading at its cap
                return

    srv.routes["/robots.txt"] = (200, {}, f"Sitemap: {srv.base_url}/huge.xml\n"
                                          f"Sitemap: {srv.base_url}/deep.xml\n".encode())
    srv.routes["/huge.xml"] = endless
    try:
        argv = common(zk_hosts, zk_root, "--sitemaps-from-robots", srv.base_url + "/x")
        started = time.monotonic()
        assert main(argv, {}) == 0
        assert time.monotonic() - started < 60
        got = {i["url"] for i in queue_items(zk, zk_root)}
        assert got == {"http://x.example/a", f"{srv.base_url}/post/deep"}
        err = capsys.readouterr().err
        assert "too-many-urls" in err or "too-large" in err
    finally:
        srv.close()


def test_bad_sitemap_flags_are_usage_errors(zk_hosts, zk_root, capsys) -> None:
    for extra, words in ((["--sitemap", "ftp://x/s.xml"], "not an absolute http(s) URL"),
                         (["--sitemap", "http://x/s.xml", "--since", "last week"],
                          "--since: expected a date"),
                         (["--start", "http://x/", "--since", "2024-01-01"], "--since filters"),
                         (["--sitemap", "http://x/s.xml", "--from-file", "-"],
                          "--from-file cannot be combined")):
        assert main(common(zk_hosts, zk_root, *extra), {}) == 2
        assert words in capsys.readouterr().err


def test_a_second_walk_skips_the_child_sitemaps_whose_index_date_is_unchanged() -> None:
    """What a watching producer's passes do: the index is read each time, a child only
    when its <lastmod> in the index changed (or it has none)."""
    import threading

    from zkcrawl.producer.sitemaps import SitemapSource
    from zkcrawl.web.fetch import FetchSettings

    with TestServer() as srv:
        base = srv.base_url

        def set_index(mod: str) -> None:
            srv.routes["/index.xml"] = xml(
                f'<sitemapindex xmlns="{NS}"><sitemap><loc>{base}/a.xml</loc>'
                f"<lastmod>{mod}</lastmod></sitemap><sitemap><loc>{base}/b.xml</loc>"
                "</sitemap></sitemapindex>".encode())

        set_index("2026-01-01")
        srv.routes["/a.xml"] = xml(urlset([(f"{base}/a/1", None)]))
        srv.routes["/b.xml"] = xml(urlset([(f"{base}/b/1", None)]))
        source = SitemapSource([f"{base}/index.xml"], [], FetchSettings(robots=False,
                                                                        guard=None),
                               None, "curl")
        stop = threading.Event()
        try:
            walks = []
            for mod in ("2026-01-01", "2026-01-01", "2026-02-01"):
                set_index(mod)
                walks.append([(sm.url.rsplit("/", 1)[-1], len(sm.urls))
                              for sm in source.walk(stop)])
        finally:
            source.close()
    assert walks[0] == [("index.xml", 0), ("a.xml", 1), ("b.xml", 1)]
    assert walks[1] == [("index.xml", 0), ("b.xml", 1)]  # a.xml: same date, not fetched
    assert walks[2] == walks[0]  # its date moved: read again
    assert len(srv.requests_for("/a.xml")) == 2


def test_dry_run_prints_what_a_sitemap_would_offer(capsys) -> None:
    with TestServer() as srv:
        srv.routes["/robots.txt"] = (404, {}, b"")
        srv.routes["/s.txt"] = (200, {"Content-Type": "text/plain"},
                                f"{srv.base_url}/x?utm_source=a\n{srv.base_url}/y\n".encode())
        argv = ["--dry-run", "--sitemap", srv.base_url + "/s.txt", "--delay", "0",
                "--allow-private-addresses", "--log-format", "json"]
        assert main(argv, {}) == 0
    assert capsys.readouterr().out.split() == [f"{srv.base_url}/x", f"{srv.base_url}/y"]
