"""Hostile inputs by name, and the bugs the repro fuzzer found, one regression test each.

The named inputs (issue 19): a repro asking for ``spare_pages: 100000``, one asking for more
than 10**12 K/V elements (one field past its cap, or every field within its cap and their
product past the pool's), a FIFO given as FILE and ``/dev/zero`` given as FILE. Each makes
``replay``, ``explain``, ``shrink`` and ``export`` exit 2 on one line with the process's peak
memory growing by less than 500 MB (measured in this process: ``VmHWM`` reset before each run,
see :func:`_harness.peak_growth`). How long each took is printed at the end of the session
("named inputs": well under a second each), never asserted beyond the watchdog's hang guard.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import PLANTED_FILE, REFUSALS, Run, peak_growth, run_command

from difftest.interfaces.cli import build_parser
from difftest.model import caps
from difftest.model.case import BatchSpec, Case
from difftest.model.errors import FormatError, InvalidCase
from difftest.records import export, untrusted
from difftest.records.repro import load_repro

ROOT = Path(__file__).resolve().parents[2]
WINDOW = ROOT / "tests" / "corpus" / "planted-window.repro.json"
FA2 = ROOT / "difftest" / "corpus" / "fa2-workspace-overflow.repro.json"
COMMANDS = ("replay", "explain", "shrink", "export")
ARGS = {
    "replay": ("--isolation", "none", "--device", "cpu"),
    "explain": ("--isolation", "none", "--device", "cpu"),
    "shrink": ("--isolation", "none", "--device", "cpu", "--max-runs", "2"),
    "export": (),
}


HANG_GUARD_S = 60.0
"""CPU seconds past which a step counts as hung (what it takes is printed, not asserted)."""


@pytest.fixture(scope="module", autouse=True)
def commands_imported() -> None:
    build_parser()  # the first parse imports every command: not the inputs' cost


def edited(folder: Path, source: Path = WINDOW, **fields: Any) -> Path:
    """``source`` with the fields at dotted paths (``case.pool.spare_pages``) set."""
    data = json.loads(source.read_text())
    data["plugins"] = [str(PLANTED_FILE)]
    for dotted, value in fields.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node[int(key) if key.isdigit() else key]
        node[last] = value
    out = folder / "edited.repro.json"
    out.write_text(json.dumps(data))
    return out


def run(command: str, file: Path, out: Path) -> Run:
    """``difftest COMMAND FILE`` in this process, measured; what it writes goes to ``out``."""
    argv = [command, str(file), "--plugin", str(PLANTED_FILE), *ARGS[command]]
    if command == "export":
        argv += ["-o", str(out / "script.py")]
    if command == "shrink":
        argv += ["--out", str(out)]
    return run_command(argv)


def refused_quickly(result: Run, *needles: str, name: str = "") -> None:
    """Exit 2 on one line holding each of ``needles``, the peak memory grown by less than
    500 MB, and no hang. The seconds are recorded (printed at the end of the session, see
    :data:`_harness.REFUSALS`), not asserted: only the watchdog's hang guard bounds them."""
    lines = result.stderr.strip().splitlines()
    REFUSALS.add(name or f"{result.command} ({lines[0][:70] if lines else ''})", result)
    assert not result.hang, f"hang: stopped after {result.seconds:.1f}s"
    assert result.code == 2, result.stdout + result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert result.peak_mb < 500, f"{result.peak_mb:.0f} MB"


NAMED: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "spare-pages-100000": (
        lambda d: edited(d, case__pool__spare_pages=100_000),
        ("spare_pages=100000", "[0, 4096]"),
    ),
    "head-dim-10**12": (
        lambda d: edited(d, case__attention__head_dim=10**12),
        ("head_dim=1000000000000",),
    ),
    "every-field-in-range-10**12-elements": (
        lambda d: edited(
            d,
            case__attention__num_qo_heads=1024,
            case__attention__num_kv_heads=1024,
            case__attention__head_dim=1024,
            case__batch__prefix_lens=[caps.MAX_SEQ_LEN - 64],
            case__attention__window_left=-1,
        ),
        ("the K/V pool would hold", "elements, more than"),
    ),
    "fifo": (
        lambda d: (os.mkfifo(d / "fifo.repro.json"), d / "fifo.repro.json")[1],
        ("not a regular file",),
    ),
    "dev-zero": (lambda d: Path("/dev/zero"), ("/dev/zero", "not a regular file")),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", NAMED)
def test_a_named_input_exits_2_within_a_second_and_500_mb(
    name: str, command: str, tmp_path: Path
) -> None:
    make, needles = NAMED[name]
    refused_quickly(run(command, make(tmp_path), tmp_path), *needles, name=f"{name} {command}")


def test_the_10_to_the_12_case_is_refused_when_it_is_built_not_when_it_is_allocated() -> None:
    body = json.loads(WINDOW.read_text())["case"]
    body["attention"].update(num_qo_heads=1024, num_kv_heads=1024, head_dim=1024)
    body["batch"]["prefix_lens"] = [caps.MAX_SEQ_LEN - 64]
    with pytest.raises(FormatError, match="K/V pool would hold 4398046511104 elements"):
        Case.from_json(body)


# -- regressions: what the fuzzer found ------------------------------------------------------


@pytest.fixture
def small_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 512 MiB free: a case over a quarter GiB does not fit."""
    monkeypatch.setattr(caps, "free_memory", lambda device_type, index=None: 512 << 20)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_case_over_the_free_memory_is_refused_before_it_is_built(
    command: str, tmp_path: Path, small_machine: None
) -> None:
    # Within every cap (one request of 2M tokens), about 1.7 GiB to materialise and judge:
    # replay built it (1.3 GB) before checking; export too (and 3 GB for the GPU corpus
    # case run through torch-sdpa).
    file = edited(tmp_path, case__batch__prefix_lens=[caps.MAX_SEQ_LEN - 64])
    needle = "MiB of tensors" if command == "export" else "more than half of the 0.5 GiB free"
    refused_quickly(run(command, file, tmp_path), needle)
    gpu_case = edited(tmp_path, FA2, finding__path="torch-sdpa")
    refused_quickly(run(command, gpu_case, tmp_path), "the case needs about 2.0 GiB")


def test_a_launch_is_checked_as_a_whole(small_machine: None) -> None:
    seed = Path(__file__).parent / "seeds" / "wrong-packed-launch.repro.json"
    repro = load_repro(seed)
    share = caps.MEMORY_SHARE * (512 << 20)
    one = repro.case.estimated_bytes()
    n = int(share // one) + 1  # n copies do not fit, one does
    untrusted.check_fits(repro.case, _cpu(), "x")
    with pytest.raises(FormatError, match=f"the launch of {n} cases needs about"):
        untrusted.check_fits(repro.case, _cpu(), "x", launch=[repro.case] * n)


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


def test_export_refuses_too_many_tensors_before_materialising(tmp_path: Path) -> None:
    file = edited(tmp_path, case__batch__prefix_lens=[caps.MAX_SEQ_LEN - 64])
    case = load_repro(file).case
    assert export.embedded_bytes(case) > export.MAX_EMBEDDED_BYTES
    refused_quickly(run("export", file, tmp_path), "128.0 MiB of tensors (limit 32 MiB)")


def test_the_embedded_size_is_never_more_than_what_is_embedded() -> None:
    from difftest.generation.materialize import materialize

    for seed in sorted((Path(__file__).parent / "seeds").glob("*.repro.json")):
        case = load_repro(seed).case
        batch = materialize(case)
        a = case.attention
        real = sum(
            t.numel() * t.element_size()
            for t in (batch.q_padded, batch.kv_storage, batch.block_tables, batch.seq_lens)
        ) + (case.batch.num_query_rows * a.num_qo_heads * a.head_dim * 8)
        assert export.embedded_bytes(case) <= real, seed.name


def test_tensor_literals_are_cut_into_lines_quickly() -> None:
    # textwrap.wrap took minutes on the 40 MB of base64 an export may embed.
    import base64
    import textwrap

    small = base64.b64encode(bytes(range(256)) * 3).decode()
    text = export._tensor_literals({"t": {"dtype": "uint8", "shape": [768], "data": small}})
    assert [line.strip()[1:-1] for line in text.splitlines()[5:-3]] == textwrap.wrap(small, 96)
    large = base64.b64encode(os.urandom(24 << 20)).decode()
    start = time.process_time()
    export._tensor_literals({"t": {"dtype": "uint8", "shape": [24 << 20], "data": large}})
    seconds = time.process_time() - start
    print(f"tensor literals of 32 MB of base64: {seconds:.2f}s CPU")
    assert seconds < HANG_GUARD_S  # a hang guard (textwrap took minutes), not a speed bound


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("case__pool__stale_fill", "a" * 100_000),
        ("case__attention__window_left", [0] * 100_000),
        ("case__batch__prefix_lens", ["a" * 100_000]),
        ("format", "b" * 100_000),
        ("case__format", ["c"] * 100_000),
        ("status", "d" * 4000),
        ("case__pool", {f"key{i}": 0 for i in range(10_000)}),
        ("finding", {"path": "x", "kind": "e" * 4000}),
        ("tensors", {"file": "f" * 4000, "keys": [], "sha256": "0" * 64}),
    ],
)
def test_a_refusal_names_the_field_without_echoing_the_file(
    field: str, value: Any, tmp_path: Path
) -> None:
    # A 100,000-character value was printed back whole on the one error line.
    result = run("replay", edited(tmp_path, **{field: value}), tmp_path)
    refused_quickly(result)
    assert len(result.stderr) < 400, result.stderr[:500]


def test_a_long_list_in_a_case_is_refused_by_its_length_first() -> None:
    body = json.loads(WINDOW.read_text())["case"]
    body["batch"]["prefix_lens"] = [0] * 1_000_000 + ["not even a number"]
    with pytest.raises(FormatError, match=r"\(1000001 items\)\]: more than 4096 items"):
        Case.from_json(body)
    with pytest.raises(InvalidCase, match=r"5000 requests.*at most 4096 requests"):
        BatchSpec(mode="target_verify", prefix_lens=(0,) * 5000, q_len=1)


def _depth_reference(text: str) -> int:
    """The first implementation of :func:`untrusted._depth`: one character at a time."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def test_the_nesting_depth_is_measured_as_before() -> None:
    rng = random.Random(19)
    for _ in range(5000):
        text = "".join(rng.choice('[]{}"\\ a,:\nß') for _ in range(rng.randrange(60)))
        assert untrusted._depth(text) == _depth_reference(text), repr(text)
    for seed in sorted((Path(__file__).parent / "seeds").glob("*.json")):
        text = seed.read_text()
        assert untrusted._depth(text) == _depth_reference(text) <= untrusted.MAX_DEPTH


@pytest.mark.parametrize(
    "content",
    [b"{}" + b" " * ((8 << 20) - 2), b'{"a": "' + b"x" * ((8 << 20) - 9) + b'"}'],
    ids=["spaces", "one-string"],
)
def test_a_file_at_the_size_cap_is_read_quickly(content: bytes, tmp_path: Path) -> None:
    # The depth scan alone took 0.84 s of CPU on 8 MiB of spaces (a Python loop per
    # character); now about 0.05 s (printed; speed is the benchmark's, not this test's).
    file = tmp_path / "big.json"
    file.write_bytes(content)
    start = time.process_time()
    with peak_growth() as peak:
        untrusted.read_json(file)
    seconds = time.process_time() - start
    print(f"read_json of 8 MiB ({content[:8]!r}...): {seconds:.2f}s CPU, {peak[0]:.0f} MB")
    assert seconds < HANG_GUARD_S  # a hang guard, not a speed bound
    assert peak[0] < 200
