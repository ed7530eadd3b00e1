"""SGLang's XQA mask buffer sized by its speculative draft length, not by the batch's ``L``.

SGLang builds the XQA draft mask as uint16 ``[max_bs, draft_len, ((draft_len + 31)//32)*2]``
from ``speculative_num_draft_tokens``; in draft extend the batch's ``L`` can be shorter. The case
model carries that length (``BatchSpec.spec_draft_len``), the XQA adapter passes SGLang's buffer,
the campaign plans such cases, and the shrinker and triage can name and drop the feature. What
the kernel computes with it is for the GPU run to show.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from difftest.campaign.planning import (
    DRAFT_LEN_SHARE,
    CampaignConfig,
    planned_cases,
    with_draft_length,
)
from difftest.execution.packing import pack_key
from difftest.generation.materialize import materialize
from difftest.model.case import AttentionConfig, BatchSpec, Case, CausalDraft, TreeDraft
from difftest.model.errors import FormatError, InvalidCase
from difftest.paths import kernel_args
from difftest.paths.contracts import ContractViolation, check_decode_args
from difftest.triage.features import BY_NAME, labels

WS = torch.zeros(64, dtype=torch.uint8)


def make(L: int = 2, draft_len: int | None = 4, mode: str = "draft_extend_v2") -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=4, num_kv_heads=2, head_dim=32, page_size=16),
        batch=BatchSpec(
            mode=mode,  # type: ignore[arg-type]
            prefix_lens=(7, 20, 3),
            q_len=L,
            spec_draft_len=draft_len,
        ),
        convention="sglang",
        seed=1,
    )


def test_the_draft_length_is_only_where_sglang_can_produce_it() -> None:
    assert make().batch.spec_draft_len == 4
    with pytest.raises(InvalidCase, match="spec_draft_len"):
        make(L=4, draft_len=4)  # equal to L: written as None
    with pytest.raises(InvalidCase, match="draft-extend batch"):
        make(mode="target_verify")  # target verify always scores the whole draft
    with pytest.raises(InvalidCase, match="draft-extend batch"):
        BatchSpec(
            mode="draft_extend_v2",
            prefix_lens=(1,),
            q_len=2,
            draft=TreeDraft(parents=(-1, 0)),
            spec_draft_len=4,
        )
    with pytest.raises(InvalidCase, match="needs convention 'sglang'"):
        make().replace(convention="plain")


def test_json_carries_it_only_when_set_so_other_cases_keep_their_digests() -> None:
    case = make()
    data = case.to_json()
    assert data["batch"]["spec_draft_len"] == 4
    assert Case.from_json(data) == case
    plain = make(draft_len=None)
    assert "spec_draft_len" not in plain.to_json()["batch"]
    assert Case.from_json(plain.to_json()) == plain
    assert case.digest() != plain.digest()
    bad = case.to_json()
    bad["batch"]["spec_draft_len"] = 2  # not longer than L
    with pytest.raises(FormatError, match="spec_draft_len"):
        Case.from_json(bad)


def test_the_xqa_mask_is_sglangs_buffer_sized_by_the_draft_length() -> None:
    batch = materialize(make(L=2, draft_len=5))
    mask = kernel_args.decode_kwargs(batch, WS, "xqa")["mask"]
    assert mask.dtype == torch.uint16 and tuple(mask.shape) == (3, 5, 2)
    words = mask.contiguous().view(torch.int32).view(3, 5)  # one 32-bit word per row
    rows = [int(w) & 0xFFFFFFFF for w in words[0].tolist()]
    assert rows == [0b1, 0b11, 0b111, 0b1111, 0b11111]  # the chain of 5 draft tokens
    assert torch.equal(words[1], words[0]) and torch.equal(words[2], words[0])
    # without the draft length, the mask is sized by L as before
    same_l = kernel_args.decode_kwargs(materialize(make(L=2, draft_len=None)), WS, "xqa")
    assert tuple(same_l["mask"].shape) == (3, 2, 2)
    # TRT-LLM gen takes no mask at all
    assert "mask" not in kernel_args.decode_kwargs(batch, WS, "trtllm-gen")


def test_the_contract_flags_the_buffer_the_xqa_path_passes_on_to_the_kernel() -> None:
    """The contract (the kernel's documented mask shape) refuses SGLang's buffer; the XQA
    path leaves that one check out for these cases so the kernel itself is judged."""
    batch = materialize(make(L=2, draft_len=4))
    kw = kernel_args.decode_kwargs(batch, WS, "xqa")
    args = {
        k: kw[k]
        for k in (
            "query",
            "kv_cache",
            "block_tables",
            "seq_lens",
            "q_len_per_req",
            "kv_layout",
            "max_seq_len",
            "sinks",
            "out",
            "window_left",
        )
    }
    with pytest.raises(ContractViolation, match=r"mask.*shape \[3, 2, 2\]"):
        check_decode_args(**args, mask=kw["mask"], workspace_buffer=WS, min_workspace_bytes=64)
    check_decode_args(**args, mask=None, workspace_buffer=WS, min_workspace_bytes=64)


def test_triage_names_it_and_the_shrinker_can_drop_it() -> None:
    case = make()
    assert "spec_draft_len" in labels(case)
    feature = BY_NAME["spec_draft_len"]
    assert feature.reset_case(case) == make(draft_len=None)
    # moving to the plain convention drops it too (only SGLang sizes a buffer by it)
    moved = BY_NAME["convention"].reset_case(case)
    assert moved is not None and moved.convention == "plain"
    assert moved.batch.spec_draft_len is None


def test_cases_with_another_draft_length_never_share_a_launch() -> None:
    assert pack_key(make(draft_len=4)) != pack_key(make(draft_len=5))
    assert pack_key(make(draft_len=4)) != pack_key(make(draft_len=None))


def test_the_campaign_plans_such_cases_and_only_where_sglang_produces_them() -> None:
    config = CampaignConfig(seed=3, swarm=False, avoid=False)
    cases = [c for _, c in itertools.islice(planned_cases(config, "cpu"), 400)]
    with_len = [c for c in cases if c.batch.spec_draft_len is not None]
    assert with_len, "no planned case had SGLang's longer draft length"
    for c in with_len:
        b = c.batch
        assert c.convention == "sglang" and b.mode == "draft_extend_v2"
        assert isinstance(b.draft, CausalDraft) and b.q_len < b.spec_draft_len <= 8
    eligible = [
        c
        for c in cases
        if c.convention == "sglang"
        and c.batch.mode == "draft_extend_v2"
        and isinstance(c.batch.draft, CausalDraft)
        and c.batch.q_len < 8
    ]
    share = len(with_len) / len(eligible)
    assert 0.5 * DRAFT_LEN_SHARE < share < 2 * DRAFT_LEN_SHARE, share


def test_with_draft_length_is_deterministic_and_leaves_other_cases_alone() -> None:
    base = make(draft_len=None)
    picked = [n for n in range(200) if with_draft_length(base, 0, n) != base]
    assert picked == [n for n in range(200) if with_draft_length(base, 0, n) != base]
    assert picked
    target = dataclasses.replace(base, batch=dataclasses.replace(base.batch, mode="target_verify"))
    assert all(with_draft_length(target, 0, n) == target for n in picked)
    plain = base.replace(convention="plain")
    assert all(with_draft_length(plain, 0, n) == plain for n in picked)


def test_the_prediction_of_what_xqa_reads_from_the_buffer() -> None:
    from _xqa_mask_reading import misread_rows

    # L = 2, D = 4: request 1 reads rows 2 and 3 of request 0's block (its first row sees
    # both draft tokens); request 2 starts at row 4, which is request 1's first row again.
    assert misread_rows(2, 4, 3) == {1: (0,)}
    assert misread_rows(4, 8, 4) == {1: (0, 1, 2), 3: (0, 1, 2)}
    assert misread_rows(3, 4, 3) == {1: (0, 1, 2), 2: (0, 1, 2)}
    assert misread_rows(4, 5, 1) == {}  # one request reads its own rows
