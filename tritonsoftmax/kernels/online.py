"""Online family: one pass with a running max and a rescaled running sum, then the write pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import LaunchConfig
from ..layout import matrix_problem
from . import _common
from ._common import Family, row_offsets
from .tile import _configs, _grid, _heuristic  # same search space: BLOCK x num_warps x stages

IMPL = "online"


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_online_fwd_kernel(
    x_ptr, y_ptr, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    BLOCK: tl.constexpr,
):
    """Softmax of one row per program: an online (max, sum) pass, then a reverse write pass.

    x_ptr, y_ptr, M, N, INNER, stride_*: as in the fused kernel. N_BUCKET, M_BUCKET: autotune
    keys only. BLOCK: tile width.
    Invariant of pass 1: m is the max over the tiles seen so far and s = sum exp(x - m) over them.
    A tile whose running max is still -inf contributes 0 (not exp(-inf - -inf) = NaN), so a
    masked prefix never poisons a valid row; an all -inf row still ends as NaN, like torch.
    Pass 2 writes exp(x - m) / s, last tile first (the tiles pass 1 left in cache).
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
        x = tl.load(x_row + cols * stride_x_col, mask=cols < N, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref), axis=0)
        m = m_new
    inv = 1.0 / s

    for t in range(0, num_tiles):
        cols = (num_tiles - 1 - t) * BLOCK + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_x_col, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) * inv
        tl.store(y_row + cols * stride_y_col, y.to(y_ptr.dtype.element_ty), mask=mask)


FAMILY = Family(IMPL, _softmax_online_fwd_kernel, _configs, _heuristic, _grid)


def launch(x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None = None) -> LaunchConfig | None:
    """Softmax over dim 1 of ``x2d`` into ``out2d`` (same shape, any strides); ``config`` skips autotuning."""
    return _common.launch(FAMILY, x2d, out2d, matrix_problem(x2d, out2d), config)
