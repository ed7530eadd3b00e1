"""Whether Triton kernels can run under Triton's interpreter in this test process."""

from __future__ import annotations

import importlib.util
import os


def not_interpretable(what: str) -> str | None:
    """Why ``what`` (a module's kernels) cannot run under Triton's interpreter here, or
    ``None``: Triton must be installed and ``TRITON_INTERPRET=1`` set before anything imports
    it (``tests/conftest.py`` sets it where no CUDA GPU is visible; Triton reads it when it
    first decorates its own functions)."""
    if importlib.util.find_spec("triton") is None:
        return f"Triton is not installed: {what} runs under its interpreter"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return (
            "TRITON_INTERPRET is not 1 in this process (tests/conftest.py sets it where no CUDA "
            "GPU is visible; Triton reads it when it first decorates its own functions)"
        )
    return None
