"""Online family: one pass with a running max and a rescaled running sum, then the write pass."""

from __future__ import annotations

import triton
import triton.language as tl

from . import _common
from ._common import Family, finish, grad_input, grad_term, load_scaled, row_offsets
from .tile import _configs, _grid, _heuristic  # same search space: BLOCK x num_warps x stages

IMPL = "online"


@triton.jit
def online_update(m, s, z):
    """Fold tile ``z`` into the running (max m, sum s = sum exp(. - m)); a tile that leaves the
    running max at -inf adds 0 (not exp(-inf - -inf) = NaN), so a masked prefix never poisons a row."""
    m_new = tl.maximum(m, tl.max(z, axis=0))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, s * tl.exp(m - m_ref) + tl.sum(tl.exp(z - m_ref), axis=0)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_online_fwd_kernel(
    x_ptr, y_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr, BLOCK: tl.constexpr,
):
    """Softmax (log_softmax, LOG) of one row per program: an online (max, sum) pass, then a
    reverse write pass.

    x_ptr, y_ptr, scale, M, N, INNER, stride_*, LOG, ZERO_MASKED: as in the fused kernel.
    N_BUCKET, M_BUCKET: autotune keys only. BLOCK: tile width.
    Invariant of pass 1: m is the max over the tiles seen so far and s = sum exp(z - m) over them
    (see online_update). An all -inf row still ends as NaN, like torch (or 0 with ZERO_MASKED).
    Pass 2 writes the output, last tile first (the tiles pass 1 left in cache).
    """
    row = tl.program_id(0)
    x_row = x_ptr + row_offsets(row, INNER, stride_x_outer, stride_x_inner)
    y_row = y_ptr + row_offsets(row, INNER, stride_y_outer, stride_y_inner)
    offs = tl.arange(0, BLOCK)
    num_tiles = tl.cdiv(N, BLOCK)

    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for t in range(0, num_tiles):
        cols = t * BLOCK + offs
        m, s = online_update(m, s, load_scaled(x_row + cols * stride_x_col, cols < N, scale))

    for t in range(0, num_tiles):
        cols = (num_tiles - 1 - t) * BLOCK + offs
        mask = cols < N
        y = finish(load_scaled(x_row + cols * stride_x_col, mask, scale), m, s, LOG, ZERO_MASKED)
        tl.store(y_row + cols * stride_y_col, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_online_bwd_kernel(
    dy_ptr, dx_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, BLOCK: tl.constexpr,
):
    """Backward of one row per program in two passes over BLOCK-wide tiles: pass 1 sums
    grad_term(dy, y) (dy * y, or dy for LOG) lane-wise, pass 2 (last tile first) writes
    dx = grad_input(...). dy_ptr/y_ptr share stride_g_*; dx_ptr uses stride_d_*.
    """
    row = tl.program_id(0)
    g_row = row_offsets(row, INNER, stride_g_outer, stride_g_inner)
    d_row = dx_ptr + row_offsets(row, INNER, stride_d_outer, stride_d_inner)
    offs = tl.arange(0, BLOCK)
    num_tiles = tl.cdiv(N, BLOCK)

    acc = tl.zeros([BLOCK], tl.float32)
    for t in range(0, num_tiles):
        cols = t * BLOCK + offs
        mask = cols < N
        dy = tl.load(dy_ptr + g_row + cols * stride_g_col, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + g_row + cols * stride_g_col, mask=mask, other=0.0).to(tl.float32)
        acc += grad_term(dy, y, LOG)
    red = tl.sum(acc, axis=0)

    for t in range(0, num_tiles):
        cols = (num_tiles - 1 - t) * BLOCK + offs
        mask = cols < N
        dy = tl.load(dy_ptr + g_row + cols * stride_g_col, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + g_row + cols * stride_g_col, mask=mask, other=0.0).to(tl.float32)
        dx = grad_input(dy, y, red, scale, LOG)
        tl.store(d_row + cols * stride_d_col, dx.to(dx_ptr.dtype.element_ty), mask=mask)


FAMILY = Family(IMPL, _softmax_online_fwd_kernel, _configs, _heuristic, _grid)
BWD_FAMILY = Family(f"{IMPL}-bwd", _softmax_online_bwd_kernel, _configs, _heuristic, _grid)


launch, launch_backward = _common.family_launchers(FAMILY, BWD_FAMILY)  # launch_backward: tile's too
