"""The one home of every back-off in zkcrawl: how long to wait after the ``n``-th failure.

The rule, stated once: **``first * 2**n`` seconds, never more than ``cap``, with an optional
jitter that takes up to ``jitter`` (a fraction) off it** -- so the wait grows monotonically
with ``n`` up to the cap, is never negative, and is finite whatever ``n`` is (the exponent is
clamped: a hostile attempt count cannot overflow the float). A server's ``Retry-After``
(parsed and capped at ``--retry-after-cap``-like bounds by
:func:`zkcrawl.web.fetch.parse_retry_after`) wins over the formula when it is a positive
finite number (:meth:`Backoff.after`); anything else (absent, 0, negative, NaN, infinite)
falls back to the formula.

The policies, each a :class:`Backoff` named here and nowhere else:

=====================  =======  =======  ======  =============================================
policy                 first    cap      jitter  what waits
=====================  =======  =======  ======  =============================================
:data:`HOST_RETRY`     1 s      60 s     --      a host that answered "try later" (408, 429,
                                                 5xx) before the item's next try, per attempt
:data:`HOST_DOWN`      1 s      600 s    --      a host that did not answer (refused,
                                                 timeout), per failure in a row
:data:`RECONNECT`      0.5 s    30 s     50 %    the PostgreSQL sink reconnecting
:data:`POOL_RESTART`   0.5 s    30 s     --      the extraction pool restarting its processes
=====================  =======  =======  ======  =============================================

The fetcher's in-fetch retries (``FetchSettings.backoff``, ``retry_after_cap``) build a
:class:`Backoff` from their settings.
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
