"""The public functions: validate, view as rows, pick a kernel, launch, return."""

from __future__ import annotations

import torch

from . import dispatch, layout
from .device import interpreter_active

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_impl(impl: str) -> None:
    if impl not in dispatch.IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(map(repr, dispatch.IMPLS))}")


def _normalize_dim(dim: int, ndim: int) -> int:
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not lo <= dim <= hi:
        raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {dim})")
    return dim % max(ndim, 1)


def _cast_input(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Apply torch's dtype rules: complex never; integer/bool only with a floating ``dtype``."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
    if x.is_complex():
        raise TypeError(f"softmax is not defined for complex input (got {x.dtype})")
    if not x.is_floating_point():
        if dtype is None:
            raise TypeError(f"softmax needs a floating-point input, got {x.dtype}; pass dtype= to cast it first")
        return x.to(dtype)
    return x


_prepared: dict[tuple, tuple] = {}  # call signature -> (PreparedLaunch, output dtype)
_PREPARED_MAX = 4096  # forget everything past this many signatures (dynamic shapes)


def _signature(x: torch.Tensor, dim, dtype, impl) -> tuple:
    """What a warm call must match to reuse a prepared launch (device as an index: cheaper than x.device)."""
    return (x.shape, x.stride(), x.dtype, x.get_device(), dim, dtype, impl)


def softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None,
            impl: str = "auto") -> torch.Tensor:
    """Softmax of ``x`` along ``dim``, a drop-in for ``torch.softmax(x, dim, dtype=dtype)``.

    fp32/fp16/bf16 tensors on a GPU (or on the CPU under ``TRITON_INTERPRET=1``) run Triton
    kernels, math in fp32; float64 and other CPU tensors are computed by ``torch.softmax``.
    ``impl`` is "auto" (the dispatcher), "fused", "tile", "online" or "split".

    Example::

        >>> y = tritonsoftmax.softmax(torch.randn(4096, 1024, device="cuda"))
    """
    try:
        hit = _prepared.get(_signature(x, dim, dtype, impl))
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: validate below
        hit = None
    if hit is not None:  # a warm call: same signature as an earlier one that ran our kernels in place
        prepared, out_dtype = hit
        y = torch.empty_like(x, dtype=out_dtype)
        prepared(x, y)
        return y
    return _softmax_cold(x, dim, dtype, impl)


def _softmax_cold(x: torch.Tensor, dim: int, dtype: torch.dtype | None, impl: str) -> torch.Tensor:
    """The first call of a signature: validate, choose, prepare (and remember) the launch."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax expects a torch.Tensor, got {type(x).__name__}")
    _check_impl(impl)
    key = _signature(x, dim, dtype, impl)
    x = _cast_input(x, dtype)
    dim = _normalize_dim(dim, x.dim())
    out_dtype = dtype or x.dtype
    if (x.dtype not in KERNEL_DTYPES or out_dtype not in KERNEL_DTYPES or x.dim() == 0
            or (x.device.type == "cpu" and not interpreter_active())):
        return torch.softmax(x, dim, dtype=out_dtype)
    y = torch.empty_like(x, dtype=out_dtype)
    if x.numel() == 0:
        return y
    problem = layout.row_problem(x, y, dim)
    if problem is not None:
        prepared = _prepare(problem, x, y, impl)
        if key[2] == x.dtype and x.device.type != "cpu":  # no cast happened; the interpreter reads env each call
            if len(_prepared) >= _PREPARED_MAX:
                _prepared.clear()
            _prepared[key] = (prepared, out_dtype)
        prepared(x, y)
        return y
    # The other dims do not collapse into two stride groups: copy to a contiguous tensor.
    x = x.contiguous()
    y = torch.empty_like(x, dtype=out_dtype)
    problem = layout.row_problem(x, y, dim)
    if problem is None:  # column stride past 32 bits: compute with the softmax dim last
        x = x.movedim(dim, -1).contiguous()
        y = torch.empty_like(x, dtype=out_dtype)
        _prepare(layout.row_problem(x, y, x.dim() - 1), x, y, impl)(x, y)
        return y.movedim(-1, dim)
    _prepare(problem, x, y, impl)(x, y)
    return y


def _prepare(problem: layout.RowProblem, x: torch.Tensor, y: torch.Tensor, impl: str):
    p = dispatch.plan(impl, problem.M, problem.N, x.dtype, y.dtype, x.device)
    return p.family.prepare(problem, p.config, p.device, p.from_store)


def clear_caches() -> None:
    """Forget every prepared launch and dispatch decision, and re-read the tuning tables next time
    (after writing a tuning table in this process, for instance)."""
    _prepared.clear()
    dispatch.clear_cache()
