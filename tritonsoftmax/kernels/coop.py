"""Coop family: the programs of a row cooperate in one launch, so each element is read from DRAM once.

A row is cut into G chunks of TILES x BLOCK elements, one program per chunk. With TILES == 1 a
program keeps its chunk in registers: it reduces it to a (max, sum) partial, exchanges it with the
row's other programs (exchange.py: through a workspace, or a CTA cluster's shared memory), combines
them and writes its chunk from registers. With TILES > 1 (rows too long for G <= SM-count chunks held
on chip) it reduces the chunk tile by tile and re-reads it after the exchange, last tile first.

The launch forms (coop_launch.CoopLaunch) are tried in order: cluster (sm_90+, G of 2-16), resident
(a CUDA cooperative launch when every program fits at once: program ids, no tickets), ticketed, and
two-phase (PHASE 1 publishes, PHASE 2 writes: under the interpreter, where programs run one after
another and would wait for each other forever). PHASE 0 is the cooperative single launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..config import LaunchConfig, n_bucket, next_power_of_2
from ..device import DeviceInfo
from ..layout import RowProblem
from . import launches, sizing
from .coop_launch import CoopLaunch
from .exchange import (
    cluster_arrive,
    cluster_mode,
    finish_departure,
    max_chunks,
    row_max_sum,
    row_sum,
    take_ticket,
)
from .kernel_family import Family
from .launch_modes import NO_MODES, LaunchModes
from .row_ops import (
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
    ref_max,
    row_bases,
    row_scale,
    tile_mask,
    tiles_grad_sum,
    tiles_grad_write,
    tiles_max_sum,
    tiles_write,
    whole_vectors,
)
from .sizing import chunk_grid, chunks
from .stagger import row_wait

IMPL = "coop"
BLOCKS = (1024, 2048, 4096, 8192, 16384)
# The heuristic's chunk: COOP_CHUNK elements a program (fp32: 32 KB, 64 values a thread of 4 warps, held in registers
# while the row's programs wait for each other), narrower until the rows give COOP_PROGRAMS_PER_SM programs an SM.
COOP_CHUNK = 8192
COOP_PROGRAMS_PER_SM = 4


@triton.jit
def held_output(z, e, m, m_r, s_r, LOG: tl.constexpr, ZERO_MASKED: tl.constexpr):
    """The output of values held in registers: scaled inputs ``z`` and e = exp(z - m) taken
    against the chunk's max ``m``, given the row's (m_r, s_r). Softmax rescales the exponentials
    already taken, exp(z - m_r) = e * exp(m - m_r); log_softmax uses finish."""
    if LOG:
        return finish(z, m_r, s_r, LOG, ZERO_MASKED)
    else:
        y = e * (exp(m - m_r) / s_r)
        if ZERO_MASKED:  # the rows of all -inf: a sum of 0 (row_ops.finish)
            y = tl.where(s_r == 0.0, 0.0, y)
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
    STAGGER_GROUPS: tl.constexpr = 2, ROW_SCALE: tl.constexpr = 0,
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
    ids for tickets, the exchange through the cluster's shared memory (exchange.py), ws_ptr and sync_ptr
    not touched; the launch gives exchange.cluster_smem_bytes(BLOCK_G) bytes of dynamic shared memory for it.
    FULL: 1 when every chunk is whole (held, TILES 1, on the plain path, ALIGN 1, with N a multiple of
    BLOCK; set by PreparedLaunch from constexprs.whole_chunks): loads and stores without a mask.
    STAGGER, STAGGER_GROUPS: as in the smem forward (stagger.row_wait; CoopLaunch sets STAGGER in resident mode,
    with two groups: rows M/2 .. M - 1 wait STAGGER cycles before their loads). ROW_SCALE: as in the fused
    kernel (one scale a row).
    """
    N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner = whole_vectors(
        N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, VEC)
    G = tl.cdiv(N, TILES * BLOCK)
    started = cluster_arrive() if CLUSTER else 0
    ticket = take_ticket(sync_ptr, M * G, PHASE, RESIDENT or CLUSTER)
    row = ticket // G
    chunk = ticket % G
    scale = row_scale(scale, row, ROW_SCALE)
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
        m_ref = ref_max(m)
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
                        ZERO_MASKED, BLOCK, TILES, HINTS, ALIGN, 1)
    finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE, PER_WORD)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_coop_bwd_kernel(
    dy_ptr, dx_ptr, ws_ptr, sync_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr, PHASE: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1, RESIDENT: tl.constexpr = 0, PER_WORD: tl.constexpr = 0,
    VEC: tl.constexpr = 1, CLUSTER: tl.constexpr = 0, ROW_SCALE: tl.constexpr = 0,
):
    """Backward with the G programs of a row cooperating: each sums grad_term(dy, y) over its
    chunk, publishes it (exchange_sum: one int64 word a program, 2 floats of ws), waits for its
    row's words, adds them and writes dx = grad_input(...) (from registers when TILES == 1, else
    re-reading, last tile first).

    dy_ptr/y_ptr share stride_g_*; dx_ptr uses stride_d_*; the rest as in the forward (ALIGN > 1: dy,
    y and dx in one layout).
    VEC: as in the fused kernel (rows of whole VEC-element vectors, constexprs.row_vec).
    CLUSTER: 1 when the launch is a cluster launch of G programs a row (cluster_mode; PHASE 0): program
    ids for tickets, the exchange through the cluster's shared memory (exchange.py), ws_ptr and sync_ptr
    not touched; the launch gives exchange.cluster_smem_bytes(BLOCK_G) bytes of dynamic shared memory for it.
    """
    N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner = whole_vectors(
        N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner, VEC)
    G = tl.cdiv(N, TILES * BLOCK)
    started = cluster_arrive() if CLUSTER else 0
    ticket = take_ticket(sync_ptr, M * G, PHASE, RESIDENT or CLUSTER)
    row = ticket // G
    chunk = ticket % G
    scale = row_scale(scale, row, ROW_SCALE)
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
                             LOG, BLOCK, TILES, HINTS, ALIGN, 1)
    finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE, PER_WORD)


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


# Few rows (fewer than CLUSTER_ROWS_PER_SM an SM) whose row is a cluster's worth of COOP_CHUNK chunks run as one CTA
# cluster a row with 8-warp programs: the exchange stays in the cluster's shared memory, and a row's few wide programs
# start together (what the tuner picks for few 16-bit rows of 16K-128K elements on the H200).
CLUSTER_ROWS_PER_SM = 2
CLUSTER_WARPS = 8


def _heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    """Forward: few rows a cluster's worth of COOP_CHUNK chunks each, on a GPU with clusters: COOP_CHUNK chunks,
    CLUSTER_WARPS warps, cluster mode. Else 4 warps (up to 64 fp32 values a thread: more loads in flight a program)."""
    wide = shape_config(device, N, COOP_CHUNK, CLUSTER_WARPS).with_meta(CLUSTER=1)
    if M < CLUSTER_ROWS_PER_SM * device.sm_count and N > COOP_CHUNK and cluster_mode(wide, chunks(N, dict(wide.meta)),
                                                                                      device, False):
        return wide
    return shape_config(device, N, _chunk(device, M, N), 4)


def _bwd_heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    """Backward (two tensors held): 8 warps for a full chunk (4096x65536 fp32 3818 GB/s), 4 below."""
    block = _chunk(device, M, N, tensors=2)
    return shape_config(device, N, block, 8 if block >= COOP_CHUNK else 4)


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
                two_phase: bool | None = None, modes: LaunchModes = NO_MODES) -> CoopLaunch:
        return CoopLaunch(self, problem, config, device, flags, two_phase, modes)


FAMILY = CoopFamily(IMPL, _softmax_coop_fwd_kernel, _heuristic, staggers=True)
BWD_FAMILY = CoopFamily(f"{IMPL}-bwd", _softmax_coop_bwd_kernel, _bwd_heuristic)


launch, launch_backward = launches.family_launchers(FAMILY, BWD_FAMILY)
