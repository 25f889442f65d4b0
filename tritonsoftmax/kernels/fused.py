"""Fused family: the whole row on chip in one load; several rows per program for short rows."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import LaunchConfig, next_power_of_2
from ..device import DeviceInfo
from ..layout import matrix_problem
from . import _common
from ._common import Family, row_offsets

IMPL = "fused"
TILES = (2048, 4096, 8192)  # elements per program when a program takes several short rows
MAX_TILE = 16384  # the most elements a several-row tile may hold
MAX_N = 65536  # longest row the fused kernel accepts at all (beyond it registers spill badly)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_fused_fwd_kernel(
    x_ptr, y_ptr, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    """Softmax of ROWS whole rows per program, each held in registers as one [ROWS, BLOCK_N] tile.

    x_ptr, y_ptr: input and output; row r starts at row_offsets(r, INNER, stride_*_outer,
    stride_*_inner) and its elements are stride_*_col apart. M rows of N elements.
    N_BUCKET, M_BUCKET: autotune keys only (unused in the body).
    BLOCK_N: next power of two >= N. ROWS: rows per program.
    Masked lanes load -inf, so they add exp(-inf - m) = 0 to a valid row's sum.
    """
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x_off = row_offsets(rows, INNER, stride_x_outer, stride_x_inner)[:, None] + (cols * stride_x_col)[None, :]
    x = tl.load(x_ptr + x_off, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=1)
    e = tl.exp(x - m[:, None])
    inv = 1.0 / tl.sum(e, axis=1)
    y = e * inv[:, None]
    y_off = row_offsets(rows, INNER, stride_y_outer, stride_y_inner)[:, None] + (cols * stride_y_col)[None, :]
    tl.store(y_ptr + y_off, y.to(y_ptr.dtype.element_ty), mask=mask)


def _configs(device: DeviceInfo, M: int, N: int) -> list[LaunchConfig]:
    block_n = next_power_of_2(N)
    # One row per program, or as many rows as make a 2K/4K/8K-element tile (no more than M needs).
    rows_options = {1} | {tile // block_n for tile in TILES if tile > block_n}
    out = []
    for rows in sorted(r for r in rows_options if r == 1 or r <= next_power_of_2(M)):
        for nw in _common.warp_choices(device, rows * block_n):
            out.append(LaunchConfig.make(nw, BLOCK_N=block_n, ROWS=rows))
    return _common.with_backend_options(device, out)


def _heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    block_n = next_power_of_2(N)
    rows = max(1, min(4096 // block_n, 64))
    # Keep at least two programs per SM when the rows allow it.
    while rows > 1 and M // rows < 2 * device.sm_count:
        rows //= 2
    return LaunchConfig.make(_common.heuristic_warps(device, rows * block_n), BLOCK_N=block_n, ROWS=rows)


def check_row_length(N: int) -> None:
    """Raise ValueError for rows too long to hold on chip."""
    if N > MAX_N:
        raise ValueError(f"impl='fused' holds the whole row on chip and takes rows of at most {MAX_N} "
                         f"elements, got {N}; use impl='online', 'tile' or 'auto'")


def _grid(M: int, N: int, meta: dict) -> tuple[int]:
    return (triton.cdiv(M, meta["ROWS"]),)


FAMILY = Family(IMPL, _softmax_fused_fwd_kernel, _configs, _heuristic, _grid)


def launch(x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None = None) -> LaunchConfig | None:
    """Softmax over dim 1 of ``x2d`` into ``out2d`` (same shape, any strides); ``config`` skips autotuning."""
    check_row_length(x2d.shape[1])
    if config is not None and config["BLOCK_N"] < x2d.shape[1]:
        raise ValueError(f"fused config BLOCK_N={config['BLOCK_N']} is shorter than the row ({x2d.shape[1]})")
    return _common.launch(FAMILY, x2d, out2d, matrix_problem(x2d, out2d), config)
