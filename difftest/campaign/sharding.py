"""Deterministic shards: split one campaign's case list into disjoint parts with no overlap.

A campaign numbers its cases ``0, 1, 2, ...`` in a fixed order (seeded). Cases come in blocks
of ``block`` consecutive indices (on a GPU, the cases of one kernel compile variant), and shard
``i`` of ``n`` owns the blocks whose number is ``i`` modulo ``n``: so no two shards compile the
same variant. Every index has exactly one owner, so the shards of a run partition it, and a
shard asked for its share of ``total`` cases runs exactly the indices below ``total`` it owns:
the union over shards is the unsharded run of ``total`` cases. Shards are numbered from 0
(``--shard 0/4`` .. ``--shard 3/4``).

Standard library only (the pytest plugin imports this module on every pytest run).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass

from difftest.model.errors import DifftestError


class ShardError(DifftestError, ValueError):
    """A shard specification is malformed; the message names the source and the value."""


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (``0 <= index < count``), owning blocks of ``block`` cases."""

    index: int = 0
    count: int = 1
    block: int = 1

    def __post_init__(self) -> None:
        if self.block < 1:
            raise ShardError(f"shard block {self.block} must be >= 1")
        if self.count < 1:
            raise ShardError(f"shard count {self.count} must be >= 1")
        if not 0 <= self.index < self.count:
            raise ShardError(
                f"shard index {self.index} must be in 0..{self.count - 1} "
                f"(shards are numbered from 0)"
            )

    @classmethod
    def parse(cls, text: str, source: str = "--shard") -> Shard:
        """``"i/N"`` as a shard; anything else is a one-line :class:`ShardError`."""
        head, sep, tail = text.strip().partition("/")
        if not sep or not head.strip().isdigit() or not tail.strip().isdigit():
            raise ShardError(f"{source} {text!r}: expected i/N with integers, e.g. 0/4")
        index, count = int(head), int(tail)
        if count < 1:
            raise ShardError(f"{source} {text!r}: the shard count must be >= 1")
        if index >= count:
            raise ShardError(
                f"{source} {text!r}: the index must be in 0..{count - 1} (shards count from 0)"
            )
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def id(self) -> str:
        """The pytest id of this shard's item: ``shard-003``."""
        return shard_id(self.index)

    def as_tuple(self) -> tuple[int, int]:
        """``(index, count)``, as :class:`difftest.campaign.run.CampaignConfig` reports it."""
        return (self.index, self.count)

    def with_block(self, block: int) -> Shard:
        return Shard(self.index, self.count, block)

    def owns(self, case_index: int) -> bool:
        return (case_index // self.block) % self.count == self.index

    def case_count(self, total: int) -> int:
        """How many of the case indices ``0 .. total-1`` this shard owns."""
        total = max(total, 0)
        cycle = self.block * self.count
        full, rest = divmod(total, cycle)
        return full * self.block + min(max(rest - self.index * self.block, 0), self.block)

    def indices(self, total: int) -> list[int]:
        """The case indices below ``total`` this shard owns, in campaign order."""
        return [k for k in range(max(total, 0)) if self.owns(k)]


def shard_id(index: int) -> str:
    return f"shard-{index:03d}"


def all_shards(count: int) -> list[Shard]:
    return [Shard(i, count) for i in range(count)]


def partition_defects(
    parts: Sequence[Collection[Hashable]], whole: Collection[Hashable]
) -> list[str]:
    """Why ``parts`` do not partition ``whole`` (empty when they do exactly).

    Checks every item of every part is in ``whole``, no item is in two parts (or twice in one),
    and every item of ``whole`` is in some part. Each defect is one line naming the item.
    """
    defects: list[str] = []
    owner: dict[Hashable, int] = {}
    wanted = set(whole)
    for n, part in enumerate(parts):
        for item in part:
            if item in owner:
                first = owner[item]
                where = "twice in part" if first == n else f"in parts {first} and"
                defects.append(f"{item!r} is {where} {n}")
                continue
            owner[item] = n
            if item not in wanted:
                defects.append(f"{item!r} in part {n} is not in the whole")
    missing = sorted((item for item in wanted if item not in owner), key=repr)
    defects.extend(f"{item!r} is in no part" for item in missing)
    return defects
