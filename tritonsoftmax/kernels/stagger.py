"""Late rows that wait: a launch whose programs all run at once, each reading its chunk, exchanging, then writing,
shows DRAM all the reads, a gap, then all the writes. With a kernel's STAGGER (SM cycles), the programs of rows
M/2 .. M - 1 wait that long before their loads, so that they read while the early rows exchange and write.
``stagger_cycles`` is the rule (shared by the smem forward, smem.staggered, and coop's forward in resident mode,
coop.CoopLaunch), ``wait_cycles`` the wait (plain Triton, which the Gluon kernels call too). NVIDIA only (``%clock64``
and ``nanosleep`` are PTX); measurements in smem.staggered and coop.CoopLaunch."""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import DeviceInfo
from ..layout import RowProblem

MAX_WAVE = 0.8  # the most of one wave of programs (what the SMs hold at once) a staggered launch fills
BYTES_PER_CYCLE = 1800  # the early rows' bytes read a cycle (~3.5 TB/s at 1.98 GHz)
MIN_CYCLES = 2000  # no wait shorter than this (too little to overlap) ...
MAX_CYCLES = 5000  # ... nor longer (past the early rows' reads it only adds time)
STEP = 500  # waits are whole steps of this many cycles: few compiled variants


def stagger_cycles(problem: RowProblem, programs: int, per_sm: int, device: DeviceInfo) -> int:
    """STAGGER for a launch of ``programs`` programs, ``per_sm`` of which an SM holds at once: 0 unless they fill
    at most MAX_WAVE of what the SMs hold (on CUDA, with at least two rows); else about as many cycles as the early
    half of the rows takes to read (BYTES_PER_CYCLE, in whole STEPs, at most MAX_CYCLES), 0 under MIN_CYCLES."""
    if device.backend != "cuda" or problem.M < 2 or programs > MAX_WAVE * per_sm * device.sm_count:
        return 0
    early_bytes = problem.M // 2 * problem.N * problem.dtype.itemsize
    cycles = min(MAX_CYCLES, early_bytes // BYTES_PER_CYCLE // STEP * STEP)
    return cycles if cycles >= MIN_CYCLES else 0


# $1: whether to wait (not 0), $2: how many SM cycles (%clock64), napping between looks; $0: 0, for ordering.
_WAIT_CYCLES = tl.constexpr("""
    {
    .reg .pred %tsw_p;
    .reg .u64 %tsw_t0, %tsw_t1, %tsw_d;
    setp.ne.u32 %tsw_p, $1, 0;
    @!%tsw_p bra TSW_DONE_${:uid};
    mov.u64 %tsw_t0, %clock64;
    cvt.u64.u32 %tsw_d, $2;
    TSW_WAIT_${:uid}:
    nanosleep.u32 64;
    mov.u64 %tsw_t1, %clock64;
    sub.u64 %tsw_t1, %tsw_t1, %tsw_t0;
    setp.lt.u64 %tsw_p, %tsw_t1, %tsw_d;
    @%tsw_p bra TSW_WAIT_${:uid};
    TSW_DONE_${:uid}:
    mov.u32 $0, 0;
    }
""")


@triton.jit
def wait_cycles(late, cycles):
    """0, returned once ``cycles`` SM cycles have passed when ``late`` (int32) is not 0, at once otherwise. The
    caller adds it to its loads' offsets (as a multiple of their vector) so that the loads come after it."""
    return tl.inline_asm_elementwise(_WAIT_CYCLES, "=r,r,r", [late, cycles], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def late_row(row, M):
    """1 (int32) for the rows that wait, M/2 .. M - 1 (rows at or past the first half, written without 2 * row,
    which could overflow), else 0."""
    return (row >= M - M // 2).to(tl.int32)
