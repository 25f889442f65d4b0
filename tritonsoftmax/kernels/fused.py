"""Fused family: the whole row on chip in one load; several rows per program for short rows."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import LaunchConfig, next_power_of_2
from ..device import DeviceInfo
from . import constexprs, launches, sizing
from .exp_domain import FMA_MAX, exp_of, exp_scale, half_log2, output_of
from .held_pieces import softmax_three_parts, softmax_two_parts
from .kernel_family import Family
from .row_ops import (
    DROP,
    KEEP,
    grad_input,
    grad_term,
    held_row_lanes,
    load_f32,
    load_raw,
    load_scaled,
    load_scaled_rows,
    ref_max,
    row_offsets,
    row_scale,
    rows_scale,
    scaled,
    scaled_rows,
    whole_row_lanes,
    whole_vectors,
)

IMPL = "fused"
TILES = (2048, 4096, 8192)  # elements per program when a program takes several short rows
# Smaller several-row tiles, with 2-8 values a thread: rows of odd length (masked, unvectorized loads) want more
# programs and threads in flight than the big tiles give.
SMALL_TILES = (512, 1024)
# Several-row tiles on few warps at 32 values a thread with 32-bit offsets (I32): a one-warp program is bound by
# instruction issue, and 64-bit address arithmetic is ~8 % of its instructions (sm_90 SASS of the backward, 4 rows
# of 256 bf16 on 1 warp: 400 -> 368), which 32-bit offsets save where every offset of the tile fits (I32_BOUNDS).
I32_TILES = (1024, 2048, 4096)
MAX_TILE = 16384  # the most elements a several-row tile may hold
MAX_N = 65536  # longest row the fused kernel accepts at all (beyond it registers spill badly)
RELOAD_MIN_N = 8192  # one-row backward configs of blocks this long or longer also come with RELOAD
PIPELINED_MIN_N = 16384  # rows at least this long also get the persistent pipelined configs
PIPELINED_STAGES = 3  # the next rows' loads in flight while this one is reduced and stored
# Short rows (blocks of 256 and 512) on many rows also get these four-row pipelined configs, (warps, programs
# an SM), two stages: a short row is too little work to hide a load's latency behind.
SHORT_PIPELINED = ((1, 32), (4, 16))
SHORT_PIPELINED_BLOCKS = (256, 512)


@triton.jit
def _tail_lanes(N, BLOCK_N: tl.constexpr, MID: tl.constexpr, TAIL: tl.constexpr):
    """The TAIL's lanes inside the row: its lane index against the elements left after the half and MID, one
    scalar, rather than its columns against N (no add a lane before the predicate; with it, ptxas placed the tail's
    load after the half's arithmetic on sm_90, triton 3.6, fp16 rows of 8704 on 8 warps)."""
    return tl.arange(0, TAIL) < N - BLOCK_N // 2 - MID


@triton.jit
def _tile_offsets(rows, cols, INNER, stride_outer, stride_inner, stride_col, I32: tl.constexpr):
    """[ROWS, BLOCK_N] element offsets of a several-row tile (rows and cols: aranges); 64-bit, or 32-bit with
    I32 (kept only where every offset the tile computes fits: PreparedLaunch and kernel_family.pruned_for_key)."""
    if I32:
        starts = (rows // INNER) * stride_outer + (rows % INNER) * stride_inner
    else:
        starts = row_offsets(rows, INNER, stride_outer, stride_inner)
    return starts[:, None] + (cols * stride_col)[None, :]


@triton.jit
def _fused_fwd_tile(
    x_ptr, y_ptr, tile, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    ALIGN: tl.constexpr, TAIL: tl.constexpr, I32: tl.constexpr, ROW_SCALE: tl.constexpr, MID: tl.constexpr,
    FOLD: tl.constexpr, WHOLE: tl.constexpr, B2: tl.constexpr,
):
    """Softmax of rows tile * ROWS .. tile * ROWS + ROWS - 1 (see _softmax_fused_fwd_kernel)."""
    if ROWS == 1:
        scale = row_scale(scale, tile, ROW_SCALE)
    else:
        scale = rows_scale(scale, tile * ROWS + tl.arange(0, ROWS), M, ROW_SCALE)
    if ROWS == 1 and ALIGN == 1:
        # One row as a 1-D tensor: the same code as a [1, BLOCK_N] tile on triton 3.6 apart from the
        # row mask (tile < M: the grid and the persistent loop never pass M), and only a 1-D
        # reduction can span a CTA cluster (num_ctas) on triton 3.8.
        if TAIL == 0:
            cols = tl.arange(0, BLOCK_N)
            mask = None if WHOLE else cols < N
            x_row = x_ptr + row_offsets(tile, INNER, stride_x_outer, stride_x_inner)
            z = load_scaled(x_row + cols * stride_x_col, mask, exp_scale(scale, B2))
            m = ref_max(tl.max(z, axis=0))
            e = exp_of(z, m, tl.abs(m) < FMA_MAX, B2)
            s = tl.sum(e, axis=0)
            y_row = y_ptr + row_offsets(tile, INNER, stride_y_outer, stride_y_inner)
            tl.store(y_row + cols * stride_y_col,
                     output_of(z, m, e, s, LOG, ZERO_MASKED, B2).to(y_ptr.dtype.element_ty), mask=mask)
        # A TAIL (or MID) is only given to a row longer than half the block (constexprs.row_tail, row_pieces), so
        # the half (and MID) lie wholly in the row: read and written without a mask.
        elif MID == 0:
            cols = tl.arange(0, BLOCK_N // 2)
            cols_t = BLOCK_N // 2 + tl.arange(0, TAIL)
            x_row = x_ptr + row_offsets(tile, INNER, stride_x_outer, stride_x_inner)
            y_row = y_ptr + row_offsets(tile, INNER, stride_y_outer, stride_y_inner)
            softmax_two_parts(x_row, y_row, 0, cols * stride_x_col, cols_t * stride_x_col, cols * stride_y_col,
                              cols_t * stride_y_col, None, _tail_lanes(N, BLOCK_N, 0, TAIL), scale, LOG,
                              ZERO_MASKED, FOLD, B2)
        else:  # the first half, the next MID elements and the tail
            cols = tl.arange(0, BLOCK_N // 2)
            cols_m = BLOCK_N // 2 + tl.arange(0, MID)
            cols_t = BLOCK_N // 2 + MID + tl.arange(0, TAIL)
            x_row = x_ptr + row_offsets(tile, INNER, stride_x_outer, stride_x_inner)
            y_row = y_ptr + row_offsets(tile, INNER, stride_y_outer, stride_y_inner)
            softmax_three_parts(x_row, y_row, 0, cols * stride_x_col, cols_m * stride_x_col, cols_t * stride_x_col,
                                cols * stride_y_col, cols_m * stride_y_col, cols_t * stride_y_col, None, None,
                                _tail_lanes(N, BLOCK_N, MID, TAIL), scale, LOG, ZERO_MASKED, FOLD, B2)
    elif ROWS > 1 and TAIL == 0:
        rows = tile * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        x_off = _tile_offsets(rows, cols, INNER, stride_x_outer, stride_x_inner, stride_x_col, I32)
        if WHOLE:  # masked by rows only
            mask = (rows < M)[:, None]
            z = load_scaled_rows(x_ptr + x_off, mask, exp_scale(scale, B2))
        else:
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            z = load_scaled(x_ptr + x_off, mask, exp_scale(scale, B2))
        m = ref_max(tl.max(z, axis=1))[:, None]
        e = exp_of(z, m, tl.max(tl.abs(m)) < FMA_MAX, B2)
        s = tl.sum(e, axis=1)[:, None]
        y = output_of(z, m, e, s, LOG, ZERO_MASKED, B2)
        y_off = _tile_offsets(rows, cols, INNER, stride_y_outer, stride_y_inner, stride_y_col, I32)
        tl.store(y_ptr + y_off, y.to(y_ptr.dtype.element_ty), mask=mask)
    elif ROWS > 1:
        # Several rows, each held as its first BLOCK_N // 2 elements ([ROWS, BLOCK_N // 2]) plus a
        # [ROWS, TAIL] tile: no registers or instructions for the block's empty end.
        rows = tile * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N // 2)
        cols_t = BLOCK_N // 2 + MID + tl.arange(0, TAIL)
        row_ok = (rows < M)[:, None]
        # the half (and MID) lie wholly in each row, as in the one-row case above: masked by rows only (a row past
        # M computes on zeros and stores nothing)
        mask, mask_t = row_ok, row_ok & _tail_lanes(N, BLOCK_N, MID, TAIL)[None, :]
        x_off = _tile_offsets(rows, cols, INNER, stride_x_outer, stride_x_inner, stride_x_col, I32)
        x_off_t = _tile_offsets(rows, cols_t, INNER, stride_x_outer, stride_x_inner, stride_x_col, I32)
        # every piece loaded before any is scaled (row_ops.load_raw)
        z, z_t = load_raw(x_ptr + x_off, mask), load_raw(x_ptr + x_off_t, mask_t)
        if MID:  # and a [ROWS, MID] tile between them (the tail then starts after it)
            cols_m = BLOCK_N // 2 + tl.arange(0, MID)
            mask_m = row_ok
            x_off_m = _tile_offsets(rows, cols_m, INNER, stride_x_outer, stride_x_inner, stride_x_col, I32)
            z_m = load_raw(x_ptr + x_off_m, mask_m)
        scale = exp_scale(scale, B2)
        z_t = scaled(z_t, mask_t, scale)
        if MID:
            z_m = scaled_rows(z_m, scale)
        z = scaled_rows(z, scale)
        m = tl.maximum(tl.max(z, axis=1), tl.max(z_t, axis=1))
        if MID:
            m = tl.maximum(m, tl.max(z_m, axis=1))
        m = ref_max(m)[:, None]
        fma_ok = tl.max(tl.abs(m)) < FMA_MAX
        e, e_t = exp_of(z, m, fma_ok, B2), exp_of(z_t, m, fma_ok, B2)
        s = tl.sum(e, axis=1) + tl.sum(e_t, axis=1)
        if MID:
            e_m = exp_of(z_m, m, fma_ok, B2)
            s += tl.sum(e_m, axis=1)
        s = s[:, None]
        y_off = _tile_offsets(rows, cols, INNER, stride_y_outer, stride_y_inner, stride_y_col, I32)
        y_off_t = _tile_offsets(rows, cols_t, INNER, stride_y_outer, stride_y_inner, stride_y_col, I32)
        y_dtype = y_ptr.dtype.element_ty
        tl.store(y_ptr + y_off, output_of(z, m, e, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask)
        tl.store(y_ptr + y_off_t, output_of(z_t, m, e_t, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask_t)
        if MID:
            y_off_m = _tile_offsets(rows, cols_m, INNER, stride_y_outer, stride_y_inner, stride_y_col, I32)
            tl.store(y_ptr + y_off_m, output_of(z_m, m, e_m, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask_m)
    else:
        # One row (tile < M: the grid and the persistent loop never pass M) off a 16-byte boundary:
        # its whole ALIGN-element groups (in BLOCK_N positions, or BLOCK_N // 2 + TAIL), then its two
        # partial end groups (x and y share one layout, unit column stride: see row_align). The row's
        # bounds stay scalars, which keeps a 32-warp program of 16384 16-bit elements at 32 registers
        # a thread (44 as [1]-tensors, sm_90).
        start = row_offsets(tile, INNER, stride_x_outer, stride_x_inner)
        if TAIL == 0:
            base, pos, mask, pos_e, mask_e = whole_row_lanes(start, N, BLOCK_N, ALIGN)
            softmax_two_parts(x_ptr, y_ptr, base, pos, pos_e, pos, pos_e, mask, mask_e, scale, LOG, ZERO_MASKED, 0, B2)
        else:
            base, pos, mask, pos_t, mask_t, pos_e, mask_e = held_row_lanes(start, N, BLOCK_N // 2, TAIL, ALIGN)
            softmax_three_parts(x_ptr, y_ptr, base, pos, pos_t, pos_e, pos, pos_t, pos_e, mask, mask_t, mask_e, scale,
                                LOG, ZERO_MASKED, 0, B2)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_fused_fwd_kernel(
    x_ptr, y_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    STAGES: tl.constexpr = 1, PER_SM: tl.constexpr = 0, ALIGN: tl.constexpr = 1, VEC: tl.constexpr = 1,
    TAIL: tl.constexpr = 0, I32: tl.constexpr = 0, HELD: tl.constexpr = 0, ROW_SCALE: tl.constexpr = 0,
    MID: tl.constexpr = 0, FOLD: tl.constexpr = 0, WHOLE: tl.constexpr = 0,
):
    """Softmax (or log_softmax, LOG) of ROWS whole rows per program, held as one [ROWS, BLOCK_N] tile
    (one row: a [BLOCK_N] vector).

    x_ptr, y_ptr: input and output; row r starts at row_offsets(r, INNER, stride_*_outer,
    stride_*_inner) and its elements are stride_*_col apart. M rows of N elements; the input
    is multiplied by ``scale`` first. N_BUCKET, M_BUCKET: autotune keys only (unused here).
    ZERO_MASKED: all -inf rows give 0. BLOCK_N: next power of two >= N. ROWS: rows per program.
    STAGES > 1: persistent programs (PER_SM an SM: a launch-grid setting the kernel does not
    read) loop over the tiles with Triton's software pipelining, STAGES - 1 tiles' loads in
    flight through shared memory while one is computed; STAGES == 1: one tile a program.
    Masked lanes are -inf, so they add exp(-inf - m) = 0 to a valid row's sum. ALIGN: 1, or the
    elements in 16 bytes when rows start off a 16-byte boundary (set by PreparedLaunch from
    constexprs.row_align): a one-row tile (ROWS == 1) is then read and written as whole aligned
    groups plus its two partial end groups (row_ops.row_window), so the loads stay 16 bytes wide;
    several-row tiles keep the plain path. VEC: the most elements, up to 16 bytes, that divide N and every
    row stride (constexprs.row_vec; 1 when Triton knows it already); N and the row strides are then
    rewritten as multiples of VEC (row_ops.whole_vectors), so the compiler knows it and the loads, stores
    and masks are VEC elements wide for any such N (16 bytes for 200 fp32 elements or 136 bf16, 8 bytes
    for 100 bf16). TAIL: 0, or a power of two with N <= BLOCK_N // 2 + TAIL (constexprs.row_tail): a one-row
    tile on the plain path (ROWS == 1, ALIGN == 1) then holds the row as its first BLOCK_N // 2 elements
    plus a TAIL-element block, so a row just past a power of two (16392 fp32) takes registers for
    16384 + 8 elements, not 32768; a realigned one-row tile (ALIGN > 1) holds its whole groups in
    BLOCK_N // 2 + TAIL positions the same way (row_tail counts them); a several-row tile holds
    [ROWS, BLOCK_N // 2] plus [ROWS, TAIL] (the launch gives several-row tiles a TAIL only with HELD).
    HELD (a config meta-parameter the kernel does not read): the launch derives TAIL from
    row_tail(any_tail=True), any tail shorter than the half (1152 elements: 1024 + 128), not only small ones;
    with HELD 2 MID and TAIL from constexprs.row_pieces. MID: 0, or a power of two below BLOCK_N // 2 on the plain paths
    (ALIGN == 1, or several rows): the row is then held as its first half, the next MID elements and a TAIL
    after them (6464: 4096 + 2048 + 512 positions, not 8192).
    I32 (a tuned meta-parameter of several-row tiles): element offsets in 32-bit arithmetic, fewer instructions
    a value for a program of 1 warp; off where an offset could pass 2**31 - 1 (PreparedLaunch,
    kernel_family.pruned_for_key).
    ROW_SCALE: ``scale`` points to one float32 scale a row (row order) instead of being one for all rows
    (a per-row temperature; row_ops.row_scale).
    FOLD (one-row tiles on the plain path with a TAIL; constexprs.held_fold): the TAIL spans at least one
    repetition of the tile's layout (16 bytes a thread over the program's threads), so the half (and MID) fold onto
    it in registers and the row's max and sum take one reduction across the program each, not one a piece.
    WHOLE (constexprs.whole_rows): N == BLOCK_N on the plain paths (TAIL 0; one row with ALIGN 1, or several rows):
    no lane of a row is masked, so loads, stores and the max take no column mask (several rows: rows past M load 0
    and store nothing).
    16-bit input and output work in the half-log2 domain (exp_domain.half_log2): an instruction an element fewer.
    """
    pid = tl.program_id(0)
    B2: tl.constexpr = half_log2(x_ptr.dtype.element_ty, y_ptr.dtype.element_ty)
    N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner = whole_vectors(
        N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, VEC)
    if STAGES == 1:
        _fused_fwd_tile(x_ptr, y_ptr, pid, scale, M, N, INNER, stride_x_outer, stride_x_inner, stride_x_col,
                        stride_y_outer, stride_y_inner, stride_y_col, LOG, ZERO_MASKED, BLOCK_N, ROWS, ALIGN, TAIL,
                        I32, ROW_SCALE, MID, FOLD, WHOLE, B2)
    else:
        for tile in tl.range(pid, tl.cdiv(M, ROWS), tl.num_programs(0), num_stages=STAGES):
            _fused_fwd_tile(x_ptr, y_ptr, tile, scale, M, N, INNER, stride_x_outer, stride_x_inner, stride_x_col,
                            stride_y_outer, stride_y_inner, stride_y_col, LOG, ZERO_MASKED, BLOCK_N, ROWS, ALIGN, TAIL,
                            I32, ROW_SCALE, MID, FOLD, WHOLE, B2)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_fused_bwd_kernel(
    dy_ptr, dx_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ALIGN: tl.constexpr = 1, VEC: tl.constexpr = 1,
    TAIL: tl.constexpr = 0, RELOAD: tl.constexpr = 0, DENSE: tl.constexpr = 0, HINTS: tl.constexpr = 1,
    I32: tl.constexpr = 0, HELD: tl.constexpr = 0, ROW_SCALE: tl.constexpr = 0, MID: tl.constexpr = 0,
):
    """Backward of ROWS whole rows per program: dx = scale * y * (dy - sum(dy * y)) for softmax,
    scale * (dy - exp(y) * sum(dy)) for log_softmax (LOG; y is then the log-probabilities).

    dy_ptr, y_ptr: the incoming gradient and the saved output, one layout (stride_g_*);
    dx_ptr: the input gradient (stride_d_*). Other arguments as in the forward kernel.
    Masked lanes load 0, which adds nothing to either row sum. ALIGN: as in the forward (one-row
    tiles only; dy, y and dx in one layout). VEC, TAIL, HELD, MID: as in the forward.
    RELOAD (plain tiles: TAIL 0, and ALIGN 1 or several rows): the tile is loaded evict_last for the
    sum and loaded again evict_first (from cache) for the write, as inductor's two-loop backward does,
    instead of being held across the reduction: fewer registers, so more programs an SM. The other
    paths ignore it.
    DENSE (the RELOAD form; PreparedLaunch refuses any other problem): dy, y and dx are M contiguous
    rows of exactly BLOCK_N, M a multiple of ROWS, so the tile needs no mask and row r starts at
    r * BLOCK_N (a compile-time stride, 64-bit): run-time strides and masks cost registers the 32K
    block cannot spare.
    HINTS: RELOAD's and DENSE's eviction hints (NVIDIA PTX); 0 on AMD, where they load plainly twice.
    I32: as in the forward (several-row and tail tiles). ROW_SCALE: as in the forward.
    """
    pid = tl.program_id(0)
    N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner = whole_vectors(
        N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner, VEC)
    if ROWS == 1 and ALIGN > 1 and DENSE == 0:  # the realigned paths hold the row as 1-D pieces
        scale = row_scale(scale, pid, ROW_SCALE)
    else:
        scale = rows_scale(scale, pid * ROWS + tl.arange(0, ROWS), M, ROW_SCALE)
    if (ROWS > 1 or ALIGN == 1) and TAIL > 0:
        # The rows held as their first BLOCK_N // 2 elements plus a TAIL-element tile (row_tail).
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N // 2)
        cols_t = BLOCK_N // 2 + MID + tl.arange(0, TAIL)
        mask = (rows < M)[:, None]  # the half (and MID) lie wholly in each row (row_tail, row_pieces)
        mask_t = (rows < M)[:, None] & (cols_t < N)[None, :]
        g_off = _tile_offsets(rows, cols, INNER, stride_g_outer, stride_g_inner, stride_g_col, I32)
        g_off_t = _tile_offsets(rows, cols_t, INNER, stride_g_outer, stride_g_inner, stride_g_col, I32)
        # every piece loaded before any is converted (row_ops.load_raw)
        dy, y = load_raw(dy_ptr + g_off, mask), load_raw(y_ptr + g_off, mask)
        dy_t, y_t = load_raw(dy_ptr + g_off_t, mask_t), load_raw(y_ptr + g_off_t, mask_t)
        if MID:  # and the [ROWS, MID] tile between the half and the tail
            cols_m = BLOCK_N // 2 + tl.arange(0, MID)
            mask_m = (rows < M)[:, None]
            g_off_m = _tile_offsets(rows, cols_m, INNER, stride_g_outer, stride_g_inner, stride_g_col, I32)
            dy_m, y_m = load_raw(dy_ptr + g_off_m, mask_m), load_raw(y_ptr + g_off_m, mask_m)
            dy_m, y_m = dy_m.to(tl.float32), y_m.to(tl.float32)
        dy, y, dy_t, y_t = dy.to(tl.float32), y.to(tl.float32), dy_t.to(tl.float32), y_t.to(tl.float32)
        red = tl.sum(grad_term(dy, y, LOG), axis=1) + tl.sum(grad_term(dy_t, y_t, LOG), axis=1)
        if MID:
            red += tl.sum(grad_term(dy_m, y_m, LOG), axis=1)
        red = red[:, None]
        d_off = _tile_offsets(rows, cols, INNER, stride_d_outer, stride_d_inner, stride_d_col, I32)
        d_off_t = _tile_offsets(rows, cols_t, INNER, stride_d_outer, stride_d_inner, stride_d_col, I32)
        tl.store(dx_ptr + d_off, grad_input(dy, y, red, scale, LOG).to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_ptr + d_off_t, grad_input(dy_t, y_t, red, scale, LOG).to(dx_ptr.dtype.element_ty), mask=mask_t)
        if MID:
            d_off_m = _tile_offsets(rows, cols_m, INNER, stride_d_outer, stride_d_inner, stride_d_col, I32)
            tl.store(dx_ptr + d_off_m, grad_input(dy_m, y_m, red, scale, LOG).to(dx_ptr.dtype.element_ty),
                     mask=mask_m)
    elif DENSE:
        rows = pid * ROWS + tl.arange(0, ROWS)
        offs = rows.to(tl.int64)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        dy, y = load_f32(dy_ptr + offs, None, KEEP * HINTS), load_f32(y_ptr + offs, None, KEEP * HINTS)
        red = tl.sum(grad_term(dy, y, LOG), axis=1)[:, None]
        dy, y = load_f32(dy_ptr + offs, None, DROP * HINTS), load_f32(y_ptr + offs, None, DROP * HINTS)
        tl.store(dx_ptr + offs, grad_input(dy, y, red, scale, LOG).to(dx_ptr.dtype.element_ty))
    elif ALIGN == 1 or ROWS > 1:
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        g_off = _tile_offsets(rows, cols, INNER, stride_g_outer, stride_g_inner, stride_g_col, I32)
        dy = load_f32(dy_ptr + g_off, mask, KEEP * RELOAD * HINTS)
        y = load_f32(y_ptr + g_off, mask, KEEP * RELOAD * HINTS)
        red = tl.sum(grad_term(dy, y, LOG), axis=1)[:, None]
        if RELOAD:  # distinct eviction policies keep the compiler from reusing the first loads' registers
            dy = load_f32(dy_ptr + g_off, mask, DROP * HINTS)
            y = load_f32(y_ptr + g_off, mask, DROP * HINTS)
        dx = grad_input(dy, y, red, scale, LOG)
        d_off = _tile_offsets(rows, cols, INNER, stride_d_outer, stride_d_inner, stride_d_col, I32)
        tl.store(dx_ptr + d_off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    elif TAIL == 0:
        base, pos, mask, pos_e, mask_e = whole_row_lanes(row_offsets(pid, INNER, stride_g_outer, stride_g_inner), N,
                                                         BLOCK_N, ALIGN)
        dy, y = load_raw(dy_ptr + base + pos, mask), load_raw(y_ptr + base + pos, mask)
        dy_e, y_e = load_raw(dy_ptr + base + pos_e, mask_e), load_raw(y_ptr + base + pos_e, mask_e)
        dy, y, dy_e, y_e = dy.to(tl.float32), y.to(tl.float32), dy_e.to(tl.float32), y_e.to(tl.float32)
        red = tl.sum(grad_term(dy, y, LOG), axis=0) + tl.sum(grad_term(dy_e, y_e, LOG), axis=0)
        tl.store(dx_ptr + base + pos, grad_input(dy, y, red, scale, LOG).to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_ptr + base + pos_e, grad_input(dy_e, y_e, red, scale, LOG).to(dx_ptr.dtype.element_ty),
                 mask=mask_e)
    else:
        base, pos, mask, pos_t, mask_t, pos_e, mask_e = held_row_lanes(
            row_offsets(pid, INNER, stride_g_outer, stride_g_inner), N, BLOCK_N // 2, TAIL, ALIGN)
        dy, y = load_raw(dy_ptr + base + pos, mask), load_raw(y_ptr + base + pos, mask)
        dy_t, y_t = load_raw(dy_ptr + base + pos_t, mask_t), load_raw(y_ptr + base + pos_t, mask_t)
        dy_e, y_e = load_raw(dy_ptr + base + pos_e, mask_e), load_raw(y_ptr + base + pos_e, mask_e)
        dy, y, dy_t, y_t = dy.to(tl.float32), y.to(tl.float32), dy_t.to(tl.float32), y_t.to(tl.float32)
        dy_e, y_e = dy_e.to(tl.float32), y_e.to(tl.float32)
        red = (tl.sum(grad_term(dy, y, LOG), axis=0) + tl.sum(grad_term(dy_t, y_t, LOG), axis=0)
               + tl.sum(grad_term(dy_e, y_e, LOG), axis=0))
        out_ty = dx_ptr.dtype.element_ty
        tl.store(dx_ptr + base + pos, grad_input(dy, y, red, scale, LOG).to(out_ty), mask=mask)
        tl.store(dx_ptr + base + pos_t, grad_input(dy_t, y_t, red, scale, LOG).to(out_ty), mask=mask_t)
        tl.store(dx_ptr + base + pos_e, grad_input(dy_e, y_e, red, scale, LOG).to(out_ty), mask=mask_e)


def _configs(device: DeviceInfo, M: int, N: int, pipelined: bool = True,
             max_per_thread: int = 32) -> list[LaunchConfig]:
    """One or several rows a program over the warp counts (8 to ``max_per_thread`` values a thread),
    several-row tiles of SMALL_TILES elements at 2-8 values a thread, and of I32_TILES elements at 32 values a
    thread with 32-bit offsets; with ``pipelined`` (the forward
    kernel only) also the persistent pipelined configs for long rows and for many short rows."""
    block_n = next_power_of_2(N)
    # One row per program, or as many rows as make a 2K/4K/8K-element tile (no more than M needs).
    rows_options = {1} | {tile // block_n for tile in TILES if tile > block_n}
    out = []
    for rows in sorted(r for r in rows_options if r == 1 or r <= next_power_of_2(M)):
        for nw in sizing.warp_choices(device, rows * block_n, max_per_thread=max_per_thread, max_warps=32):
            out.append(LaunchConfig.make(nw, BLOCK_N=block_n, ROWS=rows))
    # (tiles, fewest and most values a thread, extra meta): the small tiles, then the 32-bit-offset ones
    for tiles, least, most, extra in ((SMALL_TILES, 2, 8, {}), (I32_TILES, 32, 32, {"I32": 1})):
        for tile in (t for t in tiles if block_n < t and t // block_n <= next_power_of_2(M)):
            for nw in sizing.warp_choices(device, tile, min_per_thread=least, max_per_thread=most, max_warps=32):
                out.append(LaunchConfig.make(nw, BLOCK_N=block_n, ROWS=tile // block_n, **extra))
    if pipelined and block_n >= PIPELINED_MIN_N and M > device.sm_count:
        # Persistent and pipelined: one program an SM, the next rows' loads in flight through shared
        # memory (STAGES - 1 rows of BLOCK_N; configs too big for shared memory fail to compile and are skipped).
        for nw in sizing.warp_choices(device, block_n, max_warps=32):
            if nw >= 16:
                out.append(LaunchConfig.make(nw, BLOCK_N=block_n, ROWS=1, STAGES=PIPELINED_STAGES, PER_SM=1))
    if pipelined and block_n in SHORT_PIPELINED_BLOCKS and M > device.sm_count:
        out += [LaunchConfig.make(nw, BLOCK_N=block_n, ROWS=4, STAGES=2, PER_SM=per_sm)
                for nw, per_sm in SHORT_PIPELINED]
    return sizing.with_backend_options(device, out)


# Many rows of at least ONE_ROW_BLOCK elements: one row a program with ONE_ROW_VALUES_PER_THREAD values a thread
# (few warps, many programs an SM). A forward program then holds its row in few registers and the SM switches
# between many of them; it is what the tuner picks on the H200 for blocks of 1024 to 16384 in every dtype.
ONE_ROW_BLOCK = 1024
ONE_ROW_VALUES_PER_THREAD = 32


def _fwd_heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    """The forward's config without a table entry: for many rows (two programs an SM or more) of ONE_ROW_BLOCK or
    longer, one row a program with ONE_ROW_VALUES_PER_THREAD values a thread; else _heuristic's."""
    block_n = next_power_of_2(N)
    if block_n >= ONE_ROW_BLOCK and M >= 2 * device.sm_count:
        warps = sizing.heuristic_warps(device, block_n, per_thread=ONE_ROW_VALUES_PER_THREAD, max_warps=32)
        return LaunchConfig.make(warps, BLOCK_N=block_n, ROWS=1)
    return _heuristic(device, M, N)


def _heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    """The config without a table entry (the backward's; the forward's for few or short rows): tiles of about 4096
    elements, several short rows a program, about 16 values a thread, at least two programs an SM."""
    block_n = next_power_of_2(N)
    rows = max(1, min(4096 // block_n, 64))
    # Keep at least two programs per SM when the rows allow it.
    while rows > 1 and M // rows < 2 * device.sm_count:
        rows //= 2
    return LaunchConfig.make(sizing.heuristic_warps(device, rows * block_n, max_warps=32), BLOCK_N=block_n,
                             ROWS=rows)


def check_row_length(N: int) -> None:
    """Raise ValueError for rows too long to hold on chip."""
    if N > MAX_N:
        raise ValueError(f"impl='fused' holds the whole row on chip and takes rows of at most {MAX_N} "
                         f"elements, got {N}; use impl='online', 'tile' or 'auto'")


def _grid(M: int, N: int, meta: dict, device: DeviceInfo) -> tuple[int]:
    tiles = triton.cdiv(M, meta["ROWS"])
    if meta.get("STAGES", 1) > 1:
        return (min(tiles, meta["PER_SM"] * device.sm_count),)
    return (tiles,)


# No several-row tile holds more than MAX_TILE rows (of at least one element) or more than MAX_N's block of columns.
I32_BOUNDS = (MAX_TILE, MAX_N)
FAMILY = Family(IMPL, _softmax_fused_fwd_kernel, _configs, _fwd_heuristic, _grid, i32_bounds=I32_BOUNDS)


def _bwd_configs(device: DeviceInfo, M: int, N: int) -> list[LaunchConfig]:
    """The forward's plain configs; rows of 16K+ also with up to 64 values a thread (fewer, wider programs: the
    backward holds two tensors' rows). One-row configs of blocks of RELOAD_MIN_N+ also with RELOAD (the tile
    read again for the write instead of held in registers, so more programs fit an SM), save for rows the kernel
    holds as half a block plus a tail (row_tail), where RELOAD does nothing. The
    configs the dispatcher gives the backward of many rows that fill their block (RELOAD with 32 registers a thread,
    blocks of 1K-32K) come from dispatch.reload_row_config, not from this search space. None on AMD, where RELOAD
    has no eviction hints (HINTS = 0) and would only repeat the plain configs."""
    block_n = next_power_of_2(N)
    out = _configs(device, M, N, pipelined=False, max_per_thread=64 if block_n >= 16384 else 32)
    if block_n >= RELOAD_MIN_N and not constexprs.row_tail(N, block_n) and not device.is_hip:
        out += [c.with_meta(RELOAD=1) for c in out if c["ROWS"] == 1]
    return out


BWD_FAMILY = Family(f"{IMPL}-bwd", _softmax_fused_bwd_kernel, _bwd_configs, _heuristic, _grid, i32_bounds=I32_BOUNDS)


def _check(N: int, config: LaunchConfig | None) -> None:
    check_row_length(N)
    if config is not None and config["BLOCK_N"] < N:
        raise ValueError(f"fused config BLOCK_N={config['BLOCK_N']} is shorter than the row ({N})")


def launch(x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None = None, *, scale: float = 1.0,
           log: bool = False, zero_masked_rows: bool = False) -> LaunchConfig | None:
    """Softmax (log_softmax with ``log``) over dim 1 of ``x2d`` into ``out2d`` (same shape, any strides);
    ``config`` skips autotuning."""
    _check(x2d.shape[1], config)
    return launches.launch_forward(FAMILY, x2d, out2d, config, scale, log, zero_masked_rows)


def launch_backward(dy2d: torch.Tensor, y2d: torch.Tensor, dx2d: torch.Tensor, config: LaunchConfig | None = None,
                    *, scale: float = 1.0, log: bool = False) -> LaunchConfig | None:
    """dx of softmax (log_softmax with ``log``) over dim 1 into ``dx2d``, from the incoming gradient
    ``dy2d`` and the saved output ``y2d`` (dy2d and y2d share one layout)."""
    _check(y2d.shape[1], config)
    return launches.launch_backward(BWD_FAMILY, dy2d, y2d, dx2d, config, scale, log)
