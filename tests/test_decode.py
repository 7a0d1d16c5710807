"""HTML decoding (zkcrawl.web.decode) and the title that comes out of it (zkcrawl.web.extract)."""

from __future__ import annotations

import codecs
import encodings.aliases

import pytest
import webencodings
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.web.decode import (
    WEB_CODECS,
    charset_from_content_type,
    decode_html,
    normalize_encoding,
)
from zkcrawl.web.extract import extract_record

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


# The Python codecs of the WHATWG Encoding Standard's encodings (widened: gbk -> gb18030,
# big5 -> big5hkscs), written out by hand so that the table in zkcrawl.web.decode is checked
# against something it was not computed from.
WHATWG_CODECS = frozenset({
    "utf-8", "cp866", "iso8859-2", "iso8859-3", "iso8859-4", "iso8859-5", "iso8859-6",
    "iso8859-7", "iso8859-8", "iso8859-10", "iso8859-13", "iso8859-14", "iso8859-15",
    "iso8859-16", "koi8-r", "koi8-u", "mac-roman", "cp874", "cp1250", "cp1251", "cp1252",
    "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp1258", "mac-cyrillic", "gb18030",
    "big5hkscs", "euc_jp", "iso2022_jp", "cp932", "cp949", "utf-16-be", "utf-16-le",
})
# Python codecs a page used to be able to name: slow (punycode is quadratic), or not text.
NOT_WEB = ["punycode", "rot13", "zlib", "zip", "uu", "idna", "utf-7", "base64", "hex", "bz2",
           "quopri", "unicode_escape", "raw_unicode_escape", "utf-32", "cp1006", "mbcs",
           "undefined", "no-such-charset"]


def test_whatwg_labels_map_to_their_encoding() -> None:
    assert WEB_CODECS == WHATWG_CODECS
    expected = {"latin1": "cp1252", "iso-8859-1": "cp1252", "US-ASCII": "cp1252",
                "x-sjis": "cp932", "Shift_JIS": "cp932", "gb2312": "gb18030",
                "euc-kr": "cp949", "utf-16": "utf-16-le", "unicodefffe": "utf-16-be",
                "x-mac-roman": "mac-roman", "iso-8859-8-i": "iso8859-8", "tis-620": "cp874",
                ' "UTF8" ': "utf-8"}
    assert {label: normalize_encoding(label) for label in expected} == expected
    # "replacement" labels and x-user-defined carry no text: detection reads the page instead
    for label in ("iso-2022-kr", "hz-gb-2312", "replacement", "x-user-defined"):
        assert normalize_encoding(label) is None
    for label, name in webencodings.LABELS.items():
        assert (normalize_encoding(label) is None) == (name in ("replacement", "x-user-defined"))


@pytest.mark.parametrize("label", NOT_WEB)
def test_non_web_codecs_fall_back_to_detection(label: str) -> None:
    assert normalize_encoding(label) is None
    body = f'<meta charset="{label}"><title>Ünïcode</title>'.encode()
    assert decode_html(body, f"text/html; charset={label}") == (body.decode(), "utf-8")
    hostile = f'<meta charset="{label}">'.encode() + b"\x80-\xff" * 20_000  # not UTF-8
    text, codec = decode_html(hostile, f"text/html; charset={label}")
    assert codec in WHATWG_CODECS and text.startswith("<meta")


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.sampled_from(sorted(webencodings.LABELS)),
    st.sampled_from(sorted(set(encodings.aliases.aliases) | set(encodings.aliases.aliases.values())
                           | set(NOT_WEB))),
    st.text(st.characters(exclude_categories=()), max_size=30),
).flatmap(lambda lab: st.sampled_from([lab, lab.upper(), f" {lab}\t", f'"{lab}"'])))
def test_labels_only_ever_map_to_whatwg_codecs(label: str) -> None:
    codec = normalize_encoding(label)
    assert codec is None or codec in WHATWG_CODECS
