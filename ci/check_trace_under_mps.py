"""Whether torch.profiler (CUPTI) records a process's kernels when it is a client of CUDA's
Multi-Process Service, as :mod:`difftest.execution.device_trace` needs for a traced MPS run.

    python3 ci/check_trace_under_mps.py        (on a GPU machine with nvidia-cuda-mps-control)

Profiles five 2048x2048 matmuls in this process, then starts an MPS control daemon (its pipe
and log folders under /tmp, nothing else of the device's settings touched), runs the same in a
child process that is the daemon's client, and quits the daemon. Prints each profile's event
counts by category; exit 0 when both recorded 5 kernels, 1 otherwise. On an H100 with torch
2.11.0+cu130 (docs/validation.md, Run 44) both did.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile


def kernels_seen(tag: str) -> int:
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            a @ a
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "trace.json")
        p.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    by_cat = collections.Counter(e.get("cat") for e in events if e.get("ph") == "X")
    print(f"{tag}: {dict(by_cat)}", flush=True)
    return by_cat["kernel"]


def main() -> int:
    if sys.argv[1:] == ["client"]:
        return 0 if kernels_seen("MPS client") == 5 else 1
    plain = kernels_seen("no MPS")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY="/tmp/check-mps-pipe",
               CUDA_MPS_LOG_DIRECTORY="/tmp/check-mps-log")  # fmt: skip
    for d in (env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]):
        os.makedirs(d, exist_ok=True)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    try:
        time.sleep(1)
        client = subprocess.run([sys.executable, __file__, "client"], env=env).returncode
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env)
    return 0 if plain == 5 and client == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
