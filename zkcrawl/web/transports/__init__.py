"""HTTP transports: the interface in :mod:`.base`, the implementations beside it --
:mod:`.curl` (libcurl, the default) and :mod:`.requests` (a ``requests.Session``) -- and
:func:`transport_factory`, the one place that picks one from ``--http``.

Imports go one way: the implementations import :mod:`.base`, this module imports them; the
requests one only when it is asked for (a curl consumer never loads requests).
``tests/test_structure_imports.py`` checks that no import, at the top or inside a function,
closes a circle.
"""

from __future__ import annotations

from zkcrawl.web.transports.base import Response, Transport, TransportFactory
from zkcrawl.web.transports.curl import CurlTransport

__all__ = ["TRANSPORTS", "Response", "Transport", "TransportFactory", "transport_factory"]

#: The names ``--http`` accepts; the first is the default.
TRANSPORTS = ("curl", "requests")


def transport_factory(http: str | TransportFactory) -> TransportFactory:
    """The transport named by ``--http`` (``curl`` or ``requests``), or ``http`` itself when
    it is already a factory (a library user's own Session, say). Raises ValueError for an
    unknown name."""
    if callable(http):
        return http
    if http == "curl":  # one pool of handles for the Fetcher's threads
        return CurlTransport.factory()
    if http == "requests":  # loaded on demand: requests and urllib3 cost start-up time
        from zkcrawl.web.transports.requests import RequestsTransport

        return RequestsTransport
    raise ValueError(f"unknown HTTP transport {http!r}; one of {', '.join(TRANSPORTS)}")
