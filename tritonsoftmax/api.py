"""The public functions: ``softmax`` and ``log_softmax``, drop-ins for torch's.

A call routes through the ``tritonsoftmax::softmax`` custom operator (see ``ops.py``) only when
``torch.compile`` is tracing, and through ``ops.SoftmaxFunction`` (the same forward and backward as a
``torch.autograd.Function``) when eager autograd records the call; a plain eager call runs
:func:`execute.forward` directly. Neither eager path pays the operator's dispatch. Calls made under
a ``torch.func`` transform run torch's softmax (:func:`execute.functorch_active`). With the C++ launch
path on (``native.enable()``), an eager call asks it first: it starts the kernel of a signature the
Python path has run before, recorded by its own C++ autograd Function.
"""

from __future__ import annotations

import torch

from . import dispatch, execute, native, ops
from .kernels import exchange
from .kernels.triton_launcher import launch_hook_installed


def softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None, impl: str = "auto",
            scale: float | None = None, zero_masked_rows: bool = False) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``: a drop-in for ``torch.softmax(x, dim, dtype=dtype)``.

    fp32/fp16/bf16 tensors on a GPU (or on the CPU under ``TRITON_INTERPRET=1``) run Triton
    kernels, math in fp32; float64 and other CPU tensors are computed by torch.
    ``impl``: "auto" (the dispatcher), "fused", "tile", "online", "split", "coop" or "smem" (NVIDIA sm_80+).
    ``scale``: temperature, fused into the kernels: the result is ``torch.softmax(x * scale, dim)``. A float, or a
    tensor of one scale a row (a per-row temperature: its shape broadcasts to ``x`` with size 1 along ``dim``;
    no gradient flows into it). Every family but smem takes a tensor (auto runs coop where it would run smem);
    under ``torch.compile`` a tensor scale is computed by torch operators.
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
        if torch.compiler.is_compiling():
            execute.check_impl(impl)
            if type(scale) is torch.Tensor:  # the operator's schema takes one float scale
                return execute.forward_torch(x, dim, dtype, scale, log, zero_masked)
            return ops.softmax_op(x, dim, dtype, impl, execute.check_scale(scale), log, bool(zero_masked))
        if native.module is not None:
            return _native_entry(x, dim, dtype, impl, scale, log, zero_masked)
        return _eager(x, dim, dtype, impl, scale, log, zero_masked)
    return execute.forward(x, dim, dtype, impl, scale, log, zero_masked)


def _eager(x, dim, dtype, impl, scale, log: bool, zero_masked: bool) -> torch.Tensor:
    """An eager call on the Python path: recorded through ops.SoftmaxFunction where autograd records it."""
    if x.requires_grad and torch.is_grad_enabled():
        if execute.functorch_active():  # torch.func.grad & co: torch's softmax
            return execute.forward_cold(x, dim, dtype, impl, scale, log, zero_masked)
        execute.check_impl(impl)
        return ops.record_softmax(x, dim, dtype, impl, execute.check_scale(scale), log, bool(zero_masked))
    return execute.forward(x, dim, dtype, impl, scale, log, zero_masked)


def _native_entry(x, dim, dtype, impl, scale, log: bool, zero_masked: bool) -> torch.Tensor:
    """An eager call with the C++ launch path on (native.enable): C++ starts signatures it has a plan for; the
    others run the Python path, which then hands C++ the launch it kept."""
    mode = native.MODE_OF_IMPL.get(impl) if (type(dim) is int and dtype is None and not execute.functorch_active()
                                             and not launch_hook_installed()) else None
    if mode is None or not (scale is None or type(scale) is float):
        return _eager(x, dim, dtype, impl, scale, log, zero_masked)
    mode += 2 * bool(log) + bool(zero_masked)
    y = native.module.softmax(x, dim, 1.0 if scale is None else scale, mode)
    if y is None:
        y = _eager(x, dim, dtype, impl, scale, log, zero_masked)
        native.learn_forward(x, dim, impl, log, zero_masked, mode)
    return y


def clear_caches() -> None:
    """Forget every prepared launch and dispatch decision, and re-read the tuning tables next time
    (after writing a tuning table in this process, for instance); free the coop family's buffers."""
    import sys

    execute.forget_prepared()
    native.forget()
    dispatch.clear_cache()
    distributed = sys.modules.get("tritonsoftmax.distributed")
    if distributed is not None:
        distributed.forget_launches()
    coop = sys.modules.get("tritonsoftmax.kernels.coop")
    if coop is not None:
        exchange.release_scratch()
