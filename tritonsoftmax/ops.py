"""Autograd for tritonsoftmax, two ways with one formula:

- ``torch.library`` custom operators, so ``torch.compile`` (no graph breaks) sees tritonsoftmax as
  one op each way:

  - ``tritonsoftmax::softmax(x, dim, dtype, impl, scale, log, zero_masked) -> Tensor``
  - ``tritonsoftmax::softmax_backward(dy, y, dim, impl, scale, log, input_dtype) -> Tensor``

  Both have fake (meta) implementations: the output is ``torch.empty_like`` of the input (the
  layout every path of ours returns). The backward is registered as the forward's autograd formula.
- :class:`SoftmaxFunction`, a ``torch.autograd.Function`` for eager calls that autograd records:
  the same forward and backward without the operator's dispatch (which costs a warm call several
  times a kernel launch on the host; ``python -m bench.overhead``).

The backward is differentiable too (a double backward: gradient penalties, Hessian-vector products): where
autograd records the backward (``create_graph=True``) it runs as ``tritonsoftmax::softmax_backward``, whose
own autograd formula is in torch operators (:func:`_backward_grads`).
"""

from __future__ import annotations

import torch

from . import execute


@torch.library.custom_op("tritonsoftmax::softmax", mutates_args=())
def softmax_op(x: torch.Tensor, dim: int, dtype: torch.dtype | None, impl: str, scale: float, log: bool,
               zero_masked: bool) -> torch.Tensor:
    return execute.forward(x, dim, dtype, impl, scale, log, zero_masked)


@softmax_op.register_fake
def _softmax_fake(x, dim, dtype, impl, scale, log, zero_masked):
    execute.normalize_dim(dim, x.dim())
    if dtype is None and not x.is_floating_point():
        raise TypeError(f"softmax needs a floating-point input, got {x.dtype}; pass dtype= to cast it first")
    return torch.empty_like(x, dtype=dtype or x.dtype)


@torch.library.custom_op("tritonsoftmax::softmax_backward", mutates_args=())
def softmax_backward_op(dy: torch.Tensor, y: torch.Tensor, dim: int, impl: str, scale: float, log: bool,
                        input_dtype: torch.dtype) -> torch.Tensor:
    return execute.backward(dy, y, dim, impl, scale, log, input_dtype)


@softmax_backward_op.register_fake
def _softmax_backward_fake(dy, y, dim, impl, scale, log, input_dtype):
    return torch.empty_like(y, dtype=input_dtype)


def _setup_context(ctx, inputs, output):
    x, dim, dtype, impl, scale, log, zero_masked = inputs
    ctx.save_for_backward(output)
    ctx.args = (dim, impl, scale, log, x.dtype)


def _input_grad(ctx, dy, run_backward) -> tuple:
    """The gradients of the forward's seven inputs: ``run_backward(dy, y, dim, impl, scale, log, input_dtype)``
    for x, None for the rest."""
    (y,) = ctx.saved_tensors
    return (run_backward(dy, y, *ctx.args),) + (None,) * 6


softmax_op.register_autograd(lambda ctx, dy: _input_grad(ctx, dy, softmax_backward_op), setup_context=_setup_context)


def _backward_setup_context(ctx, inputs, output):
    dy, y, dim, impl, scale, log, input_dtype = inputs
    ctx.save_for_backward(dy, y)
    ctx.args = (dim, scale, log)


def _backward_grads(ctx, ddx) -> tuple:
    """The gradients of dx = scale * y * (dy - sum(dy * y)) (log: scale * (dy - exp(y) * sum(dy))) with respect
    to dy and y, given ddx, the gradient of dx; None for the other five inputs. In torch operators (float32 or
    wider), so a third derivative records as well."""
    dy, y = ctx.saved_tensors
    dim, scale, log = ctx.args
    work = torch.promote_types(y.dtype, torch.float32)
    g, yw, dyw = ddx.to(work), y.to(work), dy.to(work)
    if log:
        p = torch.exp(yw)
        g_dy = scale * (g - (g * p).sum(dim, keepdim=True))
        g_y = -scale * g * p * dyw.sum(dim, keepdim=True)
    else:
        r = (dyw * yw).sum(dim, keepdim=True)
        gy = (g * yw).sum(dim, keepdim=True)
        g_dy = scale * yw * (g - gy)
        g_y = scale * (g * (dyw - r) - dyw * gy)
    return (g_dy.to(dy.dtype), g_y.to(y.dtype)) + (None,) * 5


softmax_backward_op.register_autograd(_backward_grads, setup_context=_backward_setup_context)


class SoftmaxFunction(torch.autograd.Function):
    """``tritonsoftmax::softmax`` and its autograd formula for eager calls, without the operator's dispatch:
    ``SoftmaxFunction.apply(x, dim, dtype, impl, scale, log, zero_masked)``. The context is set in ``forward``:
    with a separate ``setup_context`` (which ``torch.func`` transforms need; api sends their calls to torch's
    softmax instead) a recorded call costs about as much host time as through the operator."""

    @staticmethod
    def forward(ctx, x, dim, dtype, impl, scale, log, zero_masked):
        y = execute.forward(x, dim, dtype, impl, scale, log, zero_masked)
        _setup_context(ctx, (x, dim, dtype, impl, scale, log, zero_masked), y)
        return y

    @staticmethod
    def backward(ctx, dy):
        if not torch.is_grad_enabled():
            return _input_grad(ctx, dy, execute.backward)
        # recorded (create_graph=True): through the operator, whose autograd formula gives the double backward;
        # with a tensor of scales (which the operator's schema does not take) in torch operators
        if isinstance(ctx.args[2], torch.Tensor):
            return _input_grad(ctx, dy, _recorded_backward)
        return _input_grad(ctx, dy, softmax_backward_op)


def _unwrapped_apply(cls):
    """``cls.apply`` without ``torch.autograd.Function.apply``'s Python wrapper, which binds default arguments
    (for a Function with a ``setup_context``; ours has none) and unwraps dead ``torch.func`` wrappers (api sends
    calls made under a ``torch.func`` transform to torch's softmax, never here): a few microseconds of host time
    a recorded call. The wrapper itself where torch's classes are laid out otherwise."""
    apply = getattr(super(torch.autograd.Function, cls), "apply", None)
    return apply if callable(apply) else cls.apply


# SoftmaxFunction.apply as an eager recorded call runs it (api._entry)
record_softmax = _unwrapped_apply(SoftmaxFunction)


def _recorded_backward(dy, y, dim, impl, scale, log, input_dtype):
    """The backward with a tensor of scales where autograd records it: execute.backward_torch."""
    dim = execute.normalize_dim(dim, y.dim())
    return execute.backward_torch(dy, y, dim, execute.scale_view(scale, y, dim), log, input_dtype)
