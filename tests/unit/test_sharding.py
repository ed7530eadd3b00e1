"""Shards: ``--shard i/N`` parsing, ownership, and the proof that shards partition a run."""

from __future__ import annotations

from pathlib import Path

import pytest
from _planted import cpu_session

from difftest.campaign.sharding import Shard, ShardError, all_shards, partition_defects, shard_id
from difftest.campaign.suite import ShardPlan, run_shard


@pytest.mark.parametrize(
    ("text", "index", "count"), [("0/1", 0, 1), ("3/4", 3, 4), (" 2 / 8 ", 2, 8)]
)
def test_parse_accepts_i_over_n(text: str, index: int, count: int) -> None:
    shard = Shard.parse(text)
    assert (shard.index, shard.count) == (index, count)
    assert str(shard) == f"{index}/{count}"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("4/4", "the index must be in 0..3"),
        ("1/0", "the shard count must be >= 1"),
        ("a/b", "expected i/N with integers"),
        ("3", "expected i/N with integers"),
        ("-1/4", "expected i/N with integers"),
        ("1/4/2", "expected i/N with integers"),
        ("", "expected i/N with integers"),
    ],
)
def test_parse_rejects_with_one_line_naming_source_and_value(text: str, why: str) -> None:
    with pytest.raises(ShardError) as info:
        Shard.parse(text, source="--shard")
    message = str(info.value)
    assert message.startswith(f"--shard {text!r}: ")
    assert why in message
    assert "\n" not in message


def test_constructor_validates() -> None:
    with pytest.raises(ShardError, match=r"must be in 0\.\.1"):
        Shard(2, 2)
    with pytest.raises(ShardError, match="count 0 must be >= 1"):
        Shard(0, 0)
    with pytest.raises(ShardError, match="block 0 must be >= 1"):
        Shard(0, 1, block=0)


def test_ids_are_zero_padded_and_ordered() -> None:
    assert [s.id for s in all_shards(3)] == ["shard-000", "shard-001", "shard-002"]
    assert shard_id(12) == "shard-012"


@pytest.mark.parametrize("block", [1, 2, 5])
@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_every_prefix_of_the_case_list(block: int, count: int) -> None:
    for total in range(0, 40):
        parts = [s.with_block(block).indices(total) for s in all_shards(count)]
        assert partition_defects(parts, range(total)) == []
        for shard in all_shards(count):
            owned = shard.with_block(block)
            assert owned.case_count(total) == len(owned.indices(total))
            assert owned.indices(total) == [k for k in range(total) if owned.owns(k)]


def test_blocks_stay_on_one_shard() -> None:
    shard = Shard(1, 3, block=4)
    assert shard.indices(30) == [4, 5, 6, 7, 16, 17, 18, 19, 28, 29]


def test_partition_defects_names_each_problem() -> None:
    assert partition_defects([[1, 2], [3]], [1, 2, 3]) == []
    assert partition_defects([[1, 2], [2, 3]], [1, 2, 3]) == ["2 is in parts 0 and 1"]
    assert partition_defects([[1, 1], [3]], [1, 3]) == ["1 is twice in part 0"]
    assert partition_defects([[1], [3]], [1, 2, 3, 0]) == ["0 is in no part", "2 is in no part"]
    assert partition_defects([[1, 9]], [1]) == ["9 in part 0 is not in the whole"]


@pytest.mark.parametrize("cases_per_variant", [1, 3])
def test_campaign_shards_partition_the_unsharded_campaign(
    tmp_path: Path, cases_per_variant: int
) -> None:
    session = cpu_session(("torch-sdpa",))

    def keys(shard: Shard) -> list[str]:
        plan = ShardPlan(
            seed=5,
            out_dir=tmp_path,
            shard=shard,
            max_cases=10,
            cases_per_variant=cases_per_variant,
            determinism_every=0,
        )
        result = run_shard(plan, session)
        assert len(result.cases) == plan.planned()
        return [c.key for c in result.cases]

    whole = keys(Shard())
    parts = [keys(s) for s in all_shards(3)]
    assert len(whole) == 10
    assert partition_defects(parts, whole) == []
    # Each shard runs its cases in campaign order.
    order = {k: n for n, k in enumerate(whole)}
    for part in parts:
        assert [order[k] for k in part] == sorted(order[k] for k in part)
