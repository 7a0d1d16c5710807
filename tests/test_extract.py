"""Extraction with lxml (zkcrawl.web.extract)."""

from __future__ import annotations

import lxml.etree
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.errors import UsageError
from zkcrawl.web.extract import (
    Record,
    compile_css,
    compile_xpath,
    extract_links,
    extract_next,
    extract_record,
    links_from_doc,
    parse_field_specs,
    parse_html,
    record_from_doc,
)
from zkcrawl.web.urls import LinkFilter

URL = "http://shop.example.com/list/page1.html"

LISTING = b"""<!DOCTYPE html>
<html><head><title>  Shop
   listing  </title></head>
<body>
  <a href="item/1">one</a>
  <a href="/item/2#reviews">two</a>
  <a href="//cdn.example.net/item/3">three</a>
  <a href="https://other.example.org/item/4?utm_source=feed">four</a>
  <a href="javascript:void(0)">js</a>
  <a href="mailto:shop@example.com">mail</a>
  <a href="data:text/plain,hi">data</a>
  <a href="  ">blank</a>
  <a>no href</a>
  <a class="next" href="page2.html">next</a>
  <span class="price"> 12.50 </span><span class="price">13</span>
</body></html>"""


def test_default_links_resolved_in_order_not_normalized() -> None:
    assert extract_links(LISTING, URL) == [
        "http://shop.example.com/list/item/1",
        "http://shop.example.com/item/2#reviews",
        "http://cdn.example.net/item/3",
        "https://other.example.org/item/4?utm_source=feed",
        "javascript:void(0)",
        "mailto:shop@example.com",
        "data:text/plain,hi",
        "http://shop.example.com/list/page2.html",
    ]


def test_links_then_filter_counts_drop_reasons() -> None:
    filt = LinkFilter(strip_params=("utm_*",))
    kept, dropped = [], []
    for link in extract_links(LISTING, URL):
        norm, reason = filt.check(link, URL)
        (kept if norm else dropped).append(norm or reason)
    assert "http://shop.example.com/item/2" in kept  # fragment gone
    assert "https://other.example.org/item/4" in kept  # tracking param gone
    assert dropped == ["scheme", "scheme", "scheme"]


def test_base_href_is_honoured() -> None:
    body = b'<html><head><base href="/base/dir/"></head><body><a href="x">x</a></body></html>'
    assert extract_links(body, URL) == ["http://shop.example.com/base/dir/x"]
    # a non-http <base> is ignored
    body = b'<html><head><base href="javascript:0"></head><body><a href="x">x</a></body></html>'
    assert extract_links(body, URL) == ["http://shop.example.com/list/x"]


def test_custom_xpath_css_and_elements() -> None:
    assert extract_links(LISTING, URL, xpath="//a[@class='next']/@href") == [
        "http://shop.example.com/list/page2.html"
    ]
    # an XPath selecting elements uses their href
    assert extract_links(LISTING, URL, xpath="//a[@class='next']") == [
        "http://shop.example.com/list/page2.html"
    ]
    assert extract_links(LISTING, URL, css="a.next") == ["http://shop.example.com/list/page2.html"]
    assert len(extract_links(LISTING, URL, css="a")) == 8  # <a> without href contributes none
    # EXSLT regular expressions are available
    assert extract_links(LISTING, URL, xpath=r"//a[re:test(@href, 'item/\d$')]/@href") == [
        "http://shop.example.com/list/item/1",
        "http://cdn.example.net/item/3",
    ]


def test_extract_next() -> None:
    assert extract_next(LISTING, URL, "//a[@class='next']/@href") == (
        "http://shop.example.com/list/page2.html"
    )
    assert extract_next(LISTING, URL, "//a[@rel='next']/@href") is None
    body = b'<a class="n" href="javascript:more()">js</a><a class="n" href="?p=3">3</a>'
    assert extract_next(body, URL, "//a[@class='n']/@href") == URL + "?p=3"


def test_record_title_and_fields() -> None:
    fields = parse_field_specs(
        [
            "price=//span[@class='price']",
            "first=//span[@class='price'][1]/text()",
            "count=count(//a)",
            "missing=//table",
            "href=//a[@class='next']/@href",
            "has_next=boolean(//a[@class='next'])",
        ]
    )
    rec = extract_record(LISTING, URL, fields)
    assert rec == Record(
        title="Shop listing",
        fields={
            "price": ["12.50", "13"],
            "first": "12.50",
            "count": "10",
            "missing": None,
            "href": "page2.html",
            "has_next": "true",
        },
    )


def test_title_absent_empty_or_misplaced() -> None:
    assert extract_record(b"<p>no title</p>", URL).title is None
    assert extract_record(b"<title></title>", URL).title == ""
    assert extract_record(b"<body><p>x</p><title>late</title></body>", URL).title == "late"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   \n",
        b"<!-- only a comment -->",
        b"<p>unclosed <a href='/x'>link<div></span></p></b>",
        b"\x00\x01\x02<<<>>>\xff\xfe\xfa",
        b'<?xml version="1.0" encoding="iso-8859-1"?><html><title>t\xe9</title></html>',
        b"<html><title>a\x00b</title>",
        b"<table><tr><td><a href=/in-table>x</td></tr>" * 50,
    ],
)
def test_malformed_html_is_tolerated(body: bytes) -> None:
    doc = parse_html(body, URL)
    assert doc.tag == "html"
    assert isinstance(extract_links(body, URL), list)
    assert isinstance(extract_record(body, URL, {"x": "//a"}), Record)


def test_xml_declaration_charset_is_not_trusted_over_bytes() -> None:
    body = '<?xml version="1.0" encoding="utf-8"?><title>Grüße</title>'.encode()
    assert extract_record(body, URL).title == "Grüße"


def test_parse_once_use_twice() -> None:
    doc = parse_html(LISTING, URL)
    assert len(links_from_doc(doc, URL)) == 8
    assert record_from_doc(doc).title == "Shop listing"


@pytest.mark.parametrize("expr", ["//a[", "//a/@", "nosuch(1)", "//x:a", ""])
def test_bad_xpath_is_usage_error(expr: str) -> None:
    with pytest.raises(UsageError, match=r"^--links: invalid XPath"):
        compile_xpath(expr, "--links")


def test_bad_css_is_usage_error() -> None:
    with pytest.raises(UsageError, match=r"^--links-css: invalid CSS selector 'a\['"):
        compile_css("a[", "--links-css")
    assert isinstance(compile_css("div.item > a", "--links-css"), lxml.etree.XPath)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["price"], "expected NAME=XPATH"),
        (["=//a"], "expected NAME=XPATH"),
        (["p="], "expected NAME=XPATH"),
        (["bad name=//a"], "expected NAME=XPATH"),
        (["a=//a", "a=//b"], "given twice"),
        (["a=//a["], "invalid XPath"),
    ],
)
def test_bad_field_specs(specs: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_field_specs(specs)


def test_field_spec_splits_at_first_equals() -> None:
    fields = parse_field_specs(["sku=//span[@data-x='1']"])
    assert fields["sku"].path == "//span[@data-x='1']"


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400) | st.text(max_size=300).map(lambda t: t.encode("utf-8", "replace")))
def test_extraction_never_raises(body: bytes) -> None:
    extract_links(body, URL)
    extract_record(body, URL, {"a": "//a/@href", "n": "count(//*)"})
