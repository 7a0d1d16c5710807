"""The queue recipe (SPEC §2, §3): how an item gets in, is claimed, held and settled.

One concept a module, kazoo-recipe style, each with its guarantees in its docstring:

* :mod:`.layout`    SPEC §2 in code: every path under a crawl root
* :mod:`.items`     an item as stored: encoding, the decoding rule, dead letters
* :mod:`.untrusted` the one safe decoder for every znode zkcrawl reads
* :mod:`.offers`    how items get in: batched, protected offers and back-pressure
* :mod:`.leases`    :class:`LeaseQueue`: claim (a lease), complete, retry, dead-letter
* :mod:`.claims`    what a claim hands out (:class:`Claimed`) and the settle results
* :mod:`.claimlog`  counting the claims whose holder died (SPEC §3)
* :mod:`.control`   ``<root>/control``: the cluster-wide run state
* :mod:`.registry`  ``<root>/consumers|producers/<id>``: live status nodes

Re-exports the names callers need, so ``from zkcrawl.queue import LeaseQueue`` keeps working.
"""

from zkcrawl.queue import claims
from zkcrawl.queue.claims import *  # noqa: F403 -- the claim vocabulary, as claims.__all__
from zkcrawl.queue.control import RunState
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.leases import ItemRefused, LeaseQueue
from zkcrawl.queue.offers import QueueSuspended

__all__ = [*claims.__all__, "Item", "ItemRefused", "Layout", "LeaseQueue", "QueueSuspended",
           "RunState"]
