"""What XQA would compute with SGLang's draft-length mask buffer, if it reads masks as its
source says: request ``b``'s rows start at row ``b * L`` of the buffer (``mha.cu``: ``mask +=
reqSeqOffset * divUp(qSeqLen, 32)``, with ``qSeqLen = L``), while SGLang's buffer puts request
``b`` at row ``b * D``. The GPU test (``tests/gpu/test_versions.py``) compares the kernel's wrong
rows with this prediction; ``tests/unit/test_sglang_draft_len.py`` pins the prediction."""

from __future__ import annotations


def misread_rows(L: int, draft_len: int, requests: int) -> dict[int, tuple[int, ...]]:
    """Per request, the draft rows that would see another number of draft tokens than the
    causal ``i + 1`` (requests with none are left out). Both widths must fit one 32-bit word
    per row (``L, draft_len <= 32``), as SGLang's draft lengths do."""
    assert 1 <= L < draft_len <= 32
    wrong: dict[int, tuple[int, ...]] = {}
    for b in range(requests):
        rows = []
        for i in range(L):
            flat = b * L + i  # the row XQA reads
            seen = min(L, flat % draft_len + 1)  # a chain row of the D-token buffer
            if seen != i + 1:
                rows.append(i)
        if rows:
            wrong[b] = tuple(rows)
    return wrong
