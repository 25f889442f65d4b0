"""The mode constexprs a launch derives from the problem's layout (ALIGN, VEC, TAIL, FULL), and the
layout checks of the DENSE form and of the backward's (dy, y) pair. docs/architecture.md has the
table of every kernel constexpr: what it means, who sets it, why."""

from __future__ import annotations

import torch
import triton

from ..config import LaunchConfig, next_power_of_2
from ..layout import ALIGN_BYTES, RowProblem

# Shorter rows keep plain masked loads: several such rows share a program, and the realigned window's
# extra index arithmetic costs more than the wide loads it wins on a short row.
ALIGN_MIN_N = 2048


def row_align(problem: RowProblem, *element_sizes: int) -> int:
    """ALIGN for the kernels that take it: the elements in ALIGN_BYTES of the narrowest dtype when
    rows can start off a 16-byte boundary (a row stride that is not a multiple of it), or the problem
    is a single row that is not whole 16-byte groups (odd N: masked loads one element wide otherwise),
    and the kernel can realign them (unit column stride, input and output in one layout, rows of at
    least ALIGN_MIN_N); 1 otherwise (the plain path). The realigned path assumes 16-byte aligned base
    pointers for speed only: with others it is still exact, just not vectorised."""
    x = problem.x
    if x != problem.y or x.col != 1 or problem.N < ALIGN_MIN_N:
        return 1
    group = ALIGN_BYTES // min(element_sizes)
    if problem.rows_aligned(*element_sizes) and not (problem.M == 1 and problem.N % group):
        return 1
    return group


def row_vec(problem: RowProblem, *element_sizes: int) -> int:
    """VEC for the kernels that take it: the most elements, a power of two up to ALIGN_BYTES of the widest
    dtype, that divide N and every row stride (unit-stride columns only), so that each row is whole
    vectors of VEC elements, each on a boundary of its own width given aligned base pointers: 16-byte
    loads where rows start on 16-byte boundaries (200 fp32 elements, 136 bf16), 8- or 4-byte loads where
    they start on 8 or 4 (100 or 102 bf16) instead of one element a load. Triton specialises integer
    arguments on divisibility by 16 only, so it cannot tell this itself. 1 where it knows already (N and
    every row stride multiples of 16), which leaves those launches as they were."""
    strides = (problem.x.outer, problem.x.inner, problem.y.outer, problem.y.inner)
    if problem.x.col != 1 or problem.y.col != 1 or (problem.N % 16 == 0 and all(s % 16 == 0 for s in strides)):
        return 1
    vec = ALIGN_BYTES // max(element_sizes)
    while vec > 1 and (problem.N % vec or any(s % vec for s in strides)):
        vec //= 2
    return vec


# Held chunks (TILES 1) that are whole in every program of a row skip their masks (FULL): the load, the store and
# the -inf select go plain, and x * scale - max fuses into one FFMA (about a fifth fewer instructions in coop's
# fp32 program). 16-bit programs hold twice the values a thread and gain nothing measurable, so 4-byte inputs only.
FULL_ELEMENT_BYTES = 4


def whole_chunks(problem: RowProblem, config: LaunchConfig | None, align: int, element_size: int) -> int:
    """FULL for the kernels that take it: 1 when the config holds one BLOCK-element chunk a program (TILES 1)
    on the plain path (``align`` 1), every chunk is whole (N a multiple of BLOCK) and the input's elements
    are FULL_ELEMENT_BYTES wide; else 0."""
    if config is None:
        return 0
    meta = dict(config.meta)
    return int(meta.get("TILES") == 1 and align == 1 and problem.N % meta["BLOCK"] == 0
               and element_size == FULL_ELEMENT_BYTES)


# Rows held as half a block plus a tail (row_tail): a row just past a power of two would otherwise take registers
# and instructions for twice its length. Without a request (HELD) only small tails (at most 1/TAIL_MAX_SHARE of the
# block) on blocks of TAIL_MIN_BLOCK or more: those halve a one-row program's registers and cost one more reduction
# over a few values. A larger tail adds a reduction over a second piece, which pays only where the dispatcher has
# measured it (HELD in the config).
TAIL_MIN_BLOCK = 2048
TAIL_MAX_SHARE = 64


def row_tail(N: int, block_n: int, align: int = 1, any_tail: bool = False) -> int:
    """TAIL for the kernels that take it (fused): the power of two that, after the first block_n // 2
    elements, covers the rest of a row of N (N <= block_n // 2 + TAIL), when it is at most
    block_n // TAIL_MAX_SHARE and block_n at least TAIL_MIN_BLOCK, or (``any_tail``: the config asks for the
    held form, HELD) whenever it is shorter than the half; else 0 (the row held as one block_n block).
    16392 elements in a 32768 block: 8 (16384 + 8 elements held); 1152 in a 2048 block with any_tail: 128.
    ``align`` > 1 (ALIGN: a realigned row, row_align): the window positions of its whole groups,
    cdiv(N, align) * align, are what the half and the tail hold, and the tail is at least one group
    (16-bit 4100 in an 8192 block, align 8: 8)."""
    half = block_n // 2
    held = triton.cdiv(N, align) * align
    if N <= half:
        return 0
    tail = max(next_power_of_2(held - half), align)
    if any_tail:
        return tail if tail < half else 0
    if block_n < TAIL_MIN_BLOCK:
        return 0
    return tail if tail <= block_n // TAIL_MAX_SHARE else 0


def held_fold(tail: int, rows: int, align: int, itemsize: int, warp_size: int, num_warps: int,
              log: bool = False) -> int:
    """FOLD for the fused forward: 1 where a one-row tile on the plain path (rows 1, align 1) holds a TAIL of at
    least the elements one repetition of its layout spans (16 bytes a thread, every thread of the program): the
    half and MID then fold onto the tail within each thread's registers. Not for log_softmax (``log``): compiled
    folded, it holds more registers a thread (sm_90, bf16 10816 on 16 warps: 58 against 40, two programs an SM
    where three fit), which may cost more than the barriers it saves."""
    return int(not log and rows == 1 and align == 1 and tail > 0
               and tail >= (16 // itemsize) * warp_size * num_warps)


def whole_rows(N: int, block_n: int, tail: int, rows: int, align: int) -> int:
    """WHOLE for the fused forward: 1 where a row fills its block exactly (N == block_n) on a plain path (no TAIL;
    one row a program with align 1, or several rows), so that no lane needs a column mask."""
    return int(N == block_n and tail == 0 and (rows > 1 or align == 1))


def held_length(N: int, block_n: int, align: int = 1, any_tail: bool = False, pieces: bool = False) -> int:
    """The elements a fused tile of block_n holds for a row of N: half the block plus its tail (row_tail), with
    ``pieces`` half plus MID plus TAIL where row_pieces gives three pieces, or the whole block."""
    if pieces:  # HELD 2 (which holds any tail, as HELD 1 does, where a third piece saves nothing)
        mid, tail = row_pieces(N, block_n, align)
    else:
        mid, tail = 0, row_tail(N, block_n, align, any_tail)
    if mid:
        return block_n // 2 + mid + tail
    return block_n // 2 + tail if tail else block_n


def row_pieces(N: int, block_n: int, align: int = 1) -> tuple[int, int]:
    """(MID, TAIL) for a config with HELD 2: a row past half its block held as the first half, the largest power of
    two that fits in the rest (MID) and a shorter power-of-two TAIL after it, where those three pieces hold fewer
    positions than half the block plus one tail (HELD 1): 6464 in an 8192 block as 4096 + 2048 + 512 (not 8192),
    10816 in 16384 as 8192 + 2048 + 1024 (not 12288), 4480 in 8192 as 4096 + 256 + 128 (not 4608). Else (0, the
    HELD 1 tail: row_tail with any_tail). Realigned rows (``align`` > 1) hold two pieces at most."""
    rest = N - block_n // 2
    if align > 1 or rest <= 0:
        return 0, row_tail(N, block_n, align, any_tail=True)
    mid = 1 << (rest.bit_length() - 1)  # the largest power of two <= rest
    tail = next_power_of_2(rest - mid)
    if rest > mid and mid + tail < next_power_of_2(rest):
        return mid, tail
    return 0, row_tail(N, block_n, align, any_tail=True)


def check_dense(problem: RowProblem, config: LaunchConfig) -> None:
    """A DENSE config addresses row r at r * BLOCK_N with no mask: refuse a problem that is not M
    contiguous rows of exactly BLOCK_N (input and output alike), M a multiple of ROWS."""
    rows = dict(config.meta).get("ROWS", 1)
    if not (problem.rows_dense() and problem.N == config["BLOCK_N"] and problem.M % rows == 0):
        raise ValueError(f"a DENSE config ({config}) needs contiguous rows of exactly BLOCK_N, M a multiple of "
                         f"ROWS; got M={problem.M}, N={problem.N}, row strides {problem.x.outer}/{problem.y.outer}, "
                         f"column strides {problem.x.col}/{problem.y.col}, inner {problem.inner}")


def check_same_layout(dy: torch.Tensor, y: torch.Tensor) -> None:
    """Backward kernels address dy and y with one set of strides."""
    if dy.shape != y.shape or dy.stride() != y.stride():
        raise ValueError(f"dy and y must have one shape and layout, got {tuple(dy.shape)}/{dy.stride()} "
                         f"and {tuple(y.shape)}/{y.stride()}")
