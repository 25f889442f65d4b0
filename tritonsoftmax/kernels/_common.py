"""What every kernel family shares: row addressing, the output/gradient math, the autotuner
factory and the one place a kernel is started (:class:`PreparedLaunch`).

A forward kernel's signature::

    kernel(x_ptr, y_ptr, [ws_ptr,] scale, M, N, INNER,
           stride_x_outer, stride_x_inner, stride_x_col,      # the input
           stride_y_outer, stride_y_inner, stride_y_col,      # the output
           N_BUCKET, M_BUCKET, LOG, ZERO_MASKED, <tuned constexprs>)

and a backward kernel's::

    kernel(dy_ptr, dx_ptr, [ws_ptr,] y_ptr, scale, M, N, INNER,
           <3 strides of dy and y (one layout)>, <3 strides of dx>,
           N_BUCKET, M_BUCKET, LOG, <tuned constexprs>)

A :class:`Family` names a kernel, lists its search space and its heuristic config, and computes
its grid.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime import driver

from ..config import LaunchConfig, autotune_enabled, m_bucket, n_bucket, next_power_of_2
from ..device import DeviceInfo, cuda_index, device_info, interpreter_active
from ..layout import ALIGN_BYTES, RowProblem, matrix_problem

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a triton built without its NVIDIA backend (ROCm): PDL is never on there (supports_pdl)
    @triton.jit
    def gdc_wait():
        """Stand-in: the PDL branches that call it are compiled out (PDL = 0) off NVIDIA."""
        tl.static_assert(False, "programmatic dependent launch needs triton's NVIDIA backend")

    @triton.jit
    def gdc_launch_dependents():
        """Stand-in, as gdc_wait."""
        tl.static_assert(False, "programmatic dependent launch needs triton's NVIDIA backend")


@triton.jit
def row_offsets(rows, INNER, stride_outer, stride_inner):
    """64-bit element offsets of rows ``rows``: (rows // INNER) * stride_outer + (rows % INNER) * stride_inner.

    INNER == 1 (the common last-dim case) is specialised by Triton, so the division folds away.
    """
    outer = (rows // INNER).to(tl.int64)
    inner = (rows % INNER).to(tl.int64)
    return outer * stride_outer + inner * stride_inner


@triton.jit
def whole_vectors(N, stride_a_outer, stride_a_inner, stride_b_outer, stride_b_inner, VEC: tl.constexpr):
    """N and two layouts' row strides as (v // VEC) * VEC: equal to them when row_vec gave VEC (every
    one a multiple of it), and known to the compiler as multiples of VEC, which Triton's specialisation
    (divisibility by 16 only) cannot tell for, say, N = 200. VEC == 1: the arguments as they are."""
    if VEC > 1:
        N = (N // VEC) * VEC
        stride_a_outer = (stride_a_outer // VEC) * VEC
        stride_a_inner = (stride_a_inner // VEC) * VEC
        stride_b_outer = (stride_b_outer // VEC) * VEC
        stride_b_inner = (stride_b_inner // VEC) * VEC
    return N, stride_a_outer, stride_a_inner, stride_b_outer, stride_b_inner


@triton.jit
def row_window(start, N, ALIGN: tl.constexpr):
    """A row of N elements at element offset ``start`` (from a 16-byte aligned base; scalars or
    tensors, elementwise) seen as a window of ALIGN-element groups that begins at the group holding
    its first element: window position p is element ``base + p``.

    Returns (base, shift, lo, hi, tail, end): base = start rounded down to a multiple of ALIGN
    (declared so, which lets loads be 16 bytes wide); the row is positions shift .. end - 1; the
    groups wholly inside it are positions lo .. hi - 1 (body_mask); a row that starts inside a
    group has its head in group 0, one that ends inside a group its tail in the group at position
    ``tail`` (edge_lanes). Body, head and tail never overlap and cover the row; the body lies in the
    first cdiv(N, W) * W positions for any width W that is a multiple of ALIGN. Positions are int32.
    """
    shift = (start % ALIGN).to(tl.int32)
    base = tl.multiple_of(start - shift, ALIGN)
    end = shift + N
    lo = tl.where(shift > 0, ALIGN, 0)
    hi = (end // ALIGN) * ALIGN
    return base, shift, lo, hi, tl.maximum(hi, lo), end


@triton.jit
def body_mask(pos, lo, hi, ALIGN: tl.constexpr):
    """Window positions ``pos`` in whole groups of the row (row_window's lo .. hi): a mask constant
    over each ALIGN-element group, so a masked load of them stays 16 bytes wide."""
    group = (pos // ALIGN) * ALIGN
    return (group >= lo) & (group < hi)


@triton.jit
def edge_lanes(shift, lo, tail, end, HEAD, TAIL, ALIGN: tl.constexpr):
    """Window positions and mask of a row's partial end groups (row_window) as one vector of
    2 * ALIGN lanes: lanes 0 .. ALIGN - 1 are group 0, holding the head (positions shift ..
    min(lo, end) - 1) when the row starts inside a group; the other lanes are the group at ``tail``,
    holding the tail (positions tail .. end - 1) when it ends inside one. HEAD, TAIL: whether this
    program takes each (scalars). The row arguments broadcast against the lanes (scalars for one
    row, [R, 1] for R rows)."""
    lane = tl.arange(0, 2 * ALIGN)
    in_head = lane < ALIGN
    pos = tl.where(in_head, lane, tail + lane - ALIGN)
    head = owned(HEAD, (lane >= shift) & (lane < tl.minimum(lo, end)))
    return pos, tl.where(in_head, head, owned(TAIL, pos < end))


@triton.jit
def whole_row_lanes(start, N, WIDTH: tl.constexpr, ALIGN: tl.constexpr):
    """A realigned row held whole (the fused kernels' one-row tiles; start: a scalar offset):
    (base, body positions 0 .. WIDTH - 1 with their mask, edge positions with their mask); see
    row_window, body_mask and edge_lanes."""
    tl.static_assert(WIDTH % ALIGN == 0, "the row window must hold whole ALIGN-element groups")
    base, shift, lo, hi, tail, end = row_window(start, N, ALIGN)
    pos = tl.arange(0, WIDTH)
    pos_e, mask_e = edge_lanes(shift, lo, tail, end, True, True, ALIGN)
    return base, pos, body_mask(pos, lo, hi, ALIGN), pos_e, mask_e


@triton.jit
def held_row_lanes(start, N, HALF: tl.constexpr, TAIL: tl.constexpr, ALIGN: tl.constexpr):
    """A realigned row held as HALF + TAIL window positions (the fused kernels' one-row tiles of a row just
    past a power of two; start: a scalar offset): (base, positions 0 .. HALF - 1 with their mask, positions
    HALF .. HALF + TAIL - 1 with theirs, edge positions with their mask). The row's whole groups lie in
    its first cdiv(N, ALIGN) * ALIGN positions (row_window), which HALF + TAIL covers (row_tail)."""
    tl.static_assert(HALF % ALIGN == 0 and TAIL % ALIGN == 0, "the pieces must hold whole ALIGN-element groups")
    base, shift, lo, hi, tail, end = row_window(start, N, ALIGN)
    pos = tl.arange(0, HALF)
    pos_t = HALF + tl.arange(0, TAIL)
    pos_e, mask_e = edge_lanes(shift, lo, tail, end, True, True, ALIGN)
    return base, pos, body_mask(pos, lo, hi, ALIGN), pos_t, body_mask(pos_t, lo, hi, ALIGN), pos_e, mask_e


@triton.jit
def owned(flag, mask):
    """``mask`` where the scalar ``flag`` holds, else all False (a select: the interpreter rejects
    the mask that ``flag & mask`` gives)."""
    return tl.where(flag, mask, False)


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def exp(x):
    """exp(x) as exp2(x * log2(e)) with the flush-to-zero ex2: the same ex2.approx tl.exp uses, but
    tl.exp's non-ftz form costs four more instructions per element for results below 2^-126, which
    softmax rounds to 0 anyway (an absolute error under 1.2e-38). Kernels that keep 16-bit data on chip
    are bound by instruction issue, where those four count."""
    return tl.exp2(x * LOG2E)


KEEP = tl.constexpr(1)  # EVICT: a read whose data a later pass reads again (evict_last)
DROP = tl.constexpr(2)  # EVICT: the last read of the data (evict_first)


@triton.jit
def load_f32(ptrs, mask, EVICT: tl.constexpr = 0):
    """A tile as fp32 (masked lanes 0; ``mask`` None: every lane). EVICT: 0 the default L2 policy,
    KEEP or DROP (NVIDIA PTX eviction priorities; a first pass marks what its second pass re-reads,
    as inductor's two-loop reductions do)."""
    other = None if mask is None else 0.0
    if EVICT == KEEP:
        x = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_last")
    elif EVICT == DROP:
        x = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(ptrs, mask=mask, other=other)
    return x.to(tl.float32)


@triton.jit
def store_out(ptrs, value, mask, EVICT: tl.constexpr = 0):
    """Store an output tile (cast to the pointee type). EVICT == DROP: evict_first, so the written
    lines leave L2 before the input lines a second pass still has to read."""
    if EVICT == DROP:
        tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=mask, eviction_policy="evict_first")
    else:
        tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def load_scaled(ptrs, mask, scale, EVICT: tl.constexpr = 0):
    """A tile as fp32 times ``scale``; masked lanes are -inf whatever the sign of ``scale`` (``mask``
    None: every lane; EVICT as in load_f32)."""
    if mask is None:
        return load_f32(ptrs, None, EVICT) * scale
    else:
        return tl.where(mask, load_f32(ptrs, mask, EVICT) * scale, float("-inf"))


@triton.jit
def finish(z, m, s, LOG: tl.constexpr, ZERO_MASKED: tl.constexpr):
    """The output for scaled inputs ``z`` given the row max ``m`` and s = sum exp(z - m) (both
    broadcastable to ``z``): softmax exp(z - m) / s, or log_softmax z - m - log(s) when LOG.
    ZERO_MASKED: rows whose max is -inf (all masked) give 0 instead of NaN."""
    if LOG:
        y = z - m - tl.log(s)
    else:
        y = exp(z - m) * (1.0 / s)
    if ZERO_MASKED:
        y = tl.where(m == float("-inf"), 0.0, y)
    return y


@triton.jit
def grad_term(dy, y, LOG: tl.constexpr):
    """What the backward sums over a row: dy * y for softmax, dy for log_softmax."""
    if LOG:
        return dy
    else:
        return dy * y


@triton.jit
def grad_input(dy, y, red, scale, LOG: tl.constexpr):
    """dx given the row sum ``red`` of grad_term: scale * y * (dy - red) for softmax,
    scale * (dy - exp(y) * red) for log_softmax."""
    if LOG:
        return scale * (dy - exp(y) * red)
    else:
        return scale * y * (dy - red)


@triton.jit
def online_update(m, s, z):
    """Fold tile ``z`` into the running (max m, sum s = sum exp(. - m)); a tile that leaves the
    running max at -inf adds 0 (not exp(-inf - -inf) = NaN), so a masked prefix never poisons a row."""
    m_new = tl.maximum(m, tl.max(z, axis=0))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, s * exp(m - m_ref) + tl.sum(exp(z - m_ref), axis=0)


@triton.jit
def row_bases(row, INNER, stride_x_outer, stride_x_inner, stride_y_outer, stride_y_inner, N, ALIGN: tl.constexpr):
    """Where a row's window starts in x and y, and its row_window bounds:
    (x base, y base, shift, lo, hi, tail, end). ALIGN == 1: the row's own offsets, the plain
    path (shift, lo, tail, end unused; tile_mask is cols < N). ALIGN > 1: x and y share one
    layout (row_align), both bases are the aligned window start."""
    start = row_offsets(row, INNER, stride_x_outer, stride_x_inner)
    if ALIGN == 1:
        return start, row_offsets(row, INNER, stride_y_outer, stride_y_inner), 0, 0, N, N, N
    else:
        base, shift, lo, hi, tail, end = row_window(start, N, ALIGN)
        return base, base, shift, lo, hi, tail, end


@triton.jit
def tile_mask(cols, N, lo, hi, ALIGN: tl.constexpr):
    """The lanes of a tile at window positions ``cols`` to load: cols < N on the plain path, the
    row's whole groups (body_mask) on the realigned one."""
    if ALIGN == 1:
        return cols < N
    else:
        return body_mask(cols, lo, hi, ALIGN)


# The tile loops of the kernels that walk a row (online) or a chunk of it (split, coop) in BLOCK-wide
# tiles: TILES tiles from window position ``first``; row pointers (x_row, y_row: row_bases) and column
# strides as each kernel has them; N, lo, hi, ALIGN as tile_mask takes them.

@triton.jit
def tiles_max_sum(x_row, stride_col, scale, first, N, lo, hi, BLOCK: tl.constexpr, TILES, HINTS: tl.constexpr,
                  ALIGN: tl.constexpr):
    """(max m, sum exp(z - m)) over the tiles, folded with online_update (an all -inf stretch gives
    m = -inf, s = 0). HINTS: mark the tiles to be kept in L2 for the write pass."""
    tl.static_assert(BLOCK % ALIGN == 0, "a tile must hold whole ALIGN-element groups")
    offs = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for t in range(0, TILES):
        cols = first + t * BLOCK + offs
        z = load_scaled(x_row + cols * stride_col, tile_mask(cols, N, lo, hi, ALIGN), scale, KEEP * HINTS)
        m, s = online_update(m, s, z)
    return m, s


@triton.jit
def tiles_write(x_row, y_row, stride_x_col, stride_y_col, scale, m, s, first, N, lo, hi, LOG: tl.constexpr,
                ZERO_MASKED: tl.constexpr, BLOCK: tl.constexpr, TILES, HINTS: tl.constexpr, ALIGN: tl.constexpr):
    """The output over the tiles from the row's (m, s), last tile first (the tiles read last are
    the likeliest still in cache); HINTS: this last read lets them go, and so do the stores."""
    tl.static_assert(BLOCK % ALIGN == 0, "a tile must hold whole ALIGN-element groups")
    offs = tl.arange(0, BLOCK)
    for t in range(0, TILES):
        cols = first + (TILES - 1 - t) * BLOCK + offs
        mask = tile_mask(cols, N, lo, hi, ALIGN)
        y = finish(load_scaled(x_row + cols * stride_x_col, mask, scale, DROP * HINTS), m, s, LOG, ZERO_MASKED)
        store_out(y_row + cols * stride_y_col, y, mask, DROP * HINTS)


@triton.jit
def edges_max_sum(x_row, scale, m, s, shift, lo, tail, end, HEAD, TAIL, ALIGN: tl.constexpr):
    """Fold a realigned row's partial end groups (edge_lanes) into (m, s): the head if HEAD, the
    tail if TAIL (the programs that own them)."""
    pos, mask = edge_lanes(shift, lo, tail, end, HEAD, TAIL, ALIGN)
    return online_update(m, s, load_scaled(x_row + pos, mask, scale))


@triton.jit
def edges_write(x_row, y_row, scale, m, s, shift, lo, tail, end, HEAD, TAIL, LOG: tl.constexpr,
                ZERO_MASKED: tl.constexpr, ALIGN: tl.constexpr):
    """The output of a realigned row's partial end groups (as edges_max_sum) from the row's (m, s)."""
    pos, mask = edge_lanes(shift, lo, tail, end, HEAD, TAIL, ALIGN)
    y = finish(load_scaled(x_row + pos, mask, scale), m, s, LOG, ZERO_MASKED)
    tl.store(y_row + pos, y.to(y_row.dtype.element_ty), mask=mask)


@triton.jit
def tiles_grad_sum(dy_ptr, y_ptr, g_row, stride_g_col, first, N, lo, hi, LOG: tl.constexpr, BLOCK: tl.constexpr,
                   TILES, HINTS: tl.constexpr, ALIGN: tl.constexpr):
    """Sum of grad_term(dy, y) over the tiles (dy and y share the offsets g_row + col * stride_g_col);
    HINTS as in tiles_max_sum, N, lo, hi, ALIGN as tile_mask takes them."""
    tl.static_assert(BLOCK % ALIGN == 0, "a tile must hold whole ALIGN-element groups")
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for t in range(0, TILES):
        cols = first + t * BLOCK + offs
        mask = tile_mask(cols, N, lo, hi, ALIGN)
        dy = load_f32(dy_ptr + g_row + cols * stride_g_col, mask, KEEP * HINTS)
        y = load_f32(y_ptr + g_row + cols * stride_g_col, mask, KEEP * HINTS)
        acc += grad_term(dy, y, LOG)
    return tl.sum(acc, axis=0)


@triton.jit
def tiles_grad_write(dy_ptr, y_ptr, d_row, g_row, stride_g_col, stride_d_col, red, scale, first, N, lo, hi,
                     LOG: tl.constexpr, BLOCK: tl.constexpr, TILES, HINTS: tl.constexpr, ALIGN: tl.constexpr):
    """dx = grad_input(dy, y, red) over the tiles into d_row, last tile first (HINTS as in tiles_write)."""
    tl.static_assert(BLOCK % ALIGN == 0, "a tile must hold whole ALIGN-element groups")
    offs = tl.arange(0, BLOCK)
    for t in range(0, TILES):
        cols = first + (TILES - 1 - t) * BLOCK + offs
        mask = tile_mask(cols, N, lo, hi, ALIGN)
        dy = load_f32(dy_ptr + g_row + cols * stride_g_col, mask, DROP * HINTS)
        y = load_f32(y_ptr + g_row + cols * stride_g_col, mask, DROP * HINTS)
        store_out(d_row + cols * stride_d_col, grad_input(dy, y, red, scale, LOG), mask, DROP * HINTS)


@triton.jit
def edges_grad_sum(dy_ptr, y_ptr, g_row, shift, lo, tail, end, HEAD, TAIL, LOG: tl.constexpr, ALIGN: tl.constexpr):
    """Sum of grad_term(dy, y) over a realigned row's partial end groups (as edges_max_sum)."""
    pos, mask = edge_lanes(shift, lo, tail, end, HEAD, TAIL, ALIGN)
    return tl.sum(grad_term(load_f32(dy_ptr + g_row + pos, mask), load_f32(y_ptr + g_row + pos, mask), LOG), axis=0)


@triton.jit
def edges_grad_write(dy_ptr, y_ptr, d_row, g_row, red, scale, shift, lo, tail, end, HEAD, TAIL, LOG: tl.constexpr,
                     ALIGN: tl.constexpr):
    """dx over a realigned row's partial end groups (as edges_max_sum) into d_row."""
    pos, mask = edge_lanes(shift, lo, tail, end, HEAD, TAIL, ALIGN)
    dx = grad_input(load_f32(dy_ptr + g_row + pos, mask), load_f32(y_ptr + g_row + pos, mask), red, scale, LOG)
    tl.store(d_row + pos, dx.to(d_row.dtype.element_ty), mask=mask)


@triton.jit
def chunk_of(index, N, CHUNK: tl.constexpr):
    """For kernels that cut each row into G = cdiv(N, CHUNK) chunks, one program a chunk:
    (G, row, chunk) of program ``index``."""
    G = tl.cdiv(N, CHUNK)
    return G, index // G, index % G


@triton.jit
def combine_partials(parts_ptr, G, BLOCK_G: tl.constexpr):
    """Row (max, sum) from G (max m_g, sum s_g) pairs at parts_ptr[2g], parts_ptr[2g + 1], written
    by an earlier launch: s = sum s_g * exp(m_g - max), an all -inf chunk adding 0 (never NaN)."""
    gs = tl.arange(0, BLOCK_G)
    m_g = tl.load(parts_ptr + 2 * gs, mask=gs < G, other=float("-inf"))
    s_g = tl.load(parts_ptr + 2 * gs + 1, mask=gs < G, other=0.0)
    return combine_max_sum(m_g, s_g)


@triton.jit
def combine_max_sum(m_g, s_g):
    """Row (max, sum) from partials (max m_g, sum s_g) held in a tensor (unused lanes -inf, 0)."""
    m = tl.max(m_g, axis=0)
    s = tl.sum(tl.where(m_g == float("-inf"), 0.0, s_g * exp(m_g - m)), axis=0)
    return m, s


@triton.jit
def sum_partials(parts_ptr, G, BLOCK_G: tl.constexpr):
    """The backward's row sum from G partial sums at parts_ptr[g], written by an earlier launch."""
    gs = tl.arange(0, BLOCK_G)
    return tl.sum(tl.load(parts_ptr + gs, mask=gs < G, other=0.0), axis=0)


KEY = ["N_BUCKET", "M_BUCKET"]  # plus the tensors' dtypes, which triton.autotune adds itself


def _interpreter_bench(kernel_call, quantiles=None):
    """Wall-clock timing for the interpreter (no driver to time with); quantiles all equal."""
    start = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def _gpu_bench(kernel_call, quantiles=None):
    """Short-budget ``do_bench`` for autotuning: enough to rank configs of a memory-bound kernel."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


@dataclass
class Family:
    """A kernel family: its raw kernel, search space, heuristic and grid.

    configs(device, M, N) -> every config worth trying for that shape on that device.
    heuristic(device, M, N) -> the config used without tuning (the interpreter's only config).
    grid(M, N, meta, device) -> launch grid for a config's meta-parameters on that device.
    """

    name: str
    kernel: object
    configs: Callable[[DeviceInfo, int, int], list[LaunchConfig]]
    heuristic: Callable[[DeviceInfo, int, int], LaunchConfig]
    grid: Callable[[int, int, dict, DeviceInfo], tuple[int, ...]]
    _autotuned: dict = field(default_factory=dict)
    # Families with I32 configs (32-bit offsets): (rows, columns) no tile of theirs exceeds, which PreparedLaunch
    # checks a problem's offsets against, whatever the config (see its M_BUCKET key).
    i32_bounds: tuple[int, int] | None = None
    grid_from_m: ClassVar[bool] = False  # chunks (and so the grid) sized from M: see tuning.lookup

    def prepare(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                from_store: bool = False, flags: dict[str, int] | None = None) -> PreparedLaunch:
        """A :class:`PreparedLaunch` of this family for ``problem``."""
        return PreparedLaunch(self, problem, config, device, from_store, flags)

    def dispatched_form(self, problem: RowProblem, config: LaunchConfig, device: DeviceInfo) -> LaunchConfig:
        """The config a launch runs when the dispatcher hands it ``config`` (stored or the heuristic's): as it
        is, unless the family reshapes configs to the row (smem); the tuner times this form."""
        return config

    def autotuned(self, device: DeviceInfo):
        """The ``triton.autotune`` wrapper of the kernel for one device (built once per device)."""
        tuner = self._autotuned.get(device)
        if tuner is None:
            tuner = self._make_autotuner(device)
            self._autotuned[device] = tuner
        return tuner

    def _make_autotuner(self, device: DeviceInfo):
        def prune(configs, named_args, **kwargs):
            M, N = named_args["M"], named_args["N"]
            if interpreter_active():
                return [self.heuristic(device, M, N).to_triton()]
            kept = pruned_for_key(configs, set(self.configs(device, M, N)), named_args["M_BUCKET"])
            return kept or [self.heuristic(device, M, N).to_triton()]

        # The superset over every bucket; `prune` keeps those valid for the shape at hand.
        space: list[LaunchConfig] = []
        for n in (2**k for k in range(0, 24)):
            for m in (1, 4096):
                for c in self.configs(device, m, n):
                    if c not in space:
                        space.append(c)
        triton_configs = [c.to_triton() for c in space]
        bench = _interpreter_bench if interpreter_active() else _gpu_bench
        return triton.autotune(configs=triton_configs, key=KEY, prune_configs_by={"early_config_prune": prune},
                               do_bench=bench)(self.kernel)


# How a warm call starts a compiled kernel (see c_launch_layout).
RUN_LAUNCHER = 0  # through Triton's CudaLauncher object (its Python __call__, then its C function)
C_LAUNCH_SPREAD = 1  # its C function, kernel arguments spread after 4 leading slots (triton 3.6)
C_LAUNCH_TUPLE = 2  # its C function, kernel arguments as one tuple after their annotations (triton 3.7-3.9)


def c_launch_layout(run) -> int:
    """How to call ``run`` (a CompiledKernel's ``run``) without its Python wrapper, which only
    allocates the scratch buffers a kernel may need (ours need none) and costs about 2 us of host
    time a call doing so.

    The layout is recognised from CudaLauncher.__call__'s parameters and attributes, which changed
    once between triton 3.6 and 3.7 (checked against each release's driver.py from 3.6 to 3.9);
    anything else (AMD's launcher, a kernel with scratch, a sanitizer, an unknown layout) keeps
    RUN_LAUNCHER."""
    if type(run).__name__ != "CudaLauncher" or not hasattr(run, "launch"):
        return RUN_LAUNCHER
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1) \
            or getattr(run, "gsan_enabled", False):
        return RUN_LAUNCHER
    try:
        params = tuple(inspect.signature(type(run).__call__).parameters)
    except (TypeError, ValueError):
        return RUN_LAUNCHER
    head = ("self", "gridX", "gridY", "gridZ", "stream", "function")
    if params == head + ("args",) and not hasattr(run, "arg_annotations"):
        return C_LAUNCH_SPREAD
    hooks = ("kernel_metadata", "launch_metadata", "launch_enter_hook", "launch_exit_hook", "args")
    if params == head + hooks and hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature"):
        return C_LAUNCH_TUPLE
    return RUN_LAUNCHER


def warm_launcher(run, grid3: tuple, function: int, packed_metadata, fixed_args: tuple,
                  current_stream: Callable[[int], int], device_index: int) -> Callable[..., None]:
    """A function of the leading kernel arguments (``x``, ``y`` and the extras as addresses and
    numbers, one parameter each) that starts the compiled kernel on the current stream, through
    ``run``'s C function where c_launch_layout allows; everything else a launch passes is fixed
    here, once. ``fixed_args``: the arguments after those (the problem's sizes and strides, the
    constexprs)."""
    g0, g1, g2 = grid3
    layout = c_launch_layout(run)
    if layout == C_LAUNCH_TUPLE:
        launch = run.launch
        head = (function, run.launch_cooperative_grid, run.launch_pdl, packed_metadata, None, None, None, None,
                None, run.arg_annotations, run.kernel_signature)

        def start(*args):
            launch(g0, g1, g2, current_stream(device_index), *head, (*args, *fixed_args))
    elif layout == C_LAUNCH_SPREAD:
        launch = run.launch
        head = (function, run.launch_cooperative_grid, run.launch_pdl, None, None, packed_metadata, None, None, None)

        def start(*args):
            launch(g0, g1, g2, current_stream(device_index), *head, *args, *fixed_args)
    else:
        head = (function, packed_metadata, None, None, None)

        def start(*args):
            run(g0, g1, g2, current_stream(device_index), *head, *args, *fixed_args)
    start.layout = layout
    return start


def direct_start(start: Callable[..., None], aligned: bool, fallback: Callable) -> Callable:
    """A warm PreparedLaunch's call in one Python frame for its common case: ``(x, y, scale)``, ``x``
    and ``y`` on the 16-byte alignment ``start`` (warm_launcher's) was compiled for (``aligned``), a
    float ``scale`` and no launch hook installed; any other call goes to ``fallback`` (the launch's
    own __call__, whose hook test this repeats). What it saves is the generic path's argument list and
    two Python frames, a fraction of a microsecond a warm call."""
    runtime = knobs.runtime

    def direct(x, y, *extra):
        xp, yp = x.data_ptr(), y.data_ptr()
        hook = runtime.launch_enter_hook
        whole = not (xp | yp) & 15
        if (whole is aligned and len(extra) == 1 and type(extra[0]) is float
                and (hook is None or not getattr(hook, "calls", True))):
            start(xp, yp, extra[0])
        else:
            fallback(x, y, *extra)

    return direct


PORTABLE_CLUSTER = 8  # the most CTAs a cluster may have without the function's non-portable attribute


def allow_cluster(function: int, shared_bytes: int, cluster: int) -> None:
    """Let ``function`` (a loaded CUfunction) start as clusters of ``cluster`` > 8 CTAs with
    ``shared_bytes`` of dynamic shared memory, or raise. Triton's launcher sets the non-portable
    attribute for clusters of exactly 16 only; its cuOccupancyMaxActiveClusters (triton 3.6-3.9)
    sets it, with the dynamic shared memory limit, on the function it is asked about, and answers how
    many such clusters fit at once (for 128-thread CTAs), which must be at least one."""
    ask = getattr(driver.active.utils, "cuOccupancyMaxActiveClusters", None)
    if ask is None:
        raise RuntimeError(f"this triton ({triton.__version__}) cannot start clusters of {cluster}")
    fits = ask(function, shared_bytes, cluster)
    if fits < 1:
        raise RuntimeError(f"no cluster of {cluster} CTAs fits on this GPU ({fits})")


def _hooked_runner(compiled, grid3: tuple, packed_metadata, device_index: int) -> Callable:
    """What ``compiled[grid3]`` gives (a launch that calls the launch hooks a profiler installs),
    with the given packed metadata instead of the compiled kernel's (cluster mode)."""

    def runner(*args):
        stream = driver.active.get_current_stream(device_index)
        compiled.run(*grid3, stream, compiled.function, packed_metadata, compiled.launch_metadata(grid3, stream, *args),
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)

    return runner


def constexpr_values(kernel, meta: dict) -> tuple:
    """The values a compiled kernel's launcher takes after the runtime arguments: each of
    ``kernel``'s parameters named in ``meta``, or left to its default (e.g. fused's STAGES), in
    parameter order. (Triton's own launch path fills defaults in; the warm path must do it here.)"""
    params = inspect.signature(kernel.fn).parameters
    out = []
    for name in kernel.arg_names:
        if name in meta:
            out.append(meta[name])
        elif params[name].default is not inspect.Parameter.empty:
            out.append(params[name].default)
    return tuple(out)


def _raw_args(x: torch.Tensor, y: torch.Tensor, extra: tuple) -> tuple[list, bool]:
    """The kernel arguments with each tensor as its address, and whether every address is 16-byte
    aligned. Triton's launcher takes an address as it is, where for a tensor it calls data_ptr()
    and asks the driver about the pointer (microseconds on the warm path). ``extra`` holds tensors
    and Python floats (the scale): told apart by ``type``, as ``isinstance(a, torch.Tensor)`` runs
    Python code of torch's metaclass (~0.1 us)."""
    xp, yp = x.data_ptr(), y.data_ptr()
    bits = xp | yp
    args = [xp, yp]
    for a in extra:
        if type(a) is not float:
            a = a.data_ptr()
            bits |= a
        args.append(a)
    return args, not bits & 15


# Compile options every launch passes. FP contraction (FMA) stays on, as it was the default on
# triton 3.6-3.9: saying so keeps our numerics when 3.10 turns the default off, and silences 3.9's
# warning about the coming change (which fires on any compile that leaves it unset).
COMPILE_OPTIONS = {"enable_fp_fusion": True}

# Shorter rows keep plain masked loads: several such rows share a program, and the realigned window's
# extra index arithmetic costs more than the wide loads it wins on a short row.
ALIGN_MIN_N = 2048


def row_align(problem: RowProblem, *element_sizes: int) -> int:
    """ALIGN for the kernels that take it: the elements in ALIGN_BYTES of the narrowest dtype when
    rows can start off a 16-byte boundary (a row stride that is not a multiple of it), or the problem
    is a single row that is not whole 16-byte groups (odd N: masked loads one element wide otherwise),
    and the kernel can realign them (unit column stride, input and output in one layout, rows of at
    least ALIGN_MIN_N); 1 otherwise (the plain path). The realigned path assumes 16-byte aligned base
    pointers for speed only: with others it is still exact, just not vectorised."""
    x = problem.x
    if x != problem.y or x.col != 1 or problem.N < ALIGN_MIN_N:
        return 1
    group = ALIGN_BYTES // min(element_sizes)
    if problem.rows_aligned(*element_sizes) and not (problem.M == 1 and problem.N % group):
        return 1
    return group


def row_vec(problem: RowProblem, *element_sizes: int) -> int:
    """VEC for the kernels that take it: the most elements, a power of two up to ALIGN_BYTES of the widest
    dtype, that divide N and every row stride (unit-stride columns only), so that each row is whole
    vectors of VEC elements, each on a boundary of its own width given aligned base pointers: 16-byte
    loads where rows start on 16-byte boundaries (200 fp32 elements, 136 bf16), 8- or 4-byte loads where
    they start on 8 or 4 (100 or 102 bf16) instead of one element a load. Triton specialises integer
    arguments on divisibility by 16 only, so it cannot tell this itself. 1 where it knows already (N and
    every row stride multiples of 16), which leaves those launches as they were."""
    strides = (problem.x.outer, problem.x.inner, problem.y.outer, problem.y.inner)
    if problem.x.col != 1 or problem.y.col != 1 or (problem.N % 16 == 0 and all(s % 16 == 0 for s in strides)):
        return 1
    vec = ALIGN_BYTES // max(element_sizes)
    while vec > 1 and (problem.N % vec or any(s % vec for s in strides)):
        vec //= 2
    return vec


# Held chunks (TILES 1) that are whole in every program of a row skip their masks (FULL): the load, the store and
# the -inf select go plain, and x * scale - max fuses into one FFMA (about a fifth fewer instructions in coop's
# fp32 program). 16-bit programs hold twice the values a thread and gain nothing measurable, so 4-byte inputs only.
FULL_ELEMENT_BYTES = 4


def whole_chunks(problem: RowProblem, config: LaunchConfig | None, align: int, element_size: int) -> int:
    """FULL for the kernels that take it: 1 when the config holds one BLOCK-element chunk a program (TILES 1)
    on the plain path (``align`` 1), every chunk is whole (N a multiple of BLOCK) and the input's elements
    are FULL_ELEMENT_BYTES wide; else 0."""
    if config is None:
        return 0
    meta = dict(config.meta)
    return int(meta.get("TILES") == 1 and align == 1 and problem.N % meta["BLOCK"] == 0
               and element_size == FULL_ELEMENT_BYTES)


# Rows held as half a block plus a small tail (row_tail): a row just past a power of two would otherwise take
# registers for twice its length, halving the programs an SM holds. Only small tails (at most 1/TAIL_MAX_SHARE of
# the block) on blocks of TAIL_MIN_BLOCK or more: a large tail is a second block's worth of registers again.
TAIL_MIN_BLOCK = 2048
TAIL_MAX_SHARE = 64


def row_tail(N: int, block_n: int, align: int = 1) -> int:
    """TAIL for the kernels that take it (fused): the power of two that, after the first block_n // 2
    elements, covers the rest of a row of N (N <= block_n // 2 + TAIL), when it is at most
    block_n // TAIL_MAX_SHARE and block_n at least TAIL_MIN_BLOCK; else 0 (the row held as one block_n
    block). 16392 elements in a 32768 block: 8 (16384 + 8 elements held). ``align`` > 1 (ALIGN: a realigned
    row, row_align): the window positions of its whole groups, cdiv(N, align) * align, are what the half
    and the tail hold, and the tail is at least one group (16-bit 4100 in an 8192 block, align 8: 8)."""
    half = block_n // 2
    held = triton.cdiv(N, align) * align
    if block_n < TAIL_MIN_BLOCK or N <= half:
        return 0
    tail = max(next_power_of_2(held - half), align)
    return tail if tail <= block_n // TAIL_MAX_SHARE else 0


class PreparedLaunch:
    """One family on one RowProblem, ready to start again and again with new tensors.

    The first call goes through Triton's normal path (the autotuner when no config is known);
    it remembers the chosen config and the compiled kernel, so a warm call starts the compiled
    kernel directly: no autotuner, no argument binding, no specialisation work, tensors passed
    as addresses. A call whose pointers differ in 16-byte alignment from the first (which the
    compiled kernel assumed) takes Triton's normal path again. Kernels with an ALIGN parameter get
    it from row_align on the first call (rows that start off 16 bytes are realigned). A config
    from the tuning store that fails to compile or launch falls back to the autotuner with one
    warning.
    """

    def __init__(self, family: Family, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                 from_store: bool = False, flags: dict[str, int] | None = None, cluster: int = 0,
                 cluster_smem: int = 0):
        if cluster and config is None:
            raise ValueError("a cluster launch needs a config")
        self.cluster, self.cluster_smem = cluster, cluster_smem
        if config is None and not autotune_enabled():
            config = family.heuristic(device, problem.M, problem.N)
        if config is not None and dict(config.meta).get("DENSE"):
            check_dense(problem, config)
        if config is not None and dict(config.meta).get("I32") and not problem.offsets_fit_int32(
                config["ROWS"], config["BLOCK_N"]):
            config = config.with_meta(I32=0)  # 32-bit offsets would wrap: the same config in 64-bit
        self.family, self.problem, self.config, self.device = family, problem, config, device
        self.from_store = from_store
        self.autotuned, self.autotuned_ms = False, None  # set when the first call autotuned: what the tuner chose
        self.flags = dict(flags or {})  # semantic constexprs (LOG, ZERO_MASKED, ALIGN, VEC, TAIL): not tuned
        if device.is_hip and "HINTS" in family.kernel.arg_names:
            self.flags["HINTS"] = 0  # L2 eviction hints are NVIDIA PTX: plain loads on AMD
        # The autotuner keys on (N_BUCKET, M_BUCKET) and prunes only on a key it has not seen; M_BUCKET is negative
        # where some I32 config's offsets could pass 2**31 - 1, so such problems get a key (and a pruning) of their own.
        narrow_ok = family.i32_bounds is None or problem.offsets_fit_int32(*family.i32_bounds)
        self.tail = (*problem.kernel_args(), n_bucket(problem.N), m_bucket(problem.M) * (1 if narrow_ok else -1))
        self._runner = self._warm = None
        self._aligned = None
        self.direct = self.__call__  # what a warm caller calls: direct_start's closure once a kernel is kept

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *extra: torch.Tensor | float) -> LaunchConfig | None:
        """Run the kernel on ``x`` into ``y``; returns the config launched (None when the autotuner chose).

        ``extra``: the further arguments the family's kernel takes after ``y`` (a workspace, the
        saved output, the scale)."""
        args, aligned = _raw_args(x, y, extra)
        if self._warm is not None and aligned == self._aligned:
            hook = knobs.runtime.launch_enter_hook
            if hook is None or not getattr(hook, "calls", True):  # no launch hook (a profiler's) is installed
                self._warm(*args)
            else:  # a profiler's hooks are installed: Triton's runner calls them (with the tensors)
                self._runner(x, y, *extra, *self.tail, *self._meta)
            return self.config
        self._set_align(x, y)
        if self.config is None:
            return self._autotune(x, y, extra)
        try:
            self._launch_config(x, y, extra, aligned)
        except Exception as e:
            if not self.from_store:
                raise
            warnings.warn(f"tritonsoftmax: stored config ({self.config}) for {self.family.name} failed "
                          f"({type(e).__name__}: {e}); autotuning instead", RuntimeWarning, stacklevel=2)
            self.config, self.from_store = None, False
            return self._autotune(x, y, extra)
        return self.config

    def compile(self, x: torch.Tensor, y: torch.Tensor, *extra: torch.Tensor | float):
        """Compile (without launching) what the first call with these arguments would launch, and
        load it on the device; returns Triton's CompiledKernel (n_regs, metadata), or None under
        the interpreter. Needs a config. The first call then finds it in Triton's cache."""
        self._set_align(x, y)
        kwargs, grid = self._kwargs_grid()
        compiled = self.family.kernel.warmup(x, y, *extra, *self.tail, grid=grid, **kwargs, **self.flags,
                                             **COMPILE_OPTIONS)
        if not hasattr(compiled, "packed_metadata"):
            return None
        compiled._init_handles()  # fills n_regs (triton 3.6-3.9)
        return compiled

    def _set_align(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Kernels with an ALIGN (VEC, TAIL, FULL) parameter get it from row_align (row_vec, row_tail,
        whole_chunks), once."""
        sizes = (x.element_size(), y.element_size())
        if "ALIGN" in self.family.kernel.arg_names and "ALIGN" not in self.flags:
            self.flags["ALIGN"] = row_align(self.problem, *sizes)
        if "VEC" in self.family.kernel.arg_names and "VEC" not in self.flags:
            self.flags["VEC"] = row_vec(self.problem, *sizes)
        if "TAIL" in self.family.kernel.arg_names and "TAIL" not in self.flags:
            block_n = self.config["BLOCK_N"] if self.config is not None else next_power_of_2(self.problem.N)
            self.flags["TAIL"] = row_tail(self.problem.N, block_n, self.flags.get("ALIGN", 1))
        if "FULL" in self.family.kernel.arg_names and "FULL" not in self.flags:
            self.flags["FULL"] = whole_chunks(self.problem, self.config, self.flags.get("ALIGN", 1), sizes[0])

    def _kwargs_grid(self) -> tuple[dict[str, int], tuple]:
        """The config's launch keyword arguments and the grid they give."""
        kwargs = self.config.launch_kwargs()
        return kwargs, self.family.grid(self.problem.M, self.problem.N, kwargs, self.device)

    def _launch_config(self, x: torch.Tensor, y: torch.Tensor, extra: tuple, aligned: bool) -> None:
        if self.cluster:
            self._start_clusters(x, y, extra, aligned)
            return
        kwargs, grid = self._kwargs_grid()
        compiled = self.family.kernel[grid](x, y, *extra, *self.tail, **kwargs, **self.flags, **COMPILE_OPTIONS)
        if hasattr(compiled, "packed_metadata"):  # a CompiledKernel (None under the interpreter)
            grid3 = tuple(grid) + (1,) * (3 - len(grid))
            runner = compiled[grid3]  # loads the module on the device
            self._keep(compiled, grid3, compiled.packed_metadata, runner, cuda_index(x.device), aligned)

    def _keep(self, compiled, grid3: tuple, packed_metadata, runner: Callable, dev: int, aligned: bool) -> None:
        """Remember a launched (or about to be launched) compiled kernel on GPU ``dev`` for warm calls:
        ``runner`` for calls with launch hooks installed, the warm launcher for the rest."""
        self._compiled = compiled  # kept for diagnostics (registers, spills)
        self._meta = constexpr_values(self.family.kernel, {**dict(self.config.meta), **self.flags})
        self._runner = runner
        self._warm = warm_launcher(compiled.run, grid3, compiled.function, packed_metadata, (*self.tail, *self._meta),
                                   driver.active.get_current_stream, dev)
        self._aligned = aligned
        self.direct = direct_start(self._warm, aligned, self.__call__)

    def _start_clusters(self, x: torch.Tensor, y: torch.Tensor, extra: tuple, aligned: bool) -> None:
        """Cluster mode (``cluster`` > 0, CUDA): the compiled kernel started as CTA clusters of
        ``cluster`` consecutive programs, with ``cluster_smem`` bytes of dynamic shared memory past
        what it uses (cluster.py's slots). Triton's own launch cannot: its num_ctas is also a
        compile option, which splits every tensor over the cluster. Its launcher (triton 3.6-3.9)
        takes the cluster size from the packed metadata's num_ctas and starts grid[0] x num_ctas
        programs, so the grid is the family's divided by ``cluster``."""
        compiled = self.compile(x, y, *extra)
        packed = getattr(compiled, "packed_metadata", None)
        if not (isinstance(packed, tuple) and len(packed) == 3):
            raise RuntimeError(f"cluster launch: unknown launch metadata {packed!r} (triton {triton.__version__})")
        num_warps, _, shared = packed
        packed = (num_warps, self.cluster, -(-shared // 16) * 16 + self.cluster_smem)
        if self.cluster > PORTABLE_CLUSTER:
            allow_cluster(compiled.function, packed[2], self.cluster)
        _, grid = self._kwargs_grid()
        if len(grid) != 1 or grid[0] % self.cluster:
            raise ValueError(f"cluster launch: grid {grid} is not whole clusters of {self.cluster}")
        grid3 = (grid[0] // self.cluster, 1, 1)
        dev = cuda_index(x.device)
        self._keep(compiled, grid3, packed, _hooked_runner(compiled, grid3, packed, dev), dev, aligned)
        self._warm(*_raw_args(x, y, extra)[0])

    def _autotune(self, x: torch.Tensor, y: torch.Tensor, extra: tuple) -> None:
        M, N = self.problem.M, self.problem.N
        tuner = self.family.autotuned(self.device)
        tuner[lambda meta: self.family.grid(M, N, meta, self.device)](x, y, *extra, *self.tail, **self.flags,
                                                                      **COMPILE_OPTIONS)
        self.config = LaunchConfig.from_triton(tuner.best_config)
        timings = getattr(tuner, "configs_timings", None) or {}
        best = timings.get(tuner.best_config)
        self.autotuned = True
        self.autotuned_ms = best[0] if isinstance(best, (list, tuple)) else best
        return None


def launch_matrix(family: Family, x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None,
                  extra: tuple = (), flags: dict[str, int] | None = None) -> LaunchConfig | None:
    """What every family module's launcher does: run ``family`` once over the rows of the 2-D
    ``x2d`` into ``out2d`` (any strides), exactly ``config`` if given, else autotuned (or, with
    autotuning off, the heuristic). Returns the config launched, or None when the autotuner chose."""
    prepared = family.prepare(matrix_problem(x2d, out2d), config, device_info(x2d.device), flags=flags)
    return prepared(x2d, out2d, *extra)


def launch_forward(family: Family, x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None,
                   scale: float, log: bool, zero_masked_rows: bool) -> LaunchConfig | None:
    """What every family module's ``launch`` does: softmax (log_softmax with ``log``) of ``x2d``'s
    rows into ``out2d`` (same shape, any strides) with ``family``; see :func:`launch_matrix`."""
    return launch_matrix(family, x2d, out2d, config, (float(scale),),
                         {"LOG": int(log), "ZERO_MASKED": int(zero_masked_rows)})


def launch_backward(family: Family, dy2d: torch.Tensor, y2d: torch.Tensor, dx2d: torch.Tensor,
                    config: LaunchConfig | None, scale: float, log: bool) -> LaunchConfig | None:
    """What every family module's ``launch_backward`` does: dx into ``dx2d`` from the incoming
    gradient ``dy2d`` and the saved output ``y2d`` (one layout) with the backward ``family``."""
    check_same_layout(dy2d, y2d)
    return launch_matrix(family, dy2d, dx2d, config, (y2d, float(scale)), {"LOG": int(log)})


def family_launchers(family: Family, bwd_family: Family):
    """The module-level ``launch`` and ``launch_backward`` of a family module with no checks of its own."""

    def launch(x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None = None, *, scale: float = 1.0,
               log: bool = False, zero_masked_rows: bool = False) -> LaunchConfig | None:
        """Softmax (log_softmax with ``log``) over dim 1 of ``x2d`` into ``out2d`` (same shape, any strides);
        ``config`` runs exactly that config, else the family's own choice (autotuned or heuristic)."""
        return launch_forward(family, x2d, out2d, config, scale, log, zero_masked_rows)

    def launch_bwd(dy2d: torch.Tensor, y2d: torch.Tensor, dx2d: torch.Tensor, config: LaunchConfig | None = None,
                   *, scale: float = 1.0, log: bool = False) -> LaunchConfig | None:
        """dx of softmax (log_softmax with ``log``) over dim 1 into ``dx2d``, from ``dy2d`` and the saved
        output ``y2d`` (one layout)."""
        return launch_backward(bwd_family, dy2d, y2d, dx2d, config, scale, log)

    return launch, launch_bwd


def chunks(N: int, meta: dict) -> int:
    """G: programs (chunks of TILES x BLOCK elements) per row for a split, coop or smem config; a smem
    config's LEAD adds to the row (its chunks start up to LEAD elements before it)."""
    return triton.cdiv(N + meta.get("LEAD", 0), meta["BLOCK"] * meta["TILES"])


def chunk_grid(M: int, N: int, meta: dict, device: DeviceInfo) -> tuple[int]:
    """The grid of the split and coop kernels: one program per chunk of every row."""
    return (M * chunks(N, meta),)


def warp_choices(device: DeviceInfo, elements: int, min_per_thread: int = 8,
                 max_per_thread: int = 32, max_warps: int = 16) -> list[int]:
    """num_warps values (up to ``max_warps`` and the device's threads per program) that give each
    thread between min and max elements of a program's tile."""
    out = []
    nw = 1
    while nw <= max_warps and nw * device.warp_size <= device.max_threads_per_program:
        per_thread = elements / (nw * device.warp_size)
        if min_per_thread <= per_thread <= max_per_thread or (per_thread < min_per_thread and nw == 1):
            out.append(nw)
        nw *= 2
    return out or [min(max_warps, device.max_threads_per_program // device.warp_size)]


def heuristic_warps(device: DeviceInfo, elements: int, per_thread: int = 16, max_warps: int = 16) -> int:
    """One num_warps for a tile of ``elements``: about ``per_thread`` elements a thread, 1..max_warps warps."""
    nw = 1
    while nw < max_warps and nw * 2 * device.warp_size <= device.max_threads_per_program \
            and elements > per_thread * nw * device.warp_size:
        nw *= 2
    return nw


def with_backend_options(device: DeviceInfo, configs: list[LaunchConfig]) -> list[LaunchConfig]:
    """Add AMD's ``waves_per_eu`` variants on HIP; CUDA configs carry no backend options."""
    if not device.is_hip:
        return configs
    out = list(configs)
    for c in configs:
        for waves in (1, 2):
            out.append(c.with_options(waves_per_eu=waves))
    return out


def supports_pdl(device: DeviceInfo) -> bool:
    """Programmatic dependent launch (a kernel starting while the one before it ends; Triton's
    ``launch_pdl`` with ``gdc_wait``/``gdc_launch_dependents``): NVIDIA sm_90 and later."""
    return device.sm_version >= 90


REG_ALLOC_UNIT = 256  # NVIDIA allocates registers per warp in units of this many
MAX_PROGRAMS_PER_SM = 32  # NVIDIA's limit on resident blocks per SM (sm_80 .. sm_90)
SMEM_RESERVED_PER_PROGRAM = 1024  # shared memory the driver keeps per block (sm_80 and later)


def resident_programs(device: DeviceInfo, n_regs: int, num_warps: int, shared_bytes: int) -> int:
    """How many programs of a compiled NVIDIA kernel (``n_regs`` registers a thread, ``num_warps``
    warps, ``shared_bytes`` of shared memory) one SM holds at once: the least of the thread,
    register (per-warp units of REG_ALLOC_UNIT), shared-memory and block limits. Shared memory is
    counted against one program's maximum (a little under the SM's), so the estimate errs low."""
    threads = num_warps * device.warp_size
    by_threads = device.max_threads_per_sm // threads
    regs_per_warp = -(-max(n_regs, 1) * device.warp_size // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by_regs = (device.regs_per_sm // regs_per_warp) // num_warps
    by_smem = device.shared_mem_per_block // (shared_bytes + SMEM_RESERVED_PER_PROGRAM) if shared_bytes else by_threads
    return max(0, min(by_threads, by_regs, by_smem, MAX_PROGRAMS_PER_SM))


def pruned_for_key(configs: list, wanted: set[LaunchConfig], m_bucket_key: int) -> list:
    """The ``triton.Config``s of ``configs`` that are in ``wanted`` (the search space of the shape at hand), less
    those with 32-bit offsets (I32) where the key's M_BUCKET is negative: a problem whose offsets could pass
    2**31 - 1 (PreparedLaunch)."""
    return [c for c in configs
            if LaunchConfig.from_triton(c) in wanted and (m_bucket_key > 0 or not c.kwargs.get("I32"))]


def check_dense(problem: RowProblem, config: LaunchConfig) -> None:
    """A DENSE config addresses row r at r * BLOCK_N with no mask: refuse a problem that is not M
    contiguous rows of exactly BLOCK_N (input and output alike), M a multiple of ROWS."""
    rows = dict(config.meta).get("ROWS", 1)
    if not (problem.rows_dense() and problem.N == config["BLOCK_N"] and problem.M % rows == 0):
        raise ValueError(f"a DENSE config ({config}) needs contiguous rows of exactly BLOCK_N, M a multiple of "
                         f"ROWS; got M={problem.M}, N={problem.N}, row strides {problem.x.outer}/{problem.y.outer}, "
                         f"column strides {problem.x.col}/{problem.y.col}, inner {problem.inner}")


def check_same_layout(dy: torch.Tensor, y: torch.Tensor) -> None:
    """Backward kernels address dy and y with one set of strides."""
    if dy.shape != y.shape or dy.stride() != y.stride():
        raise ValueError(f"dy and y must have one shape and layout, got {tuple(dy.shape)}/{dy.stride()} "
                         f"and {tuple(y.shape)}/{y.stride()}")
