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


FLUSH_BYTES = 256 * 1024 * 1024  # what do_bench writes between calls to empty L2


def kernel_ms(fn, calls: int = 30) -> float:
    """Mean GPU milliseconds per call of every kernel, memset and copy that ``fn`` puts on the device,
    from CUPTI's activity records (``torch.profiler``), with L2 emptied before each call as
    ``do_bench`` does. Unlike ``time_ms`` it holds no launch gap and no event time: do_bench's
    events bracket a few microseconds more than the kernels (session 16: ~2.8 us at 8x2048, where
    the kernel itself runs ~1.9 us), which decides the ranking of microsecond kernels. GPU only."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise RuntimeError("kernel_ms reads CUPTI's records: it needs a CUDA GPU")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as calibration:
        flush.zero_()
        torch.cuda.synchronize()
    flush_keys = {key for key, _, _ in _device_records(calibration)}
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    return per_call_us(_device_records(prof), flush_keys, calls) / 1e3


def _device_records(prof) -> list[tuple[str, int, float]]:
    """(name, count, total device microseconds) of each kind of device activity ``prof`` saw."""
    rows = []
    for avg in prof.key_averages():
        total = getattr(avg, "device_time_total", None)
        if total is None:  # torch before the device_* names
            total = avg.cuda_time_total
        if total > 0:
            rows.append((avg.key, avg.count, float(total)))
    return rows


def per_call_us(records: list[tuple[str, int, float]], flush_keys: set[str], calls: int) -> float:
    """Device microseconds per call from ``(name, count, total us)`` records of ``calls`` calls,
    each behind one flush whose activities are named ``flush_keys``. A flush name seen more than
    ``calls`` times means the timed function launched that same kernel: its time cannot be told
    from the flush's, so this refuses rather than guess."""
    total = 0.0
    for key, count, device_us in records:
        if key in flush_keys:
            if count != calls:
                raise RuntimeError(f"{key!r} ran {count} times in {calls} calls: the timed function launches "
                                   "the flush's own kernel, so its time cannot be separated")
            continue
        total += device_us
    if total <= 0:
        raise RuntimeError("the timed function put no kernel on the device")
    return total / calls
