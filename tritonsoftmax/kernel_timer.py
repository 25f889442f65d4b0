"""GPU time of the kernels a call launches, from CUPTI's activity records (``torch.profiler``).

``triton.testing.do_bench`` brackets each call with CUDA events: for a kernel of a few
microseconds the events' own time and the launch gap are a large, shape-independent share of what
it reports (H200, session 16: do_bench 4.74 us at fp32 8x2048, the kernel 1.87 us), and its
ranking of configs or peers at that scale follows noise. :func:`kernel_ms` adds up only what ran
on the device. The benchmark sweep and the tuner take it with ``--timer kernel``.
"""

from __future__ import annotations

import torch

FLUSH_BYTES = 256 * 1024 * 1024  # what do_bench writes between calls to empty L2
TIMERS = ("events", "kernel")  # the --timer choices of bench.sweep and tritonsoftmax.tune
NEEDS_GPU = "--timer kernel reads CUPTI's kernel records and needs a GPU"  # their refusal without one


def kernel_ms(fn, calls: int = 30) -> float:
    """Mean GPU milliseconds per call of every kernel, memset and copy that ``fn`` puts on the device,
    with L2 emptied before each call as ``do_bench`` does; no launch gap, no event time. GPU only."""
    return total_ms(kernel_profile(fn, calls))


def total_ms(profile) -> float:
    """Milliseconds per call of a :func:`kernel_profile` (rows of name, launches, microseconds)."""
    return sum(row[2] for row in profile) / 1e3


def kernel_profile(fn, calls: int = 30) -> list[tuple[str, float, float]]:
    """What ``fn`` puts on the device per call: (activity name, launches per call, microseconds per
    call), longest first, from ``calls`` calls each behind an L2-emptying flush (left out). GPU only."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise RuntimeError("the kernel timer reads CUPTI's records: it needs a CUDA GPU")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    flush_keys = _flush_keys(flush)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    return per_call(_device_records(prof), flush_keys, calls)


_flush_names: dict[int, set[str]] = {}  # device index -> what the flush puts on the device, by name


def _flush_keys(flush: torch.Tensor) -> set[str]:
    """The activity names of ``flush.zero_()``, profiled alone once per device (they do not change)."""
    from torch.profiler import ProfilerActivity, profile

    index = flush.device.index
    if index not in _flush_names:
        with profile(activities=[ProfilerActivity.CUDA]) as calibration:
            flush.zero_()
            torch.cuda.synchronize()
        _flush_names[index] = {key for key, _, _ in _device_records(calibration)}
    return _flush_names[index]


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


def per_call(records: list[tuple[str, int, float]], flush_keys: set[str], calls: int) -> list[tuple[str, float, float]]:
    """(name, launches per call, device microseconds per call), longest first, from ``(name, count,
    total us)`` records of ``calls`` calls, each behind one flush whose activities are named
    ``flush_keys``. A flush name seen more than ``calls`` times means the timed function launched
    that same kernel: its time cannot be told from the flush's, so this refuses rather than guess."""
    out = []
    for key, count, device_us in records:
        if key in flush_keys:
            if count != calls:
                raise RuntimeError(f"{key!r} ran {count} times in {calls} calls: the timed function launches "
                                   "the flush's own kernel, so its time cannot be separated")
            continue
        out.append((key, count / calls, device_us / calls))
    if not out:
        raise RuntimeError("the timed function put no kernel on the device")
    return sorted(out, key=lambda r: -r[2])
