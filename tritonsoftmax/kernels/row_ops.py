"""The Triton device functions every kernel family shares: row addressing and realigned row windows,
masked loads and stores with L2 eviction hints, the output and gradient math, and the combines of
per-chunk (max, sum) partials."""

from __future__ import annotations

import triton
import triton.language as tl

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
    return load_raw(ptrs, mask, EVICT).to(tl.float32)


@triton.jit
def load_raw(ptrs, mask, EVICT: tl.constexpr = 0):
    """load_f32 in the pointee's dtype: a caller holding a row in several pieces loads them all first and converts
    after (``scaled``), since the compiler keeps the source order and a load placed after a piece's arithmetic
    waits for the loads before it."""
    other = None if mask is None else 0.0
    if EVICT == KEEP:
        x = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_last")
    elif EVICT == DROP:
        x = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(ptrs, mask=mask, other=other)
    return x


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
    """A tile as fp32 times ``scale``, each product rounded; masked lanes are -inf whatever the sign of ``scale``
    (``mask`` None: every lane; EVICT as in load_f32).

    Without a mask the product is an fma with a zero addend: the compiler (fp fusion on) would otherwise fuse
    x * scale into the max's subtraction, fma(x, scale, -m), whose unrounded product leaves the row's max with a
    residual of up to half an ulp of m. Softmax is shift-invariant, so that residual cancels, until |m| reaches
    2^31 with a scale that is not a power of two: then it overflows or underflows exp, and the row turns NaN
    where torch's softmax of x * scale does not (the masked form's select keeps the product apart already)."""
    return scaled(load_f32(ptrs, mask, EVICT), mask, scale)


@triton.jit
def scaled(x, mask, scale):
    """load_scaled's product for a tile already loaded (load_raw, any float dtype)."""
    x = x.to(tl.float32)
    if mask is None:
        return tl.fma(x, scale, 0.0)
    else:
        return tl.where(mask, x * scale, float("-inf"))


@triton.jit
def load_scaled_rows(ptrs, row_mask, scale):
    """load_scaled for a tile whose lanes all lie in their rows, but for whole rows past the last (``row_mask``, a
    [ROWS, 1] column): those load 0 rather than -inf, since nothing of theirs is stored, so no select an element."""
    return scaled_rows(load_f32(ptrs, row_mask), scale)


@triton.jit
def scaled_rows(x, scale):
    """load_scaled_rows' product for a tile already loaded (load_raw, any float dtype)."""
    return tl.fma(x.to(tl.float32), scale, 0.0)


@triton.jit
def row_scale(scale, row, ROW_SCALE: tl.constexpr):
    """The scale of ``row``: ``scale`` itself (a float for every row), or with ROW_SCALE the row's entry of the
    per-row scales (float32, one a row in row order) that ``scale`` points to."""
    s = scale
    if ROW_SCALE:
        s = tl.load(scale + row).to(tl.float32)
    return s


@triton.jit
def rows_scale(scale, rows, M, ROW_SCALE: tl.constexpr):
    """row_scale for a tile of ``rows`` (an arange): with ROW_SCALE a [ROWS, 1] column of their scales (1 past
    M), else ``scale``."""
    s = scale
    if ROW_SCALE:
        s = tl.load(scale + rows, mask=rows < M, other=1.0).to(tl.float32)[:, None]
    return s


@triton.jit
def finish(z, m, s, LOG: tl.constexpr, ZERO_MASKED: tl.constexpr):
    """The output for scaled inputs ``z`` given the row max ``m`` and s = sum exp(z - m) (both
    broadcastable to ``z``): softmax exp(z - m) / s, or log_softmax z - m - log(s) when LOG.
    ZERO_MASKED: rows of all -inf give 0 instead of NaN. Every family takes a row's sum against ref_max(m), so
    those are exactly the rows whose sum is 0 (``m`` here may be the max or ref_max of it); a row whose max is -inf
    because a max passes NaN over (a row of NaN, or of NaN and -inf) has a NaN sum and stays NaN, as torch's."""
    if LOG:
        y = z - m - tl.log(s)
    else:
        y = exp(z - m) * (1.0 / s)
    if ZERO_MASKED:
        y = tl.where(s == 0.0, 0.0, y)
    return y


@triton.jit
def ref_max(m):
    """The max a row's exponentials are taken against: ``m``, or 0 for a row (or stretch) of max -inf, so that its
    sum is 0 (all -inf) or NaN (a NaN, which a max passes over), never the NaN of -inf - -inf."""
    return tl.where(m == float("-inf"), 0.0, m)


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
    m_ref = ref_max(m_new)
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
                ZERO_MASKED: tl.constexpr, BLOCK: tl.constexpr, TILES, HINTS: tl.constexpr, ALIGN: tl.constexpr,
                REVERSE: tl.constexpr):
    """The output over the tiles from the row's (m, s), last tile first with REVERSE (the tiles read last are
    the likeliest still in cache), else first tile first; HINTS: this last read lets them go, and so do the
    stores."""
    tl.static_assert(BLOCK % ALIGN == 0, "a tile must hold whole ALIGN-element groups")
    offs = tl.arange(0, BLOCK)
    for t in range(0, TILES):
        cols = first + ((TILES - 1 - t) if REVERSE else t) * BLOCK + offs
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
                     LOG: tl.constexpr, BLOCK: tl.constexpr, TILES, HINTS: tl.constexpr, ALIGN: tl.constexpr,
                     REVERSE: tl.constexpr):
    """dx = grad_input(dy, y, red) over the tiles into d_row, last tile first with REVERSE (HINTS and REVERSE as
    in tiles_write)."""
    tl.static_assert(BLOCK % ALIGN == 0, "a tile must hold whole ALIGN-element groups")
    offs = tl.arange(0, BLOCK)
    for t in range(0, TILES):
        cols = first + ((TILES - 1 - t) if REVERSE else t) * BLOCK + offs
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
def combine_max_sum(m_g, s_g, AXIS: tl.constexpr = 0):
    """Row (max, sum) from partials (max m_g, sum s_g) held in a tensor (unused lanes -inf, 0): with AXIS 0 one
    row's partials (the Triton and Gluon kernels' exchange), with AXIS 1 a (rows, partials) tile, one (max, sum) a
    row, an all -inf row subtracting 0 (no -inf - -inf: rows past the last). A partial of max -inf adds its sum as
    it is: 0 for an all -inf stretch, NaN for one that held a NaN (ref_max), which the row's sum then keeps."""
    m = tl.max(m_g, axis=AXIS)
    if AXIS == 0:
        s = tl.sum(tl.where(m_g == float("-inf"), s_g, s_g * exp(m_g - m)), axis=0)
    else:
        shift = ref_max(m)
        s = tl.sum(tl.where(m_g == float("-inf"), s_g, s_g * exp(m_g - shift[:, None])), axis=1)
    return m, s


@triton.jit
def sum_partials(parts_ptr, G, BLOCK_G: tl.constexpr):
    """The backward's row sum from G partial sums at parts_ptr[g], written by an earlier launch."""
    gs = tl.arange(0, BLOCK_G)
    return tl.sum(tl.load(parts_ptr + gs, mask=gs < G, other=0.0), axis=0)


