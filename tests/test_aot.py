"""`python -m cramming.kernels.aot --arch 80,90`: every attention kernel config the pruner may keep compiles for
A100 and H100 on this CPU-only machine within the block's shared memory, and the estimate the pruner uses is never
below the compiler's number. A few minutes with a cold Triton cache, seconds when warm."""
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from cramming.kernels import tuning

pytest.importorskip("triton")
LINE = re.compile(r"sm_(\d+) (\w+) d(\d+) (fwd|dkdv|dq) \((\d+), (\d+)\) w\d+ s(\d+): shared ([\d,]+) B "
                  r"\(estimate (\d+)\), \d+ regs, (\d+) B spill/thread")


@pytest.mark.slow
def test_aot_compiles_a_fitting_config_for_every_shape_or_the_router_refuses():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "cramming.kernels.aot", "--arch", "80,90"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=1200, check=False)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.fullmatch(r"aot: OK sm_80/90: \d+ configs compiled, 0 problems, \d+ spilling, \d+ refused shapes, \d+s",
                        lines[-1]), lines[-1]
    compiled = {}
    for match in filter(None, map(LINE.fullmatch, lines)):
        arch, dtype, head_dim, kernel = int(match[1]), match[2], int(match[3]), match[4]
        shared, estimate = int(match[8].replace(",", "")), int(match[9])
        assert shared <= tuning.SHARED_PER_BLOCK[arch] and estimate * tuning.ESTIMATE_MARGIN >= shared, match[0]
        assert estimate == tuning.shared_bytes(kernel, int(match[5]), int(match[6]), int(match[7]),
                                               tuning.block_d_of(head_dim), 4 if dtype == "fp32" else 2), match[0]
        if head_dim == 64 and dtype != "fp32":
            assert int(match[10]) == 0, f"spills at head dim 64: {match[0]}"
        compiled.setdefault((arch, dtype, head_dim), set()).add(kernel)
    for arch in (80, 90):
        for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
            for head_dim in (32, 64, 128, 256):
                refused = tuning.shared_memory_problem(head_dim, torch_dtype, tuning.SHARED_PER_BLOCK[arch])
                if refused:
                    assert f"sm_{arch} {dtype} d{head_dim}: router refuses triton ({refused})" in lines
                else:
                    assert compiled.get((arch, dtype, head_dim)) == {"fwd", "dkdv", "dq"}, (arch, dtype, head_dim)
    assert sum(line.split(" ")[3] == "rotary" for line in lines if line.startswith("sm_")) == 2 * 2 * 3
