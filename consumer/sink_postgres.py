"""The PostgreSQL sink's former import path: re-exports :mod:`zkcrawl.consumer.sinks.postgres`."""

from zkcrawl.consumer.sinks.postgres import PostgresSink

__all__ = ["PostgresSink"]
