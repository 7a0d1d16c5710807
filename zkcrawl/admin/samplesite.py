"""The bundled demo site: a small blog on 127.0.0.1 with the traps a real site has.

For ``zkcrawl demo`` and the tests: in-thread (``with SampleSite() as site: ...``;
:func:`expected_articles` is what a correct crawl records) or as a process
(``python -m zkcrawl.admin.samplesite --port 8000`` prints ``READY <base_url>``).

* ``/blog/page/1`` .. ``/blog/page/5``: listings linked by ``<a rel="next">``, article links
  in every URL form, with fragments, ``utm_*`` parameters, duplicates, ``javascript:``,
  ``mailto:`` and an unresolvable external host;
* ``/blog/posts/N.html`` (N = 1..40): articles; :data:`GBK_ARTICLE` is GBK declared only by
  ``<meta>``, :data:`UTF8_NOCHARSET_ARTICLE` UTF-8 undeclared, :data:`SLOW_ARTICLE` slow;
* ``/blog/posts/41.html`` 404, ``/blog/private/`` disallowed by ``/robots.txt``,
  ``/blog/posts/data.json`` not HTML.
"""

from __future__ import annotations

import argparse
import html
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

PAGES = 5
PER_PAGE = 8
ARTICLES = PAGES * PER_PAGE  # 40 valid articles
GBK_ARTICLE = 8
GBK_TITLE = "分布式爬虫示例"
UTF8_NOCHARSET_ARTICLE = 21
UTF8_TITLE = "Café crawling: a naïve résumé"
SLOW_ARTICLE = 13
MISSING_ARTICLE = ARTICLES + 1
PRIVATE_PATH = "/blog/private/draft.html"
JSON_PATH = "/blog/posts/data.json"
EXTERNAL_URL = "http://external.invalid/blog/posts/1.html"

#: Producer settings that fit this site (``--links``, ``--next``, ``--field``).
LINKS_XPATH = '//a[@class="titlelink"]/@href'
NEXT_XPATH = '//a[@rel="next"]/@href'
PAGES_TEMPLATE = "/blog/page/{page}"
FIELDS = {
    "author": '//span[@class="author"]/text()',
    "published": "//time/@datetime",
    "headline": '//h1[@class="headline"]/text()',
}

_AUTHORS = ["Ada Lovelace", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Ken Thompson"]
_ROBOTS = "User-agent: *\nDisallow: /blog/private/\n"


def article_path(n: int) -> str:
    """Path of article ``n``."""
    return f"/blog/posts/{n}.html"


def article_title(n: int) -> str:
    """The ``<title>`` of valid article ``n`` as a crawler should decode it."""
    if n == GBK_ARTICLE:
        return GBK_TITLE
    if n == UTF8_NOCHARSET_ARTICLE:
        return UTF8_TITLE
    return f"Post {n}: notes on crawling, part {n}"


def article_author(n: int) -> str:
    """The author shown in article ``n``."""
    return _AUTHORS[n % len(_AUTHORS)]


def expected_articles(base_url: str) -> dict[str, str]:
    """Normalized item URL -> expected record outcome (``"ok"`` or the ``error`` reason).

    Covers every item link a ``--same-host`` producer should offer, once each: 40
    ``ok`` articles (one of them slow), one ``http-404``, one ``robots`` and one
    ``content-type``.  Keys have no fragment and no tracking parameters.
    """
    base = base_url.rstrip("/")
    out = {f"{base}{article_path(n)}": "ok" for n in range(1, ARTICLES + 1)}
    out[f"{base}{article_path(MISSING_ARTICLE)}"] = "http-404"
    out[f"{base}{PRIVATE_PATH}"] = "robots"
    out[f"{base}{JSON_PATH}"] = "content-type"
    return out


def expected_titles(base_url: str) -> dict[str, str]:
    """Normalized URL -> title for every ``ok`` article."""
    base = base_url.rstrip("/")
    return {f"{base}{article_path(n)}": article_title(n) for n in range(1, ARTICLES + 1)}


# ------------------------------------------------------------------ pages --
def _page_links(page: int, base: str, host: str) -> list[str]:
    """href values of the ``titlelink`` anchors on listing ``page``."""
    first = (page - 1) * PER_PAGE + 1
    forms = [
        lambda n: f"../posts/{n}.html",  # relative to /blog/page/N
        lambda n: article_path(n),  # root-relative
        lambda n: f"//{host}{article_path(n)}",  # protocol-relative
        lambda n: f"{base}{article_path(n)}",  # absolute
        lambda n: f"{article_path(n)}#comments",
        lambda n: f"{article_path(n)}?utm_source=x&utm_medium=feed",
        lambda n: f"../posts/{n}.html?utm_campaign=spring#top",
        lambda n: f"{base}{article_path(n)}#comments",
    ]
    links = [forms[(i + page) % len(forms)](first + i) for i in range(PER_PAGE)]
    # Duplicates across pages: every page features article 1 and the previous page's first.
    links.append(f"{article_path(1)}?utm_source=x" if page % 2 else f"{base}{article_path(1)}")
    if page > 1:
        links.append(f"../posts/{first - PER_PAGE}.html#comments")
    links += {
        1: [EXTERNAL_URL, "mailto:editor@example.invalid"],
        2: [JSON_PATH, "javascript:void(0)"],
        3: [article_path(MISSING_ARTICLE)],
        4: [PRIVATE_PATH],
        5: [f"//{host}{article_path(MISSING_ARTICLE)}#comments"],
    }[page]
    return links


def listing_html(page: int, base: str, host: str) -> str:
    """HTML of listing ``page`` (1..PAGES)."""
    items = "\n".join(
        f'    <li><a class="titlelink" href="{html.escape(h)}">Read entry {i + 1}</a>'
        f' <a class="more" href="{html.escape(h)}">more</a></li>'
        for i, h in enumerate(_page_links(page, base, host))
    )
    nxt = (f'<a rel="next" class="next" href="/blog/page/{page + 1}">Older posts</a>'
           if page < PAGES else "")
    prev = f'<a rel="prev" class="prev" href="/blog/page/{page - 1}">Newer</a>' if page > 1 else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sample blog - page {page}</title></head>
<body>
  <nav><a href="/">Home</a> <a href="/about.html">About</a></nav>
  <h1>Sample blog, page {page} of {PAGES}</h1>
  <ul class="posts">
{items}
  </ul>
  <div class="pager">{prev} {nxt}</div>
</body></html>
"""


def article_html(n: int) -> str:
    """HTML text of valid article ``n`` (not yet encoded)."""
    title = html.escape(article_title(n))
    meta = '<meta charset="gbk">' if n == GBK_ARTICLE else (
        "" if n == UTF8_NOCHARSET_ARTICLE else '<meta charset="utf-8">')
    body = ("这是一个用于测试的中文文章。爬虫应当根据页面声明的编码正确解码。"
            if n == GBK_ARTICLE else
            "A paragraph about polite crawling, queues and back-pressure. " * (3 + n % 4))
    return f"""<!doctype html>
<html><head>{meta}<title>{title}</title></head>
<body>
  <article>
    <h1 class="headline">{title}</h1>
    <p class="byline">By <span class="author">{html.escape(article_author(n))}</span>,
      <time datetime="2024-03-{n % 28 + 1:02d}T09:{n % 60:02d}:00Z">March {n % 28 + 1}</time></p>
    <p>{body}</p>
    <p><a href="/blog/page/1">Back to the blog</a> <a href="#comments">Comments</a></p>
  </article>
</body></html>
"""


@dataclass(frozen=True)
class Hit:
    """One request the site received (for tests of politeness and robots)."""

    t: float  # time.monotonic()
    method: str
    path: str
    user_agent: str


class _SampleSiteHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, like a real server

    def log_message(self, format: str, *args: object) -> None:
        # The stdlib writes every request to stderr; SampleSite.hits records them instead.
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        site = self.server.site
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        site._record(Hit(time.monotonic(), self.command, self.path,
                         self.headers.get("User-Agent", "")))
        status, ctype, body = site.route(path)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a slow request must not block shutdown
    site: SampleSite


class SampleSite:
    """The demo blog on ``host`` (default 127.0.0.1), port 0 = any free port.

    Use as a context manager (serves from a daemon thread) or call
    :meth:`serve_forever` in the foreground.  ``base_url`` is valid once
    constructed.  ``hits`` lists every request received, in order.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, slow_s: float = 2.0) -> None:
        """Bind the listening socket now (so the port is known), serve later."""
        self.slow_s = slow_s
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        self._httpd = _Server((host, port), _SampleSiteHandler)
        self._httpd.site = self
        bound_host, bound_port = self._httpd.server_address[:2]
        assert isinstance(bound_host, str)  # an AF_INET server's (bytes: only AF_UNIX's)
        self.host = f"{bound_host}:{bound_port}"
        self.base_url = f"http://{self.host}"
        self._thread: threading.Thread | None = None

    def _record(self, hit: Hit) -> None:
        with self._lock:
            self.hits.append(hit)

    def route(self, path: str) -> tuple[int, str, bytes]:
        """(status, Content-Type, body) for ``path``; no I/O except the slow sleep."""
        html_utf8 = "text/html; charset=utf-8"
        if path == "/robots.txt":
            return 200, "text/plain; charset=utf-8", _ROBOTS.encode()
        if path in ("/", "/blog", "/blog/"):
            return 200, html_utf8, b'<html><body><a href="/blog/page/1">Blog</a></body></html>'
        if path.startswith("/blog/page/"):
            tail = path.removeprefix("/blog/page/")
            if tail.isdigit() and 1 <= int(tail) <= PAGES:
                return 200, html_utf8, listing_html(int(tail), self.base_url, self.host).encode()
        if path == JSON_PATH:
            return 200, "application/json", json.dumps({"posts": ARTICLES}).encode()
        if path == PRIVATE_PATH:
            return 200, html_utf8, b"<html><head><title>Draft</title></head><body></body></html>"
        if path.startswith("/blog/posts/") and path.endswith(".html"):
            stem = path.removeprefix("/blog/posts/").removesuffix(".html")
            if stem.isdigit() and 1 <= int(stem) <= ARTICLES:
                n = int(stem)
                if n == SLOW_ARTICLE:
                    time.sleep(self.slow_s)
                if n == GBK_ARTICLE:
                    # No charset in the header: only the <meta> tells the truth.
                    return 200, "text/html", article_html(n).encode("gbk")
                if n == UTF8_NOCHARSET_ARTICLE:
                    return 200, "text/html", article_html(n).encode("utf-8")
                return 200, html_utf8, article_html(n).encode("utf-8")
        return 404, html_utf8, b"<html><head><title>Not found</title></head></html>"

    def start(self) -> Self:
        """Serve from a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever,
                                            name="samplesite", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` (from another thread)."""
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving and close the socket.  In-flight slow requests are abandoned."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _raise_interrupt(signum: int, frame: object) -> None:
    # SIGTERM should end the process as cleanly as Ctrl-C.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``python -m zkcrawl.admin.samplesite [--host H] [--port N] [--slow-s S]``."""
    ap = argparse.ArgumentParser(prog="python -m zkcrawl.admin.samplesite",
                                 description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--slow-s", type=float, default=2.0, help="delay of the slow article")
    args = ap.parse_args(argv)
    site = SampleSite(args.host, args.port, args.slow_s)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    print(f"READY {site.base_url}", flush=True)
    try:
        site.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        site._httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
