"""URL normalization and link filtering (zkcrawl.web.urls)."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zkcrawl.errors import UsageError
from zkcrawl.web.urls import (
    LinkFilter,
    compile_patterns,
    drop_reason,
    host_key,
    host_of,
    normalize_url,
)

BASE = "http://example.com/dir/page.html"


@pytest.mark.parametrize(
    ("url", "base", "expected"),
    [
        # relative, dot segments, protocol-relative
        ("other.html", BASE, "http://example.com/dir/other.html"),
        ("../up.html", BASE, "http://example.com/up.html"),
        ("/abs?x=1", BASE, "http://example.com/abs?x=1"),
        ("?page=2", BASE, "http://example.com/dir/page.html?page=2"),
        ("//cdn.example.net/a.js", "https://example.com/", "https://cdn.example.net/a.js"),
        ("//cdn.example.net", BASE, "http://cdn.example.net/"),
        ("http://example.com/a/./b/../c", None, "http://example.com/a/c"),
        ("http://example.com/a/b/..", None, "http://example.com/a/"),
        # case, default ports, empty path, fragments, empty query
        ("HTTP://Example.COM:80", None, "http://example.com/"),
        ("https://EXAMPLE.com:443/X", None, "https://example.com/X"),
        ("http://example.com:8080/", None, "http://example.com:8080/"),
        ("https://example.com:80/", None, "https://example.com:80/"),
        ("http://example.com/p#section", None, "http://example.com/p"),
        ("#top", BASE, "http://example.com/dir/page.html"),
        ("http://example.com/?", None, "http://example.com/"),
        ("http://example.com./x", None, "http://example.com/x"),
        # percent-encoding
        ("http://example.com/%7euser/%41", None, "http://example.com/~user/A"),
        ("http://example.com/a%2fb%2Fc", None, "http://example.com/a%2Fb%2Fc"),
        ("http://example.com/a b", None, "http://example.com/a%20b"),
        ("http://example.com/?q=a b&r=<x>", None, "http://example.com/?q=a%20b&r=%3Cx%3E"),
        ("http://example.com/%zz%", None, "http://example.com/%25zz%25"),
        ("http://example.com/café", None, "http://example.com/caf%C3%A9"),
        ("http://example.com/%2E%2E/x", None, "http://example.com/x"),
        # IDN
        ("http://Bücher.example/straße", None, "http://xn--bcher-kva.example/stra%C3%9Fe"),
        ("http://例え.テスト/", None, "http://xn--r8jz45g.xn--zckzah/"),
        # whitespace copied out of attributes
        ("  http://example.com/x\n ", None, "http://example.com/x"),
        ("http://exa\tmple.com/", None, "http://example.com/"),
        # IPv6 and userinfo
        ("http://[::1]:8080/x", None, "http://[::1]:8080/x"),
        ("http://[2001:DB8::0001]/", None, "http://[2001:db8::1]/"),
        ("http://user:p@ss@example.com/", None, "http://user:p%40ss@example.com/"),
    ],
)
def test_normalize(url: str, base: str | None, expected: str) -> None:
    assert normalize_url(url, base) == expected
    assert normalize_url(expected) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("javascript:void(0)", "javascript"),
        ("JavaScript:alert(1)", "javascript"),
        ("mailto:someone@example.com", "mailto"),
        ("data:text/html,<p>hi</p>", "data"),
        ("ftp://example.com/file", "scheme"),
        ("tel:+123", "scheme"),
        ("http://", "invalid"),
        ("http:///path", "invalid"),
        ("http://[::1/x", "invalid"),
        ("http://example.com:99999/", "invalid"),
        ("http://exa mple.com/", "invalid"),
        ("http://example.com:12ab/", "invalid"),
    ],
)
def test_dropped(url: str, reason: str) -> None:
    assert normalize_url(url, BASE) is None
    assert drop_reason(url, BASE) == reason


def test_relative_without_base_is_invalid() -> None:
    assert normalize_url("page.html") is None
    assert drop_reason("page.html") == "invalid"
    assert drop_reason("page.html", BASE) is None


def test_strip_params_globs_keep_order() -> None:
    url = "http://example.com/p?b=2&utm_source=x&a=1&UTM_X=y&fbclid=z&utm_medium=m#f"
    assert normalize_url(url, strip_params=("utm_*", "fbclid")) == (
        "http://example.com/p?b=2&a=1&UTM_X=y"
    )
    assert normalize_url("http://e.com/?utm_a=1", strip_params=("utm_*",)) == "http://e.com/"
    # names are matched decoded: utm%5Fsource is utm_source
    assert normalize_url("http://e.com/?utm%5Fsource=1&k", strip_params=("utm_*",)) == (
        "http://e.com/?k"
    )


def test_host_of() -> None:
    assert host_of("http://Example.com/x") == "example.com"
    assert host_of("http://example.com:8080/x") == "example.com:8080"
    assert host_of("https://example.com:443/") == "example.com"
    assert host_of("http://u:p@example.com/") == "example.com"
    assert host_of("mailto:x@y") == ""


def test_compile_patterns() -> None:
    pats = compile_patterns([r"/item/\d+", "^https://"], "--allow")
    assert all(isinstance(p, re.Pattern) for p in pats)
    with pytest.raises(UsageError, match=r"--deny: invalid regex '\(unclosed'"):
        compile_patterns(["ok", "(unclosed"], "--deny")


def test_link_filter() -> None:
    src = "http://shop.example.com/list?page=1"
    f = LinkFilter(
        allow=compile_patterns([r"/item/"], "--allow"),
        deny=compile_patterns([r"/item/secret"], "--deny"),
        same_host=True,
        strip_params=("utm_*",),
    )
    assert f.check("/item/1?utm_source=x#r", src) == ("http://shop.example.com/item/1", None)
    assert f.check("/about", src) == (None, "not-allowed")
    assert f.check("/item/secret-sale", src) == (None, "deny")
    assert f.check("http://other.example.com/item/2", src) == (None, "other-host")
    assert f.check("javascript:void(0)", src) == (None, "scheme")
    assert f.check("mailto:a@b", src) == (None, "scheme")
    assert f.check("http://[broken/item/", src) == (None, "invalid")
    # no rules: everything http(s) passes
    assert LinkFilter().check("//elsewhere.org/x", src) == ("http://elsewhere.org/x", None)


# -- properties -------------------------------------------------------------------------------

_url_chars = st.sampled_from(
    [*"abcXYZ019-._~:/?#[]@!$&'()*+,;=% \t\n\\\"<>^`{|}", "é", "ü", "€", "ß", "中", "\x00"]
)
_piece = st.text(_url_chars, max_size=12)
url_like = st.builds(
    lambda scheme, host, port, path, query, frag: (
        f"{scheme}://{host}{port}/{path}{'?' + query if query else ''}{'#' + frag if frag else ''}"
    ),
    st.sampled_from(["http", "HTTP", "https", "hTTps", "ftp", "javascript"]),
    st.one_of(
        st.sampled_from(["example.com", "EXAMPLE.com.", "bücher.de", "[::1]", "1.2.3.4", ""]),
        _piece,
    ),
    st.sampled_from(["", ":80", ":443", ":8080", ":", ":x", ":0080"]),
    _piece,
    _piece,
    _piece,
)
_settings = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(st.text())
@example("http://a/%2541")
@example("http://a/%%32%35")
@example("http://a/..%2F..")
def test_normalize_never_raises_and_is_idempotent_on_any_text(text: str) -> None:
    once = normalize_url(text)
    assert once is None or normalize_url(once) == once
    drop_reason(text)
    host_of(text)


@_settings
@given(url_like, st.one_of(st.none(), st.sampled_from([BASE, "https://x.org/a/b?c#d", "junk"])))
def test_normalize_url_like_idempotent(url: str, base: str | None) -> None:
    once = normalize_url(url, base)
    if once is not None:
        assert once.startswith(("http://", "https://"))
        assert "#" not in once
        assert normalize_url(once) == once
        assert normalize_url(once, base) == once
        assert drop_reason(url, base) is None
    else:
        assert drop_reason(url, base) is not None


@_settings
@given(url_like, st.text(max_size=30))
def test_normalize_relative_never_raises(base: str, rel: str) -> None:
    once = normalize_url(rel, base, strip_params=("utm_*", "a*"))
    assert once is None or normalize_url(once) == once


@pytest.mark.parametrize("url", [
    "http://Example.COM/a", "https://example.com:443/x?q#f", "http://example.com:8080/",
    "http://user:pw@example.com/p", "http://bücher.example/ß", "HTTP://EXAMPLE.com",
    "http://127.0.0.1:5000/a/1.html", "http://[::1]:80/", "not a url", "",
])
def test_host_key_is_host_of_for_every_url(url: str) -> None:
    assert host_key(url) == (host_of(url) if url else "")
    assert host_key(url) == host_key(url)  # the cached answer is the same
