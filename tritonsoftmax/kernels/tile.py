"""Tile family: three passes over tiles of a row (max, sum, write), the second in reverse order."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ..config import LaunchConfig, next_power_of_2
from ..device import DeviceInfo
from . import launches, sizing
from .kernel_family import Family
from .row_ops import exp, finish, load_scaled, ref_max, row_offsets, row_scale, whole_vectors

IMPL = "tile"
BLOCKS = (1024, 2048, 4096, 8192)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_tile_fwd_kernel(
    x_ptr, y_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr, BLOCK: tl.constexpr,
    VEC: tl.constexpr = 1, CACHE_OPT: tl.constexpr = 1, ROW_SCALE: tl.constexpr = 0,
):
    """Softmax (log_softmax, LOG) of one row per program in three passes over BLOCK-wide tiles.

    x_ptr, y_ptr, scale, M, N, INNER, stride_*, LOG, ZERO_MASKED: as in the fused kernel.
    N_BUCKET, M_BUCKET: autotune keys only. BLOCK: tile width.
    Pass 1 keeps m_vec, the lane-wise max over the tiles seen; m = max(m_vec) is the row max.
    Pass 2 walks the tiles last to first (the last tiles are the ones pass 1 left in cache) and
    keeps s_vec, the lane-wise sum of exp(z - m). Pass 3 writes the output, first tile first
    (the first tiles are the ones pass 2 left in cache). CACHE_OPT = 0 walks pass 2 first to last too
    (the textbook's forward order, kept to measure what the reverse order buys).
    VEC: as in the fused kernel (rows of whole VEC-element vectors, constexprs.row_vec). ROW_SCALE: as in the
    fused kernel (one scale a row).
    """
    N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner = whole_vectors(
        N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, VEC)
    row = tl.program_id(0)
    scale = row_scale(scale, row, ROW_SCALE)
    x_row = x_ptr + row_offsets(row, INNER, stride_x_outer, stride_x_inner)
    y_row = y_ptr + row_offsets(row, INNER, stride_y_outer, stride_y_inner)
    offs = tl.arange(0, BLOCK)
    num_tiles = tl.cdiv(N, BLOCK)

    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    for t in range(0, num_tiles):
        cols = t * BLOCK + offs
        m_vec = tl.maximum(m_vec, load_scaled(x_row + cols * stride_x_col, cols < N, scale))
    m = tl.max(m_vec, axis=0)
    m_ref = ref_max(m)

    s_vec = tl.zeros([BLOCK], tl.float32)
    for t in range(0, num_tiles):
        cols = ((num_tiles - 1 - t) if CACHE_OPT else t) * BLOCK + offs
        s_vec += exp(load_scaled(x_row + cols * stride_x_col, cols < N, scale) - m_ref)
    s = tl.sum(s_vec, axis=0)

    for t in range(0, num_tiles):
        cols = t * BLOCK + offs
        mask = cols < N
        y = finish(load_scaled(x_row + cols * stride_x_col, mask, scale), m, s, LOG, ZERO_MASKED)
        tl.store(y_row + cols * stride_y_col, y.to(y_ptr.dtype.element_ty), mask=mask)


def configs_over(blocks: tuple[int, ...]) -> Callable[[DeviceInfo, int, int], list[LaunchConfig]]:
    """The search space of a family that walks rows in tiles of one of ``blocks``: each tile width
    up to the row's power of two (the smallest only for rows that fit it) x warp_choices."""
    def configs(device: DeviceInfo, M: int, N: int) -> list[LaunchConfig]:
        out = []
        for block in blocks:
            if block > max(blocks[0], next_power_of_2(N)) or (block == blocks[0] and N > blocks[0]):
                continue
            # No num_stages variants: a bare `range` loop is never software-pipelined, whatever the
            # launch's num_stages (the same PTX for 1..3), so they would only double the tuning time.
            for nw in sizing.warp_choices(device, block):
                out.append(LaunchConfig.make(nw, BLOCK=block))
        return sizing.with_backend_options(device, out)
    return configs


_configs = configs_over(BLOCKS)


def _heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    block = min(4096, max(BLOCKS[0], next_power_of_2(N)))
    return LaunchConfig.make(sizing.heuristic_warps(device, block), BLOCK=block)


def _grid(M: int, N: int, meta: dict, device: DeviceInfo) -> tuple[int]:
    return (M,)


FAMILY = Family(IMPL, _softmax_tile_fwd_kernel, _configs, _heuristic, _grid)


def launch(x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None = None, *, scale: float = 1.0,
           log: bool = False, zero_masked_rows: bool = False) -> LaunchConfig | None:
    """Softmax (log_softmax with ``log``) over dim 1 of ``x2d`` into ``out2d`` (same shape, any strides);
    ``config`` skips autotuning. (The tile family's backward is the online family's.)"""
    return launches.launch_forward(FAMILY, x2d, out2d, config, scale, log, zero_masked_rows)
