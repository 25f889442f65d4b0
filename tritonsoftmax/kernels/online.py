"""Online family: one pass with a running max and a rescaled running sum, then the write pass."""

from __future__ import annotations

import triton
import triton.language as tl

from . import launches
from .kernel_family import Family
from .row_ops import (
    edges_grad_sum,
    edges_grad_write,
    edges_max_sum,
    edges_write,
    row_bases,
    row_scale,
    tiles_grad_sum,
    tiles_grad_write,
    tiles_max_sum,
    tiles_write,
    whole_vectors,
)
from .tile import BLOCKS as TILE_BLOCKS
from .tile import _grid, _heuristic, configs_over

IMPL = "online"
# tile's widths and 16384 (16 warps): a wider tile keeps more of a long 16-bit row's loads in flight
# per program; the tuner picks between them
BLOCKS = (*TILE_BLOCKS, 16384)
_configs = configs_over(BLOCKS)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_online_fwd_kernel(
    x_ptr, y_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr, BLOCK: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1,
    VEC: tl.constexpr = 1, CACHE_OPT: tl.constexpr = 1, ROW_SCALE: tl.constexpr = 0,
):
    """Softmax (log_softmax, LOG) of one row per program: an online (max, sum) pass, then a
    reverse write pass.

    x_ptr, y_ptr, scale, M, N, INNER, stride_*, LOG, ZERO_MASKED: as in the fused kernel.
    N_BUCKET, M_BUCKET: autotune keys only. BLOCK: tile width. HINTS: L2 eviction hints (pass 1
    evict_last, pass 2 evict_first; 0 gives plain loads, kept for measurement). ALIGN: as in the
    fused kernel (rows off a 16-byte boundary walked as whole aligned groups, row_ops.row_window).
    Invariant of pass 1: m is the max over the tiles seen so far and s = sum exp(z - m) over them
    (see row_ops.online_update). An all -inf row still ends as NaN, like torch (or 0 with ZERO_MASKED).
    Pass 2 writes the output, last tile first (the tiles pass 1 left in cache); CACHE_OPT = 0 walks it
    first tile first instead (the textbook's forward order, kept to measure what the reverse order buys).
    VEC, ROW_SCALE: as in the fused kernel (rows of whole VEC-element vectors; one scale a row).
    """
    N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner = whole_vectors(
        N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, VEC)
    row = tl.program_id(0)
    scale = row_scale(scale, row, ROW_SCALE)
    x_base, y_base, shift, lo, hi, tail, end = row_bases(row, INNER, stride_x_outer, stride_x_inner,
                                                         stride_y_outer, stride_y_inner, N, ALIGN)
    x_row = x_ptr + x_base
    y_row = y_ptr + y_base
    num_tiles = tl.cdiv(N, BLOCK)
    m, s = tiles_max_sum(x_row, stride_x_col, scale, 0, N, lo, hi, BLOCK, num_tiles, HINTS, ALIGN)
    if ALIGN > 1:
        m, s = edges_max_sum(x_row, scale, m, s, shift, lo, tail, end, True, True, ALIGN)
        edges_write(x_row, y_row, scale, m, s, shift, lo, tail, end, True, True, LOG, ZERO_MASKED, ALIGN)
    tiles_write(x_row, y_row, stride_x_col, stride_y_col, scale, m, s, 0, N, lo, hi, LOG, ZERO_MASKED, BLOCK,
                num_tiles, HINTS, ALIGN, CACHE_OPT)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_online_bwd_kernel(
    dy_ptr, dx_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, BLOCK: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1,
    VEC: tl.constexpr = 1, CACHE_OPT: tl.constexpr = 1, ROW_SCALE: tl.constexpr = 0,
):
    """Backward of one row per program in two passes over BLOCK-wide tiles: pass 1 sums
    grad_term(dy, y) (dy * y, or dy for LOG) lane-wise, pass 2 (last tile first) writes
    dx = grad_input(...). dy_ptr/y_ptr share stride_g_*; dx_ptr uses stride_d_*; HINTS and ALIGN as
    in the forward (ALIGN > 1: dy, y and dx share one layout); CACHE_OPT = 0: pass 2 first tile first.
    VEC, ROW_SCALE: as in the fused kernel (rows of whole VEC-element vectors; one scale a row).
    """
    N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner = whole_vectors(
        N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner, VEC)
    row = tl.program_id(0)
    scale = row_scale(scale, row, ROW_SCALE)
    g_row, d_base, shift, lo, hi, tail, end = row_bases(row, INNER, stride_g_outer, stride_g_inner,
                                                        stride_d_outer, stride_d_inner, N, ALIGN)
    d_row = dx_ptr + d_base
    num_tiles = tl.cdiv(N, BLOCK)
    red = tiles_grad_sum(dy_ptr, y_ptr, g_row, stride_g_col, 0, N, lo, hi, LOG, BLOCK, num_tiles, HINTS, ALIGN)
    if ALIGN > 1:
        red += edges_grad_sum(dy_ptr, y_ptr, g_row, shift, lo, tail, end, True, True, LOG, ALIGN)
        edges_grad_write(dy_ptr, y_ptr, d_row, g_row, red, scale, shift, lo, tail, end, True, True, LOG, ALIGN)
    tiles_grad_write(dy_ptr, y_ptr, d_row, g_row, stride_g_col, stride_d_col, red, scale, 0, N, lo, hi, LOG, BLOCK,
                     num_tiles, HINTS, ALIGN, CACHE_OPT)


FAMILY = Family(IMPL, _softmax_online_fwd_kernel, _configs, _heuristic, _grid)
BWD_FAMILY = Family(f"{IMPL}-bwd", _softmax_online_bwd_kernel, _configs, _heuristic, _grid)


launch, launch_backward = launches.family_launchers(FAMILY, BWD_FAMILY)  # launch_backward: tile's too
