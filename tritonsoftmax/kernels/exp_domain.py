"""The half-log2 domain of the fused forward of 16-bit rows: inputs times scale * log2(e) / 2, so that each
element's exponential is exp2 of one fma (half_log2 says why and where)."""

from __future__ import annotations

import triton
import triton.language as tl

from .row_ops import exp

HALF_LOG2E = tl.constexpr(0.7213475204444817)  # log2(e) / 2
LN2 = tl.constexpr(0.6931471805599453)
FMA_MAX = tl.constexpr(1e38)  # the largest |max| whose double, 2 max, is a finite fp32 (exp_of's fma)


@triton.constexpr_function
def half_log2(x_dtype, y_dtype):
    """B2 for a kernel reading ``x_dtype`` and writing ``y_dtype`` (pointee dtypes): True where both are 16-bit
    floats. Such a kernel may work in the half-log2 domain (exp_scale, exp_of, output_of): inputs times
    scale * log2(e) / 2, so that exp(x * scale - max) is exp2(fma(z, 2, -2 max)), an fma and the ex2 an element
    instead of a subtraction, a multiply by log2(e) and the ex2. The domain's product is rounded at the input's
    magnitude rather than at its distance from the max (an exponent error up to |x * scale| * 2^-24): short of fp32's
    precision for large fp32 inputs, so fp32 keeps the natural domain, but far inside a 16-bit output's, since 16-bit
    inputs that close to the row's max are a few of their own steps from it (tests/test_held_rows.py: large values
    one step apart)."""
    return x_dtype.primitive_bitwidth == 16 and y_dtype.primitive_bitwidth == 16


@triton.jit
def exp_scale(scale, B2: tl.constexpr):
    """What inputs are multiplied by (scaled, scaled_rows): ``scale``, or in the half-log2 domain (B2, half_log2)
    scale * log2(e) / 2, a product never larger than the scaled input, so no finite one overflows."""
    if B2:
        return scale * HALF_LOG2E
    else:
        return scale


@triton.jit
def exp_of(z, m, fma_ok, B2: tl.constexpr):
    """exp(x * scale - max) for inputs ``z`` (scaled) and their max ``m`` (ref_max): row_ops.exp(z - m) in the natural
    domain; in the half-log2 domain (B2) exp2(fma(z, 2, -2 m)), whose 2 m is exact, where ``fma_ok`` (a scalar:
    every |m| of the tile below FMA_MAX), else exp2((z - m) * 2), where 2 m would overflow."""
    if B2:
        if fma_ok:
            d = tl.fma(z, 2.0, -2.0 * m)
        else:
            d = (z - m) * 2.0
        e = tl.exp2(d)
    else:
        e = exp(z - m)
    return e


@triton.jit
def output_of(z, m, e, s, LOG: tl.constexpr, ZERO_MASKED: tl.constexpr, B2: tl.constexpr):
    """finish for a tile whose exponentials e = exp_of(z, m) are already taken: softmax e / s; log_softmax
    z - m - log(s), in the half-log2 domain (z - m) * 2 ln(2) - log(s) (not from exp_of's exponent, which
    overflows to -inf where z - m times log2(e) passes fp32's range and the output does not)."""
    if LOG:
        if B2:
            y = tl.fma(z - m, 2.0 * LN2, -tl.log(s))
        else:
            y = z - m - tl.log(s)
    else:
        y = e * (1.0 / s)
    if ZERO_MASKED:
        y = tl.where(s == 0.0, 0.0, y)
    return y
