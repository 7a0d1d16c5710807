"""zkcrawl: a crawl cluster coordinated by ZooKeeper. The Python API for extending it::

    from zkcrawl import Page, PageResult, Processor, ResultPipeline, run_consumer, run_producer

:class:`Page`, :class:`PageResult`, :class:`Processor` and :class:`ResultPipeline` are in
:mod:`zkcrawl.page`, :func:`run_consumer` / :func:`run_producer` in :mod:`zkcrawl.api`,
:class:`ExitStatus` in :mod:`zkcrawl.errors`. The names load on first use (PEP 562), so the
commands, which import submodules only, do not pay for lxml at start-up through this file.

"SPEC §N" in the code cites section N of the product contract, docs/reference/contract.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zkcrawl.api import run_consumer, run_producer
    from zkcrawl.errors import ExitStatus
    from zkcrawl.page import Page, PageResult, Processor, ResultPipeline

_WHERE = {"Page": "zkcrawl.page", "PageResult": "zkcrawl.page", "Processor": "zkcrawl.page",
          "ResultPipeline": "zkcrawl.page", "run_consumer": "zkcrawl.api",
          "run_producer": "zkcrawl.api", "ExitStatus": "zkcrawl.errors"}

__all__ = ["ExitStatus", "Page", "PageResult", "Processor", "ResultPipeline", "run_consumer",
           "run_producer"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'zkcrawl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
