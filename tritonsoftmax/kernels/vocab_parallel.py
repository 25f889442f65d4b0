"""The small per-row steps of a row split across ranks (``tritonsoftmax.distributed``), each one kernel in place of
a dozen torch operators: a step costs one launch of host time, not one for each operator.

The rows' statistics travel as float32 tables of ``K`` words by ``M`` rows (word-major, ``(K, M)``), so that the
ranks' tables all-gathered back to back are ``(world, K, M)``. Words: 0 the row's max over this rank's slice, 1 the
sum of exp(z - max) there ((-inf, 0) where the slice is all -inf), and for cross-entropy 2 the target's logit where
the target is in this slice (else 0), 3 the slice's sum of logits (label smoothing; else 0).

Split workspaces (``ws``) are the split family's: ``C`` (max, sum) pairs a row, row-major ``(M, C, 2)``; its write
pass combines a row's C pairs, so a workspace whose first pair is the whole row's (and the others empty: max -inf,
sum 0) writes the whole row's softmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import next_power_of_2
from .row_ops import combine_max_sum
from .triton_launcher import COMPILE_OPTIONS

ROW_TILE = 2048  # elements of a program's (rows x words) tile
BLOCK_ROWS = 256  # rows a program of the row-wise kernels takes


@triton.jit
def _slice_bounds(widths_ptr, rank, BLOCK_W: tl.constexpr):
    """(start, width) of ``rank``'s slice of the whole row, from every rank's width (int64, rank order)."""
    ranks = tl.arange(0, BLOCK_W)
    return tl.sum(tl.load(widths_ptr + ranks, mask=ranks < rank, other=0), 0), tl.load(widths_ptr + rank)


@triton.jit
def _store_whole_pair(ws_ptr, rows, in_rows, C, m, s, BLOCK_C: tl.constexpr):
    """Each row's first pair of the split workspace ``ws`` (M, C, 2) set to (m, s), its other C - 1 empty (max
    -inf, sum 0): the write pass's combine then gives (m, s) as it is."""
    cols = tl.arange(0, BLOCK_C)
    first = cols[None, :] == 0
    out = ws_ptr + (rows[:, None] * C + cols[None, :]) * 2
    keep = in_rows[:, None] & (cols[None, :] < C)
    tl.store(out, tl.where(first, m[:, None], float("-inf")), mask=keep)
    tl.store(out + 1, tl.where(first, s[:, None], 0.0), mask=keep)


@triton.jit
def _local_stats_kernel(ws_ptr, out_ptr, logits_ptr, target_ptr, widths_ptr, rowsum_ptr, M, C, rank, ignore_index,
                        stride_l_row, stride_l_col, stride_t,
                        PICK: tl.constexpr, SMOOTH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                        BLOCK_W: tl.constexpr):
    """One rank's statistics table ``out`` (K, M) from the split stats pass's workspace ``ws`` (M, C, 2).

    Pointers: ``ws_ptr`` the pairs (contiguous); ``out_ptr`` the (K, M) table (contiguous; K = 4 with PICK, else 2);
    with PICK: ``logits_ptr`` this rank's (M, W) slice (strides ``stride_l_row``, ``stride_l_col``), ``target_ptr``
    (M,) int64 indices into the whole vocabulary (stride ``stride_t``), ``widths_ptr`` every rank's slice width
    (int64, rank order: this slice starts at the sum of those before ``rank``), ``rowsum_ptr`` (M,) float32 row sums
    of the slice (read with SMOOTH). Constexprs: PICK (cross-entropy's words 2 and 3), SMOOTH, BLOCK_R rows a
    program, BLOCK_C >= C, BLOCK_W >= the number of ranks (PICK)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    in_rows = rows < M
    mask = in_rows[:, None] & (cols[None, :] < C)
    at = ws_ptr + (rows[:, None] * C + cols[None, :]) * 2
    top, total = combine_max_sum(tl.load(at, mask=mask, other=float("-inf")), tl.load(at + 1, mask=mask, other=0.0),
                                 1)
    tl.store(out_ptr + rows, top, mask=in_rows)
    tl.store(out_ptr + M + rows, total, mask=in_rows)
    if PICK:
        start, width = _slice_bounds(widths_ptr, rank, BLOCK_W)
        t = tl.load(target_ptr + rows.to(tl.int64) * stride_t, mask=in_rows, other=ignore_index)
        here = in_rows & (t != ignore_index) & (t >= start) & (t < start + width)
        picked = tl.load(logits_ptr + rows.to(tl.int64) * stride_l_row + (t - start) * stride_l_col, mask=here,
                         other=0.0).to(tl.float32)
        tl.store(out_ptr + 2 * M + rows, picked, mask=in_rows)
        if SMOOTH:
            tl.store(out_ptr + 3 * M + rows, tl.load(rowsum_ptr + rows, mask=in_rows, other=0.0), mask=in_rows)
        else:
            tl.store(out_ptr + 3 * M + rows, tl.zeros_like(picked), mask=in_rows)


@triton.jit
def _whole_pairs_kernel(g_ptr, ws_ptr, M, C, world, K,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr):
    """The split write pass's workspace ``ws`` (M, C, 2) from every rank's table gathered in ``g_ptr`` (world, K, M),
    contiguous: each row's first pair the whole row's (max, sum of exp(z - max)) over the ranks, the other C - 1
    empty. Constexprs: BLOCK_R rows a program, BLOCK_C >= C, BLOCK_W >= ``world``."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ranks = tl.arange(0, BLOCK_W)
    in_rows = rows < M
    mask = in_rows[:, None] & (ranks[None, :] < world)
    at = g_ptr + ranks[None, :] * K * M + rows[:, None]
    top, total = combine_max_sum(tl.load(at, mask=mask, other=float("-inf")), tl.load(at + M, mask=mask, other=0.0),
                                 1)
    _store_whole_pair(ws_ptr, rows, in_rows, C, top, total, BLOCK_C)


@triton.jit
def _ce_finish_kernel(g_ptr, target_ptr, widths_ptr, lse_ptr, loss_ptr, blocks_ptr, M, world, ignore_index,
                      smoothing, stride_t,
                      BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    """Cross-entropy from every rank's table gathered in ``g_ptr`` (world, 4, M), contiguous: each row's log-sum-exp
    to ``lse_ptr`` (M,), its loss to ``loss_ptr`` (M,) ((1 - smoothing) (lse - target's logit) + smoothing (lse - row
    sum / V), 0 where the target is ``ignore_index``), and a program's (loss sum, rows counted, targets outside the
    vocabulary) to ``blocks_ptr`` (programs, 3). ``target_ptr``: (M,) int64 (stride ``stride_t``);
    ``widths_ptr``: the ranks' slice widths (V is their sum). Constexprs: BLOCK_R rows a program, BLOCK_W >=
    ``world``."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    ranks = tl.arange(0, BLOCK_W)
    in_rows = rows < M
    mask = in_rows[:, None] & (ranks[None, :] < world)
    at = g_ptr + ranks[None, :] * 4 * M + rows[:, None]
    top, total = combine_max_sum(tl.load(at, mask=mask, other=float("-inf")), tl.load(at + M, mask=mask, other=0.0),
                                 1)
    picked = tl.sum(tl.load(at + 2 * M, mask=mask, other=0.0), 1)
    row_sum = tl.sum(tl.load(at + 3 * M, mask=mask, other=0.0), 1)
    lse = tl.where(in_rows, top, 0.0) + tl.log(tl.where(in_rows, total, 1.0))  # rows past M: 0, no log of 0
    vocab = tl.sum(tl.load(widths_ptr + ranks, mask=ranks < world, other=0), 0)
    t = tl.load(target_ptr + rows.to(tl.int64) * stride_t, mask=in_rows, other=ignore_index)
    valid = in_rows & (t != ignore_index)
    loss = (1.0 - smoothing) * (lse - picked) + smoothing * (lse - row_sum / vocab.to(tl.float32))
    loss = tl.where(valid, loss, 0.0)
    tl.store(lse_ptr + rows, lse, mask=in_rows)
    tl.store(loss_ptr + rows, loss, mask=in_rows)
    outside = valid & ((t < 0) | (t >= vocab))
    tl.store(blocks_ptr + pid * 3, tl.sum(loss, 0))
    tl.store(blocks_ptr + pid * 3 + 1, tl.sum(valid.to(tl.float32), 0))
    tl.store(blocks_ptr + pid * 3 + 2, tl.sum(outside.to(tl.float32), 0))


@triton.jit
def _ce_grad_pairs_kernel(grad_ptr, count_ptr, lse_ptr, target_ptr, ws_ptr, g_ptr, M, C, ignore_index,
                          stride_grad, stride_t,
                          MEAN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The cross-entropy gradient's row weights and the split write pass's workspace for them. Each row's weight g
    (``grad_ptr`` at stride ``stride_grad``: 0 for a reduced loss's one gradient, divided by ``count_ptr``'s
    count with MEAN; 0 where the target is ``ignore_index``) to ``g_ptr`` (M,), and ``ws`` (M, C, 2) with the row's
    first pair (lse, 1 / g) and the others empty, so that the write pass gives exp(z - lse) / (1 / g) = g * softmax
    (a row of g = 0: 1 / 0 = inf, and 0). ``lse_ptr``: (M,) float32; ``target_ptr``: (M,) int64 (stride
    ``stride_t``). Constexprs: MEAN, BLOCK_R rows a program, BLOCK_C >= C."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = rows < M
    g = tl.load(grad_ptr + rows.to(tl.int64) * stride_grad, mask=in_rows, other=0.0).to(tl.float32)
    if MEAN:
        g = g / tl.load(count_ptr)
    t = tl.load(target_ptr + rows.to(tl.int64) * stride_t, mask=in_rows, other=ignore_index)
    g = tl.where(t != ignore_index, g, 0.0)
    tl.store(g_ptr + rows, g, mask=in_rows)
    zero = g == 0.0
    inv = tl.where(zero, float("inf"), 1.0 / tl.where(zero, 1.0, g))  # 1 / 0 = inf without dividing by 0
    _store_whole_pair(ws_ptr, rows, in_rows, C, tl.load(lse_ptr + rows, mask=in_rows, other=0.0), inv, BLOCK_C)


@triton.jit
def _ce_target_kernel(dz_ptr, g_ptr, target_ptr, widths_ptr, M, rank, ignore_index, weight,
                      stride_d_row, stride_d_col, stride_t,
                      BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    """The target's column of the cross-entropy gradient: ``dz`` (M, W) float32 (strides ``stride_d_row``,
    ``stride_d_col``) gets ``weight`` * g (``g_ptr``: (M,) row weights; ``weight`` = -(1 - smoothing)) added at
    each row's target where it is in this rank's slice. ``target_ptr``: (M,) int64 (stride ``stride_t``);
    ``widths_ptr``: the ranks' slice widths, this slice starting at the sum of those before ``rank``. Constexprs:
    BLOCK_R rows a program, BLOCK_W >= the number of ranks."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = rows < M
    start, width = _slice_bounds(widths_ptr, rank, BLOCK_W)
    t = tl.load(target_ptr + rows.to(tl.int64) * stride_t, mask=in_rows, other=ignore_index)
    here = in_rows & (t != ignore_index) & (t >= start) & (t < start + width)
    at = dz_ptr + rows.to(tl.int64) * stride_d_row + (t - start) * stride_d_col
    g = tl.load(g_ptr + rows, mask=here, other=0.0)
    tl.store(at, tl.load(at, mask=here, other=0.0) + weight * g, mask=here)


def _row_grid(M: int, width: int) -> tuple[int, int]:
    """(rows a program, programs) for a (rows x ``width``) tile of at most ROW_TILE elements a program."""
    rows = max(1, min(BLOCK_ROWS, ROW_TILE // width))
    rows = 1 << (rows.bit_length() - 1)
    return rows, triton.cdiv(M, rows)


def local_stats(ws: torch.Tensor, M: int, C: int, out: torch.Tensor, pick: tuple | None = None) -> torch.Tensor:
    """Fill ``out`` (K, M) from the split stats pass's ``ws`` (see the module docstring); ``pick``: for
    cross-entropy, (logits, target, widths, rank, ignore_index, row sums or None)."""
    block_c = next_power_of_2(C)
    rows, programs = _row_grid(M, block_c)
    if pick is None:
        _local_stats_kernel[(programs,)](ws, out, ws, ws, ws, ws, M, C, 0, 0, 0, 0, 0, PICK=False, SMOOTH=False,
                                         BLOCK_R=rows, BLOCK_C=block_c, BLOCK_W=1, **COMPILE_OPTIONS)
        return out
    logits, target, widths, rank, ignore_index, row_sums = pick
    _local_stats_kernel[(programs,)](ws, out, logits, target, widths, ws if row_sums is None else row_sums, M, C,
                                     rank, ignore_index, logits.stride(0), logits.stride(1), target.stride(0),
                                     PICK=True, SMOOTH=row_sums is not None, BLOCK_R=rows, BLOCK_C=block_c,
                                     BLOCK_W=next_power_of_2(widths.numel()), **COMPILE_OPTIONS)
    return out


def whole_pairs(gathered: torch.Tensor, M: int, C: int) -> torch.Tensor:
    """The split write pass's workspace (M * C * 2 floats) from the ranks' tables ``gathered`` (world, K, M)."""
    world, K = gathered.shape[0], gathered.shape[1]
    ws = torch.empty(M * C * 2, device=gathered.device, dtype=torch.float32)
    block_w, block_c = next_power_of_2(world), next_power_of_2(C)
    rows, programs = _row_grid(M, max(block_w, block_c))
    _whole_pairs_kernel[(programs,)](gathered, ws, M, C, world, K, BLOCK_R=rows, BLOCK_C=block_c, BLOCK_W=block_w,
                                     **COMPILE_OPTIONS)
    return ws


def ce_finish(gathered: torch.Tensor, target: torch.Tensor, widths: torch.Tensor, ignore_index: int,
              smoothing: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lse (M,), loss (M,), (loss sum, rows counted, targets outside the vocabulary)) from the ranks' tables
    ``gathered`` (world, 4, M): see _ce_finish_kernel."""
    world, M = gathered.shape[0], gathered.shape[2]
    block_w = next_power_of_2(world)
    rows, programs = _row_grid(M, block_w)
    lse = torch.empty(M, device=gathered.device, dtype=torch.float32)
    loss = torch.empty_like(lse)
    blocks = torch.empty(programs, 3, device=gathered.device, dtype=torch.float32)
    _ce_finish_kernel[(programs,)](gathered, target, widths, lse, loss, blocks, M, world, ignore_index,
                                   float(smoothing), target.stride(0), BLOCK_R=rows, BLOCK_W=block_w,
                                   **COMPILE_OPTIONS)
    return lse, loss, blocks.sum(0)


def ce_grad_pairs(grad: torch.Tensor, count: torch.Tensor | None, lse: torch.Tensor, target: torch.Tensor,
                  ignore_index: int, C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ws, g): the split write pass's workspace for g * softmax and the row weights g (see
    _ce_grad_pairs_kernel); ``grad`` one value (a reduced loss's) or one a row; ``count`` divides it (mean)."""
    M = lse.shape[0]
    ws = torch.empty(M * C * 2, device=lse.device, dtype=torch.float32)
    g = torch.empty(M, device=lse.device, dtype=torch.float32)
    block_c = next_power_of_2(C)
    rows, programs = _row_grid(M, block_c)
    _ce_grad_pairs_kernel[(programs,)](grad, lse if count is None else count, lse, target, ws, g, M, C, ignore_index,
                                       grad.stride(0) if grad.dim() else 0, target.stride(0), MEAN=count is not None,
                                       BLOCK_R=rows, BLOCK_C=block_c, **COMPILE_OPTIONS)
    return ws, g


def ce_target(dz: torch.Tensor, g: torch.Tensor, target: torch.Tensor, widths: torch.Tensor, rank: int,
              ignore_index: int, weight: float) -> None:
    """Add ``weight`` * g at each row's target column in ``dz`` where it is in this rank's slice."""
    M = dz.shape[0]
    rows, programs = _row_grid(M, 1)
    _ce_target_kernel[(programs,)](dz, g, target, widths, M, rank, ignore_index, float(weight), dz.stride(0),
                                   dz.stride(1), target.stride(0), BLOCK_R=rows,
                                   BLOCK_W=next_power_of_2(widths.numel()), **COMPILE_OPTIONS)
