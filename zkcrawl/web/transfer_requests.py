"""The requests transport's former import path: re-exports
:mod:`zkcrawl.web.transports.requests`. New code imports from there."""

from zkcrawl.web.transports.requests import PROTOCOL, WATCHDOG, RequestsTransport, Watchdog

__all__ = ["PROTOCOL", "WATCHDOG", "RequestsTransport", "Watchdog"]
