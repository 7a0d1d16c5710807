"""The queue recipe (SPEC §2, §3): how an item gets in, is owned, held and settled.

One concept a module, kazoo-recipe style, each with its guarantees in its docstring:

* :mod:`.layout`          SPEC §2 in code: every path under a crawl root
* :mod:`.items`           an item as stored: encoding, the decoding rule, dead letters
* :mod:`.untrusted`       the one safe decoder for every znode zkcrawl reads
* :mod:`.ingress`         ``<root>/queue``: batched, protected offers and back-pressure
* :mod:`.partitions`      host -> partition, and who owns which
* :mod:`.partition_queue` batches, ownership fenced by an epoch, checkpoints, the ingress mover
* :mod:`.claims`          what a claim hands out (:class:`Claimed`) and the settle results
* :mod:`.control`         ``<root>/control``: the cluster-wide run state
* :mod:`.registry`        ``<root>/consumers|producers/<id>``: live status nodes

Re-exports the names callers need (``from zkcrawl.queue import IngressQueue``).
"""

from zkcrawl.queue import claims
from zkcrawl.queue.claims import *  # noqa: F403 -- the claim vocabulary, as claims.__all__
from zkcrawl.queue.control import RunState
from zkcrawl.queue.ingress import IngressQueue, ItemRefused
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout

__all__ = [*claims.__all__, "IngressQueue", "Item", "ItemRefused", "Layout", "RunState"]
