"""Shared benchmark pieces: shape presets, timing and bandwidth arithmetic."""

from __future__ import annotations

import time
from pathlib import Path

import torch

# The design notes' forward table (M, N), in its order.
DESIGN_FWD_SHAPES = {
    torch.float32: [(8, 2048), (32, 8192), (4096, 256), (4096, 1024), (4096, 4096), (4096, 16384),
                    (4096, 65536), (4096, 262144), (65536, 2048), (16384, 8192), (1, 131072), (8, 131072),
                    (32, 152064), (4, 1048576), (1, 8388608)],
    torch.bfloat16: [(4096, 256), (4096, 1024), (4096, 4096), (4096, 65536), (65536, 2048), (4, 1048576),
                     (1, 8388608)],
}
DESIGN_FWD_SHAPES[torch.float16] = DESIGN_FWD_SHAPES[torch.bfloat16]  # the notes give no fp16 row: bf16's shapes


# The design notes' backward table (M, N).
DESIGN_BWD_SHAPES = {
    torch.float32: [(4096, 1024), (4096, 16384), (4096, 65536), (4096, 262144), (65536, 2048), (8, 131072),
                    (4, 1048576)],
    torch.bfloat16: [(4096, 65536), (4, 1048576)],
}
DESIGN_BWD_SHAPES[torch.float16] = DESIGN_BWD_SHAPES[torch.bfloat16]


def results_dir(slug: str, suite: str, override: str | None = None) -> Path:
    """Where a benchmark suite writes: ``override`` if given, else bench/results/<gpu slug>/<suite>/
    (created)."""
    out = Path(override or f"bench/results/{slug}/{suite}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def fwd_bytes(M: int, N: int, dtype: torch.dtype) -> int:
    """Bytes a forward softmax must move: read x once, write y once."""
    return 2 * M * N * torch.finfo(dtype).bits // 8


def bwd_bytes(M: int, N: int, dtype: torch.dtype) -> int:
    """Bytes a softmax backward must move: read dy and y, write dx."""
    return 3 * M * N * torch.finfo(dtype).bits // 8


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def time_ms(fn, warmup_ms: float = 10, rep_ms: float = 40) -> float:
    """Median milliseconds per call: ``triton.testing.do_bench`` on a GPU, a wall clock otherwise
    (the interpreter has no driver to time with, and its numbers measure the interpreter)."""
    if torch.cuda.is_available():
        import triton

        return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]
