"""The fused forward's rows held as 1-D pieces (a half block and a tail, with MID three; a realigned row's body and
end groups): every piece loaded before any is scaled (row_ops.load_raw), and the last piece scaled first, so that
ptxas places no piece's load after another's arithmetic (which would wait for the loads before it and leave the
later load's latency unhidden); the row's max and sum over all the pieces, the output written piece by piece."""

from __future__ import annotations

import triton
import triton.language as tl

from .exp_domain import FMA_MAX, exp_of, exp_scale, output_of
from .row_ops import load_raw, ref_max, scaled


@triton.jit
def _folded(v, T: tl.constexpr):
    """A 1-D piece of a multiple of T elements as [len / T, T], to be reduced along its first axis: with T at least
    the elements one layout repetition spans (FOLD), those are one thread's registers, so the reduction takes no
    shuffle or barrier."""
    return tl.reshape(v, [v.shape[0] // T, T])


@triton.jit
def softmax_two_parts(x_ptr, y_ptr, base, x_a, x_b, y_a, y_b, mask_a, mask_b, scale, LOG: tl.constexpr,
                      ZERO_MASKED: tl.constexpr, FOLD: tl.constexpr = 0, B2: tl.constexpr = 0):
    """Softmax of one row held as two 1-D pieces (a realigned row's body and end groups; a row's first
    half block and its TAIL): input at x_ptr + base + x_a and x_ptr + base + x_b (masked lanes -inf),
    output at y_ptr + base + y_a and y_ptr + base + y_b, the same lanes. FOLD (the second piece's length divides
    the first's): the first piece folded onto the second in registers (_folded), so the row's max and sum each
    take one reduction across the program, not two. B2: in the half-log2 domain (exp_domain.half_log2)."""
    z_a = load_raw(x_ptr + base + x_a, mask_a)
    z_b = load_raw(x_ptr + base + x_b, mask_b)
    scale = exp_scale(scale, B2)
    z_b = scaled(z_b, mask_b, scale)
    z_a = scaled(z_a, mask_a, scale)
    if FOLD:
        T: tl.constexpr = z_b.shape[0]
        m = ref_max(tl.max(tl.maximum(tl.max(_folded(z_a, T), axis=0), z_b), axis=0))
    else:
        m = ref_max(tl.maximum(tl.max(z_a, axis=0), tl.max(z_b, axis=0)))
    fma_ok = tl.abs(m) < FMA_MAX
    e_a = exp_of(z_a, m, fma_ok, B2)
    e_b = exp_of(z_b, m, fma_ok, B2)
    if FOLD:
        s = tl.sum(tl.sum(_folded(e_a, T), axis=0) + e_b, axis=0)
    else:
        s = tl.sum(e_a, axis=0) + tl.sum(e_b, axis=0)
    y_dtype = y_ptr.dtype.element_ty
    tl.store(y_ptr + base + y_a, output_of(z_a, m, e_a, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask_a)
    tl.store(y_ptr + base + y_b, output_of(z_b, m, e_b, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask_b)


@triton.jit
def softmax_three_parts(x_ptr, y_ptr, base, x_a, x_b, x_c, y_a, y_b, y_c, mask_a, mask_b, mask_c, scale,
                        LOG: tl.constexpr, ZERO_MASKED: tl.constexpr, FOLD: tl.constexpr = 0, B2: tl.constexpr = 0):
    """Softmax of one row held as three 1-D pieces (a realigned row's first half, tail and partial end groups,
    held_row_lanes; a row's first half, MID elements and a tail): input at x_ptr + base + x_*, output at
    y_ptr + base + y_*, the same lanes (masked lanes -inf). FOLD: as in softmax_two_parts, the first two pieces
    folded onto the third. B2: as in softmax_two_parts."""
    z_a = load_raw(x_ptr + base + x_a, mask_a)
    z_b = load_raw(x_ptr + base + x_b, mask_b)
    z_c = load_raw(x_ptr + base + x_c, mask_c)
    scale = exp_scale(scale, B2)
    z_c = scaled(z_c, mask_c, scale)
    z_b = scaled(z_b, mask_b, scale)
    z_a = scaled(z_a, mask_a, scale)
    if FOLD:
        T: tl.constexpr = z_c.shape[0]
        top = tl.maximum(tl.max(_folded(z_a, T), axis=0), tl.max(_folded(z_b, T), axis=0))
        m = ref_max(tl.max(tl.maximum(top, z_c), axis=0))
    else:
        m = ref_max(tl.maximum(tl.maximum(tl.max(z_a, axis=0), tl.max(z_b, axis=0)), tl.max(z_c, axis=0)))
    fma_ok = tl.abs(m) < FMA_MAX
    e_a = exp_of(z_a, m, fma_ok, B2)
    e_b = exp_of(z_b, m, fma_ok, B2)
    e_c = exp_of(z_c, m, fma_ok, B2)
    if FOLD:
        s = tl.sum(tl.sum(_folded(e_a, T), axis=0) + tl.sum(_folded(e_b, T), axis=0) + e_c, axis=0)
    else:
        s = tl.sum(e_a, axis=0) + tl.sum(e_b, axis=0) + tl.sum(e_c, axis=0)
    y_dtype = y_ptr.dtype.element_ty
    tl.store(y_ptr + base + y_a, output_of(z_a, m, e_a, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask_a)
    tl.store(y_ptr + base + y_b, output_of(z_b, m, e_b, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask_b)
    tl.store(y_ptr + base + y_c, output_of(z_c, m, e_c, s, LOG, ZERO_MASKED, B2).to(y_dtype), mask=mask_c)
