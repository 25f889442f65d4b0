"""Device-busy time of the kernels a call launches, from CUPTI's activity records (``torch.profiler``).

``triton.testing.do_bench`` brackets each call with CUDA events: for a kernel of a few
microseconds the events' own time and the launch gap are a large, shape-independent share of what
it reports (a couple of microseconds on the H200, more than the kernel itself at fp32 8x2048),
and its ranking of configs or peers at that scale follows noise. :func:`kernel_ms` counts only what ran
on the device. The benchmark sweep and the tuner take it with ``--timer kernel``.

A call's time is the length of the union of its activities' intervals: the time the device was busy
with it. Kernels that overlap are counted once: split's second pass is a programmatic dependent
launch whose programs start while the first pass ends, and the sum of the two durations would
count that overlap twice.
For kernels that run one after another the union is their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FLUSH_BYTES = 256 * 1024 * 1024  # what do_bench writes between calls to empty L2
TIMERS = ("events", "kernel")  # the --timer choices of bench.sweep and tritonsoftmax.tune
NEEDS_GPU = "--timer kernel reads CUPTI's kernel records and needs a GPU"  # their refusal without one


@dataclass(frozen=True)
class KernelProfile:
    """What a function put on the device per call: ``rows`` of (activity name, launches per call,
    microseconds per call), longest first, and ``busy_us``: microseconds per call the device was
    busy with them (the union of their intervals; less than the rows' sum where kernels overlapped)."""

    rows: list[tuple[str, float, float]]
    busy_us: float


def kernel_ms(fn, calls: int = 30) -> float:
    """Mean GPU milliseconds per call that the kernels, memsets and copies ``fn`` puts on the device
    keep it busy, with L2 emptied before each call as ``do_bench`` does; no launch gap, no event
    time, overlapping kernels counted once. GPU only."""
    return total_ms(kernel_profile(fn, calls))


def total_ms(profile: KernelProfile) -> float:
    """Milliseconds per call of a :func:`kernel_profile`: the time the device was busy."""
    return profile.busy_us / 1e3


def kernel_profile(fn, calls: int = 30) -> KernelProfile:
    """What ``fn`` puts on the device per call (see :class:`KernelProfile`), from ``calls`` calls each
    behind an L2-emptying flush (left out). GPU only."""
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
    intervals = _device_intervals(prof)
    return KernelProfile(per_call(_records(intervals), flush_keys, calls), busy_per_call(intervals, flush_keys, calls))


_flush_names: dict[int, set[str]] = {}  # device index -> what the flush puts on the device, by name


def _flush_keys(flush: torch.Tensor) -> set[str]:
    """The activity names of ``flush.zero_()``, profiled alone once per device (they do not change)."""
    from torch.profiler import ProfilerActivity, profile

    index = flush.device.index
    if index not in _flush_names:
        with profile(activities=[ProfilerActivity.CUDA]) as calibration:
            flush.zero_()
            torch.cuda.synchronize()
        _flush_names[index] = {key for key, _, _ in _records(_device_intervals(calibration))}
    return _flush_names[index]


def _records(intervals: list[tuple[str, float, float]]) -> list[tuple[str, int, float]]:
    """(name, count, total microseconds) of each kind of activity among ``intervals``, those of no duration left
    out."""
    totals: dict[str, list] = {}
    for name, start, end in intervals:
        row = totals.setdefault(name, [0, 0.0])
        row[0] += 1
        row[1] += end - start
    return [(name, count, total) for name, (count, total) in totals.items() if total > 0]


def _device_intervals(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every device activity ``prof`` saw, by start."""
    from torch.autograd import DeviceType

    return sorted(((e.key, e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type in (DeviceType.CUDA, getattr(DeviceType, "HIP", DeviceType.CUDA))),
                  key=lambda r: r[1])


def busy_per_call(intervals: list[tuple[str, float, float]], flush_keys: set[str], calls: int) -> float:
    """Mean microseconds per call that the device was busy: ``intervals`` (name, start, end; by start)
    are ``calls`` calls, each opened by one flush activity named in ``flush_keys`` (left out); a call's
    time is the length of the union of its activities' intervals."""
    flushes = [i for i, (name, _, _) in enumerate(intervals) if name in flush_keys]
    if len(flushes) != calls:
        raise RuntimeError(f"{len(flushes)} flushes in {calls} calls: the timed function launches the flush's "
                           "own kernel, or the profile lost records, so calls cannot be told apart")
    total = 0.0
    for first, after in zip(flushes, flushes[1:] + [len(intervals)], strict=True):
        end = float("-inf")
        for _, start, stop in intervals[first + 1:after]:
            total += max(0.0, stop - max(start, end))
            end = max(end, stop)
    if total <= 0:
        raise RuntimeError("the timed function put no kernel on the device")
    return total / calls


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
