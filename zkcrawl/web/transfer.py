"""The transports' former import path: re-exports :mod:`zkcrawl.web.transports` (the
interface, the libcurl transport, :func:`~zkcrawl.web.transports.transport_factory`). New
code imports from there."""

from zkcrawl.web.transports import TRANSPORTS, transport_factory
from zkcrawl.web.transports.base import (
    ACCEPT,
    DRAIN_BYTES,
    BodySink,
    Response,
    Transport,
    TransportFactory,
    ascii_url,
    ca_bundle,
    parse_head,
)
from zkcrawl.web.transports.curl import CurlTransport, curl_proxy

__all__ = [
    "ACCEPT",
    "DRAIN_BYTES",
    "TRANSPORTS",
    "BodySink",
    "CurlTransport",
    "Response",
    "Transport",
    "TransportFactory",
    "ascii_url",
    "ca_bundle",
    "curl_proxy",
    "parse_head",
    "transport_factory",
]
