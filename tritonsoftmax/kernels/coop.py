"""Coop family: the programs of a row cooperate in one launch, so each element is read from DRAM once.

A row is cut into G chunks of TILES x BLOCK elements, one program per chunk. With TILES == 1 a
program keeps its chunk in registers: it reduces it to a (max, sum) partial, publishes the partial
to a workspace as one 64-bit word, waits until its row's G words are there (row_words: no
barrier counter, no fence), combines them and writes its chunk from registers. With TILES > 1
(rows too long for G <= SM-count chunks held on chip) it reduces the chunk tile by tile and
re-reads it after the exchange, last tile first.

Forward progress: each program takes a ticket from an atomic counter when it starts and works
on chunk ticket % G of row ticket // G. Tickets go out in start order, so a waiting program only
waits for partners that already run or that can start: when a row still has chunks without a
program, no later row has one, so every resident program belongs to that row; with G at most the
SM count there is a free slot for the next one. The ticket counter resets itself (its last holder
sets it to 0), and a row's last program to leave zeroes the row's words and departure counter
(with depart's PER_WORD, each word's last reader zeroes that word and its counter), so one zeroed
buffer per (device, stream) serves every launch on that stream and no program waits for anything
on its way out.

On CUDA, when the compiled kernel's occupancy holds all M x G programs at once, the launch is a
CUDA cooperative launch instead (the driver then runs every program together, or refuses the
launch), and program ids replace tickets (RESIDENT): the ticket's atomic round trip before the
first load is gone, which is a visible share of a few-microsecond launch over few long rows.

On NVIDIA sm_90+, a config with CLUSTER 1 whose rows make 2-16 chunks runs each row's programs as
one CTA cluster instead (cluster_mode): the partials go through the cluster's shared memory
(cluster.py), the hardware starts a cluster's programs together, and neither tickets nor the
workspace are used: shared memory across the cluster answers faster than an L2 round trip.

Programs that wait for each other deadlock under the Triton interpreter, which runs programs one
after another. There (and whenever ``two_phase`` is asked for) the same kernel runs as two
launches: PHASE 1 publishes the partials, PHASE 2 combines and writes; PHASE 0 is the cooperative
single launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from ..config import LaunchConfig, n_bucket, next_power_of_2
from ..device import DeviceInfo, interpreter_active
from ..layout import RowProblem
from . import launches, sizing
from .cluster import cluster_arrive, cluster_max_sum, cluster_smem_bytes, cluster_sum
from .kernel_family import Family
from .launches import PreparedLaunch
from .row_ops import (
    combine_max_sum,
    edge_lanes,
    edges_grad_sum,
    edges_grad_write,
    edges_max_sum,
    edges_write,
    exp,
    finish,
    grad_input,
    grad_term,
    load_f32,
    load_scaled,
    row_bases,
    tile_mask,
    tiles_grad_sum,
    tiles_grad_write,
    tiles_max_sum,
    tiles_write,
    whole_vectors,
)
from .sizing import chunk_grid, chunks
from .stagger import row_wait, stagger_meta

try:  # the backend a kernel is compiled for, asked at compile time (poll_words)
    from triton.language.target_info import is_hip
except ImportError as e:  # triton before 3.4
    raise ImportError(f"the coop family needs triton >= 3.6 ({e})") from e

IMPL = "coop"
BLOCKS = (1024, 2048, 4096, 8192, 16384)
# The heuristic's chunk: COOP_CHUNK elements a program (fp32: 32 KB, 64 values a thread of 4 warps, held in registers
# while the row's programs wait for each other), narrower until the rows give COOP_PROGRAMS_PER_SM programs an SM.
COOP_CHUNK = 8192
COOP_PROGRAMS_PER_SM = 4
NEG_INF = tl.constexpr(float("-inf"))
WORD_FLOATS = 2  # workspace floats a program: one int64 word (publish_word)
PER_WORD_CHUNKS = (8, 16)  # per_word_departure: the chunks a row may have
PER_WORD_ROWS_PER_SM = 4  # per_word_departure: the rows an SM it needs at least
COOPERATIVE_LAUNCH = {"launch_cooperative_grid": 1}  # CUDA launch option: every program resident at once
CLUSTER_SIZES = range(2, 17)  # chunks a row in cluster mode: 8 is CUDA's portable most, 16 the H100/H200's
CLUSTER_MIN_SM = 90  # distributed shared memory and barrier.cluster: sm_90+
CLUSTER_MIN_WARPS = 2  # a one-warp program's reductions need no shared memory, and then Triton declares none


@triton.jit
def take_ticket(sync_ptr, total, PHASE: tl.constexpr, RESIDENT: tl.constexpr):
    """This program's ticket: start order in the cooperative launch (PHASE 0), else its program id
    (also in PHASE 0 with RESIDENT, a launch whose programs CUDA runs all at once, so that start
    order cannot matter and the ticket's atomic round trip before the first load is saved).

    sync_ptr[0] counts tickets; the holder of the last one (total - 1) sets it back to 0."""
    if PHASE == 0 and not RESIDENT:
        ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
        tl.store(sync_ptr, 0, mask=ticket == total - 1)
    else:
        ticket = tl.program_id(0)
    return ticket


@triton.jit
def low_bits(x):
    """A float32's bits as the low half of an int64 (high half 0)."""
    return x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF


@triton.jit
def pack_pair(lo, hi):
    """One 64-bit word holding two float32 values' bits: ``lo`` in the low half, ``hi`` in the high
    half (little-endian, so the word reads back as the floats pair[0] = lo, pair[1] = hi)."""
    return (low_bits(hi) << 32) | low_bits(lo)


@triton.jit
def unpack_pair(v):
    """The two float32 values of pack_pair's words ``v``: (low half, high half)."""
    lo = (v & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    hi = (v >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def publish_word(ws_ptr, ticket, word, PHASE: tl.constexpr):
    """Write this program's ``word`` (never 0) to its slot: ws_ptr, the float32 workspace read as
    int64, one word a program, all 0 when a launch starts (PHASE 0: a relaxed exchange, so that
    the word is written whole for the polls of row_words; else a store)."""
    words = ws_ptr.to(tl.pointer_type(tl.int64))
    if PHASE == 0:
        tl.atomic_xchg(words + ticket, word, sem="relaxed")
    else:
        tl.store(words + ticket, word)


@triton.jit
def row_words(ws_ptr, row, G, gs, WAIT: tl.constexpr):
    """The G words of a row over the chunk indices ``gs`` (0 .. BLOCK_G - 1, in the layout the caller
    wants; lanes at or past G read as 1). WAIT (the single launch): polled until none is 0.

    That is the whole exchange: no barrier counter, no fence. A word carries its partial itself, so
    it is read whole (a relaxed 64-bit exchange against volatile 64-bit loads) and is valid once
    non-zero, where a counter barrier with release/acquire atomics would add its own round trips after
    the row's last arrival. The words go back to 0 through depart."""
    words = ws_ptr.to(tl.pointer_type(tl.int64)) + row * G + gs
    if WAIT:
        v = poll_words(words, gs < G)
        missing = tl.sum((v == 0).to(tl.int32), axis=0)
        while missing > 0:
            v = poll_words(words, gs < G)
            missing = tl.sum((v == 0).to(tl.int32), axis=0)
        # Where the layout holds a lane in several threads (BLOCK_G under the program's threads), each copy polls
        # on its own and the reduction may take its count from one copy only (triton 3.9 does: two warps' counts
        # share one shared-memory slot), so the loop can end while another copy still holds a 0. A lane still at 0
        # looks once more: its word is non-zero by now (a copy saw it so; words leave 0 once a launch).
        v = tl.where(v == 0, poll_words(words, (gs < G) & (v == 0)), v)
    else:
        v = tl.load(words, mask=gs < G, other=1)
    return v


@triton.jit
def poll_words(words, mask):
    """One look at the words (masked lanes 1) that sees other programs' latest writes: a volatile
    load on NVIDIA (ld.volatile, served by L2); on AMD a relaxed atomic add of 0, since Triton
    gives a volatile load there no cache-coherence bits (compiled for gfx90a/gfx942: a plain
    buffer_load, which a CU's L1 may answer with a stale line forever). LLVM may lower the add of 0
    to a device-scope atomic load, which has the bits (triton 3.6 on gfx90a and gfx1100: glc)."""
    if is_hip():
        v = tl.where(mask, tl.atomic_add(words, 0, mask=mask, sem="relaxed"), 1)
    else:
        v = tl.load(words, mask=mask, other=1, volatile=True)
    return v


@triton.jit
def zero_word(sync_ptr):
    """sync_ptr[1], an int32 that is always 0 (nothing writes it), for depart's operand; loaded
    before the word is published, so that it has arrived by the time depart needs it."""
    return tl.load(sync_ptr + 1)


@triton.jit
def depart(ws_ptr, sync_ptr, row, G, gs, after, zero, PER_WORD: tl.constexpr):
    """The single launch's way out of the exchange, called right after the combine.

    The count must not leave before this program's loads of the words (row_words) have returned,
    or the last departer could zero a word that someone still polls. Its operand, 1 + (the bits of
    ``after`` & ``zero``), depends on every word read (``after``: a float32 the caller combined from
    them) and on ``zero`` (zero_word), whose value no compiler knows, so the dependence cannot be
    folded away: no fence is needed for it.

    PER_WORD 0: one count a program on the row's counter (sync_ptr[2 + row]); the row's last
    departer zeroes the row's words and the counter for the next launch, which the kernel boundary
    orders before it. Triton hands a scalar atomic's result to every thread through shared memory
    behind a barrier, so the program waits one L2 round trip here, before its output stores.
    PER_WORD 1: lane g counts this program out of word g (its reader counter sync_ptr[2 + row * G
    + g]), one tensor atomic a lane; with BLOCK_G >= the program's threads (CoopLaunch) no lane is
    replicated, so each thread keeps its own results and nothing waits for them until
    finish_departure, after the stores. G atomics a program instead of 1: worth it for rows of a few chunks
    (per_word_departure), not where G is in the hundreds. Returns what finish_departure takes (the counts
    seen)."""
    one = 1 + (after.to(tl.int32, bitcast=True) & zero)
    if PER_WORD:
        seen = tl.atomic_add(sync_ptr + 2 + row * G + gs, gs * 0 + one, mask=gs < G, sem="relaxed")
    else:
        count_ptr = sync_ptr + 2 + row
        if tl.atomic_add(count_ptr, one, sem="relaxed") == G - 1:
            words = ws_ptr.to(tl.pointer_type(tl.int64))
            tl.store(words + row * G + gs, (gs * 0).to(tl.int64), mask=gs < G)
            tl.store(count_ptr, 0)
        seen = gs * 0
    return seen


@triton.jit
def finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE: tl.constexpr, PER_WORD: tl.constexpr):
    """The end of a PER_WORD departure, at the end of the kernel: the last reader of word g (``seen``
    == G - 1 in lane g) zeroes the word and its counter. Nothing to do otherwise."""
    if PHASE == 0 and PER_WORD:
        if G > 1:
            last = (gs < G) & (seen == G - 1)
            words = ws_ptr.to(tl.pointer_type(tl.int64))
            tl.store(words + row * G + gs, (gs * 0).to(tl.int64), mask=last)
            tl.store(sync_ptr + 2 + row * G + gs, gs * 0, mask=last)


@triton.jit
def _max_sum_of(v, gs, G):
    m_g, s_g = unpack_pair(v)
    return combine_max_sum(tl.where(gs < G, m_g, NEG_INF), tl.where(gs < G, s_g, 0.0))


@triton.jit
def _sum_of(v, gs, G):
    part_g, _ = unpack_pair(v)
    return tl.sum(tl.where(gs < G, part_g, 0.0), axis=0)


@triton.jit
def exchange_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, PHASE: tl.constexpr, PER_WORD: tl.constexpr):
    """The row's (max, sum) from this program's chunk partial (m, s). The word exchanged is
    pack_pair(m, s), never 0 (s >= 1 when m is finite, as the chunk's max adds exp(0); m = -inf,
    +inf or NaN has non-zero bits): publish_word, row_words, depart. PHASE 1 only publishes and
    returns (m, s); PHASE 2 only combines (m and s are not read; CoopLaunch zeroes the words after
    it). A one-chunk row (G == 1) in the single launch returns (m, s) as they are: no workspace, no
    exchange (smem's one-chunk rows). Also returns the counts depart saw, for
    finish_departure (PER_WORD: see depart)."""
    seen = gs * 0
    if PHASE == 0:
        if G > 1:
            zero = zero_word(sync_ptr)
            publish_word(ws_ptr, ticket, pack_pair(m, s), PHASE)
            m, s = _max_sum_of(row_words(ws_ptr, row, G, gs, True), gs, G)
            seen = depart(ws_ptr, sync_ptr, row, G, gs, s, zero, PER_WORD)
    elif PHASE == 1:
        publish_word(ws_ptr, ticket, pack_pair(m, s), PHASE)
    else:
        m, s = _max_sum_of(row_words(ws_ptr, row, G, gs, False), gs, G)
    return m, s, seen


@triton.jit
def exchange_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, PHASE: tl.constexpr, PER_WORD: tl.constexpr):
    """The backward's row sum from this program's partial sum, as exchange_max_sum; the word holds
    the sum's bits in its low half and 1 in its high half, which keeps it non-zero whatever the sum."""
    seen = gs * 0
    if PHASE == 0:
        if G > 1:
            zero = zero_word(sync_ptr)
            publish_word(ws_ptr, ticket, low_bits(part) | (1 << 32), PHASE)
            part = _sum_of(row_words(ws_ptr, row, G, gs, True), gs, G)
            seen = depart(ws_ptr, sync_ptr, row, G, gs, part, zero, PER_WORD)
    elif PHASE == 1:
        publish_word(ws_ptr, ticket, low_bits(part) | (1 << 32), PHASE)
    else:
        part = _sum_of(row_words(ws_ptr, row, G, gs, False), gs, G)
    return part, seen


@triton.jit
def row_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, started, PHASE: tl.constexpr, PER_WORD: tl.constexpr,
                CLUSTER: tl.constexpr, BLOCK_G: tl.constexpr):
    """The row's (max, sum) and the counts for finish_departure, from this program's chunk partial (m, s):
    with CLUSTER through the cluster's shared memory (cluster_max_sum; no departure), else through the
    workspace (exchange_max_sum). ``started``: cluster_arrive's result (0 without CLUSTER)."""
    if CLUSTER:
        m_r, s_r = cluster_max_sum(m, s, G, gs, started, BLOCK_G)
        seen = gs * 0
    else:
        m_r, s_r, seen = exchange_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, PHASE, PER_WORD)
    return m_r, s_r, seen


@triton.jit
def row_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, started, PHASE: tl.constexpr, PER_WORD: tl.constexpr,
            CLUSTER: tl.constexpr, BLOCK_G: tl.constexpr):
    """The backward's row sum and departure counts, as row_max_sum (cluster_sum or exchange_sum)."""
    if CLUSTER:
        red = cluster_sum(part, G, gs, started, BLOCK_G)
        seen = gs * 0
    else:
        red, seen = exchange_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, PHASE, PER_WORD)
    return red, seen


@triton.jit
def held_output(z, e, m, m_r, s_r, LOG: tl.constexpr, ZERO_MASKED: tl.constexpr):
    """The output of values held in registers: scaled inputs ``z`` and e = exp(z - m) taken
    against the chunk's max ``m``, given the row's (m_r, s_r). Softmax rescales the exponentials
    already taken, exp(z - m_r) = e * exp(m - m_r); log_softmax uses finish."""
    if LOG:
        return finish(z, m_r, s_r, LOG, ZERO_MASKED)
    else:
        y = e * (exp(m - m_r) / s_r)
        if ZERO_MASKED:
            y = tl.where(m_r == NEG_INF, 0.0, y)
        return y


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_coop_fwd_kernel(
    x_ptr, y_ptr, ws_ptr, sync_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr, PHASE: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1, RESIDENT: tl.constexpr = 0, PER_WORD: tl.constexpr = 0,
    VEC: tl.constexpr = 1, CLUSTER: tl.constexpr = 0, FULL: tl.constexpr = 0, STAGGER: tl.constexpr = 0,
    STAGGER_GROUPS: tl.constexpr = 2,
):
    """Softmax (log_softmax, LOG) with the G = cdiv(N, TILES * BLOCK) programs of a row cooperating.

    x_ptr, y_ptr, scale, M, N, INNER, stride_*, LOG, ZERO_MASKED: as in the fused kernel.
    ws_ptr: float32, 2 words per program (ticket t: ws[2t] = chunk max, ws[2t + 1] = sum of
    exp(z - max) over the chunk; one int64 word to publish_word, 0 when a launch starts and
    ends). sync_ptr: int32, [0] the ticket counter, [1] always 0 (zero_word), [2 + r] row r's
    departure counter, or with PER_WORD [2 + t] word t's reader counter (all 0 when a launch
    starts and ends).
    BLOCK: tile width; TILES: tiles per chunk (1: the chunk stays in registers, one read, its
    exponentials rescaled rather than taken again); BLOCK_G: power of two >= G. PHASE: 0
    cooperative, 1 partials only, 2 combine and write only (the two-launch mode). HINTS: L2 eviction
    hints on the two reads when TILES > 1 (0 gives plain loads). ALIGN: as in the fused kernel;
    chunks are cut from the realigned row's window (row_ops.row_window), chunk 0 also takes the
    head group and chunk G - 1 the tail group. RESIDENT: 1 when the launch is a CUDA cooperative
    launch (every program resident at once): program ids replace tickets (take_ticket). PER_WORD:
    how programs leave the exchange (depart; BLOCK_G >= the program's threads when 1).
    VEC: as in the fused kernel (rows of whole VEC-element vectors, constexprs.row_vec).
    CLUSTER: 1 when the launch is a cluster launch of G programs a row (cluster_mode; PHASE 0): program
    ids for tickets, the exchange through the cluster's shared memory (cluster.py), ws_ptr and sync_ptr
    not touched; the launch gives cluster.cluster_smem_bytes(BLOCK_G) bytes of dynamic shared memory for it.
    FULL: 1 when every chunk is whole (held, TILES 1, on the plain path, ALIGN 1, with N a multiple of
    BLOCK; set by PreparedLaunch from constexprs.whole_chunks): loads and stores without a mask.
    STAGGER, STAGGER_GROUPS: as in the smem forward (stagger.row_wait; CoopLaunch sets STAGGER in resident mode,
    with two groups: rows M/2 .. M - 1 wait STAGGER cycles before their loads).
    """
    N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner = whole_vectors(
        N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, VEC)
    G = tl.cdiv(N, TILES * BLOCK)
    started = cluster_arrive() if CLUSTER else 0
    ticket = take_ticket(sync_ptr, M * G, PHASE, RESIDENT or CLUSTER)
    row = ticket // G
    chunk = ticket % G
    first = chunk * (TILES * BLOCK)
    x_base, y_base, shift, lo, hi, tail, end = row_bases(row, INNER, stride_x_outer, stride_x_inner,
                                                         stride_y_outer, stride_y_inner, N, ALIGN)
    if STAGGER > 0:  # the late rows' loads wait (the wait's 0 added to their base in whole 128-element steps)
        x_base += (row_wait(row, M, STAGGER, STAGGER_GROUPS) // 128) * 128
    x_row = x_ptr + x_base
    offs = tl.arange(0, BLOCK)
    pos_e, mask_e = edge_lanes(shift, lo, tail, end, chunk == 0, chunk == G - 1, ALIGN)  # used when ALIGN > 1
    tl.static_assert(BLOCK % ALIGN == 0, "a chunk must hold whole ALIGN-element groups")
    tl.static_assert(not FULL or (TILES == 1 and ALIGN == 1), "FULL: held chunks on the plain path only")
    if TILES == 1:
        mask = None if FULL else tile_mask(first + offs, N, lo, hi, ALIGN)
        z = load_scaled(x_row + (first + offs) * stride_x_col, mask, scale)
        if ALIGN == 1:
            m = tl.max(z, axis=0)
        else:
            z_e = load_scaled(x_row + pos_e, mask_e, scale)
            m = tl.maximum(tl.max(z, axis=0), tl.max(z_e, axis=0))
        m_ref = tl.where(m == NEG_INF, 0.0, m)
        e = exp(z - m_ref)
        s = tl.sum(e, axis=0)
        if ALIGN > 1:
            e_e = exp(z_e - m_ref)
            s += tl.sum(e_e, axis=0)
    else:
        m, s = tiles_max_sum(x_row, stride_x_col, scale, first, N, lo, hi, BLOCK, TILES, HINTS, ALIGN)
        if ALIGN > 1:
            m, s = edges_max_sum(x_row, scale, m, s, shift, lo, tail, end, chunk == 0, chunk == G - 1, ALIGN)
    gs = tl.arange(0, BLOCK_G)
    m_r, s_r, seen = row_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, started, PHASE, PER_WORD, CLUSTER, BLOCK_G)
    if PHASE != 1:
        y_row = y_ptr + y_base
        if TILES == 1:
            y = held_output(z, e, m, m_r, s_r, LOG, ZERO_MASKED)
            tl.store(y_row + (first + offs) * stride_y_col, y.to(y_ptr.dtype.element_ty), mask=mask)
            if ALIGN > 1:
                y_e = held_output(z_e, e_e, m, m_r, s_r, LOG, ZERO_MASKED)
                tl.store(y_row + pos_e, y_e.to(y_ptr.dtype.element_ty), mask=mask_e)
        else:
            if ALIGN > 1:
                edges_write(x_row, y_row, scale, m_r, s_r, shift, lo, tail, end, chunk == 0, chunk == G - 1, LOG,
                            ZERO_MASKED, ALIGN)
            tiles_write(x_row, y_row, stride_x_col, stride_y_col, scale, m_r, s_r, first, N, lo, hi, LOG,
                        ZERO_MASKED, BLOCK, TILES, HINTS, ALIGN)
    finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE, PER_WORD)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_coop_bwd_kernel(
    dy_ptr, dx_ptr, ws_ptr, sync_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr, PHASE: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1, RESIDENT: tl.constexpr = 0, PER_WORD: tl.constexpr = 0,
    VEC: tl.constexpr = 1, CLUSTER: tl.constexpr = 0,
):
    """Backward with the G programs of a row cooperating: each sums grad_term(dy, y) over its
    chunk, publishes it (exchange_sum: one int64 word a program, 2 floats of ws), waits for its
    row's words, adds them and writes dx = grad_input(...) (from registers when TILES == 1, else
    re-reading, last tile first).

    dy_ptr/y_ptr share stride_g_*; dx_ptr uses stride_d_*; the rest as in the forward (ALIGN > 1: dy,
    y and dx in one layout).
    VEC: as in the fused kernel (rows of whole VEC-element vectors, constexprs.row_vec).
    CLUSTER: 1 when the launch is a cluster launch of G programs a row (cluster_mode; PHASE 0): program
    ids for tickets, the exchange through the cluster's shared memory (cluster.py), ws_ptr and sync_ptr
    not touched; the launch gives cluster.cluster_smem_bytes(BLOCK_G) bytes of dynamic shared memory for it.
    """
    N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner = whole_vectors(
        N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner, VEC)
    G = tl.cdiv(N, TILES * BLOCK)
    started = cluster_arrive() if CLUSTER else 0
    ticket = take_ticket(sync_ptr, M * G, PHASE, RESIDENT or CLUSTER)
    row = ticket // G
    chunk = ticket % G
    first = chunk * (TILES * BLOCK)
    g_row, d_base, shift, lo, hi, tail, end = row_bases(row, INNER, stride_g_outer, stride_g_inner,
                                                        stride_d_outer, stride_d_inner, N, ALIGN)
    offs = tl.arange(0, BLOCK)
    pos_e, mask_e = edge_lanes(shift, lo, tail, end, chunk == 0, chunk == G - 1, ALIGN)  # used when ALIGN > 1
    tl.static_assert(BLOCK % ALIGN == 0, "a chunk must hold whole ALIGN-element groups")
    if TILES == 1:
        mask = tile_mask(first + offs, N, lo, hi, ALIGN)
        dy = load_f32(dy_ptr + g_row + (first + offs) * stride_g_col, mask)
        y = load_f32(y_ptr + g_row + (first + offs) * stride_g_col, mask)
        if ALIGN > 1:  # loaded before the first sum: its barrier would hold these loads back a round trip
            dy_e = load_f32(dy_ptr + g_row + pos_e, mask_e)
            y_e = load_f32(y_ptr + g_row + pos_e, mask_e)
        part = tl.sum(grad_term(dy, y, LOG), axis=0)
        if ALIGN > 1:
            part += tl.sum(grad_term(dy_e, y_e, LOG), axis=0)
    else:
        part = tiles_grad_sum(dy_ptr, y_ptr, g_row, stride_g_col, first, N, lo, hi, LOG, BLOCK, TILES, HINTS, ALIGN)
        if ALIGN > 1:
            part += edges_grad_sum(dy_ptr, y_ptr, g_row, shift, lo, tail, end, chunk == 0, chunk == G - 1, LOG,
                                   ALIGN)
    gs = tl.arange(0, BLOCK_G)
    red, seen = row_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, started, PHASE, PER_WORD, CLUSTER, BLOCK_G)
    if PHASE != 1:
        d_row = dx_ptr + d_base
        if TILES == 1:
            dx = grad_input(dy, y, red, scale, LOG)
            tl.store(d_row + (first + offs) * stride_d_col, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if ALIGN > 1:
                dx_e = grad_input(dy_e, y_e, red, scale, LOG)
                tl.store(d_row + pos_e, dx_e.to(dx_ptr.dtype.element_ty), mask=mask_e)
        else:
            if ALIGN > 1:
                edges_grad_write(dy_ptr, y_ptr, d_row, g_row, red, scale, shift, lo, tail, end, chunk == 0,
                                 chunk == G - 1, LOG, ALIGN)
            tiles_grad_write(dy_ptr, y_ptr, d_row, g_row, stride_g_col, stride_d_col, red, scale, first, N, lo, hi,
                             LOG, BLOCK, TILES, HINTS, ALIGN)
    finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE, PER_WORD)


def max_chunks(device: DeviceInfo) -> int:
    """The most programs a row may have: the forward-progress argument needs G <= SM count."""
    return max(1, device.sm_count)


def has_clusters(device: DeviceInfo) -> bool:
    """The device runs CTA clusters that exchange through distributed shared memory: NVIDIA sm_90+."""
    return device.backend == "cuda" and device.sm_version >= CLUSTER_MIN_SM


def cluster_mode(config: LaunchConfig, G: int, device: DeviceInfo, two_phase: bool) -> bool:
    """Whether a single launch runs each row's G programs as one CTA cluster that exchanges through
    shared memory (cluster.py): asked for by the config (CLUSTER 1), on NVIDIA sm_90+, with G one of
    CLUSTER_SIZES and at least CLUSTER_MIN_WARPS warps (cluster.py finds its slots from Triton's
    shared memory symbol, which a kernel that uses no shared memory lacks)."""
    return (bool(dict(config.meta).get("CLUSTER")) and not two_phase and has_clusters(device) and G in CLUSTER_SIZES
            and config.num_warps >= CLUSTER_MIN_WARPS)


def per_word_departure(G: int, M: int, device: DeviceInfo) -> bool:
    """Whether a single launch of a family that departs_per_word (smem) has its programs leave the
    exchange word by word (depart's PER_WORD): rows of PER_WORD_CHUNKS chunks, at least
    PER_WORD_ROWS_PER_SM rows an SM. Many rows of a few chunks gain from not waiting on one counter
    before their stores; with G in the tens or hundreds every program would add to G counters."""
    return PER_WORD_CHUNKS[0] <= G <= PER_WORD_CHUNKS[1] and M >= PER_WORD_ROWS_PER_SM * device.sm_count


def shape_config(device: DeviceInfo, N: int, block: int, num_warps: int, min_tiles: int = 1) -> LaunchConfig:
    """TILES and BLOCK_G for a BLOCK, sized on the N bucket (so one config serves the bucket):
    ``min_tiles`` tiles a chunk (coop: 1; smem holds several in shared memory) while the row fits in
    max_chunks chunks, else as many tiles as it takes."""
    nb = n_bucket(N)
    tiles = max(min_tiles, next_power_of_2(triton.cdiv(nb, block * max_chunks(device))))
    num_warps = min(num_warps, device.max_threads_per_program // device.warp_size)
    return LaunchConfig.make(num_warps, BLOCK=block, TILES=tiles,
                             BLOCK_G=next_power_of_2(triton.cdiv(nb, block * tiles)))


def _configs(device: DeviceInfo, M: int, N: int) -> list[LaunchConfig]:
    """Every BLOCK with 4-64 values a thread; where the device has clusters and a row's chunks make
    one (CLUSTER_SIZES), each such config also in cluster mode (CLUSTER 1)."""
    out = []
    for block in BLOCKS:
        if block > max(BLOCKS[0], next_power_of_2(N)):
            continue
        for nw in sizing.warp_choices(device, block, min_per_thread=4, max_per_thread=64):
            out += with_cluster_mode(shape_config(device, N, block, nw), N, device)
    return sizing.with_backend_options(device, out)


def with_cluster_mode(config: LaunchConfig, N: int, device: DeviceInfo) -> list[LaunchConfig]:
    """``config``, and beside it the same in cluster mode (CLUSTER 1) where cluster_mode allows it for
    rows of N elements: the search spaces of coop and smem."""
    clustered = config.with_meta(CLUSTER=1)
    return [config, clustered] if cluster_mode(clustered, chunks(N, dict(config.meta)), device, False) else [config]


def _chunk(device: DeviceInfo, M: int, N: int, tensors: int = 1) -> int:
    """COOP_CHUNK elements a program, narrower (down to 1024) when M rows would give fewer than
    COOP_PROGRAMS_PER_SM programs per SM; but where a row fits in max_chunks chunks of at most COOP_CHUNK / tensors
    elements (the forward holds x, the backward dy and y), never narrower than that: narrower chunks would need more
    than max_chunks programs a row and so be read twice (TILES > 1). The backward holds two tensors, so its chunks
    are half as long for the same registers."""
    nb = n_bucket(N)
    want = COOP_PROGRAMS_PER_SM * device.sm_count
    block = max(BLOCKS[0], min(COOP_CHUNK, next_power_of_2(triton.cdiv(max(M, 1) * nb, want))))
    held = next_power_of_2(triton.cdiv(nb, max_chunks(device)))
    if held * tensors <= COOP_CHUNK:
        block = max(block, held)
    return min(block, max(BLOCKS[0], next_power_of_2(N)))


def _heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    """Forward: 4 warps (up to 64 fp32 values a thread: more loads in flight per program measured
    best on the H200, 4096x65536 fp32 3458 GB/s against 3286 with 8 warps)."""
    return shape_config(device, N, _chunk(device, M, N), 4)


def _bwd_heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    """Backward (two tensors held): 8 warps for a full chunk (4096x65536 fp32 3818 GB/s), 4 below."""
    block = _chunk(device, M, N, tensors=2)
    return shape_config(device, N, block, 8 if block >= COOP_CHUNK else 4)


_scratch: dict = {}  # (device index, stream) -> (ws float32 view, sync int32 view, ws words, sync words)


def scratch(device: torch.device, ws_words: int, sync_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The workspace and the counters for a launch on ``device``'s current stream.

    One buffer per (device, stream), zeroed when made and grown when a launch needs more; every
    launch leaves it zeroed again (depart; CoopLaunch after two phases). Launches on one
    stream run one after another, so they can share it. During CUDA-graph capture a fresh buffer
    is made (its zero fill is captured too) and not kept."""
    if device.type == "cuda":  # a tensor's device: its index is always set
        key = (device.index, driver.active.get_current_stream(device.index))
    else:
        key = (device.type, 0)
    found = _scratch.get(key)
    if found is not None and found[2] >= ws_words and found[3] >= sync_words:
        return found[0], found[1]
    ws_cap = max(ws_words, 2 * (found[2] if found else 0), 4096)
    ws_cap = -(-ws_cap // 4) * 4  # the counters start 16-byte aligned
    sync_cap = max(sync_words, 2 * (found[3] if found else 0), 1024)
    buf = torch.zeros(ws_cap + sync_cap, device=device, dtype=torch.float32)
    views = (buf[:ws_cap], buf[ws_cap:].view(torch.int32), ws_cap, sync_cap)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _scratch[key] = views
    return views[0], views[1]


def release_scratch() -> None:
    """Drop every kept buffer (the next launch on a stream makes a new zeroed one)."""
    _scratch.clear()


class CoopLaunch:
    """The coop kernel on one problem, ready to start again and again (see PreparedLaunch).

    One launch on a GPU; two launches (PHASE 1, then 2) under the interpreter or with
    ``two_phase``. On CUDA the single launch is a cooperative one (RESIDENT, no tickets) when the
    compiled kernel's occupancy holds every program at once, and a CTA-cluster launch (CLUSTER)
    where cluster_mode allows (``mode`` says which: "cluster", "resident", "ticketed" or
    "two-phase"; decided on the first call: a cluster or cooperative launch that fails to compile
    or start leaves the next mode, with the reason in ``cluster_error`` / ``resident_error``).
    Without a config it uses the heuristic
    (a waiting kernel is not something to hand to Triton's autotuner; ``python -m
    tritonsoftmax.tune --families coop`` times each config and stores the winner). A config is
    checked for enough partial slots (BLOCK_G >= G) and, for the single launch, for forward
    progress (G <= max_chunks)."""

    def __init__(self, family: CoopFamily, problem: RowProblem, config: LaunchConfig | None,
                 device: DeviceInfo, flags: dict[str, int] | None = None, two_phase: bool | None = None):
        self.problem, self.device = problem, device
        self.config = config or family.default_config(device, problem)
        g = chunks(problem.N, dict(self.config.meta))
        if two_phase is None:
            two_phase = interpreter_active()
        if not two_phase and g > max_chunks(device):
            raise ValueError(f"coop config {self.config}: {g} programs a row; at most {max_chunks(device)} "
                             f"(the SM count) can be guaranteed to run together on {device.name}")
        if next_power_of_2(g) > self.config["BLOCK_G"]:
            raise ValueError(f"coop config {self.config}: BLOCK_G must be >= the {g} chunks of a "
                             f"{problem.N}-element row")
        flags = dict(flags or {})
        # What the kernels run: the config, or with depart's PER_WORD a BLOCK_G of at least the
        # program's threads (no lane of the exchange replicated); __call__ returns the config.
        run = self.config
        self.resident_error = self.cluster_error = None
        self._resident = self._cluster = None
        self._idle_scratch = None  # cluster mode: the scratch pointers passed, which the kernel never touches
        if cluster_mode(run, g, device, two_phase):
            self._cluster = PreparedLaunch(family, problem, run, device, flags={**flags, "PHASE": 0},
                                           cluster=g, cluster_smem=cluster_smem_bytes(run["BLOCK_G"]))
        if "CLUSTER" in dict(run.meta):
            run = run.with_meta(CLUSTER=0)
        self.per_word = family.departs_per_word and not two_phase and per_word_departure(g, problem.M, device)
        if self.per_word:
            flags["PER_WORD"] = 1
            run = run.with_meta(BLOCK_G=max(run["BLOCK_G"], run.num_warps * device.warp_size))
        phases = (1, 2) if two_phase else (0,)
        self.launches = [PreparedLaunch(family, problem, run, device, flags={**flags, "PHASE": p})
                         for p in phases]
        self.mode = "two-phase" if two_phase else "ticketed"
        self.programs = problem.M * g
        # What threads and the block limit alone allow (registers only lower it): beyond that the
        # cooperative variant is not even compiled (many rows, e.g. 4096 x G programs).
        at_most = sizing.resident_programs(device, 1, self.config.num_warps, 0) * device.sm_count
        if not two_phase and device.backend == "cuda" and self.programs <= at_most:
            cooperative = run.with_options(**COOPERATIVE_LAUNCH)
            self._resident = PreparedLaunch(family, problem, cooperative, device,
                                            flags={**flags, "PHASE": 0, "RESIDENT": 1})
        # The forward's late rows wait in a resident launch of under a wave (_first_resident_call), unless the
        # config names its own STAGGER.
        self.staggers = family.staggers and "STAGGER" not in dict(self.config.meta)
        self.ws_words = WORD_FLOATS * self.programs
        self.sync_words = 2 + (self.programs if self.per_word else problem.M)  # the departure counters

    @property
    def stagger(self) -> int:
        """The STAGGER the resident launch runs with (0 in any other mode, or before the first call)."""
        return dict(self.launches[0].config.meta).get("STAGGER", 0) if self.mode == "resident" else 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *extra) -> LaunchConfig:
        if self._idle_scratch is not None:  # cluster mode: no per-stream scratch lookup on the warm path
            self.launches[0](x, y, *self._idle_scratch, *extra)
            return self.config
        ws, sync = scratch(x.device, self.ws_words, self.sync_words)
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            try:
                cluster(x, y, ws, sync, *extra)
                self.launches, self.mode, self._resident = [cluster], "cluster", None
                self._idle_scratch = (ws, sync)
                return self.config
            except Exception as e:  # a launch the driver refuses starts nothing; the other modes remain
                self.cluster_error = f"{type(e).__name__}: {e}"
        if self._resident is not None:
            self._first_resident_call(x, y, ws, sync, extra)
            return self.config
        for launch in self.launches:
            launch(x, y, ws, sync, *extra)
        if len(self.launches) > 1:  # PHASE 2 leaves the words it read; the next single launch wants 0
            ws[:self.ws_words].zero_()
        return self.config

    def _first_resident_call(self, x: torch.Tensor, y: torch.Tensor, ws: torch.Tensor, sync: torch.Tensor,
                             extra: tuple) -> None:
        """First call on CUDA: the cooperative launch when all programs fit on the GPU at once (a
        cooperative launch beyond that is refused, so the estimate must not be high; on the H200 it
        matches the driver's limit). Should the driver refuse it anyway (an estimate off on another GPU),
        nothing ran: the ticketed launch takes over for good, and ``resident_error`` keeps the reason. In
        coop's forward (``staggers``) the late half of the rows waits (stagger.stagger_meta, in halves), so that
        DRAM is not idle while every program exchanges at once; cluster mode does not stagger."""
        resident, self._resident = self._resident, None
        try:
            compiled = resident.compile(x, y, ws, sync, *extra)
            per_sm = 0 if compiled is None else sizing.resident_programs(
                self.device, compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared)
            if self.programs <= per_sm * self.device.sm_count:
                meta = stagger_meta(self.problem, self.programs, per_sm, self.device) if self.staggers else {}
                if meta:
                    resident = PreparedLaunch(resident.family, self.problem, resident.config.with_meta(**meta),
                                              self.device, flags=resident.flags)
                resident(x, y, ws, sync, *extra)
                self.launches, self.mode = [resident], "resident"
                return
        except Exception as e:  # a refused cooperative launch starts nothing; the ticketed one is always valid
            self.resident_error = f"{type(e).__name__}: {e}"
        for launch in self.launches:
            launch(x, y, ws, sync, *extra)


class CoopFamily(Family):
    """A coop family as the dispatcher sees it: ``prepare`` gives a :class:`CoopLaunch`.
    ``configs``: the search space (coop's unless another kernel with coop's launch, smem, brings its own)."""

    grid_from_m = True
    # Whether launches take depart's PER_WORD where per_word_departure says so: smem's. Coop's own
    # kernels keep one count a row: their programs hold wide register chunks and gain nothing from it.
    departs_per_word = False

    def __init__(self, name: str, kernel, heuristic, configs=_configs, staggers: bool = False):
        super().__init__(name, kernel, configs, heuristic, chunk_grid)
        self.staggers = staggers  # whether a resident launch staggers its late rows (stagger.py): coop's forward

    def default_config(self, device: DeviceInfo, problem: RowProblem) -> LaunchConfig:
        """The config a launch without a given or stored one runs: the heuristic for the shape."""
        return self.heuristic(device, problem.M, problem.N)

    def prepare(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                from_store: bool = False, flags: dict[str, int] | None = None,
                two_phase: bool | None = None) -> CoopLaunch:
        return CoopLaunch(self, problem, config, device, flags, two_phase)


FAMILY = CoopFamily(IMPL, _softmax_coop_fwd_kernel, _heuristic, staggers=True)
BWD_FAMILY = CoopFamily(f"{IMPL}-bwd", _softmax_coop_bwd_kernel, _bwd_heuristic)


launch, launch_backward = launches.family_launchers(FAMILY, BWD_FAMILY)
