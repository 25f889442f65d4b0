"""Split family: one row spread over many programs, for few long rows.

When M rows cannot fill the GPU, each row is cut into G chunks of TILES x BLOCK elements and
M x G programs run two kernels: the first writes each chunk's (max, sum) partial to a small
workspace, the second combines its row's G partials and writes its chunk. No program waits for
another (safe under the interpreter and on any GPU), partials are combined without a host
round-trip, and when the rows fit in L2 the second read of each chunk comes from cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import LaunchConfig, n_bucket, next_power_of_2
from ..device import DeviceInfo
from ..layout import RowProblem
from . import launches, sizing
from .kernel_family import Family
from .launch_modes import NO_MODES, LaunchModes
from .launches import Launch, PreparedLaunch
from .row_ops import (
    DROP,
    chunk_of,
    combine_partials,
    edges_grad_sum,
    edges_grad_write,
    edges_max_sum,
    edges_write,
    finish,
    gdc_launch_dependents,
    gdc_wait,
    grad_input,
    load_f32,
    load_scaled,
    row_bases,
    row_scale,
    store_out,
    sum_partials,
    tile_mask,
    tiles_grad_sum,
    tiles_grad_write,
    tiles_max_sum,
    tiles_write,
    whole_vectors,
)
from .sizing import chunk_grid, chunks

IMPL = "split"
PROGRAMS_PER_SM = 8  # aim for this many programs per SM across all rows
MAX_CHUNKS = 1024  # partials one program combines (BLOCK_G)
BLOCKS = (1024, 2048, 4096, 8192)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_split_stats_kernel(
    x_ptr, y_ptr, ws_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1, PDL: tl.constexpr = 0,
    VEC: tl.constexpr = 1, ROW_SCALE: tl.constexpr = 0,
):
    """Pass 1: program p takes chunk g = p % G of row p // G (G = cdiv(N, TILES * BLOCK)).

    x_ptr, scale, strides: as in the fused kernel; y_ptr, LOG, ZERO_MASKED, BLOCK_G: unused here
    (one signature and config for both passes). ws_ptr: float32 workspace; ws[2p] = the chunk's
    max m, ws[2p + 1] = sum exp(z - m) over the chunk (row_ops.online_update's invariant: an all -inf
    chunk gives m = -inf, s = 0, never NaN). BLOCK: tile width; TILES: tiles per chunk. HINTS: L2
    eviction hints (this pass evict_last, pass 2 evict_first; 0 gives plain loads). ALIGN: as in
    the fused kernel; chunks are cut from the realigned row's window (row_ops.row_window), chunk 0
    also takes the head group and chunk G - 1 the tail group. PDL: pass 2 is launched as a
    programmatic dependent launch (NVIDIA sm_90+): each program lets it start at once.
    VEC: as in the fused kernel (rows of whole VEC-element vectors, constexprs.row_vec). ROW_SCALE (every
    split kernel takes it; the backward's partial pass has no scale to apply): as in the fused kernel (one scale a
    row).
    """
    N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner = whole_vectors(
        N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, VEC)
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    G, row, g = chunk_of(pid, N, TILES * BLOCK)
    scale = row_scale(scale, row, ROW_SCALE)
    x_base, _, shift, lo, hi, tail, end = row_bases(row, INNER, stride_x_outer, stride_x_inner,
                                                    stride_y_outer, stride_y_inner, N, ALIGN)
    x_row = x_ptr + x_base
    m, s = tiles_max_sum(x_row, stride_x_col, scale, g * (TILES * BLOCK), N, lo, hi, BLOCK, TILES, HINTS, ALIGN)
    if ALIGN > 1:  # chunk 0 owns the row's head group, chunk G - 1 its tail group
        m, s = edges_max_sum(x_row, scale, m, s, shift, lo, tail, end, g == 0, g == G - 1, ALIGN)
    tl.store(ws_ptr + 2 * pid, m)
    tl.store(ws_ptr + 2 * pid + 1, s)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_split_write_kernel(
    x_ptr, y_ptr, ws_ptr, scale, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, ZERO_MASKED: tl.constexpr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1, PDL: tl.constexpr = 0,
    VEC: tl.constexpr = 1, ROW_SCALE: tl.constexpr = 0,
):
    """Pass 2: combine row p // G's G partials into (max m_r, sum s_r), write chunk p % G.

    Arguments as in pass 1; BLOCK_G >= G (power of two); LOG, ZERO_MASKED as in the fused kernel.
    s_r = sum over chunks of s_g * exp(m_g - m_r), an all -inf chunk adding 0. A row of all -inf
    has m_r = -inf and gives NaN, like torch (0 with ZERO_MASKED). Tiles are written last first;
    a one-tile chunk (TILES == 1) is loaded before the partials are read (and, with PDL, before
    waiting for pass 1). PDL: launched as a programmatic dependent launch; it waits for pass 1 (and
    its partials) before reading them.
    VEC: as in the fused kernel (rows of whole VEC-element vectors, constexprs.row_vec).
    """
    N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner = whole_vectors(
        N, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, VEC)
    pid = tl.program_id(0)
    G, row, g = chunk_of(pid, N, TILES * BLOCK)
    scale = row_scale(scale, row, ROW_SCALE)
    x_base, y_base, shift, lo, hi, tail, end = row_bases(row, INNER, stride_x_outer, stride_x_inner,
                                                         stride_y_outer, stride_y_inner, N, ALIGN)
    x_row = x_ptr + x_base
    y_row = y_ptr + y_base
    if TILES == 1:  # x does not depend on pass 1: its one tile is in flight while pass 1 ends
        cols = g * BLOCK + tl.arange(0, BLOCK)
        mask = tile_mask(cols, N, lo, hi, ALIGN)
        z = load_scaled(x_row + cols * stride_x_col, mask, scale, DROP * HINTS)
    if PDL:
        gdc_wait()
    m, s = combine_partials(ws_ptr + 2 * row * G, G, BLOCK_G)
    if ALIGN > 1:
        edges_write(x_row, y_row, scale, m, s, shift, lo, tail, end, g == 0, g == G - 1, LOG, ZERO_MASKED, ALIGN)
    if TILES == 1:
        store_out(y_row + cols * stride_y_col, finish(z, m, s, LOG, ZERO_MASKED), mask, DROP * HINTS)
    else:
        tiles_write(x_row, y_row, stride_x_col, stride_y_col, scale, m, s, g * (TILES * BLOCK), N, lo, hi, LOG,
                    ZERO_MASKED, BLOCK, TILES, HINTS, ALIGN, 1)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_split_bwd_partial_kernel(
    dy_ptr, dx_ptr, ws_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1, PDL: tl.constexpr = 0,
    VEC: tl.constexpr = 1, ROW_SCALE: tl.constexpr = 0,
):
    """Backward pass 1: ws[p] = sum of grad_term(dy, y) over chunk p % G of row p // G.

    dy_ptr/y_ptr share stride_g_*; dx_ptr (unused here) uses stride_d_*; the rest (ALIGN: dy, y and
    dx in one layout; PDL) as in pass 1 of the forward.
    VEC: as in the fused kernel (rows of whole VEC-element vectors, constexprs.row_vec).
    """
    N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner = whole_vectors(
        N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner, VEC)
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    G, row, g = chunk_of(pid, N, TILES * BLOCK)
    g_row, _, shift, lo, hi, tail, end = row_bases(row, INNER, stride_g_outer, stride_g_inner,
                                                   stride_d_outer, stride_d_inner, N, ALIGN)
    part = tiles_grad_sum(dy_ptr, y_ptr, g_row, stride_g_col, g * (TILES * BLOCK), N, lo, hi, LOG, BLOCK, TILES, HINTS,
                          ALIGN)
    if ALIGN > 1:
        part += edges_grad_sum(dy_ptr, y_ptr, g_row, shift, lo, tail, end, g == 0, g == G - 1, LOG, ALIGN)
    tl.store(ws_ptr + pid, part)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_split_bwd_write_kernel(
    dy_ptr, dx_ptr, ws_ptr, y_ptr, scale, M, N, INNER,
    stride_g_outer, stride_g_inner, stride_g_col,
    stride_d_outer, stride_d_inner, stride_d_col,
    N_BUCKET, M_BUCKET,
    LOG: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr,
    HINTS: tl.constexpr = 1, ALIGN: tl.constexpr = 1, PDL: tl.constexpr = 0,
    VEC: tl.constexpr = 1, ROW_SCALE: tl.constexpr = 0,
):
    """Backward pass 2: sum row p // G's G partials, write dx for chunk p % G (last tile first; a
    one-tile chunk loaded before the partials are read). PDL as in the forward's pass 2; VEC as in the
    fused kernel (rows of whole VEC-element vectors, constexprs.row_vec)."""
    N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner = whole_vectors(
        N, stride_g_outer, stride_g_inner, stride_d_outer, stride_d_inner, VEC)
    pid = tl.program_id(0)
    G, row, g = chunk_of(pid, N, TILES * BLOCK)
    scale = row_scale(scale, row, ROW_SCALE)
    g_row, d_base, shift, lo, hi, tail, end = row_bases(row, INNER, stride_g_outer, stride_g_inner,
                                                        stride_d_outer, stride_d_inner, N, ALIGN)
    d_row = dx_ptr + d_base
    if TILES == 1:  # as in the forward's pass 2: dy and y of a one-tile chunk are loaded first
        cols = g * BLOCK + tl.arange(0, BLOCK)
        mask = tile_mask(cols, N, lo, hi, ALIGN)
        dy = load_f32(dy_ptr + g_row + cols * stride_g_col, mask, DROP * HINTS)
        y = load_f32(y_ptr + g_row + cols * stride_g_col, mask, DROP * HINTS)
    if PDL:
        gdc_wait()
    red = sum_partials(ws_ptr + row * G, G, BLOCK_G)
    if ALIGN > 1:
        edges_grad_write(dy_ptr, y_ptr, d_row, g_row, red, scale, shift, lo, tail, end, g == 0, g == G - 1, LOG, ALIGN)
    if TILES == 1:
        store_out(d_row + cols * stride_d_col, grad_input(dy, y, red, scale, LOG), mask, DROP * HINTS)
    else:
        tiles_grad_write(dy_ptr, y_ptr, d_row, g_row, stride_g_col, stride_d_col, red, scale, g * (TILES * BLOCK), N,
                         lo, hi, LOG, BLOCK, TILES, HINTS, ALIGN, 1)


def _shape_config(device: DeviceInfo, M: int, N: int, block: int, num_warps: int) -> LaunchConfig:
    """TILES and BLOCK_G for a BLOCK: about PROGRAMS_PER_SM programs per SM over all rows, at most
    MAX_CHUNKS chunks a row. Sized on the N bucket, so the config serves every N in the bucket."""
    nb = n_bucket(N)
    want = max(1, min(MAX_CHUNKS, PROGRAMS_PER_SM * device.sm_count // max(M, 1)))
    chunk = max(block, next_power_of_2(triton.cdiv(nb, want)))
    while triton.cdiv(nb, chunk) > MAX_CHUNKS:
        chunk *= 2
    return LaunchConfig.make(num_warps, BLOCK=block, TILES=chunk // block,
                             BLOCK_G=next_power_of_2(triton.cdiv(nb, chunk)))


def _configs(device: DeviceInfo, M: int, N: int) -> list[LaunchConfig]:
    out = []
    for block in BLOCKS:
        if block > max(BLOCKS[0], next_power_of_2(N)):
            continue
        for nw in sizing.warp_choices(device, block):
            out.append(_shape_config(device, M, N, block, nw))
    return sizing.with_backend_options(device, out)


def _heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    want = max(1, min(MAX_CHUNKS, PROGRAMS_PER_SM * device.sm_count // max(M, 1)))
    block = min(4096, max(BLOCKS[0], next_power_of_2(triton.cdiv(n_bucket(N), want))))
    return _shape_config(device, M, N, block, sizing.heuristic_warps(device, block))


class SplitLaunch(Launch):
    """The two passes of the split family, ready to start again and again (see PreparedLaunch).

    Without a config (tuning-table miss) it uses the heuristic: Triton's autotuner times one
    kernel, not a two-kernel pipeline; ``python -m tritonsoftmax.tune --families split`` times
    the whole pipeline for each config and stores the winner. A stored split config is
    validated here like any explicit one. ``passes``: the two Family objects (forward or backward);
    ``words``: workspace floats per program (2 for (max, sum), 1 for the backward's partial sum).
    """

    def __init__(self, passes: tuple[Family, Family], words: int, problem: RowProblem,
                 config: LaunchConfig | None, device: DeviceInfo, flags: dict[str, int] | None = None):
        self.problem, self.device = problem, device
        self.config = config or _heuristic(device, problem.M, problem.N)
        meta = dict(self.config.meta)
        if next_power_of_2(chunks(problem.N, meta)) > meta["BLOCK_G"]:
            raise ValueError(f"split config {self.config}: BLOCK_G must be >= the {chunks(problem.N, meta)} chunks "
                             f"of a {problem.N}-element row")
        flags = dict(flags or {})
        self.pdl = bool(flags.pop("PDL", True)) and sizing.supports_pdl(device)
        second = self.config
        if self.pdl:  # pass 2 may start while pass 1 ends; it waits for pass 1 before reading partials
            second = self.config.with_options(launch_pdl=1)
        flags["PDL"] = int(self.pdl)
        self._first = PreparedLaunch(passes[0], problem, self.config, device, flags=flags)
        self._second = PreparedLaunch(passes[1], problem, second, device, flags=flags)
        self.words = words
        self.chunks_per_row = chunks(problem.N, meta)
        self._ws_len = words * chunk_grid(problem.M, problem.N, meta, device)[0]

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *extra) -> LaunchConfig:
        self.write(x, y, self.partials(x, y, *extra), *extra)
        return self.config

    def partials(self, x: torch.Tensor, y: torch.Tensor, *extra) -> torch.Tensor:
        """Pass 1 alone: the float32 workspace of partials, ``words`` floats for each of the ``chunks_per_row``
        chunks of each row, rows in order (viewed as (M, chunks_per_row, words))."""
        ws = torch.empty(self._ws_len, device=x.device, dtype=torch.float32)
        self._first(x, y, ws, *extra)
        return ws

    def write(self, x: torch.Tensor, y: torch.Tensor, ws: torch.Tensor, *extra) -> None:
        """Pass 2 alone, from a workspace laid out as :meth:`partials` gives it (a row's partials combined: a
        chunk of max -inf and sum 0 adds nothing, nor does a backward partial of 0)."""
        self._second(x, y, ws, *extra)


class SplitFamily(Family):
    """A split family as the dispatcher sees it: ``prepare`` gives a :class:`SplitLaunch`."""

    grid_from_m = True

    def __init__(self, name: str, passes: tuple[Family, Family], words: int):
        super().__init__(name, passes[1].kernel, _configs, _heuristic, chunk_grid)
        self.passes, self.words = passes, words

    def prepare(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                from_store: bool = False, flags: dict[str, int] | None = None,
                modes: LaunchModes = NO_MODES) -> SplitLaunch:
        return SplitLaunch(self.passes, self.words, problem, config, device, flags)


def _pass(name: str, kernel) -> Family:
    return Family(name, kernel, _configs, _heuristic, chunk_grid)


FAMILY = SplitFamily(IMPL, (_pass("split-stats", _softmax_split_stats_kernel),
                            _pass("split-write", _softmax_split_write_kernel)), words=2)
BWD_FAMILY = SplitFamily(f"{IMPL}-bwd", (_pass("split-bwd-partial", _softmax_split_bwd_partial_kernel),
                                         _pass("split-bwd-write", _softmax_split_bwd_write_kernel)), words=1)


launch, launch_backward = launches.family_launchers(FAMILY, BWD_FAMILY)
