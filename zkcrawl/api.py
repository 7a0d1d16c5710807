"""Running zkcrawl from Python: a producer or a consumer in-process, as the commands do.

``run_consumer(argv)`` and ``run_producer(argv)`` take the same arguments as
``zkcrawl-consumer`` / ``zkcrawl-producer`` and return their :class:`ExitStatus` (errors are
one line on stderr, never an exception). Signal handlers are installed only when called from
the main thread; a consumer run elsewhere stops on ``--exit-when-idle`` (or its process'
end). Processors and pipelines are named as on the command line (``module:callable``): the
code must be importable by the process, which is what lets a cluster of consumers load it.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence

from zkcrawl.errors import ExitStatus

__all__ = ["run_consumer", "run_producer"]

_IMPORTING = threading.Lock()


def _main(module: str) -> Callable[[list[str], Mapping[str, str]], ExitStatus]:
    """``module``'s ``main``, imported on first use -- one thread at a time: a producer and a
    consumer started in two threads at once would import the same modules concurrently,
    which CPython can report as an import deadlock (``_DeadlockError``, seen in CI)."""
    with _IMPORTING:
        main: Callable[[list[str], Mapping[str, str]], ExitStatus] = importlib.import_module(
            module).main
    return main


def run_consumer(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    """``zkcrawl-consumer ARGV`` in this process (``env``: the environment variables read,
    default ``os.environ``)."""
    return _main("zkcrawl.consumer.main")(list(argv), os.environ if env is None else env)


def run_producer(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    """``zkcrawl-producer ARGV`` in this process."""
    return _main("zkcrawl.producer.main")(list(argv), os.environ if env is None else env)
