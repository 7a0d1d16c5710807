"""Property tests: untrusted input (page bytes, headers, hrefs, robots.txt, settings) gives a
result or a recorded reason, never a stray exception.

* charset decoding (zkcrawl.web.decode): arbitrary bytes, ``Content-Type`` values and ``<meta>``
  declarations decode to UTF-8-encodable text with a codec of the WHATWG set;
* URL normalization (zkcrawl.web.urls): arbitrary text (lone surrogates, controls, huge ports, odd
  IP spellings, ``javascript:``, over-long strings) gives an ASCII http(s) URL of at most 8 KiB,
  or ``None`` and a drop reason;
* robots.txt (zkcrawl.web.robots): arbitrary bodies, user agents and URLs give a verdict;
* settings (zkcrawl.settings, zkcrawl.consumer.settings, zkcrawl.producer.settings): arbitrary file
  contents, environment values and numeric flag values give settings whose numbers are usable, or a
  :class:`UsageError` (exit 2).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import webencodings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zkcrawl.consumer.settings import ConsumerSettings
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.producer.settings import ProducerSettings
from zkcrawl.settings import ArgumentParser, CommonSettings, add_options, parse
from zkcrawl.web.decode import (
    WEB_CODECS,
    charset_from_content_type,
    decode_html,
    html_encoding,
    normalize_encoding,
)
from zkcrawl.web.robots import RobotsCache, RobotsDecision, robots_url
from zkcrawl.web.urls import (
    LinkFilter,
    compile_patterns,
    drop_reason,
    host_key,
    host_of,
    normalize_url,
)

props = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Every character, lone surrogates and C0/C1 controls included.
any_char = st.characters(exclude_categories=())
any_text = st.text(any_char, max_size=80)

# -- charset decoding ---------------------------------------------------------------------------

# Names of the BOM encodings html_encoding() reports (their codec consumes the BOM).
BOM_NAMES = {"utf-8", "utf-16-le", "utf-16-be"}
LABELS = sorted(webencodings.LABELS)
PY_CODECS = ["punycode", "rot13", "zlib", "uu", "idna", "utf-7", "base64", "hex", "bz2",
             "unicode_escape", "raw_unicode_escape", "utf-32", "mbcs", "cp1006", "undefined"]
label = st.one_of(st.sampled_from(LABELS), st.sampled_from(PY_CODECS), any_text)


def quoted(text: str) -> st.SearchStrategy[str]:
    return st.sampled_from([text, f'"{text}"', f"'{text}'", f" {text} ", text.upper()])


content_type = st.one_of(
    st.none(),
    any_text,
    label.flatmap(quoted).map(lambda lab: f"text/html; charset={lab}"),
)
meta = label.flatmap(quoted).flatmap(
    lambda lab: st.sampled_from([
        f"<meta charset={lab}>",
        f'<meta http-equiv="Content-Type" content="text/html; charset={lab}">',
        f"<META CHARSET={lab}",  # unterminated
    ])
)
page_body = st.one_of(
    st.binary(max_size=2000),
    st.tuples(meta, st.binary(max_size=1500)).map(
        lambda t: t[0].encode("utf-8", "surrogatepass") + t[1]
    ),
)


@props
@given(page_body, content_type)
@example(b'<meta charset="punycode">' + b"\x80-" * 500, "text/html; charset=punycode")
@example(b"\xff\xfe" + b"\x00\xd8" * 10, None)  # a BOM, then lone UTF-16 surrogates
@example(b"<p>" + b"\xa4" * 100, "text/html; charset=" + " " * 5000)
def test_decode_gives_text_and_a_web_codec(body: bytes, ctype: str | None) -> None:
    text, codec = decode_html(body, ctype)
    assert codec in WEB_CODECS | BOM_NAMES
    text.encode("utf-8")  # no lone surrogates: the text can be written anywhere
    assert html_encoding(body, ctype)[0] == codec


@props
@given(label)
def test_labels_map_into_the_web_codecs(lab: str) -> None:
    codec = normalize_encoding(lab)
    assert codec is None or codec in WEB_CODECS


@props
@given(st.one_of(st.none(), any_text, st.text(any_char, max_size=3000)))
def test_charset_from_content_type_never_raises(ctype: str | None) -> None:
    lab = charset_from_content_type(ctype)
    assert lab is None or (lab.isascii() and lab)


# -- URL normalization --------------------------------------------------------------------------

REASONS = {None, "javascript", "mailto", "data", "scheme", "invalid", "too-long"}
schemes = st.sampled_from(["http://", "https://", "HTTP://", "javascript:", "mailto:", "data:",
                           "ftp://", "//", "", "http:", "http:/", "hTTps://"])
hosts = st.one_of(
    st.sampled_from([
        "example.com", "EXAMPLE.com.", "bücher.example", "例え.テスト", "127.0.0.1", "127.1",
        "0x7f.0.0.1", "0177.0.0.1", "2130706433", "[::1]", "[::ffff:1.2.3.4]",
        "[fe80::1%25eth0]", "[v1.x]", "[::1", "::1]", "1.2.3.4.5", "%65xample.com", "a..b",
        "xn--", "xn--zz", "-a-.b", "_", "\ud800.com", "a\x00b", "ex\u00adample.com",
        "\uff25\uff38\uff21\uff2d\uff30\uff2c\uff25.com", "user@host", "a" * 300,
    ]),
    any_text,
)
ports = st.one_of(
    st.just(""),
    st.integers(min_value=-5, max_value=10**30).map(lambda p: f":{p}"),
    st.sampled_from([":", ":0", ":080", ":65535", ":65536", ":٣", ":+80", ": 80", ":80:80"]),
)
tails = st.one_of(
    any_text,
    st.sampled_from(["/", "/a/../../b", "/%2e%2E/", "?q=%zz#f", "/\udcff", "/\t\n\r", "#\ud800"]),
)
url_like = st.one_of(
    any_text,
    st.tuples(schemes, st.sampled_from(["", "user:pw@", "@", "\ud800@"]), hosts, ports, tails)
    .map("".join),
)
long_url = st.tuples(
    st.sampled_from(["http://example.com/", "https://a.b/?q=", "http://a/#"]),
    st.integers(min_value=8000, max_value=12000),
    st.sampled_from(["a", "é", "\ud800", " ", "%41"]),
).map(lambda t: t[0] + t[2] * t[1])
bases = st.one_of(st.none(), st.sampled_from(["http://example.com/d/p.html", "junk", ""]),
                  url_like)


def check_normalized(norm: str) -> None:
    assert norm.isascii() and norm.startswith(("http://", "https://"))
    assert len(norm) <= 8192
    assert normalize_url(norm) == norm


@props
@given(st.one_of(url_like, long_url), bases, st.lists(any_text, max_size=3))
@example("http://example.com/" + "a" * 8200, None, [])
@example("http://a/\ud800", None, [])
@example("http://a:99999999999999999999999/", None, [])
def test_url_functions_give_a_url_or_a_reason(url: str, base: str | None, strip: list) -> None:
    norm = normalize_url(url, base, strip)
    if norm is not None:
        check_normalized(norm)
    reason = drop_reason(url, base)
    assert reason in REASONS
    assert (reason is None) == (normalize_url(url, base) is not None)
    for host in (host_of(url), host_key(url)):
        assert isinstance(host, str) and host.isascii()


@props
@given(st.one_of(url_like, long_url), bases, st.booleans())
def test_link_filter_keeps_or_gives_a_reason(url: str, source: str | None, same: bool) -> None:
    norm, reason = LinkFilter(same_host=same, strip_params=("utm_*",)).check(url, source or "")
    assert (norm is None) != (reason is None)
    if norm is not None:
        check_normalized(norm)
    else:
        assert reason in REASONS | {"other-host"}


def test_over_long_urls_are_dropped_as_too_long() -> None:
    url = "http://example.com/" + "é" * 4100  # 8219 bytes of UTF-8, fewer characters
    assert normalize_url(url) is None and drop_reason(url) == "too-long"
    assert LinkFilter().check(url, "http://example.com/") == (None, "too-long")
    # short input whose percent-encoded form passes 8 KiB
    assert drop_reason("http://example.com/" + "<" * 3000) == "too-long"
    assert normalize_url("http://example.com/" + "a" * 8000) is not None


@props
@given(st.lists(st.one_of(any_text, st.sampled_from(["a{4294967296}", "(" * 5000, "\\N{x}"])),
                max_size=3))
def test_compile_patterns_compiles_or_says_usage(patterns: list[str]) -> None:
    try:
        compile_patterns(patterns, "--deny")
    except UsageError as exc:
        assert exc.exit_status == ExitStatus.USAGE


# -- robots.txt ---------------------------------------------------------------------------------

directive = st.sampled_from(["User-agent", "Disallow", "Allow", "Crawl-delay", "Sitemap",
                             "Request-rate", "Visit-time", "Host", "user-AGENT"])
robots_line = st.one_of(
    st.tuples(directive, st.sampled_from([":", ": ", " : "]), any_text).map("".join),
    any_text,
)
robots_body = st.one_of(
    st.binary(max_size=1500),
    st.lists(robots_line, max_size=20).map(
        lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")
    ),
)


@props
@given(robots_body, st.one_of(st.sampled_from(["zkcrawl", "*", ""]), any_text),
       st.one_of(url_like, st.just("http://example.com/").map(lambda u: u)),
       st.sampled_from([200, 0, 301, 404, 500, 999, -1]))
@example(b"User-agent: *\nCrawl-delay: nan\nDisallow: /x", "zkcrawl", "http://a/x", 200)
@example(b"User-agent: *\nDisallow: /private", "zkcrawl", "http://a/public/../private", 200)
def test_robots_gives_a_verdict(body: bytes, agent: str, url: str, status: int) -> None:
    cache = RobotsCache(lambda _url: (status, body), agent, clock=lambda: 0.0)
    verdict = cache.decide(url)
    assert isinstance(verdict, RobotsDecision) and isinstance(verdict.allowed, bool)
    delay = verdict.crawl_delay
    assert delay is None or (math.isfinite(delay) and delay >= 0)
    robots = robots_url(url)
    assert robots is None or (robots.isascii() and robots.endswith("/robots.txt"))


def test_robots_rules_see_the_normalized_path() -> None:
    cache = RobotsCache(lambda _url: (200, b"User-agent: *\nDisallow: /private"), "zkcrawl")
    assert not cache.allowed("http://a/public/../private")
    assert not cache.allowed("http://a/%70rivate")
    assert cache.allowed("http://a/public")


# -- settings -----------------------------------------------------------------------------------

KEYS = ["threads", "backlog", "timeout", "zk-timeout", "session_timeout", "max-bytes", "root",
        "zk", "id", "start", "field", "robots", "fp-rate", "exit-when-idle", "batch",
        "metrics-port", "delivery", "log-level", "max_depth", "expected", "delay"]
toml_value = st.one_of(
    st.sampled_from(["inf", "-inf", "nan", "1e400", "1.5", "0", "-1", "true", "1979-05-27",
                     '"x"', '""', "[]", "[1, [2]]", '["a", 1]', "{a = 1}", "'\\u0000'",
                     '"\\ud800"', '"/a//b"', '"/zk\\u0001"', "[" * 400 + "]" * 400,
                     "{a = " * 300 + "1" + "}" * 300]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats().map(repr),
    any_text.map(lambda t: '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'),
)
toml_line = st.tuples(st.one_of(st.sampled_from(KEYS), any_text), toml_value).map(
    lambda kv: f"{kv[0]} = {kv[1]}"
)
toml_file = st.one_of(
    st.lists(toml_line, max_size=6).map(lambda lines: "\n".join(lines).encode("utf-8",
                                                                             "surrogatepass")),
    st.binary(max_size=300),
)
number = st.one_of(
    st.sampled_from(["inf", "nan", "-0", "1e400", "1_0", "٣", "0x10", " 7 ", "", "-1e-400",
                     "9" * 5000, "1" * 30, "4096", "100000000", "1e9", "3.5"]),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats().map(repr),
    any_text,
)
NUMERIC_FLAGS = {
    CommonSettings: ["--zk-timeout", "--session-timeout"],
    ConsumerSettings: ["--threads", "--backlog", "--timeout", "--max-attempts",
                       "--domain-delay", "--max-bytes", "--exit-when-idle", "--metrics-port",
                       "--grace", "--stats-interval"],
    ProducerSettings: ["--max-pages", "--expected", "--fp-rate", "--max-depth", "--batch",
                       "--delay", "--timeout", "--retries", "--max-bytes"],
}
ENV_NAMES = ["ZKCRAWL_THREADS", "ZKCRAWL_ZK_TIMEOUT", "ZKCRAWL_ROBOTS", "ZKCRAWL_START",
             "ZKCRAWL_ROOT", "ZKCRAWL_ID", "ZKCRAWL_FP_RATE", "ZKCRAWL_EXIT_WHEN_IDLE",
             "ZKCRAWL_DELIVERY", "ZKCRAWL_EXPECTED", "ZKCRAWL_CONFIG"]
environment = st.dictionaries(st.sampled_from(ENV_NAMES), st.one_of(number, any_text),
                              max_size=4)
classes = st.sampled_from(list(NUMERIC_FLAGS))
# ZooKeeper refuses these in a path (PathUtils.validatePath).
ZK_BAD = set(map(chr, [*range(0x20), *range(0x7F, 0xA0), *range(0xD800, 0xF900),
                       *range(0xFFF0, 0x10000)]))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("props")


def load(cls: type, argv: list[str], env: dict[str, str]) -> object | None:
    """The settings, or None for a usage error; any other exception fails the test."""
    parser = ArgumentParser(prog="zkcrawl")  # no command prefix: ZKCRAWL_<FLAG>
    add_options(parser, cls)
    if cls is ProducerSettings:
        argv = ["--start", "http://example.com/", *argv]
    try:
        return parse(cls, parser, argv, env)[0]
    except UsageError as exc:
        assert exc.exit_status == ExitStatus.USAGE
        return None


def check_usable(obj: object) -> None:
    """Accepted settings hold numbers every consumer of them can take."""
    for field in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, field.name)
        if isinstance(value, float):
            assert math.isfinite(value) and abs(value) <= 1e9, field.name
        elif isinstance(value, int) and not isinstance(value, bool):
            assert abs(value) <= 2**53, field.name
        elif isinstance(value, str):
            value.encode("utf-8")
    for name in (obj.root, getattr(obj, "id", None) or "x"):  # type: ignore[attr-defined]
        assert not set(name) & ZK_BAD and "//" not in name


@props
@given(classes, toml_file, environment)
@example(CommonSettings, b"zk-timeout = inf", {})
@example(CommonSettings, b"\xff", {})
@example(CommonSettings, b"zk = " + b"[" * 1000 + b"]" * 1000, {})
@example(ConsumerSettings, b"threads = 1e400", {})
@example(ConsumerSettings, b"threads = inf", {})
@example(CommonSettings, b"", {"ZKCRAWL_CONFIG": "a\x00b"})
@example(CommonSettings, b"", {"ZKCRAWL_CONFIG": "\ud800"})
def test_settings_file_and_env(workdir: Path, cls: type, content: bytes,
                               env: dict[str, str]) -> None:
    cfg = workdir / "settings.toml"
    cfg.write_bytes(content)
    if "ZKCRAWL_CONFIG" in env:  # arbitrary names, inside the work dir
        env = {**env, "ZKCRAWL_CONFIG": str(workdir / env["ZKCRAWL_CONFIG"].replace("/", "_"))}
    obj = load(cls, ["--config", str(cfg)] if "ZKCRAWL_CONFIG" not in env else [], env)
    if obj is not None:
        check_usable(obj)


@props
@given(classes.flatmap(lambda c: st.tuples(st.just(c), st.sampled_from(NUMERIC_FLAGS[c]))),
       number, st.booleans())
@example((ConsumerSettings, "--threads"), "100000000", True)
@example((CommonSettings, "--zk-timeout"), "nan", True)
@example((ProducerSettings, "--expected"), "1" * 30, True)
def test_numeric_flags(cls_flag: tuple[type, str], value: str, joined: bool) -> None:
    cls, flag = cls_flag
    obj = load(cls, [f"{flag}={value}"] if joined else [flag, value], {})
    if obj is not None:
        check_usable(obj)


@props
@given(st.sampled_from(["--root", "--id"]),
       st.one_of(any_text, st.sampled_from(["/a//b", "/a/", "/", "/zk\x01", "/\ud800", "/a/./b",
                                            "/a/..", "/ok/path", "name", "na/me", ""])))
def test_znode_flags(flag: str, value: str) -> None:
    obj = load(ConsumerSettings, [f"{flag}={value}"], {})
    if obj is not None:
        check_usable(obj)


def test_usage_error_messages_name_the_flag() -> None:
    with pytest.raises(UsageError, match="--threads"):
        parse(ConsumerSettings, _parser(ConsumerSettings), ["--threads", "1" * 30], {})
    with pytest.raises(UsageError, match="--zk-timeout"):
        parse(CommonSettings, _parser(CommonSettings), ["--zk-timeout", "nan"], {})
    with pytest.raises(UsageError, match="--root"):
        parse(CommonSettings, _parser(CommonSettings), ["--root", "/a\x00"], {})


def _parser(cls: type) -> ArgumentParser:
    parser = ArgumentParser(prog="zkcrawl")  # no command prefix: ZKCRAWL_<FLAG>
    add_options(parser, cls)
    return parser

