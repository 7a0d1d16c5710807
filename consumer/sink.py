"""The sinks' former import path: re-exports :mod:`consumer.sinks` (the interface, the JSON
Lines sink and :func:`~consumer.sinks.open_sink`). New code imports from there."""

from consumer.sinks import (
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
