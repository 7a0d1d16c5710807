"""Politeness: the minimum gap between two requests to one host.

* :mod:`.local`    :class:`Politeness` (the interface) and :class:`LocalPoliteness`, one
  process's per-host table
* :mod:`.cluster`  :class:`ClusterPoliteness`: the same table shared by every consumer of a
  root through ``<root>/hosts/<host>`` (SPEC §4)
"""

from zkcrawl.politeness.local import LocalPoliteness, Politeness

__all__ = ["LocalPoliteness", "Politeness"]
