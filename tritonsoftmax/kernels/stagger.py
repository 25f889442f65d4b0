"""Late rows that wait: a launch whose programs all run at once, each reading its chunk, exchanging, then writing,
shows DRAM all the reads, a gap, then all the writes. With a kernel's STAGGER (SM cycles), the programs of rows
M/2 .. M - 1 wait that long before their loads, so that they read while the early rows exchange and write.
``stagger_meta`` is the rule (shared by the smem forward, smem_launch.staggered, and coop's forward in resident
mode, coop_launch.CoopLaunch), ``row_wait`` the wait (plain Triton, which the Gluon kernels call too). In cluster mode
the smem forward's rows wait in more groups than two (STAGGER_GROUPS G: the first cdiv(M, G) rows at once, the
next after one group's wait, ...). NVIDIA only (``%clock64`` and ``nanosleep`` are PTX)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import DeviceInfo
from ..layout import RowProblem
from .launch_modes import Stagger

BYTES_ROUNDING = 50  # bytes a cycle are rounded to this: waits are whole STEPs anyway
STEP = 500  # waits are whole steps of this many cycles: few compiled variants


def bytes_per_cycle(device: DeviceInfo, read_share: float) -> int:
    """The early rows' bytes read a SM cycle: ``read_share`` of the peak DRAM bandwidth over the SM clock (H200,
    share 0.74: 1800, 4.81 TB/s at 1.98 GHz); 0 where the device does not say its clocks."""
    if not (device.sm_clock_khz and device.dram_bytes_per_s):
        return 0
    per_cycle = read_share * device.dram_bytes_per_s / (device.sm_clock_khz * 1000)
    return int(round(per_cycle / BYTES_ROUNDING)) * BYTES_ROUNDING


def stagger_meta(problem: RowProblem, programs: int, per_sm: int, device: DeviceInfo, bounds: Stagger | None,
                 grouped: bool = False) -> dict[str, int]:
    """STAGGER (and STAGGER_GROUPS) for a launch of ``programs`` programs, ``per_sm`` of which an SM holds at once,
    within the arch's measured ``bounds`` (launch_modes.Stagger; None: no wait). On CUDA, with at least two rows
    whose early half takes min_cycles to read (bytes_per_cycle), the rows wait in two halves, or, ``grouped``, in the
    most groups (4 or 8, at most max_groups) of which each still reads for min_group_cycles; a group waits as many
    cycles a group before it as a group's rows take to read (in whole STEPs, at most max_cycles). {} where the
    programs fill more than max_wave of what the SMs hold (max_grouped_wave with more than two groups), where nothing
    waits, or where the device does not say its clocks."""
    if bounds is None:
        return {}
    M = problem.M
    row_bytes = problem.N * problem.dtype.itemsize
    per_cycle = bytes_per_cycle(device, bounds.read_share)
    if device.backend != "cuda" or not per_cycle or M < 2 or M // 2 * row_bytes < bounds.min_cycles * per_cycle:
        return {}
    groups = 2
    while (grouped and 2 * groups <= min(bounds.max_groups, M)
           and M // (2 * groups) * row_bytes >= bounds.min_group_cycles * per_cycle):
        groups *= 2
    if programs > (bounds.max_grouped_wave if groups > 2 else bounds.max_wave) * per_sm * device.sm_count:
        return {}
    cycles = min(bounds.max_cycles, M // groups * row_bytes // per_cycle // STEP * STEP)
    return {"STAGGER": cycles} if groups == 2 else {"STAGGER": cycles, "STAGGER_GROUPS": groups}


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
def row_group(row, M, GROUPS: tl.constexpr):
    """The group (int32) of ``row`` when the M rows fall into GROUPS groups of cdiv(M, GROUPS) rows, in order."""
    return row // ((M + GROUPS - 1) // GROUPS)


@triton.jit
def row_wait(row, M, STAGGER, GROUPS: tl.constexpr):
    """0 (int32), returned once the row's group (row_group) has waited: group g waits g * STAGGER SM cycles, group 0
    not at all."""
    group = row_group(row, M, GROUPS)
    return wait_cycles((group > 0).to(tl.int32), group * STAGGER)
