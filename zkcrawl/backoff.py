"""The one home of every back-off in zkcrawl: how long to wait after the ``n``-th failure.

The rule: ``first * 2**n`` seconds, never more than ``cap``, optionally minus up to
``jitter`` of it -- monotonic in ``n``, never negative, finite for any ``n`` (the exponent is
clamped). A positive finite ``Retry-After`` wins over it (:meth:`Backoff.after`).

=====================  =======  =======  ======  =============================================
policy                 first    cap      jitter  what waits
=====================  =======  =======  ======  =============================================
:data:`HOST_RETRY`     1 s      60 s     --      a host that answered "try later", per attempt
:data:`HOST_DOWN`      1 s      600 s    --      a host that did not answer, per failure in a
                                                 row
:data:`RECONNECT`      0.5 s    30 s     50 %    the PostgreSQL sink reconnecting
:data:`POOL_RESTART`   0.5 s    30 s     --      the extraction pool restarting its processes
=====================  =======  =======  ======  =============================================

The fetcher's in-fetch retries build a :class:`Backoff` from ``FetchSettings``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HOST_DOWN", "HOST_RETRY", "MAX_EXPONENT", "POOL_RESTART", "RECONNECT", "Backoff"]

MAX_EXPONENT = 32  # 2**32 s is far past any cap: a larger n changes nothing


@dataclass(frozen=True, slots=True)
class Backoff:
    """``first * 2**n`` seconds up to ``cap``, minus up to ``jitter`` of it (see the module
    docstring). ``first`` and ``cap`` are >= 0; ``jitter`` is in [0, 1]."""

    first: float
    cap: float
    jitter: float = 0.0

    def delay(self, n: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``n``-th failure (``n`` < 0 counts as 0). Never
        negative, never above ``cap``, monotone in ``n`` when ``jitter`` is 0."""
        base = min(self.cap, self.first * 2.0 ** min(max(0, n), MAX_EXPONENT))
        if self.jitter:
            base *= 1.0 - self.jitter * min(1.0, max(0.0, rand()))
        return max(0.0, base)

    def after(self, n: int, retry_after: float | None) -> float:
        """The server's ``Retry-After`` when it gave a positive finite one (its cap is the
        parser's), else :meth:`delay` of ``n``."""
        if retry_after is not None and math.isfinite(retry_after) and retry_after > 0:
            return retry_after
        return self.delay(n)


HOST_RETRY = Backoff(first=1.0, cap=60.0)
HOST_DOWN = Backoff(first=1.0, cap=600.0)
RECONNECT = Backoff(first=0.5, cap=30.0, jitter=0.5)
POOL_RESTART = Backoff(first=0.5, cap=30.0)
