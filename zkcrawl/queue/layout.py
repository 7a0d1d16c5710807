"""SPEC §2 in code: every znode path zkcrawl reads or writes under one crawl root.

Guarantee: no other module builds a path under the root by hand; a change of layout is a
change here (and in SPEC §2). Pure: no ZooKeeper calls.

::

    <root>/queue/qn-NNNNNNNNNN     the ingress           <root>/control       run state
    <root>/leases/qn-NNNNNNNNNN    old: per-item leases  <root>/hosts/<host>  ignored (old)
    <root>/dead/dl-NNNNNNNNNN      dead letters          <root>/offers/<tok>  offer markers
    <root>/consumers/<id>          consumer status       <root>/discovered/   found links
    <root>/producers/<id>          producer status
    <root>/fetched/fn-NNNNNNNNNN   fetch outcomes (re-crawl state, consumer -> producer)
    <root>/partitions/<p>          a partition (data: its checkpoint; version: its epoch)
    <root>/partitions/<p>/owner    its owner (ephemeral)
    <root>/partitions/<p>/qn-NNNNNNNNNN   a batch of its items
"""

from __future__ import annotations

from dataclasses import dataclass

ITEM_PREFIX = "qn-"
DEAD_PREFIX = "dl-"
DISCOVERED_PREFIX = "dn-"
FETCHED_PREFIX = "fn-"


@dataclass(frozen=True)
class Layout:
    """The paths of one crawl root (``--root``)."""

    root: str

    @classmethod
    def of(cls, root: str) -> Layout:
        """``/zkcrawl/`` and ``/zkcrawl`` are the same root; ``/`` is the empty prefix."""
        return cls(root.rstrip("/"))

    # -- containers --------------------------------------------------------------------
    @property
    def queue(self) -> str:
        return f"{self.root}/queue"

    @property
    def leases(self) -> str:
        return f"{self.root}/leases"

    @property
    def dead(self) -> str:
        return f"{self.root}/dead"

    @property
    def offers(self) -> str:
        return f"{self.root}/offers"

    @property
    def consumers(self) -> str:
        return f"{self.root}/consumers"

    @property
    def producers(self) -> str:
        return f"{self.root}/producers"

    @property
    def control(self) -> str:
        return f"{self.root}/control"

    @property
    def hosts(self) -> str:
        return f"{self.root}/hosts"

    @property
    def discovered(self) -> str:
        return f"{self.root}/discovered"

    @property
    def fetched(self) -> str:
        return f"{self.root}/fetched"

    @property
    def partitions(self) -> str:
        return f"{self.root}/partitions"

    def partition(self, p: int) -> str:
        """``<root>/partitions/<p>``: ``p`` as a plain decimal (no padding)."""
        return f"{self.root}/partitions/{p}"

    def partition_owner(self, p: int) -> str:
        return f"{self.root}/partitions/{p}/owner"

    def partition_batch_prefix(self, p: int) -> str:
        """What a sequential create of a new batch of partition ``p`` names."""
        return f"{self.root}/partitions/{p}/{ITEM_PREFIX}"

    # -- single nodes ------------------------------------------------------------------
    def item(self, name: str) -> str:
        return f"{self.root}/queue/{name}"

    def lease(self, name: str) -> str:
        return f"{self.root}/leases/{name}"

    def dead_letter_path(self, name: str) -> str:
        return f"{self.root}/dead/{name}"

    def consumer(self, consumer_id: str) -> str:
        return f"{self.root}/consumers/{consumer_id}"

    def producer(self, producer_id: str) -> str:
        return f"{self.root}/producers/{producer_id}"

    @property
    def item_prefix(self) -> str:
        """What a sequential create of a new item names (``<root>/queue/qn-``)."""
        return f"{self.root}/queue/{ITEM_PREFIX}"

    @property
    def dead_prefix(self) -> str:
        return f"{self.root}/dead/{DEAD_PREFIX}"

    def containers(self) -> tuple[str, ...]:
        """The persistent parents a consumer or producer makes sure exist."""
        return (self.queue, self.dead, self.offers)
