"""The sinks' former import path: re-exports :mod:`zkcrawl.consumer.sinks` (the interface, the JSON
Lines sink and :func:`~zkcrawl.consumer.sinks.open_sink`). New code imports from there."""

from zkcrawl.consumer.sinks import (
    Entry,
    JsonLinesSink,
    Record,
    ResultSink,
    Sink,
    SinkUnavailable,
    open_sink,
)

__all__ = ["Entry", "JsonLinesSink", "Record", "ResultSink", "Sink", "SinkUnavailable",
           "open_sink"]
