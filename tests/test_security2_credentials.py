"""Issue 27, item 4 and the weak spots on what an operator is shown: credentials never shown,
invisible characters and homograph hosts escaped.

* a password in a URL (``user:p@ss@host`` included: before, ``***@ss@host``) never reaches
  ``--print-config`` (``--out postgresql://...`` from the flag, the environment or the file;
  before, printed in clear), logs, records, dead-letter znodes, ``queue list``, ``dead list``
  or ``status --consumer`` (text and ``--json``; before, all in clear);
* a ``--config`` file holding ``zk-auth`` that others may read is warned about (before,
  silently used);
* zero-width, BOM and tag characters are escaped, a homograph host is shown as punycode.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.httpd import Response, TestServer
from zkcrawl import logs
from zkcrawl.cli import main as zkcrawl_main
from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.layout import Layout
from zkcrawl.textsafe import printable, redact_userinfo, shown_url

SECRET = f"s3cr{uuid.uuid4().hex[:8]}"
PG_URL = f"postgresql://bob:{SECRET}@127.0.0.1:1/crawl"


def run(capsys: pytest.CaptureFixture[str], main, argv: list[str], env=None
        ) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = int(main(argv, dict(env or {})))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_hidden(*texts: str | bytes) -> None:
    for text in texts:
        data = text.decode() if isinstance(text, bytes) else text
        assert SECRET not in data and SECRET[4:] not in data, data[-3000:]


# -- redact_userinfo ------------------------------------------------------------------
@pytest.mark.parametrize("text, shown", [
    (f"http://user:p@{SECRET}@example.org/x", "http://***@example.org/x"),
    (f"see https://a:{SECRET}@h/x and ftp://u:{SECRET}@@h2", "see https://***@h/x and ftp://***@h2"),
    (f"https://u:{SECRET}(x@host?q=a@b#c@d", "https://***@host?q=a@b#c@d"),
    ("https://host/?mail=x@y", "https://host/?mail=x@y"),
    (f"postgresql://db/crawl?sslmode=require&PassWord={SECRET}&x=1",
     "postgresql://db/crawl?sslmode=require&PassWord=***&x=1"),
], ids=["at-signs", "two-urls", "parenthesis", "no-userinfo", "query-password"])
def test_the_whole_userinfo_is_masked(text, shown) -> None:
    assert redact_userinfo(text) == shown


userinfo = st.text(st.characters(blacklist_characters="/?#", blacklist_categories=("Zs", "Cc",
                                                                                   "Zl", "Zp",
                                                                                   "Cs")),
                   min_size=1, max_size=30)


@given(userinfo, userinfo)
def test_no_part_of_a_password_survives(user: str, password: str) -> None:
    out = redact_userinfo(f"https://{user}:{password}@example.org/p")
    assert out == "https://***@example.org/p"


# -- --print-config, logs ---------------------------------------------------------------
def test_print_config_masks_url_credentials_from_any_source(tmp_path, capsys) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f'out = "{PG_URL}"\n')
    for argv, env in ((["--out", PG_URL], {}), ([], {"ZKCRAWL_CONSUMER_OUT": PG_URL}),
                      (["--config", str(conf)], {})):
        _, out, err = run(capsys, consumer_main, [*argv, "--print-config"], env)
        assert "postgresql://***@127.0.0.1:1/crawl" in out, out
        assert_hidden(out, err)
    for url in (f"postgresql://db/crawl?password={SECRET}", f"postgresql://u:{SECRET}@[bad/db"):
        rc, out, err = run(capsys, consumer_main, ["--out", url, "--print-config"])
        assert rc == 2 and err.count("\n") == 1, err  # refused, in one line without it
        assert_hidden(out, err)


def test_log_lines_mask_a_password_holding_at_signs() -> None:
    buf = io.StringIO()
    logs.configure("json", "info", stream=buf)
    try:
        logs.get_logger("t").info("item.done", url=f"https://bob:p@{SECRET}@example.org/x",
                                  out=f"postgresql://db/crawl?password={SECRET}")
        logs.flush()
    finally:
        logs.configure("json", "info")
    assert "https://***@example.org/x" in buf.getvalue()
    assert_hidden(buf.getvalue())


def test_config_file_with_zk_auth_readable_by_others_is_warned_about(zk_hosts, tmp_path,
                                                                     capsys) -> None:
    conf = tmp_path / "zkcrawl.toml"
    conf.write_text(f'zk-auth = "digest:crawler:{SECRET}"\n')
    conf.chmod(0o644)
    argv = ["status", "--zk", zk_hosts, "--root", f"/t-{uuid.uuid4().hex[:8]}",
            "--config", str(conf), "--log-format", "json"]
    rc, _, err = run(capsys, zkcrawl_main, argv)
    assert rc == 0 and "--config (it holds zk-auth)" in err and "chmod 600" in err, err
    assert_hidden(err)
    conf.chmod(0o600)
    rc, _, err = run(capsys, zkcrawl_main, argv)
    assert rc == 0 and "--config" not in err, err


# -- records, dead letters, admin output -------------------------------------------------
@pytest.fixture
def failing() -> Iterator[TestServer]:
    down: Response = (500, {"Content-Type": "text/plain"}, b"no")
    with TestServer({"/down": down}) as srv:
        yield srv


def test_records_dead_letters_and_admin_output_never_show_url_passwords(
        zk, zk_hosts, zk_root, failing, tmp_path, capsys) -> None:
    layout = Layout.of(zk_root)
    fetched_url = failing.url("/down").replace("://", f"://bob:{SECRET}@")
    secret_url = failing.url("/down").replace("://", f"://bob:p@{SECRET}@")
    zk.ensure_path(layout.queue)
    zk.create(layout.item_prefix, item_codec.Item(url=fetched_url).encode(), sequence=True)
    out = tmp_path / "records.jsonl"
    rc, stdout, err = run(capsys, consumer_main, [
        "--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--exit-when-idle", "1",
        "--max-attempts", "1", "--allow-private-addresses", "--no-robots", "--domain-delay",
        "0", "--id", "c1", "--log-format", "json", "--log-level", "debug"])
    assert rc == 0, err
    assert_hidden(stdout, err, out.read_text())
    (name,) = zk.get_children(layout.dead)
    letter = zk.get(layout.dead_letter_path(name))[0]
    assert_hidden(letter)
    assert b"://***@127.0.0.1" in letter

    # A dead letter an older version wrote, a queued item and a lease of consumer c1.
    zk.create(layout.dead_prefix, json.dumps({"item": "qn-1", "url": secret_url, "error":
                                              f"at {secret_url}", "attempts": 3,
                                              "data": secret_url}).encode(), sequence=True)
    queued = zk.create(layout.item_prefix, item_codec.Item(url=secret_url).encode(), sequence=True)
    zk.ensure_path(layout.leases)
    zk.create(layout.lease(queued.rsplit("/", 1)[1]),
              json.dumps({"consumer": "c1", "claimed_at": time.time()}).encode(),
              ephemeral=True)
    base = ["--zk", zk_hosts, "--root", zk_root]
    for argv in (["queue", "list"], ["queue", "list", "--json"], ["dead", "list"],
                 ["dead", "list", "--json"], ["status", "--consumer", "c1"],
                 ["status", "--consumer", "c1", "--json"], ["status", "--json"]):
        rc, text, err = run(capsys, zkcrawl_main, [*argv, *base])
        assert rc == 0, (argv, err)
        assert_hidden(text, err)
        if argv[0] != "status" or "--consumer" in argv:
            assert "://***@127.0.0.1" in text, (argv, text)
    rc, text, _ = run(capsys, zkcrawl_main, ["dead", "requeue", "--all", *base])
    assert "credentials were masked" in text + _, text  # not requeued with "***" as the user


# -- invisible characters, homographs -----------------------------------------------------
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u3164\U000e0041\U000e007f\ufe0f"


@given(st.text(alphabet=st.sampled_from(INVISIBLE + "ab"), max_size=30))
def test_invisible_characters_are_always_escaped(text: str) -> None:
    out = printable(text)
    assert not any(c in INVISIBLE for c in out)
    assert out.replace("\\", "").isascii()


@given(st.text(max_size=60), st.sampled_from(["http://", "https://", "postgresql://"]))
def test_a_shown_url_has_an_ascii_authority_and_no_unsafe_character(rest: str, scheme: str
                                                                    ) -> None:
    out = shown_url(scheme + rest)
    assert printable(out) == out  # nothing left to escape
    authority = out[len(scheme):].split("/")[0].split("?")[0].split("#")[0]
    assert authority.isascii(), out
    out.encode("utf-8")


def test_admin_output_escapes_invisible_characters_and_shows_homographs_as_punycode(
        zk, zk_hosts, zk_root, capsys) -> None:
    layout = Layout.of(zk_root)
    zk.ensure_path(layout.queue)
    # Written by anyone who could write the queue: not through the producer's normalizer.
    zk.create(layout.item_prefix, b"http://p\xd0\xb0ypal.com/log\xe2\x80\x8bin\xf3\xa0\x81\x81",
              sequence=True)
    rc, text, err = run(capsys, zkcrawl_main, ["queue", "list", "--zk", zk_hosts, "--root",
                                              zk_root])
    assert rc == 0, err
    assert "http://xn--pypal-4ve.com/log\\u200bin\\U000e0041" in text, text
    assert shown_url("https://u:p@m\u00fcnchen.de:8080/") == "https://***@xn--mnchen-3ya.de:8080/"
