"""Fuzzing ``difftest replay``, ``explain`` and ``shrink`` with mutated real repro files.

A repro file is untrusted input (issue 19). Whatever is in it, each command exits 0, 1 or 2,
never prints a traceback, and finishes within a bounded time and memory (see
:mod:`_harness`). Two tests:

- random mutations (Hypothesis): one to three edits of a real repro's JSON tree (a value
  replaced by another type, an extreme or non-finite number, a deep or giant value; a key
  deleted or written twice; a wrong format version; the whole file nested deep or padded
  past the size cap), then maybe byte damage (truncation, flipped bytes, non-UTF-8 bytes);
- the sweep: every field path of a real repro of each kind, deleted, written twice and
  replaced by each kind of wrong value.

``DIFFTEST_FUZZ=nightly`` (see the conftest) runs 10,000 random inputs and the full sweep
(every edit of every field path of every seed).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from _harness import COMMANDS, Workspace, env_profile, run_input, seed_files
from _mutate import (
    CASE_FORMATS,
    FORMATS,
    NON_UTF8,
    FieldPath,
    Raw,
    all_values,
    delete,
    dumps,
    duplicate_key,
    field_paths,
    flip_bytes,
    get,
    insert_bytes,
    iter_sweep,
    load_seed,
    replace,
    truncate,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NIGHTLY = env_profile() == "nightly"
SHARDS = 4
"""The random test runs as this many items (each on its own share of the seeds), so that
``pytest -n`` spreads it."""
EXAMPLES = 2500 if NIGHTLY else 250
"""Random inputs per shard."""

SEEDS = seed_files()
TREES = {seed: load_seed(seed) for seed in SEEDS}

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not NIGHTLY,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _edit(draw: Any, tree: Any, labels: list[str]) -> Any:
    """One edit of ``tree`` (a JSON object still, or a marker after a duplicated key)."""
    paths = field_paths(tree)
    kind = draw(
        st.sampled_from(["value"] * 8 + ["delete"] * 2 + ["twice", "format", "case-format", "wrap"])
    )
    if kind == "format":
        value = draw(st.sampled_from(FORMATS))
        labels.append(f"format = {value!r}")
        return replace(tree, ("format",), value) if "format" in tree else tree
    if kind == "case-format" and isinstance(tree.get("case"), dict):
        value = draw(st.sampled_from(CASE_FORMATS))
        labels.append(f"case.format = {value!r}")
        return replace(tree, ("case", "format"), value)
    if kind == "wrap":
        depth = draw(st.sampled_from([2, 31, 33, 200, 100_000]))
        labels.append(f"whole file nested {depth} deep")
        return Raw("[" * depth + dumps(tree) + "]" * depth)
    if not paths:
        return tree
    path: FieldPath = draw(st.sampled_from(paths))
    where = "/".join(map(str, path))
    if kind == "delete":
        labels.append(f"{where}: deleted")
        return delete(tree, path)
    current = get(tree, path)
    value = draw(st.sampled_from(all_values(current)))
    if kind == "twice" and isinstance(path[-1], str):
        labels.append(f"{where}: twice, then {value!r:.40}")
        return duplicate_key(tree, path, value)
    labels.append(f"{where} = {value!r:.40}")
    return replace(tree, path, value)


@st.composite
def mutated_repro(draw: Any, seeds: list[Path]) -> tuple[Path, str, bytes]:
    """``(seed, label, file bytes)``: a real repro with one to three edits, then maybe
    damaged as bytes."""
    seed = draw(st.sampled_from(seeds))
    tree: Any = TREES[seed]
    labels: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        if not isinstance(tree, dict):
            break  # a duplicated key or a wrapped file: nothing more to walk
        tree = _edit(draw, tree, labels)
    data = dumps(tree).encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "flip", "bytes", "pad"]))
    if damage == "truncate":
        at = draw(st.integers(0, len(data)))
        labels.append(f"truncated at {at}")
        data = truncate(data, at)
    elif damage == "flip":
        rng = random.Random(draw(st.integers(0, 2**32)))
        count = draw(st.integers(1, 8))
        labels.append(f"{count} byte(s) flipped")
        data = flip_bytes(data, rng, count)
    elif damage == "bytes":
        chunk = draw(st.sampled_from(NON_UTF8))
        at = draw(st.integers(0, len(data)))
        labels.append(f"{chunk!r} at {at}")
        data = insert_bytes(data, at, chunk)
    elif damage == "pad":
        size = draw(st.sampled_from([(8 << 20) - len(data), (8 << 20) + 1]))
        labels.append(f"padded to {len(data) + max(0, size)} bytes")
        data = data + b" " * max(0, size)
    return seed, f"{seed.name}: {'; '.join(labels)}", data


@pytest.mark.parametrize("shard", range(SHARDS))
def test_mutated_repros_exit_cleanly_in_bounded_time_and_memory(
    shard: int, registry: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ws = Workspace(tmp_path_factory.mktemp(f"fuzz-{shard}"))
    seeds = SEEDS[shard::SHARDS]
    problems: list[str] = []

    @FUZZ_SETTINGS
    @given(mutated_repro(seeds))
    def check(example: tuple[Path, str, bytes]) -> None:
        seed, label, data = example
        found = run_input(ws, data, label, seed=seed)
        problems.extend(found)
        assert not found, "\n".join(found)

    check()
    assert not problems


# -- the sweep -------------------------------------------------------------------------------

SWEPT = [
    s
    for s in SEEDS
    if NIGHTLY
    or s.name
    in {
        "crash-long-table.repro.json",
        "hang-large-group.repro.json",
        "nondeterministic-racy-merge.repro.json",
        "nonfinite-hand-edited.repro.json",
        "pending-page-stride.repro.json",
        "raised-padded-rows.repro.json",
        "wrong-packed-launch.repro.json",
        "wrong-fp8-window-padded.repro.json",
        "wrong-tree-padded.repro.json",
        "wrong-window-sidecar.repro.json",
        "xqa-bmm2-scale-ignored.repro.json",
    }
]
"""CI: one real repro of each kind and feature (and one of a GPU path; the test below checks
the list covers them); nightly: every seed."""
SWEEP_EDITS = 2
"""CI: edits per field path (taken in turn from the path's list, so that across the paths each
kind of edit is made); nightly: every edit of every path (its deletion, its key twice and each
of :func:`_mutate.sweep_values`; about 100,000 runs over every seed, an hour on one core).
Each edit goes through one command, the four in turn. The random test draws from the longer
:func:`_mutate.all_values`."""


@pytest.mark.parametrize("seed", SWEPT, ids=[s.name.removesuffix(".repro.json") for s in SWEPT])
def test_every_field_path_edited_exits_cleanly(
    seed: Path, registry: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ws = Workspace(tmp_path_factory.mktemp("sweep"))
    tree = TREES[seed]
    edits = list(iter_sweep(tree))
    if not NIGHTLY:
        per_path: dict[str, list[tuple[str, bytes]]] = {}
        for label, data in edits:
            per_path.setdefault(label.split(":")[0].split(" = ")[0], []).append((label, data))
        edits = [
            group[(i * SWEEP_EDITS + k) % len(group)]
            for i, group in enumerate(per_path.values())
            for k in range(SWEEP_EDITS)
        ]
    problems: list[str] = []
    for i, (label, data) in enumerate(edits):
        command = COMMANDS[i % len(COMMANDS)]
        problems += run_input(ws, data, f"{seed.name}: {label}", seed=seed, commands=(command,))
    assert not problems, "\n".join(problems[:20])


def _features(seed: Path) -> set[str]:
    """What a seed repro holds: its finding kind (or ``pending``) and the case features the
    fuzzer must reach through it."""
    tree = TREES[seed]
    case = tree["case"]
    a, b = case["attention"], case["batch"]
    found = {tree["finding"]["kind"] if tree.get("finding") else "pending"}
    if tree.get("launch"):
        found.add("packed launch")
    if tree.get("tensors"):
        found.add("tensor sidecar")
    if a["window_left"] >= 0:
        found.add("window")
    if a["sinks"]:
        found.add("sinks")
    if a["kv_dtype"] == "fp8_e4m3" and (a["k_scale"], a["v_scale"]) != (1.0, 1.0):
        found.add("fp8 scales")
    if b["draft"]["kind"] == "tree":
        found.add("tree draft")
    if b["padding_requests"] or b["padding_rows"]:
        found.add("padding")
    if len(set(b["prefix_lens"])) > 1:
        found.add("ragged")
    return found


def test_the_ci_sweep_reaches_every_kind_and_feature_of_a_real_repro() -> None:
    wanted = {
        "WRONG",
        "CRASH",
        "HANG",
        "RAISED",
        "NONDETERMINISTIC",
        "NONFINITE",
        "pending",
        "packed launch",
        "tensor sidecar",
        "window",
        "sinks",
        "fp8 scales",
        "tree draft",
        "padding",
        "ragged",
    }
    reached = set().union(*(_features(s) for s in SWEPT))
    assert wanted <= reached, f"no swept seed has {sorted(wanted - reached)}"
    assert len(SWEPT) >= 9
