"""The generator's bits are pinned: every stored case materialises to exactly the stored bytes.

Repro files in the corpus record metrics that replays compare bit for bit, so the tensors a case
produces must never change, on any device, whatever the generator's implementation (on a CPU
both with and without numpy, :data:`rng.NUMPY_ON_CPU`). The cases
and the SHA-256 of each tensor of their :class:`Batch` live in
``tests/data/generation_bits.json``; they were written by the generator as it was before it was
made fast (commit "tests: pin the generator's bits"), and any change of a digest is a change of
what every stored case means.

The digests are regenerated only when a change of bits is intended (a new case format, say):

    python tests/unit/test_generation_bits.py --write
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from difftest.campaign.planning import case_seed
from difftest.generation import rng
from difftest.generation.materialize import materialize
from difftest.model.batch import Batch
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
    ValueSpec,
)

DATA = Path(__file__).parents[1] / "data" / "generation_bits.json"
TENSORS = ("q_padded", "kv_storage", "block_tables", "seq_lens", "sinks", "draft_mask")


def tensor_digest(t: torch.Tensor | None) -> str | None:
    """SHA-256 of dtype, shape and bytes (row-major) of ``t``."""
    if t is None:
        return None
    c = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{c.dtype}|{tuple(c.shape)}|".encode())
    h.update(c.view(torch.uint8).numpy().tobytes() if c.numel() else b"")
    return h.hexdigest()


def batch_digests(batch: Batch) -> dict[str, Any]:
    out: dict[str, Any] = {name: tensor_digest(getattr(batch, name)) for name in TENSORS}
    view = batch.kv_cache
    out["kv_cache_view"] = [list(view.shape), list(view.stride()), view.storage_offset()]
    return out


def _stored() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(DATA.read_text())["cases"]
    return entries


def _paths() -> list[tuple[str, bool]]:
    """``(device, numpy_on_cpu)``: the CPU through numpy and through torch alone, and CUDA."""
    paths = [("cpu", True), ("cpu", False)]
    return [*paths, ("cuda", False)] if torch.cuda.is_available() else paths


@pytest.mark.parametrize(("device", "numpy_on_cpu"), _paths())
def test_every_stored_case_gives_the_stored_bits(
    device: str, numpy_on_cpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rng, "NUMPY_ON_CPU", numpy_on_cpu)
    wrong = []
    for entry in _stored():
        case = Case.from_json(entry["case"])
        got = batch_digests(materialize(case, device))
        if got != entry["digests"]:
            bad = sorted(k for k in got if got[k] != entry["digests"].get(k))
            wrong.append(f"{entry['name']}: {', '.join(bad)}")
    assert not wrong, "generator bits changed:\n" + "\n".join(wrong)


def test_the_store_route_gives_the_stored_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device with Triton each role is drawn and stored in place
    (:mod:`difftest.generation.fused_store`: one call per role, whole, into its slots; queries
    as a pool of one-row pages). Here that route runs on the CPU with the kernel stood in for by
    its torch form: the recipes, slots, views and padding rows it hands over give every stored
    case's bits (the kernel's own bits against the torch form: its first-use check, and this
    file's CUDA parametrisation above on a GPU)."""
    from difftest.generation import fused_store
    from difftest.generation import materialize as m

    monkeypatch.setattr(fused_store, "usable", lambda device: True)
    monkeypatch.setattr(fused_store, "_checked", True)
    calls: list[str] = []

    def kernel(segments: list[fused_store.Segment]) -> None:
        calls.extend(str(s.dest.dtype) for s in segments)
        fused_store.one_by_one(m._store_torch, segments)

    monkeypatch.setattr(fused_store, "launch", kernel)
    wrong = []
    for entry in _stored():
        case = Case.from_json(entry["case"])
        got = batch_digests(materialize(case, "cpu"))
        if got != entry["digests"]:
            bad = sorted(k for k in got if got[k] != entry["digests"].get(k))
            wrong.append(f"{entry['name']}: {', '.join(bad)}")
    assert not wrong, "the store route changed bits:\n" + "\n".join(wrong)
    assert len(calls) >= 3 * len(_stored())  # K, V and the queries of every case, at least


def test_stream_numbers_and_campaign_seeds_are_pinned() -> None:
    # The numbers are part of every stored case's bits (and of every campaign's case seeds).
    assert {s.name: s.value for s in rng.Stream} == {
        "Q": 1,
        "K": 2,
        "V": 3,
        "SINKS": 4,
        "STALE_K": 5,
        "STALE_V": 6,
        "PAD": 7,
        "BASE": 8,
        "OUTLIER": 9,
        "PAGE_ORDER": 10,
        "STALE_PAGES": 11,
        "CASE_SEED": 12,
        "GRAPH_QUERY": 13,
        "GRAPH_TABLE": 14,
    }
    pairs = ((0, 0), (1, 0), (0, 7), (12345, 3), (2**63 - 1, 99))
    # Written by campaign.run.case_seed before the streams were gathered into rng.Stream.
    assert [case_seed(s, c) for s, c in pairs] == [
        4231501602,
        25116301,
        2333851031,
        3899235432,
        2307901305,
    ]


def test_the_stored_cases_cover_every_option() -> None:
    cases = [Case.from_json(e["case"]) for e in _stored()]
    seen: dict[str, set[object]] = {}
    for c in cases:
        a, p = c.attention, c.pool
        for name, value in (
            ("family", c.values.family),
            ("stale_fill", p.stale_fill),
            ("table_fill", p.table_fill),
            ("page_order", p.page_order),
            ("kv_storage", p.kv_storage),
            ("table_width", p.table_width),
            ("kv_dtype", a.kv_dtype),
            ("q_dtype", a.q_dtype),
            ("sinks", a.sinks),
            ("shared", p.shared_prefix_pages > 0),
            ("padding_rows", c.batch.padding_rows > 0),
            ("padding_requests", c.batch.padding_requests > 0),
            ("tree", c.batch.draft.kind == "tree"),
            ("page_size_1", a.page_size == 1),
            ("big_pool", c.num_pages() * a.page_size * a.num_kv_heads * a.head_dim > 1 << 20),
        ):
            seen.setdefault(name, set()).add(value)
    assert seen["family"] == {
        "randn",
        "large_logits",
        "near_ties",
        "outlier_tokens",
        "position_coded",
    }
    assert seen["stale_fill"] == {"zeros", "randn", "large"}
    assert seen["table_fill"] == {"zero", "stale_pages", "out_of_range"}
    assert seen["page_order"] == {"sequential", "reversed", "shuffled"}
    assert seen["kv_storage"] == {"hnd", "nhd", "kv_split_nhd"}
    assert seen["kv_dtype"] == {"bf16", "fp16", "fp8_e4m3"}
    for flag in ("table_width", "q_dtype"):
        assert len(seen[flag]) == 2, flag
    for flag in ("sinks", "shared", "padding_rows", "padding_requests", "tree", "page_size_1"):
        assert seen[flag] == {False, True}, flag
    assert True in seen["big_pool"]


# -- writing the stored cases (only when a change of bits is intended) -----------------------


def _handmade() -> list[tuple[str, Case]]:
    """Cases aimed at each option and at the edges (big pools, odd sizes, extreme seeds)."""
    families = ("randn", "large_logits", "near_ties", "outlier_tokens", "position_coded")
    stale = ("zeros", "randn", "large")
    tables = ("zero", "stale_pages", "out_of_range")
    orders = ("sequential", "reversed", "shuffled")
    storages = ("hnd", "nhd", "kv_split_nhd")
    kv_dtypes = ("bf16", "fp16", "fp8_e4m3")
    heads = ((4, 2), (8, 1), (2, 2), (16, 4), (1, 1), (6, 3))
    dims = (8, 16, 64, 32, 96, 128, 80)
    pages = (4, 1, 16, 3, 8, 32, 64)
    out: list[tuple[str, Case]] = []
    for i in range(30):
        hq, hkv = heads[i % len(heads)]
        ps = pages[i % len(pages)]
        kv = kv_dtypes[(i // 2) % 3]
        q_dtype: Any = "fp16" if kv == "fp16" or i % 5 == 0 else "bf16"
        n_req = 1 + i % 4
        prefixes = tuple((7 * i + 13 * r) % (5 * ps + 11) + ps * (i % 3) for r in range(n_req))
        shared = (min(prefixes) // ps) if (n_req > 1 and i % 3 == 1) else 0
        context = i % 4 == 3
        attn = AttentionConfig(
            num_qo_heads=hq,
            num_kv_heads=hkv,
            head_dim=dims[i % len(dims)],
            page_size=ps,
            q_dtype=q_dtype,
            kv_dtype=kv,
            out_dtype=q_dtype,
            sinks=i % 3 == 0,
            window_left=-1 if i % 4 else 5,
            q_scale=(1.0, 0.5, 2.0)[i % 3],
            k_scale=(1.0, 0.25, 0.0625, 3.0)[i % 4],
            v_scale=(1.0, 2.0, 0.125)[i % 3],
        )
        q_len = 2 + i % 5
        case = Case(
            attention=attn,
            batch=BatchSpec(
                mode=("target_verify", "draft_extend_v2")[i % 2],
                prefix_lens=prefixes,
                q_len=q_len,
                draft=TreeDraft(parents=(-1, *(j // 2 for j in range(1, q_len))))
                if i % 4 == 1
                else CausalDraft(),
                padding_requests=i % 3,
                padding_rows=(i * 3) % 5,
            ),
            pool=PoolSpec(
                kv_storage=storages[i % 3],  # type: ignore[arg-type]
                page_order=orders[(i // 3) % 3],  # type: ignore[arg-type]
                spare_pages=i % 5,
                shared_prefix_pages=shared,
                table_width="context" if context else "exact",
                table_fill=tables[(i // 2) % 3],  # type: ignore[arg-type]
                stale_fill=stale[(i + i // 3) % 3],  # type: ignore[arg-type]
                context_len=max(prefixes) + q_len + 3 * ps + i if context else None,
            ),
            values=ValueSpec(family=families[i % 5], scale=(1.0, 0.5, 2.0, 4.0)[i % 4]),  # type: ignore[arg-type]
            convention=("sglang", "plain")[i % 2],
            seed=(i * 2654435761) % (1 << 32) if i % 7 else (1 << 63) - 1 - i,
        )
        out.append((f"grid-{i:02d}", case))
    big = AttentionConfig(num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16)
    for j, (family, storage, order, fill, kv) in enumerate(
        (
            ("randn", "hnd", "shuffled", "randn", "bf16"),
            ("outlier_tokens", "kv_split_nhd", "reversed", "large", "fp8_e4m3"),
            ("near_ties", "nhd", "sequential", "zeros", "fp16"),
            ("position_coded", "hnd", "shuffled", "large", "bf16"),
        )
    ):
        attn = dataclasses.replace(
            big,
            kv_dtype=kv,  # type: ignore[arg-type]
            q_dtype="fp16" if kv == "fp16" else "bf16",
            out_dtype="fp16" if kv == "fp16" else "bf16",
            k_scale=0.5,
            sinks=j % 2 == 1,
        )
        prefixes = (2500 + 37 * j, 1111, 3001 - j)
        out.append(
            (
                f"big-{j}",
                Case(
                    attention=attn,
                    batch=BatchSpec(
                        mode="target_verify", prefix_lens=prefixes, q_len=3 + j, padding_rows=2
                    ),
                    pool=PoolSpec(
                        kv_storage=storage,  # type: ignore[arg-type]
                        page_order=order,  # type: ignore[arg-type]
                        spare_pages=5 + j,
                        shared_prefix_pages=j * 20,
                        stale_fill=fill,  # type: ignore[arg-type]
                        table_fill=tables[j % 3],  # type: ignore[arg-type]
                    ),
                    values=ValueSpec(family=family),  # type: ignore[arg-type]
                    seed=1000 + j,
                ),
            )
        )
    return out


def _sampled() -> list[tuple[str, Case]]:
    from difftest.generation.sampling import sample_cases
    from difftest.generation.strategies import CPU_LIMITS, cases

    drawn = sample_cases(cases(limits=CPU_LIMITS), seed=20260116, count=20)
    return [(f"sampled-{i:02d}", c) for i, c in enumerate(drawn)]


def write() -> None:
    entries = [
        {"name": name, "case": case.to_json(), "digests": batch_digests(materialize(case))}
        for name, case in _handmade() + _sampled()
    ]
    DATA.parent.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join(json.dumps(e, sort_keys=True) for e in entries)  # one case a line
    DATA.write_text('{"cases": [\n' + lines + "\n]}\n")
    print(f"wrote {len(entries)} cases to {DATA}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write()
