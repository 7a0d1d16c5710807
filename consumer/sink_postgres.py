"""The PostgreSQL sink's former import path: re-exports :mod:`consumer.sinks.postgres`."""

from consumer.sinks.postgres import PostgresSink

__all__ = ["PostgresSink"]
