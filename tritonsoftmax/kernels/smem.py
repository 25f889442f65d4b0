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
exchange.py), which the 16-bit backward's heuristic config takes by backward_cluster's rule.

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

from ..config import LaunchConfig
from ..device import DeviceInfo
from ..layout import RowProblem
from . import coop, launches
from .coop import CoopFamily
from .exchange import cluster_arrive, finish_departure, row_max_sum, row_sum, take_ticket
from .launch_modes import NO_MODES, LaunchModes
from .row_ops import exp, grad_input, grad_term, load_f32, ref_max, row_offsets, store_out
from .smem_launch import (
    SmemLaunch,
    balanced_config,
    bwd_heuristic,
    config_space,
    heuristic,
    line_lead,
    register_capped,
    staggered,
)
from .stagger import row_wait

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
except ImportError as e:  # a triton without Gluon or without its NVIDIA backend
    raise ImportError(f"the smem family needs triton's Gluon with the NVIDIA backend ({e})") from e

IMPL = "smem"
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
    the sum's log ``log_s``; ZERO_MASKED: 0 for a row of all -inf, whose sum is 0 (row_ops.finish)."""
    z = gl.fma(x, scale, -m)
    if LOG:
        y = z - log_s
    else:
        y = exp(z) * inv
    if ZERO_MASKED:
        y = gl.where(inv == float("inf"), 0.0, y)
    return y


@gluon.jit
def _edge_max_sum(x_e, lanes, scale, m, s):
    """(m, s) of a chunk's whole vectors (_chunk_max_sum) joined with its partial vectors' elements x_e (fp32,
    the lanes of _edge_lanes)."""
    z = gl.where(lanes, x_e * scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(z, 0))
    m_ref = ref_max(m_new)
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
    m_ref = ref_max(m)
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
    elements: sizing.chunks), this program's ticket (exchange.take_ticket), and the row and the chunk of
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
    through the cluster's shared memory, past the chunk's: exchange.py). STAGGER: 0, or the SM cycles a group of rows
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


class SmemFamily(CoopFamily):
    """A smem family (forward or backward): ``prepare`` gives a :class:`SmemLaunch`. ``held``: the
    tensors whose chunks a program keeps in shared memory; ``fallback``: the coop family that runs
    the calls the kernel cannot take. Its heuristic also takes the input's dtype."""

    departs_per_word = True  # exchange.per_word_departure: smem's programs depart word by word

    def __init__(self, name: str, kernel, heuristic, held: int, fallback: CoopFamily):
        super().__init__(name, kernel, heuristic, configs=config_space(held))
        self.held, self.fallback = held, fallback

    def default_config(self, device: DeviceInfo, problem: RowProblem) -> LaunchConfig:
        """The heuristic, told the input's dtype (the backward sizes its chunks in bytes)."""
        return self.heuristic(device, problem.M, problem.N, problem.dtype)

    def dispatched_form(self, problem: RowProblem, config: LaunchConfig, device: DeviceInfo,
                        modes: LaunchModes = NO_MODES) -> LaunchConfig:
        """A config sized on the N bucket (stored, ruled or the heuristic's) as a launch the dispatcher chose runs
        it: cut to the row (balanced_config, with LEAD for rows off 128-byte lines), registers capped by what the
        chunks' shared memory leaves (register_capped), the forward's late rows staggered in a launch of less than
        a wave (staggered)."""
        itemsize = problem.dtype.itemsize
        cut = balanced_config(config, problem.N, itemsize, device, line_lead(problem), self.held)
        capped = register_capped(cut, itemsize, self.held, device)
        return staggered(capped, problem, device, modes.stagger) if self.held == 1 else capped

    def prepare(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                from_store: bool = False, flags: dict[str, int] | None = None,
                two_phase: bool | None = None, modes: LaunchModes = NO_MODES) -> SmemLaunch:
        return SmemLaunch(self, problem, config, device, flags, two_phase, from_store, modes)


FAMILY = SmemFamily(IMPL, _softmax_smem_fwd_kernel, heuristic, held=1, fallback=coop.FAMILY)
BWD_FAMILY = SmemFamily(f"{IMPL}-bwd", _softmax_smem_bwd_kernel, bwd_heuristic, held=2,
                        fallback=coop.BWD_FAMILY)

# A layout the kernels cannot take runs coop's (SmemLaunch).
launch, launch_backward = launches.family_launchers(FAMILY, BWD_FAMILY)
