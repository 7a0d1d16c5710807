"""HTML decoding (zkcrawl.decode) and the title that comes out of it (zkcrawl.extract)."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.decode import charset_from_content_type, decode_html, normalize_encoding
from zkcrawl.extract import extract_record

GBK_TITLE = "北京大学新闻网 — 学术动态与校园生活"
# Real Chinese punctuation (full-width commas) on purpose: it is part of what gets detected.
GBK_TEXT = "北京大学是中国近代第一所国立综合性大学，创办于1898年，初名京师大学堂。" * 3  # noqa: RUF001
BIG5_TITLE = "國立臺灣大學新聞網"
BIG5_TEXT = "國立臺灣大學是臺灣第一所綜合性大學，前身為日治時期的臺北帝國大學，校園位於臺北市。" * 3  # noqa: RUF001


def page(title: str, text: str, meta: str = "") -> str:
    return f"<html><head>{meta}<title>{title}</title></head><body><p>{text}</p></body></html>"


CASES = {
    "gbk": (GBK_TITLE, GBK_TEXT, "gbk", "gb18030"),
    "big5": (BIG5_TITLE, BIG5_TEXT, "big5", "big5hkscs"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("where", ["meta", "meta-http-equiv", "header", "neither"])
def test_chinese_pages_get_the_right_title(name: str, where: str) -> None:
    title, text, codec, expected_encoding = CASES[name]
    meta = {
        "meta": f'<meta charset="{codec}">',
        "meta-http-equiv": (
            f'<meta http-equiv="Content-Type" content="text/html; charset={codec.upper()}">'
        ),
    }.get(where, "")
    body = page(title, text, meta).encode(codec)
    content_type = f"text/html; charset={codec}" if where == "header" else "text/html"

    decoded, encoding = decode_html(body, content_type)
    assert title in decoded
    record = extract_record(body, "http://example.com/", content_type=content_type)
    assert record.title == title
    if where != "neither":
        assert encoding == expected_encoding
    else:  # detection may name a compatible codec; the text is what matters
        assert codecs.lookup(encoding).name in {"gb18030", "gbk", "big5", "big5hkscs", "cp950"}


def test_header_wins_over_meta_and_bom_wins_over_header() -> None:
    body = page("Grüße", "x", '<meta charset="windows-1251">').encode("utf-8")
    assert decode_html(body, "text/html; charset=UTF-8") == (body.decode("utf-8"), "utf-8")
    bom = codecs.BOM_UTF8 + "<title>é</title>".encode()
    assert decode_html(bom, "text/html; charset=iso-8859-1") == ("<title>é</title>", "utf-8")
    utf16 = "<title>é</title>".encode("utf-16")  # BOM included
    assert decode_html(utf16)[0] == "<title>é</title>"


def test_unknown_labels_fall_through() -> None:
    body = '<meta charset="no-such-charset"><title>Ünïcode</title>'.encode()
    assert decode_html(body, "text/html; charset=bogus") == (body.decode("utf-8"), "utf-8")


def test_legacy_labels_widen_to_supersets() -> None:
    assert normalize_encoding("GB2312") == "gb18030"
    assert normalize_encoding("x-gbk") == "gb18030"
    assert normalize_encoding("Big5") == "big5hkscs"
    assert normalize_encoding("ISO-8859-1") == "cp1252"
    assert normalize_encoding("us-ascii") == "cp1252"
    assert normalize_encoding("base64") is None  # a codec, but not a text encoding
    assert normalize_encoding("nonsense") is None
    # a GB18030-only character in a page labelled gb2312 still decodes
    body = '<meta charset="gb2312"><title>€ 𠀀</title>'.encode("gb18030")
    assert "€ 𠀀" in decode_html(body)[0]


def test_utf8_detected_first_even_when_cut_mid_character() -> None:
    body = "<title>naïve café 中文</title>".encode()
    assert decode_html(body) == (body.decode(), "utf-8")
    text, enc = decode_html(body[:-9])  # cut inside a 3-byte character
    assert enc == "utf-8" and text.startswith("<title>naïve café 中")


def test_undeclared_western_page_is_windows_1252() -> None:
    body = "<p>Café crème brûlée à la française, déjà vu</p>".encode("cp1252")
    assert decode_html(body) == (body.decode("cp1252"), "cp1252")


def test_charset_from_content_type() -> None:
    assert charset_from_content_type('text/html; charset="Shift_JIS"') == "Shift_JIS"
    assert charset_from_content_type("text/html") is None
    assert charset_from_content_type(None) is None


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=600),
    st.one_of(
        st.none(),
        st.sampled_from(
            [
                "text/html; charset=gbk",
                "text/html; charset=utf-16",
                "text/html; charset=bogus",
                "text/html",
            ]
        ),
    ),
)
def test_never_raises(body: bytes, content_type: str | None) -> None:
    text, encoding = decode_html(body, content_type)
    assert isinstance(text, str)
    codecs.lookup(encoding)
