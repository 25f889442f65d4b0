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
from ..layout import RowProblem, matrix_problem
from . import _common
from ._common import Family, PreparedLaunch, row_offsets

IMPL = "split"
PROGRAMS_PER_SM = 8  # aim for this many programs per SM across all rows
MAX_CHUNKS = 1024  # partials one program combines (BLOCK_G)
BLOCKS = (1024, 2048, 4096)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_split_stats_kernel(
    x_ptr, y_ptr, ws_ptr, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """Pass 1: program p takes chunk g = p % G of row p // G (G = cdiv(N, TILES * BLOCK)).

    x_ptr: input rows (addressed as in the fused kernel); y_ptr: unused here (common signature);
    ws_ptr: float32 workspace, ws[2 * p] = chunk max m, ws[2 * p + 1] = sum of exp(x - m) over the
    chunk. BLOCK: tile width; TILES: tiles per chunk; BLOCK_G: unused here (shared config).
    Invariant: m is the max of the tiles seen, s = sum exp(x - m) over them; a tile whose running
    max is still -inf adds 0 (so an all -inf chunk gives m = -inf, s = 0, never NaN).
    """
    pid = tl.program_id(0)
    G = tl.cdiv(N, TILES * BLOCK)
    row = pid // G
    g = pid % G
    x_row = x_ptr + row_offsets(row, INNER, stride_x_outer, stride_x_inner)
    offs = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for t in range(0, TILES):
        cols = (g * TILES + t) * BLOCK + offs
        x = tl.load(x_row + cols * stride_x_col, mask=cols < N, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref), axis=0)
        m = m_new
    tl.store(ws_ptr + 2 * pid, m)
    tl.store(ws_ptr + 2 * pid + 1, s)


@triton.jit(do_not_specialize=["N_BUCKET", "M_BUCKET"])
def _softmax_split_write_kernel(
    x_ptr, y_ptr, ws_ptr, M, N, INNER,
    stride_x_outer, stride_x_inner, stride_x_col,
    stride_y_outer, stride_y_inner, stride_y_col,
    N_BUCKET, M_BUCKET,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """Pass 2: combine row p // G's G partials into (max M_r, sum S_r), write chunk p % G.

    Pointers, strides and BLOCK/TILES as in pass 1; BLOCK_G >= G (power of two).
    S_r = sum over chunks of s_g * exp(m_g - M_r), an all -inf chunk adding 0. A row of all -inf
    has M_r = -inf and gives NaN (exp(-inf - -inf)), like torch. Tiles are written last first.
    """
    pid = tl.program_id(0)
    G = tl.cdiv(N, TILES * BLOCK)
    row = pid // G
    g = pid % G
    gs = tl.arange(0, BLOCK_G)
    parts = ws_ptr + 2 * (row * G + gs)
    m_g = tl.load(parts, mask=gs < G, other=float("-inf"))
    s_g = tl.load(parts + 1, mask=gs < G, other=0.0)
    m = tl.max(m_g, axis=0)
    w = tl.where(m_g == float("-inf"), 0.0, s_g * tl.exp(m_g - m))
    inv = 1.0 / tl.sum(w, axis=0)
    x_row = x_ptr + row_offsets(row, INNER, stride_x_outer, stride_x_inner)
    y_row = y_ptr + row_offsets(row, INNER, stride_y_outer, stride_y_inner)
    offs = tl.arange(0, BLOCK)
    for t in range(0, TILES):
        cols = (g * TILES + (TILES - 1 - t)) * BLOCK + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_x_col, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) * inv
        tl.store(y_row + cols * stride_y_col, y.to(y_ptr.dtype.element_ty), mask=mask)


def chunks(N: int, meta: dict) -> int:
    """G: chunks per row for a config."""
    return triton.cdiv(N, meta["BLOCK"] * meta["TILES"])


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
        for nw in _common.warp_choices(device, block):
            out.append(_shape_config(device, M, N, block, nw))
    return _common.with_backend_options(device, out)


def _heuristic(device: DeviceInfo, M: int, N: int) -> LaunchConfig:
    want = max(1, min(MAX_CHUNKS, PROGRAMS_PER_SM * device.sm_count // max(M, 1)))
    block = min(4096, max(BLOCKS[0], next_power_of_2(triton.cdiv(n_bucket(N), want))))
    return _shape_config(device, M, N, block, _common.heuristic_warps(device, block))


def _grid(M: int, N: int, meta: dict) -> tuple[int]:
    return (M * chunks(N, meta),)


class SplitLaunch:
    """The two passes of the split family, ready to start again and again (see PreparedLaunch).

    Without a config (tuning-table miss) it uses the heuristic: Triton's autotuner times one
    kernel, not a two-kernel pipeline; ``python -m tritonsoftmax.tune --families split`` times
    the whole pipeline for each config and stores the winner. ``from_store`` is kept for the
    common interface; a stored split config is validated here like any explicit one.
    """

    def __init__(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                 from_store: bool = False):
        self.problem, self.device = problem, device
        self.config = config or _heuristic(device, problem.M, problem.N)
        meta = dict(self.config.meta)
        if next_power_of_2(chunks(problem.N, meta)) > meta["BLOCK_G"]:
            raise ValueError(f"split config {self.config}: BLOCK_G must be >= the {chunks(problem.N, meta)} chunks "
                             f"of a {problem.N}-element row")
        self.from_store = from_store
        self._stats = PreparedLaunch(_STATS, problem, self.config, device)
        self._write = PreparedLaunch(_WRITE, problem, self.config, device)
        self._ws_len = 2 * _grid(problem.M, problem.N, dict(self.config.meta))[0]

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> LaunchConfig:
        ws = torch.empty(self._ws_len, device=x.device, dtype=torch.float32)
        self._stats(x, y, ws)
        self._write(x, y, ws)
        return self.config


class SplitFamily(Family):
    """The split family as the dispatcher sees it: ``prepare`` gives a :class:`SplitLaunch`."""

    def prepare(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                from_store: bool = False) -> SplitLaunch:
        return SplitLaunch(problem, config, device, from_store)


_STATS = Family("split-stats", _softmax_split_stats_kernel, _configs, _heuristic, _grid)
_WRITE = Family("split-write", _softmax_split_write_kernel, _configs, _heuristic, _grid)
FAMILY = SplitFamily(IMPL, _softmax_split_write_kernel, _configs, _heuristic, _grid)


def launch(x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None = None) -> LaunchConfig:
    """Softmax over dim 1 of ``x2d`` into ``out2d`` (same shape, any strides); ``config`` or the heuristic."""
    from ..device import device_info

    return SplitLaunch(matrix_problem(x2d, out2d), config, device_info(x2d.device))(x2d, out2d)
