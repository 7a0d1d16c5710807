"""Test result pipelines: a chain that tags, drops and fails records (issue #17)."""

from __future__ import annotations

from typing import Any

EVENTS: list[str] = []  # open/close calls, in order, for the lifecycle test


class Tag:
    """Adds a field (the first stage: what it returns is what the next one gets)."""

    def open(self) -> None:
        EVENTS.append("Tag.open")

    def process(self, record: dict[str, Any]) -> dict[str, Any]:
        record["fields"]["tagged"] = True
        return record

    def close(self) -> None:
        EVENTS.append("Tag.close")


class DropMarked:
    """Drops the records of URLs with /drop in them."""

    def open(self) -> None:
        EVENTS.append("DropMarked.open")

    def process(self, record: dict[str, Any]) -> dict[str, Any] | None:
        return None if "/drop" in (record["url"] or "") else record

    def close(self) -> None:
        EVENTS.append("DropMarked.close")


class FailOnBad:
    """Raises for URLs with /bad in them (after changing the record: never stored)."""

    def open(self) -> None:
        pass

    def process(self, record: dict[str, Any]) -> dict[str, Any]:
        if "/bad" in (record["url"] or ""):
            record["fields"]["half"] = "done"
            raise RuntimeError("database said no")
        return record

    def close(self) -> None:
        raise OSError("close failed")  # logged, never fatal


class NoProcess:
    def open(self) -> None:
        pass


class FailOpen:
    def open(self) -> None:
        raise ConnectionError("no database")

    def process(self, record: dict[str, Any]) -> dict[str, Any]:
        return record
