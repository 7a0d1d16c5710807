"""One duration parser for the producer (issue #23): ``--watch`` (1 s to 366 days) and
``--recrawl-min``/``--recrawl-max`` (1 s to 3650 days) read the same spellings, each caller
keeps its bound, and nothing but a :class:`UsageError` naming the flag ever comes out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.errors import UsageError
from zkcrawl.producer import recrawl, watch
from zkcrawl.producer.settings import ProducerSettings

DAY = 86400.0
SPELLINGS = {"90": 90, "90s": 90, "1.5m": 90, "15m": 900, "15min": 900, "15 MIN": 900,
             " 2h ": 7200, "1H": 3600, "30d": 30 * DAY, "2w": 14 * DAY, "1.5": 1.5}


def test_both_callers_read_the_same_spellings() -> None:
    for text, seconds in SPELLINGS.items():
        assert watch.parse_duration(text) == seconds, text
        assert recrawl.parse_duration(text, "--recrawl-min") == seconds, text


@pytest.mark.parametrize(("parse", "flag", "high"), [
    (lambda t: watch.parse_duration(t), "--watch", 366),
    (lambda t: watch.parse_duration(t, "--since"), "--since", 366),
    (lambda t: recrawl.parse_duration(t, "--recrawl-max"), "--recrawl-max", 3650)])
def test_each_caller_keeps_its_bound(parse: object, flag: str, high: int) -> None:
    assert callable(parse)
    assert parse("1s") == 1 and parse(f"{high}d") == high * DAY
    for bad in ("0s", "0.5", f"{high + 1}d", f"{high * 86400 + 1}", "9" * 400, "-1s", "1e3",
                "", "m", "min", "5 mins", "5ms", "1y"):
        with pytest.raises(UsageError, match=flag):
            parse(bad)
    with pytest.raises(UsageError, match=f"{high:g} days"):
        parse(f"{high + 1}d")


def test_through_the_settings() -> None:
    ok = ProducerSettings(recrawl_min="10min", recrawl_max="3650d", watch="366d")
    ok._validate_recrawl()
    ok._validate_sitemaps(listing=True)
    for field, value in (("recrawl_max", "3651d"), ("watch", "367d")):
        with pytest.raises(UsageError):
            s = ProducerSettings(**{field: value})  # type: ignore[arg-type]
            s._validate_recrawl()
            s._validate_sitemaps(listing=True)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=24),
                 st.from_regex(r"\s*\d{1,12}(\.\d{0,6})?\s*(s|m|min|h|d|w|S|MIN|W)?\s*",
                               fullmatch=True),
                 st.none(), st.integers(), st.binary(max_size=8)),
       st.sampled_from([1.0, 366 * DAY, recrawl.MAX_SECONDS]))
def test_the_parser_only_raises_usage_errors(text: object, high: float) -> None:
    try:
        seconds = watch.parse_duration(text, "--flag", max_seconds=high)  # type: ignore[arg-type]
    except UsageError as exc:
        assert "--flag" in str(exc) and "\n" not in str(exc)
    else:
        assert isinstance(seconds, float) and 1 <= seconds <= high
