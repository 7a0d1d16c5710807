"""The requests transport's former import path: re-exports
:mod:`zkcrawl.web.transports.requests`. New code imports from there."""

from zkcrawl.web.transports.requests import PROTOCOL, WATCHDOG, SessionWire, Watchdog

__all__ = ["PROTOCOL", "WATCHDOG", "SessionWire", "Watchdog"]
