"""The public functions: validate, view as rows, pick a kernel, launch, return.

``softmax``/``log_softmax`` route through the ``tritonsoftmax::softmax`` custom operator (see
``ops.py``) only when ``torch.compile`` is tracing, and through ``ops.SoftmaxFunction`` (the same
forward and backward as a ``torch.autograd.Function``) when eager autograd records the call; a plain
eager call runs :func:`forward` directly. Neither eager path pays the operator's dispatch. Calls made
under a ``torch.func`` transform run torch's softmax (:func:`_functorch_active`).
"""

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


def _check_scale(scale) -> float:
    if scale is None:
        return 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python number, got {type(scale).__name__}")
    return float(scale)


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


def softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None, impl: str = "auto",
            scale: float | None = None, zero_masked_rows: bool = False) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``: a drop-in for ``torch.softmax(x, dim, dtype=dtype)``.

    fp32/fp16/bf16 tensors on a GPU (or on the CPU under ``TRITON_INTERPRET=1``) run Triton
    kernels, math in fp32; float64 and other CPU tensors are computed by torch.
    ``impl``: "auto" (the dispatcher), "fused", "tile", "online", "split", "coop" or "smem" (NVIDIA sm_80+).
    ``scale``: temperature, fused into the kernels: the result is ``torch.softmax(x * scale, dim)``.
    ``zero_masked_rows``: rows that are entirely -inf give zeros (and zero gradient), not NaN.
    Differentiable; works under ``torch.compile`` and in CUDA graphs.

    Example::

        >>> y = tritonsoftmax.softmax(torch.randn(4096, 1024, device="cuda"), scale=0.125)
    """
    return _entry(x, dim, dtype, impl, scale, False, zero_masked_rows)


def log_softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None, impl: str = "auto",
                scale: float | None = None) -> torch.Tensor:
    """Log-softmax of ``x`` along ``dim``: a drop-in for ``torch.log_softmax(x, dim, dtype=dtype)``.

    Same kernels, rules and options as :func:`softmax` (``scale`` gives ``log_softmax(x * scale)``).

    Example::

        >>> logp = tritonsoftmax.log_softmax(logits, dim=-1)
    """
    return _entry(x, dim, dtype, impl, scale, True, False)


def _entry(x, dim, dtype, impl, scale, log: bool, zero_masked: bool) -> torch.Tensor:
    # type() first: isinstance on torch.Tensor runs Python code of torch's metaclass (~0.1 us a call)
    if type(x) is torch.Tensor or isinstance(x, torch.Tensor):
        compiling = torch.compiler.is_compiling()
        if compiling or (x.requires_grad and torch.is_grad_enabled()):
            if not compiling and _functorch_active():  # torch.func.grad & co: torch's softmax, which they trace
                return _forward_cold(x, dim, dtype, impl, scale, log, zero_masked)
            from . import ops

            _check_impl(impl)
            run = ops.softmax_op if compiling else ops.SoftmaxFunction.apply
            return run(x, dim, dtype, impl, _check_scale(scale), log, bool(zero_masked))
    return forward(x, dim, dtype, impl, scale, log, zero_masked)


# call signature -> (what starts it warm: the launch's ``direct`` where it has one, output dtype or None: x's,
# the prepared launch)
_prepared: dict[tuple, tuple] = {}
_PREPARED_MAX = 4096  # forget everything past this many signatures (dynamic shapes)


def _signature(x: torch.Tensor, dim, dtype, impl, log, zero_masked) -> tuple:
    """What a warm call must match to reuse a prepared launch (device as an index: cheaper than x.device)."""
    return (x.shape, x.stride(), x.dtype, x.get_device(), dim, dtype, impl, log, zero_masked)


def forward(x: torch.Tensor, dim: int, dtype: torch.dtype | None, impl: str, scale: float | None, log: bool,
            zero_masked: bool) -> torch.Tensor:
    """Softmax/log-softmax without autograd: the eager path (and the custom operator's body)."""
    try:
        hit = _prepared.get(_signature(x, dim, dtype, impl, log, zero_masked))
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: validate below
        hit = None
    if hit is not None:  # a warm call: same signature as an earlier one that ran our kernels in place
        start, out_dtype, _ = hit
        y = torch.empty_like(x) if out_dtype is None else torch.empty_like(x, dtype=out_dtype)  # no dtype: cheaper
        try:
            start(x, y, 1.0 if scale is None else _check_scale(scale))
        except RuntimeError:  # a torch.func wrapper (vmap) has no storage: its data_ptr raises before any launch
            if not _functorch_active():
                raise
            return _forward_cold(x, dim, dtype, impl, scale, log, zero_masked)
        return y
    return _forward_cold(x, dim, dtype, impl, scale, log, zero_masked)


def _functorch_active() -> bool:
    """A torch.func transform (vmap, grad, jacrev, ...) is running: its tensors are wrappers without storage, which
    our kernels cannot read and whose autograd they would not record."""
    return torch._C._are_functorch_transforms_active()


def _torch_forward(x, dim, out_dtype, scale, log, zero_masked) -> torch.Tensor:
    """The reference computation for what our kernels do not take (float64, CPU tensors, torch.func transforms)."""
    z = x if scale == 1.0 else x * scale
    y = torch.log_softmax(z, dim, dtype=out_dtype) if log else torch.softmax(z, dim, dtype=out_dtype)
    if zero_masked:
        y = y.masked_fill((z == float("-inf")).all(dim, keepdim=True), 0.0)
    return _like_input(y, x, out_dtype)


def _like_input(r: torch.Tensor, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``r`` in the layout of ``torch.empty_like(x)`` (what every path of ours returns)."""
    out = torch.empty_like(x, dtype=out_dtype)
    if out.stride() == r.stride():
        return r
    return out.copy_(r)


def _forward_cold(x, dim, dtype, impl, scale, log, zero_masked) -> torch.Tensor:
    """The first call of a signature: validate, choose, prepare (and remember) the launch."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax expects a torch.Tensor, got {type(x).__name__}")
    _check_impl(impl)
    s = _check_scale(scale)
    key = _signature(x, dim, dtype, impl, log, zero_masked)
    x = _cast_input(x, dtype)
    dim = _normalize_dim(dim, x.dim())
    out_dtype = dtype or x.dtype
    if (x.dtype not in KERNEL_DTYPES or out_dtype not in KERNEL_DTYPES or x.dim() == 0 or x.numel() == 0
            or (x.device.type == "cpu" and not interpreter_active()) or _functorch_active()):
        return _torch_forward(x, dim, out_dtype, s, log, zero_masked)
    flags = {"LOG": int(log), "ZERO_MASKED": int(zero_masked)}
    y = torch.empty_like(x, dtype=out_dtype)
    # Remember the launch unless a cast happened (the key is the uncast input's) or the interpreter
    # runs it (it reads the environment on every call).
    remember = key if key[2] == x.dtype and x.device.type != "cpu" else None
    return _launch_rows(x, y, (), dim, impl, flags, False, s, remember, out_dtype)


def _launch_rows(a: torch.Tensor, out: torch.Tensor, rest: tuple, dim: int, impl: str, flags: dict, backward: bool,
                 scale: float, remember: tuple | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Run the chosen kernel over the rows along ``dim``: ``a`` (x, or the backward's dy) and ``rest``
    (the saved output) into ``out``; prepared launches of in-place layouts are kept under ``remember``.
    Layouts whose other dims do not collapse into two stride groups (or whose column stride passes
    32 bits) run on contiguous copies with ``dim`` last, written back into ``out``'s layout."""
    problem = layout.row_problem(a, out, dim)
    if problem is not None:
        prepared = _prepare(problem, a, out, impl, flags, backward)
        prepared(a, out, *rest, scale)
        if remember is not None:  # after the first launch, which gives a PreparedLaunch its direct start
            if len(_prepared) >= _PREPARED_MAX:
                _prepared.clear()
            _prepared[remember] = (getattr(prepared, "direct", prepared), None if out_dtype == a.dtype else out_dtype,
                                   prepared)
        return out
    at, *rt = (t.movedim(dim, -1).contiguous() for t in (a, *rest))
    ot = torch.empty_like(at, dtype=out.dtype)
    _prepare(layout.row_problem(at, ot, at.dim() - 1), at, ot, impl, flags, backward)(at, ot, *rt, scale)
    return out.copy_(ot.movedim(-1, dim))


def _prepare(problem: layout.RowProblem, x: torch.Tensor, y: torch.Tensor, impl: str, flags: dict,
             backward: bool):
    aligned = problem.rows_aligned(x.element_size(), y.element_size())
    dense = problem.rows_dense() and x.element_size() == y.element_size()
    p = dispatch.plan(impl, problem.M, problem.N, x.dtype, y.dtype, x.device, backward, aligned, dense)
    return p.family.prepare(problem, p.config, p.device, p.from_store, flags)


def backward(dy: torch.Tensor, y: torch.Tensor, dim: int, impl: str, scale: float, log: bool,
             input_dtype: torch.dtype) -> torch.Tensor:
    """The input gradient of softmax/log_softmax from the incoming gradient and the saved output:
    scale * y * (dy - sum(dy * y)), or scale * (dy - exp(y) * sum(dy)) for log_softmax."""
    dim = _normalize_dim(dim, y.dim())
    if (y.dtype not in KERNEL_DTYPES or y.dim() == 0 or y.numel() == 0
            or (y.device.type == "cpu" and not interpreter_active())):
        dyf, yf = dy.to(y.dtype), y
        if log:
            dx = scale * (dyf - torch.exp(yf) * dyf.sum(dim, keepdim=True))
        else:
            dx = scale * yf * (dyf - (dyf * yf).sum(dim, keepdim=True))
        return _like_input(dx.to(input_dtype), y, input_dtype)
    key = ("bwd", y.shape, y.stride(), y.dtype, y.get_device(), dim, impl, log)
    if dy.dtype != y.dtype or dy.stride() != y.stride():
        dy = torch.empty_like(y).copy_(dy)  # the kernels read dy and y with one set of strides
    dx = torch.empty_like(y)
    hit = _prepared.get(key)
    if hit is not None:  # the prepared launch itself: its direct start takes (x, y, scale) calls only
        hit[2](dy, dx, y, float(scale))
    else:
        _launch_rows(dy, dx, (y,), dim, impl, {"LOG": int(log)}, True, float(scale),
                     key if y.device.type != "cpu" else None, y.dtype)
    return dx if input_dtype == dx.dtype else dx.to(input_dtype)


def clear_caches() -> None:
    """Forget every prepared launch and dispatch decision, and re-read the tuning tables next time
    (after writing a tuning table in this process, for instance); free the coop family's buffers."""
    import sys

    _prepared.clear()
    dispatch.clear_cache()
    coop = sys.modules.get("tritonsoftmax.kernels.coop")
    if coop is not None:
        coop.release_scratch()
