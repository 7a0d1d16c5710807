"""``zkcrawl try`` logs the traceback of one's processor every time it raises, and its note
says so (issue #26 review, gap 5): the real ``zkcrawl try`` from the user's directory
against a real HTTP server; the consumer's note (once per callable, exception type and line)
is checked on a real consumer in ``tests/test_diag26_report.py``."""

from __future__ import annotations

import re

from tests.httpd import TestServer, html
from tests.test_diag26_report import run

ARTICLE = '''def parse(page):
    raise ValueError("no date here")
'''


def test_the_note_of_zkcrawl_try_says_every_time(tmp_path):
    (tmp_path / "article.py").write_text(ARTICLE)
    with TestServer({"/a": html("<title>t</title>")}) as srv:
        rc, out, err = run("zkcrawl.cli", "try", srv.url("/a"), "--allow-private-addresses",
                           "--no-robots", "--processor", "article:parse", "--log-format",
                           "console", cwd=tmp_path)
    assert rc == 0, err
    assert "error processor: ValueError: no date here (article.py:2)" in out, out
    [warned] = [x for x in err.splitlines() if "processor.failed" in x]
    [note] = re.findall(r"note='([^']*)'", warned)
    assert note.startswith("the traceback of your code, logged each time it raises "
                           "(zkcrawl try;"), note
    assert "Traceback" in err and 'article.py", line 2, in parse' in err
