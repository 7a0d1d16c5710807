"""One HTTP GET on the wire with a ``requests.Session``: the ``--http requests`` transport.

The same :class:`~zkcrawl.web.transfer.Transport` as libcurl's :class:`~zkcrawl.web.transfer.Wire`,
so :mod:`zkcrawl.web.fetch` runs the same policy over either, with the same outcomes. It is for
library users who extend ``requests``: auth plugins, mounted adapters, a Session of their own
(``Fetcher(settings, http=lambda ua: SessionWire(ua, session=make_session()))``). It costs more
CPU per page than libcurl (see the README's HTTP section for the measured figures).

Guarantees, matching the libcurl transport:

* **One GET, never a redirect** (``allow_redirects=False``): the caller follows them, so each
  hop passes robots.txt and politeness again. Only ``http`` and ``https`` are sent.
* **The body** is streamed (``stream=True``) in chunks through
  :class:`~zkcrawl.web.transfer.BodySink`, the libcurl transport's own body policy: a 2xx of
  an accepted media type is kept up to ``limit`` decoded bytes (gzip and deflate are inflated
  one bounded chunk at a time, so a gzip bomb inflates no further than ``limit``), then the
  transfer stops with ``too-large``; an error or redirect body is drained up to
  :data:`~zkcrawl.web.transfer.DRAIN_BYTES` for connection reuse; anything cut short closes
  its connection. A content coding urllib3 cannot inflate is a ``connection`` error, as one
  libcurl cannot inflate is (both do gzip and deflate; br and zstd depend on the build).
* **Time**: connecting within ``connect``; the head within ``min(idle, budget)`` of silence;
  each body read within the smaller of ``idle`` and what is left of ``budget`` (the socket
  timeout is set before every read), so a server trickling bytes is cut at the budget. The
  head itself is bounded per read, not as a whole: a server dripping header bytes could hold
  it for longer than ``budget`` (libcurl's budget covers the head too).
* **Connections**: one Session per transport, one transport per thread (the Fetcher keeps
  them thread-local), keep-alive connections reused across that thread's fetches. No cookie
  is kept or sent back (as with libcurl, whose cookie engine is off), so a long crawl does not
  grow a cookie jar.
* **Environment**: proxies as requests reads them (``trust_env``: ``http_proxy``,
  ``https_proxy``, ``all_proxy``, ``no_proxy``, in either case -- unlike libcurl, which ignores
  ``HTTP_PROXY`` in capitals -- and ``~/.netrc`` credentials); HTTPS peers verified against
  :func:`~zkcrawl.web.transfer.ca_bundle` (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``,
  ``CURL_CA_BUNDLE``, else certifi), in that order.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import time

import requests
import requests.adapters
import urllib3.exceptions

from zkcrawl.web.transfer import ACCEPT, BodySink, Response, ca_bundle, wire_url

__all__ = ["SessionWire"]

CHUNK = 64 * 1024  # decoded bytes per read: a bound on what one read inflates
# What urllib3 inflates here (gzip, deflate; br and zstd when their modules are installed).
_CODINGS = frozenset({*urllib3.HTTPResponse.CONTENT_DECODERS, "identity", ""})


class SessionWire:
    """One thread's ``requests.Session``. Not thread-safe: one per thread. ``session``: a
    Session of your own (auth, adapters, cookies as you set them); the User-Agent and Accept
    headers are set on it, everything else is left as given."""

    def __init__(self, user_agent: str, max_connections: int = 32,
                 session: requests.Session | None = None) -> None:
        if session is None:
            session = requests.Session()
            session.cookies = requests.cookies.RequestsCookieJar(
                policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            adapter = requests.adapters.HTTPAdapter(pool_connections=max_connections,
                                                    pool_maxsize=1)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        session.headers.update({"User-Agent": user_agent, "Accept": ACCEPT,
                                "Accept-Encoding": "gzip, deflate"})
        self._session = session
        self._verify: str | bool = ca_bundle() or True

    def get(self, url: str, *, connect: float, idle: float, budget: float, limit: int,
            accept: tuple[str, ...]) -> Response:
        """GET ``url``; never raises for network trouble (see :class:`Response`)."""
        deadline = time.monotonic() + budget
        try:
            resp = self._session.get(wire_url(url), allow_redirects=False, stream=True,
                                     timeout=(connect, min(idle, budget)), verify=self._verify)
        except requests.Timeout as exc:
            return Response(error="timeout", detail=str(exc))
        except requests.ConnectionError as exc:
            return Response(error="connection", detail=str(exc))
        except (ValueError, UnicodeError) as exc:  # InvalidURL, InvalidSchema, MissingSchema
            return Response(error="bad-url", detail=str(exc))
        except requests.RequestException as exc:
            return Response(error="connection", detail=str(exc))
        with contextlib.closing(resp):  # after a whole body: back to the pool; else dropped
            return _read(resp, BodySink(limit, accept, _head(resp)), deadline, idle)

    def close(self) -> None:
        """Close the Session's connections (a transfer running on its thread finishes with
        the connection it holds, then that connection is dropped)."""
        self._session.close()


def _head(resp: requests.Response) -> tuple[int | None, dict[str, str]]:
    """Status and lower-case headers; the last value of a repeated header wins (as libcurl's
    head parsing has it, where requests would join them with commas)."""
    return resp.status_code, {name.lower(): value for name, value in resp.raw.headers.items()}


def _read(resp: requests.Response, sink: BodySink, deadline: float, idle: float) -> Response:
    status, headers = sink.status_and_headers()
    error, detail = _stream(resp, sink, deadline, idle)
    if error is None and sink.verdict is not None:
        error = sink.verdict  # a body cut by us (too-large) or refused (content-type)
    return Response(status, headers, sink.body(), error, detail)


def _stream(resp: requests.Response, sink: BodySink, deadline: float, idle: float
            ) -> tuple[str | None, str]:
    """Feed the body to ``sink`` until it ends, the sink stops it, or time runs out."""
    coding = _unsupported_coding(sink.status_and_headers()[1])
    raw = resp.raw
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", "the whole transfer took longer than its budget"
            _set_timeout(raw, min(idle, left))
            chunk = raw.read1(CHUNK, decode_content=coding is None)
            if not chunk:
                return None, ""
            if coding is not None:
                return "connection", f"unsupported Content-Encoding {coding!r}"
            if sink.write(chunk) == 0:
                return None, ""  # sink.verdict says why, when it matters
    except urllib3.exceptions.ReadTimeoutError as exc:
        return "timeout", str(exc)
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as exc:
        return "connection", str(exc)  # reset, truncated (IncompleteRead), undecodable


def _unsupported_coding(headers: dict[str, str]) -> str | None:
    value = headers.get("content-encoding", "").lower()
    bad = [c for c in (part.strip() for part in value.split(",")) if c not in _CODINGS]
    return bad[0] if bad else None


def _set_timeout(raw: urllib3.HTTPResponse, seconds: float) -> None:
    """The timeout of the next socket read of ``raw`` (a read blocks at most that long)."""
    conn = raw.connection
    sock = getattr(conn, "sock", None) if conn is not None else None
    if sock is not None:
        sock.settimeout(seconds)
