"""Smem family: coop's cooperative rows, each program's chunk held in shared memory (Gluon).

A row is cut into G chunks of TILES x BLOCK elements, one program per chunk, as in the coop family
(same tickets, partial exchange, workspace and launch: :class:`~tritonsoftmax.kernels.coop.CoopLaunch`).
The difference is where a chunk waits for its row's partials: coop holds it in registers as fp32,
this kernel copies it into shared memory with ``cp.async`` and keeps it there in the input dtype.
A 16-bit chunk then takes half the on-chip bytes of coop's, 228 KB of shared memory an SM hold
far more of them than the register file holds fp32 values, and the copies in flight hold no
registers. So every element is read from DRAM once, even for 16-bit rows too long for coop's registers
and for few long rows beyond what coop holds at once. The backward holds dy's and y's chunks alike.
Both kernels take coop's cluster mode (CLUSTER: the partials through a CTA cluster's shared memory,
cluster.py), which the 16-bit backward's heuristic config takes by backward_cluster's rule.

The kernels are written in Gluon (triton.experimental.gluon), Triton's explicit-layout dialect: plain
Triton cannot place a tensor in shared memory. So this family needs an NVIDIA GPU of sm_80 or later
(cp.async) and a triton with Gluon and its NVIDIA backend (compiled for sm_90 on 3.6 to 3.9 and
run on 3.6; the API names that moved between them are looked up both ways below). Gluon has no
interpreter: on the CPU the kernel can only be compiled (for sm_90, which the tests do), never run.
It has not run on AMD and is never chosen there.

What the kernels assume, and :class:`SmemLaunch` checks before each launch (else the call runs
the coop family's kernel, which takes any layout): unit column strides, 16-byte aligned base
pointers and row starts, and N a multiple of the 16-byte vector (so each vector of a row is wholly
in or out of it, which 16-byte copies need); save the odd-row form (LEAD = odd_lead): rows
that start anywhere or end inside a vector, when input and output share one layout and element size
(odd_rows_fit; base pointers still 16-byte aligned). Each row's window then starts on the line that holds
its first element; the copies take whole vectors (a row's first and last also hold its neighbours'
elements, masked out of the sums), and the stores are 16 bytes wide but for those two partial vectors.
"""

from __future__ import annotations

import warnings

import torch
import triton

from ..config import LaunchConfig, n_bucket, next_power_of_2
from ..device import DeviceInfo
from ..layout import ALIGN_BYTES, RowProblem, whole_vectors
from . import SMEM_MIN_SM, coop, launches, sizing
from .cluster import cluster_arrive
from .coop import COOP_PROGRAMS_PER_SM, CoopFamily, CoopLaunch, finish_departure, row_max_sum, row_sum, take_ticket
from .row_ops import exp, grad_input, grad_term, load_f32, row_offsets, store_out
from .sizing import SMEM_RESERVED_PER_PROGRAM, chunks
from .stagger import row_wait, stagger_meta

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
except ImportError as e:  # a triton without Gluon or without its NVIDIA backend
    raise ImportError(f"the smem family needs triton's Gluon with the NVIDIA backend ({e})") from e

IMPL = "smem"
BLOCKS = (2048, 4096, 8192)
MAX_CHUNK_BYTES = 128 * 1024  # shared memory one program may take for its chunk (fp32: 32K elements)
ONE_CHUNK_MAX = 32768  # the forward heuristic makes rows of up to this bucket one chunk
CHUNK = 16384  # the forward heuristic's chunk (elements) for longer rows
BALANCE_BLOCK = 1024  # the narrowest copy group (elements) of balanced chunks (balanced_config)
CLUSTER_CUT_MIN_CHUNK = 8192  # _even_cut: no G + 1 chunks of fewer elements for a cluster-mode config ...
CLUSTER_CUT_MAX_G = 8  # ... of at most this many chunks a row (CUDA's portable cluster size)
CAPPED_WARPS = 4  # configs of this many warps get a register cap (register_capped)
REGISTER_CAP = 64  # the least cap: 8 four-warp programs an SM by registers (65536 / (128 x 64))
MAX_REGISTERS = 255  # the most registers ptxas gives a thread
LINE_BYTES = 128  # the line each row's chunks start on, with LEAD (line_lead)
_async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared  # renamed in triton 3.9


@gluon.jit
def _row_lanes(cols, lo, hi, LEAD: gl.constexpr):
    """The lanes at window positions ``cols`` that lie in the row, positions lo .. hi - 1: cols < hi, and
    with LEAD (a chunk window that starts before the row: _line_lead, _odd_row) also cols >= lo."""
    if LEAD > 0:
        inside = (cols >= lo) & (cols < hi)
    else:
        inside = cols < hi
    return inside


@gluon.jit
def _vector_lanes(cols, lo, hi, VEC: gl.constexpr):
    """The lanes of the 16-byte vectors (VEC elements, window positions ``cols`` from a 16-byte boundary) that
    hold any of the row's positions lo .. hi - 1: what an odd row's 16-byte copies take."""
    return (cols >= (lo // VEC) * VEC) & (cols < ((hi + VEC - 1) // VEC) * VEC)


@gluon.jit
def _odd_row(in_ptr, in_offset, out_offset, chunk, N, CHUNK: gl.constexpr, LEAD: gl.constexpr, VEC: gl.constexpr,
             layout: gl.constexpr):
    """Where an odd row (ODD) lies for the program holding chunk ``chunk`` (CHUNK elements) of it. The row starts at
    element ``in_offset`` from ``in_ptr`` (a 16-byte aligned base) and at ``out_offset`` in the output, on any
    element; lead: the elements between the LINE_BYTES line ((LEAD + 1) elements wide) holding its first element and
    that element. Returns (in_window, out_window, lead, lo, hi, first, edge_cols, edge_lanes): the offsets of the
    windows that start on that line, written as multiples of VEC so that the compiler knows their vectors 16-byte
    aligned; the row's whole vectors, window positions lo .. hi - 1; the chunk's first position; and _edge_lanes."""
    ITEM: gl.constexpr = 16 // VEC
    lead = (((in_ptr + in_offset).to(gl.int64) & ((LEAD + 1) * ITEM - 1)) // ITEM).to(gl.int32)
    first = chunk * CHUNK
    edge_cols, edge_lanes = _edge_lanes(first, lead, lead + N, CHUNK, VEC, layout)
    return (((in_offset - lead) // VEC) * VEC, ((out_offset - lead) // VEC) * VEC, lead,
            ((lead + VEC - 1) // VEC) * VEC, ((lead + N) // VEC) * VEC, first, edge_cols, edge_lanes)


@gluon.jit
def _edge_lanes(first, lo, hi, CHUNK: gl.constexpr, VEC: gl.constexpr, layout: gl.constexpr):
    """(cols, lanes) of an odd row's elements in its two partial vectors (the one holding position lo, the one
    holding hi - 1; each only when the row does not fill it), as 2 x VEC window positions, and the lanes of
    them in the row and in this program's window (first .. first + CHUNK - 1). A few elements a row, read and
    written one at a time, so that the tiles hold and store whole vectors only, as for aligned rows (masks of
    single elements over every tile cost a forward 100 more registers a thread: spills, offline)."""
    lo_whole = ((lo + VEC - 1) // VEC) * VEC
    hi_whole = (hi // VEC) * VEC
    e = gl.arange(0, 2 * VEC, layout=layout)
    cols = gl.where(e < VEC, (lo // VEC) * VEC + e, hi_whole + e - VEC)
    lanes = ((cols >= lo) & (cols < hi) & ((cols < lo_whole) | (cols >= hi_whole))
             & (cols >= first) & (cols < first + CHUNK))
    return cols, lanes


@gluon.jit
def _row_window(in_ptr, row, INNER, stride_in_outer, stride_in_inner, stride_out_outer, stride_out_inner, chunk, N,
                CHUNK: gl.constexpr, LEAD: gl.constexpr, ODD: gl.constexpr, VEC: gl.constexpr, VEC_OUT: gl.constexpr,
                layout: gl.constexpr):
    """Where row ``row`` lies for the program holding chunk ``chunk`` (CHUNK elements) of it, as element offsets from
    the input's base pointer ``in_ptr`` (16-byte aligned; VEC elements a 16-byte vector) and the output's (VEC_OUT).
    Returns (in_row, out_row, lead, lo, hi, first, edge_cols, edge_lanes) as _odd_row does for odd rows (ODD: the
    kernels' LEAD % VEC != 0). Other rows: their own offsets, with the strides and N written as whole 16-byte
    vectors so that the compiler knows the copies and stores 16 bytes wide (SmemLaunch checks they are); lo .. hi - 1
    the whole row; first the chunk's start less _line_lead; lead, edge_cols and edge_lanes 0 (odd rows only)."""
    if ODD:
        gl.static_assert(VEC == VEC_OUT, "an odd row's output has the input's element size")
        return _odd_row(in_ptr, row_offsets(row, INNER, stride_in_outer, stride_in_inner),
                        row_offsets(row, INNER, stride_out_outer, stride_out_inner), chunk, N, CHUNK, LEAD, VEC, layout)
    else:
        in_row = row_offsets(row, INNER, (stride_in_outer // VEC) * VEC, (stride_in_inner // VEC) * VEC)
        out_row = row_offsets(row, INNER, (stride_out_outer // VEC_OUT) * VEC_OUT,
                              (stride_out_inner // VEC_OUT) * VEC_OUT)
        return in_row, out_row, 0, 0, (N // VEC) * VEC, chunk * CHUNK - _line_lead(in_ptr + in_row, LEAD, VEC), 0, 0


@gluon.jit
def _line_lead(row_ptr, LEAD: gl.constexpr, VEC: gl.constexpr):
    """Elements between the line of LEAD + VEC elements (line_lead: LINE_BYTES) that holds the row's first
    element and that element (0 without LEAD): a multiple of VEC, at most LEAD (row_ptr is 16-byte aligned,
    VEC elements a 16-byte vector). A program whose chunk window starts that far before its chunk reads and
    writes whole lines."""
    if LEAD > 0:
        gl.static_assert((LEAD // VEC + 1) & (LEAD // VEC) == 0, "a line must be a power of two of vectors")
        lead = ((row_ptr.to(gl.int64) >> 4) & (LEAD // VEC)).to(gl.int32) * VEC
    else:
        lead = 0
    return lead


@gluon.jit
def _in_row(z, cols, lo, hi, MASKED: gl.constexpr, LEAD: gl.constexpr):
    """``z`` with MASKED, lanes outside the row (_row_lanes) -inf; applied after the scale, so that a
    negative or zero scale cannot turn the masked lanes into +inf or NaN."""
    if MASKED:
        z = gl.where(_row_lanes(cols, lo, hi, LEAD), z, float("-inf"))
    return z


@gluon.jit
def _output(x, scale, m, inv, log_s, LOG: gl.constexpr, ZERO_MASKED: gl.constexpr):
    """softmax (log_softmax, LOG) of fp32 inputs ``x`` given the row's max ``m`` of scale * x, 1 / its sum ``inv`` and
    the sum's log ``log_s``; ZERO_MASKED: 0 for a row whose max is -inf."""
    z = gl.fma(x, scale, -m)
    if LOG:
        y = z - log_s
    else:
        y = exp(z) * inv
    if ZERO_MASKED:
        y = gl.where(m == float("-inf"), 0.0, y)
    return y


@gluon.jit
def _edge_max_sum(x_e, lanes, scale, m, s):
    """(m, s) of a chunk's whole vectors (_chunk_max_sum) joined with its partial vectors' elements x_e (fp32,
    the lanes of _edge_lanes)."""
    z = gl.where(lanes, x_e * scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(z, 0))
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, s * exp(m - m_ref) + gl.sum(exp(z - m_ref), 0)


@gluon.jit
def _max_of_flipped(a, b, flip):
    """max(a, b XOR flip) in a's dtype, where ``flip`` holds 0 or the sign bit (+0.0 or -0.0): one
    xor and one max.bf16x2 / max.f16x2 for two 16-bit lanes (sm_80+), no conversion; fp32 one each.
    NaN lanes lose to numbers, as in gl.maximum."""
    if a.dtype == gl.bfloat16:
        r = gl.inline_asm_elementwise("{ .reg .b32 t; xor.b32 t, $2, $3; max.bf16x2 $0, $1, t; }", "=r,r,r,r",
                                      [a, b, flip], dtype=a.dtype, is_pure=True, pack=2)
    elif a.dtype == gl.float16:
        r = gl.inline_asm_elementwise("{ .reg .b32 t; xor.b32 t, $2, $3; max.f16x2 $0, $1, t; }", "=r,r,r,r",
                                      [a, b, flip], dtype=a.dtype, is_pure=True, pack=2)
    else:
        r = gl.inline_asm_elementwise("{ .reg .b32 t; xor.b32 t, $2, $3; max.f32 $0, $1, t; }", "=r,r,r,r",
                                      [a, b, flip], dtype=a.dtype, is_pure=True, pack=1)
    return r


@gluon.jit
def _chunk_max_sum(buf, first, offs, lo, hi, scale, TILES: gl.constexpr, BLOCK: gl.constexpr,
                   MASKED: gl.constexpr, LEAD: gl.constexpr, layout: gl.constexpr):
    """(m, s) of the chunk: m = max of scale * x, s = sum of exp(scale * x - m) (0 when m = -inf),
    waiting for each copy group in turn. MASKED: the chunk's window runs past the row's end or (LEAD)
    starts before the row (those lanes hold the copy's zero fill, or an odd row's neighbours).
    m is |scale| times the max of sign(scale) * x, which rounding keeps exact. That max is taken on
    the raw values, the sign flipped by an xor of the sign bit: two 16-bit lanes an instruction pair,
    so the first pass costs a 16-bit element neither a conversion nor a multiply. No branch on the
    sign: a version that took max or min under a runtime branch on it, nested in the MASKED one, wrote
    shared memory out of bounds in its PHASE 1 kernel on triton 3.6 (compute-sanitizer; the cause was
    not isolated further)."""
    sign = gl.where(scale < 0, -1.0, 1.0)
    flip = (gl.zeros([BLOCK], gl.float32, layout) * sign).to(buf.dtype)  # +0.0 or -0.0: 0 or the sign bit
    ev = gl.full([BLOCK], float("-inf"), buf.dtype, layout)
    if MASKED:
        hole = (gl.full([BLOCK], float("-inf"), gl.float32, layout) * sign).to(buf.dtype)  # -inf once flipped
    for t in gl.static_range(TILES):
        cp.wait_group(TILES - 1 - t)
        v = buf.index(t).load(layout)
        if MASKED:
            v = gl.where(_row_lanes(first + t * BLOCK + offs, lo, hi, LEAD), v, hole)
        ev = _max_of_flipped(ev, v, flip)
    m = gl.max(ev.to(gl.float32), 0) * gl.abs(scale)
    m_ref = gl.where(m == float("-inf"), 0.0, m)
    sv = gl.zeros([BLOCK], gl.float32, layout)
    for t in gl.static_range(TILES):
        v = buf.index(t).load(layout).to(gl.float32)
        sv += exp(_in_row(gl.fma(v, scale, -m_ref), first + t * BLOCK + offs, lo, hi, MASKED, LEAD))
    return m, gl.sum(sv, 0)


@gluon.jit
def _chunk_grad_sum(dyb, yb, first, offs, lo, hi, TILES: gl.constexpr, BLOCK: gl.constexpr, LOG: gl.constexpr,
                    MASKED: gl.constexpr, LEAD: gl.constexpr, layout: gl.constexpr):
    """The chunk's sum of grad_term(dy, y), waiting for each copy group in turn; MASKED: lanes outside the row
    (_row_lanes) add nothing whatever they hold."""
    acc = gl.zeros([BLOCK], gl.float32, layout)
    for t in gl.static_range(TILES):
        cp.wait_group(TILES - 1 - t)
        dy = dyb.index(t).load(layout).to(gl.float32)
        y = yb.index(t).load(layout).to(gl.float32)
        term = grad_term(dy, y, LOG)
        if MASKED:
            term = gl.where(_row_lanes(first + t * BLOCK + offs, lo, hi, LEAD), term, 0.0)
        acc += term
    return gl.sum(acc, 0)


@gluon.jit
def _ticket_chunk(sync_ptr, M, N, TILES: gl.constexpr, BLOCK: gl.constexpr, PHASE: gl.constexpr,
                  RESIDENT: gl.constexpr, LEAD: gl.constexpr):
    """(G, ticket, row, chunk): the programs a row has (chunks of TILES x BLOCK covering LEAD + N
    elements: sizing.chunks), this program's ticket (coop.take_ticket), and the row and the chunk of
    it that the ticket names."""
    G = (N + LEAD + TILES * BLOCK - 1) // (TILES * BLOCK)
    ticket = take_ticket(sync_ptr, M * G, PHASE, RESIDENT)
    return G, ticket, ticket // G, ticket % G


@gluon.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_smem_fwd_kernel(
    x_ptr, y_ptr, ws_ptr, sync_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: gl.constexpr, ZERO_MASKED: gl.constexpr,
    BLOCK: gl.constexpr, TILES: gl.constexpr, BLOCK_G: gl.constexpr, PHASE: gl.constexpr,
    RESIDENT: gl.constexpr = 0, PER_WORD: gl.constexpr = 0, LEAD: gl.constexpr = 0,
    CLUSTER: gl.constexpr = 0, STAGGER: gl.constexpr = 0, STAGGER_GROUPS: gl.constexpr = 2,
):
    """Softmax (log_softmax, LOG) with the G = cdiv(LEAD + N, TILES * BLOCK) programs of a row cooperating,
    each holding its chunk in shared memory.

    x_ptr, y_ptr: input and output, 16-byte aligned, unit column strides (stride_x_col and
    stride_y_col are not read), rows starting on 16-byte boundaries, N a multiple of the 16-byte
    vector, save the odd-row form (LEAD below; SmemLaunch checks all of it). scale, M, N, INNER,
    stride_*_outer/inner, LOG, ZERO_MASKED: as in the fused kernel. ws_ptr, sync_ptr, BLOCK_G, PHASE,
    RESIDENT, PER_WORD: as in the coop kernel (tickets and the (max, sum) exchange are coop's: row_max_sum).
    BLOCK: elements per copy group (one cp.async group, waited for in order); TILES: groups a chunk holds in shared
    memory (TILES x BLOCK x the input's element size bytes). LEAD: 0, or LINE_BYTES less
    one 16-byte vector in elements (line_lead): each row's chunks then start on the 128-byte line that
    holds its first element (_line_lead elements before it, masked), so every copy and store of the row
    covers whole lines, whatever its start; or odd_lead, LINE_BYTES less one element (ODD, LEAD not a
    multiple of the vector): rows may start on any element and N need not be whole vectors (x and y of one
    layout and element size; _odd_row, _vector_lanes, _edge_lanes). The output stores carry no eviction
    hint: nothing reads the input again, so evict_first on the output buys no L2 room and measured slower.
    CLUSTER: as in the coop kernel (a cluster launch of the row's G programs; the (max, sum) pairs go
    through the cluster's shared memory, past the chunk's: cluster.py). STAGGER: 0, or the SM cycles a group of rows
    waits per group before it (stagger.row_wait; staggered): the rows fall into STAGGER_GROUPS groups of
    cdiv(M, STAGGER_GROUPS), group g waiting g * STAGGER before its copies, so that it reads while the groups before
    it exchange and write.

    The arithmetic is cut to what a 16-bit chunk can afford (at ~4 TB/s an SM handles ~4 bf16
    elements a cycle, three passes each): exp(z - m) is row_ops.exp (flush-to-zero) of
    fma(x, scale, -m), and only a row's last chunk masks its lanes.
    """
    VEC: gl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth
    VEC_Y: gl.constexpr = 128 // y_ptr.dtype.element_ty.primitive_bitwidth
    ODD: gl.constexpr = LEAD % VEC != 0
    NW: gl.constexpr = gl.num_warps()
    tile_layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [NW], [0])
    part_layout: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    started = cluster_arrive() if CLUSTER else 0
    G, ticket, row, chunk = _ticket_chunk(sync_ptr, M, N, TILES, BLOCK, PHASE, RESIDENT or CLUSTER, LEAD)
    # An odd row is positions lead .. lead + N - 1 of a window that starts on its first element's line; the tiles
    # hold its whole vectors, lo .. hi - 1, and the edge lanes its partial vectors' elements.
    x_win, y_win, lead, lo, hi, first, e_cols, e_lanes = _row_window(
        x_ptr, row, INNER, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, chunk, N, TILES * BLOCK,
        LEAD, ODD, VEC, VEC_Y, part_layout)
    if STAGGER > 0:  # the late rows' copies wait (the wait's 0 added to their window, so they come after it)
        x_win += (row_wait(row, M, STAGGER, STAGGER_GROUPS) // VEC) * VEC
    x_row = x_ptr + x_win
    y_row = y_ptr + y_win
    buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [TILES, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    offs = gl.arange(0, BLOCK, layout=tile_layout)
    for t in gl.static_range(TILES):
        cols = first + t * BLOCK + offs
        if ODD:
            _async_load(buf.index(t), x_row + cols, mask=_vector_lanes(cols, lead, lead + N, VEC))
        else:
            _async_load(buf.index(t), x_row + cols, mask=_row_lanes(cols, lo, hi, LEAD))
        cp.commit_group()
    if ODD:
        x_e = load_f32(x_row + e_cols, e_lanes)
    if PHASE != 2:
        if LEAD > 0:
            whole = (first >= lo) & (first + TILES * BLOCK <= hi)
        else:
            whole = first + TILES * BLOCK <= hi
        if whole:
            m, s = _chunk_max_sum(buf, first, offs, lo, hi, scale, TILES, BLOCK, False, LEAD, tile_layout)
        else:
            m, s = _chunk_max_sum(buf, first, offs, lo, hi, scale, TILES, BLOCK, True, LEAD, tile_layout)
        if ODD:
            m, s = _edge_max_sum(x_e, e_lanes, scale, m, s)
    else:
        cp.wait_group(0)
        m = 0.0  # not read: PHASE 2 takes the row's partials from the workspace
        s = 0.0
    gs = gl.arange(0, BLOCK_G, layout=part_layout)
    m_r, s_r, seen = row_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, started, PHASE, PER_WORD, CLUSTER, BLOCK_G)
    if PHASE != 1:
        inv = 1.0 / s_r
        log_s = gl.log(s_r)
        for t in gl.static_range(TILES):
            cols = first + t * BLOCK + offs
            x = buf.index(t).load(tile_layout).to(gl.float32)  # lanes outside the row: not stored
            y = _output(x, scale, m_r, inv, log_s, LOG, ZERO_MASKED)
            store_out(y_row + cols, y, _row_lanes(cols, lo, hi, LEAD))
        if ODD:
            store_out(y_row + e_cols, _output(x_e, scale, m_r, inv, log_s, LOG, ZERO_MASKED), e_lanes)
    finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE, PER_WORD)


@gluon.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_smem_bwd_kernel(
    dy_ptr, dx_ptr, ws_ptr, sync_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: gl.constexpr, BLOCK: gl.constexpr, TILES: gl.constexpr, BLOCK_G: gl.constexpr, PHASE: gl.constexpr,
    RESIDENT: gl.constexpr = 0, PER_WORD: gl.constexpr = 0, LEAD: gl.constexpr = 0,
    CLUSTER: gl.constexpr = 0,
):
    """dx of softmax (log_softmax, LOG) with the G = cdiv(LEAD + N, TILES * BLOCK) programs of a row
    cooperating, each holding its chunks of dy and y in shared memory in their dtype: one pass sums
    grad_term(dy, y) over the chunk, the row's partial sums meet through coop's exchange
    (row_sum), and a second pass writes dx = grad_input(dy, y, red, scale) from shared memory.

    dy_ptr, y_ptr: incoming gradient and saved output, one layout (stride_g_*); dx_ptr: the result
    (stride_d_*). Unit column strides (stride_g_col and stride_d_col are not read), 16-byte aligned
    base pointers and row starts, N a whole number of 16-byte vectors, save the odd-row form (SmemLaunch
    checks all of it). scale, M, N, INNER, LOG: as in the forward. ws_ptr: float32, two a program (exchange_sum's
    word); sync_ptr, BLOCK_G, PHASE, RESIDENT, PER_WORD: as in the coop backward. BLOCK: elements a copy
    group; TILES: copy groups a chunk (2 x TILES x BLOCK x the element size bytes of shared memory).
    LEAD: as in the forward (the lines of dy's rows; odd rows: dy, y and dx of one layout). CLUSTER: as in the
    forward (the partial sums through the cluster's shared memory). The dx stores carry no eviction hint, as in the
    forward."""
    VEC: gl.constexpr = 128 // dy_ptr.dtype.element_ty.primitive_bitwidth
    VEC_D: gl.constexpr = 128 // dx_ptr.dtype.element_ty.primitive_bitwidth
    ODD: gl.constexpr = LEAD % VEC != 0
    NW: gl.constexpr = gl.num_warps()
    tile_layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [NW], [0])
    part_layout: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    started = cluster_arrive() if CLUSTER else 0
    G, ticket, row, chunk = _ticket_chunk(sync_ptr, M, N, TILES, BLOCK, PHASE, RESIDENT or CLUSTER, LEAD)
    g_row, d_row, lead, lo, hi, first, e_cols, e_lanes = _row_window(  # as in the forward
        dy_ptr, row, INNER, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner, chunk, N, TILES * BLOCK,
        LEAD, ODD, VEC, VEC_D, part_layout)
    dyb = gl.allocate_shared_memory(dy_ptr.dtype.element_ty, [TILES, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    yb = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [TILES, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    offs = gl.arange(0, BLOCK, layout=tile_layout)
    for t in gl.static_range(TILES):
        cols = first + t * BLOCK + offs
        if ODD:
            copied = _vector_lanes(cols, lead, lead + N, VEC)
        else:
            copied = _row_lanes(cols, lo, hi, LEAD)
        _async_load(dyb.index(t), dy_ptr + g_row + cols, mask=copied)
        _async_load(yb.index(t), y_ptr + g_row + cols, mask=copied)
        cp.commit_group()
    if ODD:
        dy_e = load_f32(dy_ptr + g_row + e_cols, e_lanes)
        y_e = load_f32(y_ptr + g_row + e_cols, e_lanes)
    if PHASE != 2:
        # Lanes outside the row hold the copies' zero fill, which adds 0; an odd row's partial vectors also hold
        # its neighbours' elements, masked out of the tiles' sum (their own elements come in by the edge lanes).
        if ODD:
            if (first < lo) | (first + TILES * BLOCK > hi):
                part = _chunk_grad_sum(dyb, yb, first, offs, lo, hi, TILES, BLOCK, LOG, True, LEAD, tile_layout)
            else:
                part = _chunk_grad_sum(dyb, yb, first, offs, lo, hi, TILES, BLOCK, LOG, False, LEAD, tile_layout)
            part += gl.sum(grad_term(dy_e, y_e, LOG), 0)  # masked edge lanes load 0: they add 0
        else:
            part = _chunk_grad_sum(dyb, yb, first, offs, lo, hi, TILES, BLOCK, LOG, False, LEAD, tile_layout)
    else:
        cp.wait_group(0)
        part = 0.0  # not read: PHASE 2 takes the row's partials from the workspace
    gs = gl.arange(0, BLOCK_G, layout=part_layout)
    red, seen = row_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, started, PHASE, PER_WORD, CLUSTER, BLOCK_G)
    if PHASE != 1:
        for t in gl.static_range(TILES):
            cols = first + t * BLOCK + offs
            dy = dyb.index(t).load(tile_layout).to(gl.float32)
            y = yb.index(t).load(tile_layout).to(gl.float32)
            store_out(dx_ptr + d_row + cols, grad_input(dy, y, red, scale, LOG), _row_lanes(cols, lo, hi, LEAD))
        if ODD:
            store_out(dx_ptr + d_row + e_cols, grad_input(dy_e, y_e, red, scale, LOG), e_lanes)
    finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE, PER_WORD)


def max_chunk_elements(device: DeviceInfo, held: int = 1) -> int:
    """The longest chunk (elements) a config may give a program that holds ``held`` tensors' chunks
    (forward 1: x; backward 2: dy and y): MAX_CHUNK_BYTES, counting 4 bytes an element of each (fp32),
    within what one program may allocate on ``device``."""
    return min(MAX_CHUNK_BYTES, device.shared_mem_per_block - SMEM_RESERVED_PER_PROGRAM) // (4 * held)


def max_row(device: DeviceInfo, held: int = 1) -> int:
    """The longest row (elements) the family takes, a power of two (configs are sized on the N bucket):
    at most one longest chunk on each SM (coop.max_chunks)."""
    return 1 << ((coop.max_chunks(device) * max_chunk_elements(device, held)).bit_length() - 1)


def _config_space(held: int):
    """The search space of a kernel that holds ``held`` tensors' chunks: chunks of 4K to 32K
    elements (as many as fit) in copy groups of 2K-8K, 4 or 8 warps; each also in cluster mode where
    coop.with_cluster_mode offers it."""

    def configs(device: DeviceInfo, M: int, N: int) -> list[LaunchConfig]:
        most = max_chunk_elements(device, held)
        out = []
        for block in BLOCKS:
            for chunk in (4096, 8192, 16384, 32768):
                if chunk < block or chunk > most:
                    continue
                for nw in (4, 8):
                    c = coop.shape_config(device, N, block, nw, chunk // block)
                    if c["TILES"] * block <= most and c not in out:
                        out += coop.with_cluster_mode(c, N, device)
        return out

    return configs


def _heuristic(device: DeviceInfo, M: int, N: int, dtype: torch.dtype = torch.float32) -> LaunchConfig:
    """Rows longer than 32K: chunks of 16K elements in eight 2K copy groups, 4 warps, in every dtype (a chunk of
    32-64 KB: several programs an SM, each with many copies in flight). Rows of up to 32K (the N bucket): the
    row is one chunk (no exchange), 8 warps for 32K, 4 for 16K.

    The config is the bucket's; a launch cuts it to its row's length (balanced_config). ``dtype`` is not read
    (the backward's heuristic sizes its chunks in bytes; both take it, as SmemFamily.default_config gives it)."""
    nb = n_bucket(N)
    if nb <= ONE_CHUNK_MAX:
        return coop.shape_config(device, N, 2048, 8 if nb >= ONE_CHUNK_MAX else 4, min_tiles=max(1, nb // 2048))
    return coop.shape_config(device, N, 2048, 4, min_tiles=CHUNK // 2048)


def _even_cut(config: LaunchConfig, need: int, block: int, device: DeviceInfo, fewer: int = 0,
              most: int = 0) -> tuple[int, int, dict]:
    """(elements allocated a row, chunks, meta to change) of the fewest-allocating of: ``config`` as it is
    over ``need`` elements, and ``need`` cut into ``fewer`` (when under G, in chunks of at most ``most``
    elements), G or G + 1 chunks (G: the config's count) of ``block`` copy groups. Ties keep the earlier (the
    fewer chunks). A config in cluster mode with G of at most CLUSTER_CUT_MAX_G takes G + 1 only in chunks of at
    least CLUSTER_CUT_MIN_CHUNK elements: in a small cluster one more, smaller chunk adds a program to every
    exchange for little shared memory saved, while past 8 programs a cluster (fewer such clusters fit the GPU at
    once) the smaller chunks win. A config that runs in cluster mode at G never takes a G + 1 that would not (16
    chunks to 17): the cluster's exchange beats the workspace's at every G of 2-16."""
    g0 = chunks(need, dict(config.meta))
    best = (g0 * config["TILES"] * config["BLOCK"], g0, {})
    cluster = bool(dict(config.meta).get("CLUSTER"))
    clustered = coop.cluster_mode(config, g0, device, False)
    for g in ((fewer,) if 0 < fewer < g0 else ()) + (g0, g0 + 1):
        cut = {"BLOCK": block, "TILES": triton.cdiv(triton.cdiv(need, g), block)}
        if g < g0 and cut["TILES"] * block > most:
            continue
        if g > g0 and cluster and g0 <= CLUSTER_CUT_MAX_G and cut["TILES"] * block < CLUSTER_CUT_MIN_CHUNK:
            continue
        if g > g0 and clustered and not coop.cluster_mode(config, g, device, False):
            continue  # G + 1 past the largest cluster: the row would exchange through the workspace instead
        if g <= coop.max_chunks(device) and chunks(need, cut) == g and g * cut["TILES"] * block < best[0]:
            best = (g * cut["TILES"] * block, g, cut)
    return best


def balanced_config(config: LaunchConfig, N: int, itemsize: int, device: DeviceInfo, lead: int = 0,
                    held: int = 1) -> LaunchConfig:
    """``config`` (sized on the N bucket) with a row of exactly N elements cut into even chunks, when that
    takes less shared memory a row: G or G + 1 chunks (G = the config's chunk count at N) of the fewest
    BALANCE_BLOCK copy groups (or the narrowest group its warps can copy in 16-byte vectors) that cover
    the row, whichever allocates fewer elements. Else the config as it is. ``lead`` (line_lead, rows off
    128-byte lines): the same over lead + N elements, with LEAD = lead, when that allocates no more; an
    odd_lead always (odd rows need it), where the row's chunks stay within coop.max_chunks.

    Over the lead the cut also tries the chunk count the row needs without it (in chunks of at most
    max_chunk_elements for ``held`` tensors), first, so that on a tie in shared memory the lead adds no chunk;
    and a one-chunk config (BLOCK_G 1) that the lead still cuts runs its chunks as a CTA cluster where the
    device has them (coop.cluster_mode): a second chunk exchanging through the cluster costs little, and through
    the workspace it would cost a ticketed exchange.

    A chunk's shared memory is allocated whole, so the bucket's chunks leave the last chunk of a row
    past a multiple of them part empty, holding shared memory (an SM's programs) for nothing; the cut
    gives that memory back. Rows that chunks fill (65536, every power of two) keep their config."""
    block = max(BALANCE_BLOCK, config.num_warps * device.warp_size * (ALIGN_BYTES // itemsize))
    allocated, g, cut = _even_cut(config, N, block, device)
    if lead:
        led = _even_cut(config, N + lead, block, device, chunks(N, dict(config.meta)),
                        max_chunk_elements(device, held))
        # odd rows: the kernels cannot take them without their lead
        if (is_odd_lead(lead, itemsize) or led[0] <= allocated) and led[1] <= coop.max_chunks(device):
            allocated, g, cut = led
            cut = {**cut, "LEAD": lead}
    if not cut:
        return config
    if g > 1 and config["BLOCK_G"] == 1 and coop.cluster_mode(config.with_meta(CLUSTER=1), g, device, False):
        cut = {**cut, "CLUSTER": 1}
    return config.with_meta(**cut, BLOCK_G=max(config["BLOCK_G"], next_power_of_2(g)))


def line_lead(problem: RowProblem) -> int:
    """LEAD for a launch the dispatcher chose: LINE_BYTES less one 16-byte vector, in input elements, when
    some input row of ``problem`` starts off a LINE_BYTES line, else 0 (row starts are counted from the
    base pointer, which torch's allocations place on a line); for odd rows (off 16-byte boundaries, or N not
    whole 16-byte vectors) that the kernels can take (odd_rows_fit), ODD_LEAD."""
    itemsize = problem.dtype.itemsize
    if not (problem.rows_aligned(itemsize) and whole_vectors(problem.N, itemsize)):
        return odd_lead(itemsize) if odd_rows_fit(problem, itemsize) else 0
    if all(s * itemsize % LINE_BYTES == 0 for s in (problem.x.outer, problem.x.inner)):
        return 0
    return (LINE_BYTES - ALIGN_BYTES) // itemsize


def odd_lead(itemsize: int) -> int:
    """LEAD of the odd-row form: LINE_BYTES less one element, in elements of ``itemsize`` bytes (bf16 63, fp32
    31). Not a multiple of the 16-byte vector, which is what tells the kernels the form (their ODD)."""
    return LINE_BYTES // itemsize - 1


def is_odd_lead(lead: int, itemsize: int) -> bool:
    """Whether LEAD ``lead`` (elements of ``itemsize`` bytes) is the odd-row form: not a multiple of the 16-byte
    vector (the kernels' ODD)."""
    return lead % (ALIGN_BYTES // itemsize) != 0


def odd_rows_fit(problem: RowProblem, *element_sizes: int) -> bool:
    """Whether the kernels' odd-row form takes ``problem``'s rows wherever they start: input and output (and
    the backward's saved output, in dy's layout) of one layout along unit-stride columns and of one element
    size, so that every row's tensors sit alike against 16-byte boundaries. Not rows of one element: triton 3.6
    fails to lower the kernels with N specialised to 1 (3.9 does not)."""
    return problem.N > 1 and problem.x == problem.y and problem.x.col == 1 and len(set(element_sizes)) == 1


def programs_per_sm(config: LaunchConfig, itemsize: int, held: int, device: DeviceInfo, n_regs: int = 1) -> int:
    """The programs of ``config`` an SM holds at once (sizing.resident_programs) by its ``held`` chunks of
    TILES x BLOCK elements of ``itemsize`` bytes in shared memory and ``n_regs`` registers a thread (1: shared
    memory, threads and the block limit alone)."""
    chunk_bytes = config["TILES"] * config["BLOCK"] * itemsize * held
    return sizing.resident_programs(device, n_regs, config.num_warps, chunk_bytes)


def register_cap(config: LaunchConfig, itemsize: int, held: int, device: DeviceInfo) -> int:
    """The registers a thread of ``config`` may take without holding fewer programs an SM than its chunks' shared
    memory allows (programs_per_sm): the register file over those programs' threads, to a multiple of 8, at least
    REGISTER_CAP and at most MAX_REGISTERS."""
    programs = max(1, programs_per_sm(config, itemsize, held, device))
    fit = device.regs_per_sm // (programs * config.num_warps * device.warp_size) // 8 * 8
    return max(REGISTER_CAP, min(MAX_REGISTERS, fit))


def register_capped(config: LaunchConfig, itemsize: int, held: int, device: DeviceInfo) -> LaunchConfig:
    """``config`` with ptxas held to register_cap registers a thread (the ``maxnreg`` launch option) when it has
    CAPPED_WARPS warps, so registers never hold fewer programs an SM than the chunks' shared memory allows: 64
    (8 programs) for chunks of up to ~26 KB (forward 16-bit 13 x 1024), more for larger ones (16-bit 14 x 1024:
    72, 16384: 80; fp32 16384: 168; the backward's two 16-bit 16K chunks: 168). Configs of other warp counts, or
    that name their own cap, are left alone. Uncapped, ptxas can take a few registers more than the chunks' shared
    memory leaves room for and lose a program an SM; a cap set too low spills (larger chunks, cluster mode and
    LEAD each add address registers), hence a cap that grows with the chunk."""
    if config.num_warps != CAPPED_WARPS or "maxnreg" in dict(config.options):
        return config
    return config.with_options(maxnreg=register_cap(config, itemsize, held, device))


def staggered(config: LaunchConfig, problem: RowProblem, device: DeviceInfo) -> LaunchConfig:
    """The forward ``config`` (cut and register-capped) with STAGGER (stagger.stagger_meta) where its programs fill
    little enough of what the SMs hold, counted from the register cap and the chunk's shared memory (a config without
    a cap is left alone): later rows wait about as long as earlier rows' bytes take to read before their copies, in
    halves, or, for a cluster config (CLUSTER), in 4 or 8 groups (STAGGER_GROUPS).

    When every program of a launch runs at once, DRAM sees all the reads, a gap while every row exchanges, then
    all the writes; staggered rows read while earlier ones exchange and write. A launch of a wave or more
    already overlaps them and loses from any wait (stagger.MAX_GROUPED_WAVE); the backward, which reads two
    tensors for each one it writes, gains nothing and has none. The wait counts SM cycles, so a GPU held to
    lower clocks waits longer in time."""
    cap = dict(config.options).get("maxnreg")
    if cap is None:
        return config
    programs = problem.M * chunks(problem.N, dict(config.meta))
    meta = stagger_meta(problem, programs, programs_per_sm(config, problem.dtype.itemsize, 1, device, cap), device,
                        grouped=bool(dict(config.meta).get("CLUSTER")))
    return config.with_meta(**meta) if meta else config


# The 16-bit backward on smem-bwd's heuristic config (backward_cluster) takes coop's cluster mode (the row's G
# programs one CTA cluster, their partial sums through the cluster's shared memory: kernels/cluster.py)
# when a row has at most SMEM_BWD_CLUSTER_MAX_G chunks, or when all rows make at most
# SMEM_BWD_CLUSTER_MAX_PROGRAMS programs (and G is a cluster size, 2-16): large clusters over many rows
# wait for a whole cluster's worth of SMs to come free. The forward in cluster mode loses at many rows
# and is not ruled in.
SMEM_BWD_CLUSTER_MAX_G = 7
SMEM_BWD_CLUSTER_MAX_PROGRAMS = 8192

BWD_CHUNK_BYTES = 64 * 1024  # dy and y chunks of a backward program, when the rows give enough programs


def _bwd_heuristic(device: DeviceInfo, M: int, N: int, dtype: torch.dtype = torch.bfloat16) -> LaunchConfig:
    """Backward of dy and y of ``dtype``: 2K copy groups, 4 warps, chunks
    of BWD_CHUNK_BYTES (16K elements in 16-bit, 8K in fp32) where the rows give at least
    COOP_PROGRAMS_PER_SM programs an SM, else narrower, down to 4K elements (more programs for few rows). A
    program's dy and y chunks together stay within BWD_CHUNK_BYTES so that several fit an SM's shared memory."""
    want = COOP_PROGRAMS_PER_SM * device.sm_count
    most = BWD_CHUNK_BYTES // (2 * dtype.itemsize)
    chunk = min(most, max(4096, next_power_of_2(triton.cdiv(max(M, 1) * n_bucket(N), want))))
    return coop.shape_config(device, N, 2048, 4, min_tiles=chunk // 2048)


def backward_cluster(problem: RowProblem, config: LaunchConfig, device: DeviceInfo) -> bool:
    """Whether the 16-bit backward on the heuristic's ``config`` (cut to the row) runs in cluster mode: rows of at
    most SMEM_BWD_CLUSTER_MAX_G chunks, or at most SMEM_BWD_CLUSTER_MAX_PROGRAMS programs in all (why: above),
    where coop.cluster_mode allows it."""
    g = chunks(problem.N, dict(config.meta))
    return (problem.dtype.itemsize == 2
            and (g <= SMEM_BWD_CLUSTER_MAX_G or problem.M * g <= SMEM_BWD_CLUSTER_MAX_PROGRAMS)
            and coop.cluster_mode(config.with_meta(CLUSTER=1), g, device, False))


class SmemLaunch(CoopLaunch):
    """CoopLaunch of a smem kernel. A call the kernel cannot take (base pointers off 16 bytes, rows
    off 16-byte boundaries or along strided columns, N not a whole number of 16-byte vectors, N = 1) runs
    the coop family's kernel (forward or backward, its heuristic config) instead; ``fallbacks``
    counts the calls that ran coop's kernel.
    The layout is checked once, the base pointers on every call (two or three address reads).

    Gluon is experimental: should the kernel fail to compile or load on its first call (a triton
    or GPU it was not checked on; it compiles for sm_90 on triton 3.6-3.9 and ran on 3.6), a launch
    the dispatcher chose (the heuristic or a stored config) warns once and runs coop's kernel for
    good, with the reason in ``smem_error``. A config given explicitly raises instead, so the tuner
    never times coop under smem's name."""

    def __init__(self, family: SmemFamily, problem: RowProblem, config: LaunchConfig | None,
                 device: DeviceInfo, flags: dict[str, int] | None = None, two_phase: bool | None = None,
                 from_store: bool = False):
        if device.sm_version < SMEM_MIN_SM:
            raise RuntimeError(f"the smem family is a Gluon kernel for NVIDIA sm_{SMEM_MIN_SM}+ GPUs (cp.async); "
                               f"it cannot run on {device.name} ({device.backend}/{device.arch})"
                               + (" or under the Triton interpreter" if device.backend != "cuda" else ""))
        chosen = config is None or from_store  # the dispatcher's choice, not the caller's
        heuristic = config is None
        if chosen:
            config = family.dispatched_form(problem, config or family.default_config(device, problem), device)
        if heuristic and family.held == 2 and backward_cluster(problem, config, device):
            config = config.with_meta(CLUSTER=1)
        super().__init__(family, problem, config, device, flags, two_phase)
        most = max_chunk_elements(device, family.held)
        if self.config["TILES"] * self.config["BLOCK"] > most:
            raise ValueError(f"{family.name} config {self.config}: a {self.config['TILES'] * self.config['BLOCK']}"
                             f"-element chunk does not fit in shared memory (at most {most}; rows of up to "
                             f"{max_row(device, family.held)} elements on {device.name})")
        self.family = family
        self._flags, self._two_phase = dict(flags or {}), two_phase
        self._layout_ok: bool | None = None
        self._coop: CoopLaunch | None = None
        self._may_give_up = chosen
        self._started = False
        self.smem_error: str | None = None
        self.fallbacks = 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *extra) -> LaunchConfig:
        if self._layout_ok is None:
            sizes = (x.element_size(), y.element_size(), *(e.element_size() for e in extra[:self.family.held - 1]))
            if is_odd_lead(dict(self.config.meta).get("LEAD", 0), x.element_size()):
                self._layout_ok = odd_rows_fit(self.problem, *sizes)
            else:
                self._layout_ok = (whole_vectors(self.problem.N, x.element_size())
                                   and self.problem.rows_aligned(x.element_size(), y.element_size()))
        ptrs = x.data_ptr() | y.data_ptr()
        if self.family.held == 2:
            ptrs |= extra[0].data_ptr()  # the backward's saved output (dy's layout)
        if self._layout_ok and self.smem_error is None and (ptrs & (ALIGN_BYTES - 1)) == 0:
            if self._started:
                return super().__call__(x, y, *extra)
            try:
                done = super().__call__(x, y, *extra)
                self._started = True
                return done
            except Exception as e:  # nothing ran: compiling or loading the kernel failed
                if not self._may_give_up:
                    raise
                self.smem_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                warnings.warn(f"tritonsoftmax: the {self.family.name} kernel failed on {self.device.name} "
                              f"({self.smem_error}); running the coop family's kernel instead", RuntimeWarning,
                              stacklevel=2)
        self.fallbacks += 1
        if self._coop is None:
            self._coop = self.family.fallback.prepare(self.problem, None, self.device, flags=self._flags,
                                                      two_phase=self._two_phase)
        return self._coop(x, y, *extra)


class SmemFamily(CoopFamily):
    """A smem family (forward or backward): ``prepare`` gives a :class:`SmemLaunch`. ``held``: the
    tensors whose chunks a program keeps in shared memory; ``fallback``: the coop family that runs
    the calls the kernel cannot take. Its heuristic also takes the input's dtype."""

    departs_per_word = True  # coop.per_word_departure: smem's programs depart word by word

    def __init__(self, name: str, kernel, heuristic, held: int, fallback: CoopFamily):
        super().__init__(name, kernel, heuristic, configs=_config_space(held))
        self.held, self.fallback = held, fallback

    def default_config(self, device: DeviceInfo, problem: RowProblem) -> LaunchConfig:
        """The heuristic, told the input's dtype (the backward sizes its chunks in bytes)."""
        return self.heuristic(device, problem.M, problem.N, problem.dtype)

    def dispatched_form(self, problem: RowProblem, config: LaunchConfig, device: DeviceInfo) -> LaunchConfig:
        """A config sized on the N bucket (stored, ruled or the heuristic's) as a launch the dispatcher chose runs
        it: cut to the row (balanced_config, with LEAD for rows off 128-byte lines), registers capped by what the
        chunks' shared memory leaves (register_capped), the forward's late rows staggered in a launch of less than
        a wave (staggered)."""
        itemsize = problem.dtype.itemsize
        cut = balanced_config(config, problem.N, itemsize, device, line_lead(problem), self.held)
        capped = register_capped(cut, itemsize, self.held, device)
        return staggered(capped, problem, device) if self.held == 1 else capped

    def prepare(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                from_store: bool = False, flags: dict[str, int] | None = None,
                two_phase: bool | None = None) -> SmemLaunch:
        return SmemLaunch(self, problem, config, device, flags, two_phase, from_store)


FAMILY = SmemFamily(IMPL, _softmax_smem_fwd_kernel, _heuristic, held=1, fallback=coop.FAMILY)
BWD_FAMILY = SmemFamily(f"{IMPL}-bwd", _softmax_smem_bwd_kernel, _bwd_heuristic, held=2,
                        fallback=coop.BWD_FAMILY)

# A layout the kernels cannot take runs coop's (SmemLaunch).
launch, launch_backward = launches.family_launchers(FAMILY, BWD_FAMILY)
