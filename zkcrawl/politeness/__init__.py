"""Politeness: the minimum gap between two requests to one host.

* :mod:`.local`    :class:`Politeness` (the interface), :class:`LocalPoliteness` (one
  process's per-host table) and the two caps, :data:`MAX_CRAWL_DELAY` and
  :data:`MAX_BACK_OFF`
* :mod:`.gate`     :class:`HostGate`: the consumer's front for a scheduler whose threads never
  wait for a host (it keeps its per-host state in a :class:`LocalPoliteness` table)

The gap holds cluster-wide because every host has one owner (SPEC §4,
:mod:`zkcrawl.consumer.ownership`): the owner's table is the only one that schedules it, in memory
-- no ZooKeeper write per request.
"""

from zkcrawl.politeness.gate import EARLY, HostGate
from zkcrawl.politeness.local import (
    MAX_BACK_OFF,
    MAX_CRAWL_DELAY,
    LocalPoliteness,
    Politeness,
)

__all__ = ["EARLY", "MAX_BACK_OFF", "MAX_CRAWL_DELAY", "HostGate", "LocalPoliteness",
           "Politeness"]
