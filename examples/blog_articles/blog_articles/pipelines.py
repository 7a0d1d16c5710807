"""The result pipeline: only articles with an author are stored."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class RequireAuthor:
    """Drops records without ``fields.author`` (listing pages, errors); counts both."""

    def open(self) -> None:
        self.kept = self.dropped = 0

    def process(self, record: dict[str, Any]) -> dict[str, Any] | None:
        if not (record.get("fields") or {}).get("author"):
            self.dropped += 1
            return None
        self.kept += 1
        return record

    def close(self) -> None:
        log.warning("RequireAuthor: kept %d records, dropped %d", self.kept, self.dropped)
