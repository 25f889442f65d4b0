"""``torch.library`` custom operators, so autograd, ``torch.compile`` (no graph breaks) and CUDA
graphs see tritonsoftmax as one op each way:

- ``tritonsoftmax::softmax(x, dim, dtype, impl, scale, log, zero_masked) -> Tensor``
- ``tritonsoftmax::softmax_backward(dy, y, dim, impl, scale, log, input_dtype) -> Tensor``

Both have fake (meta) implementations: the output is ``torch.empty_like`` of the input (the
layout every path of ours returns). The backward is registered as the forward's autograd formula;
it is not itself differentiable (no double backward).
"""

from __future__ import annotations

import torch

from . import api


@torch.library.custom_op("tritonsoftmax::softmax", mutates_args=())
def softmax_op(x: torch.Tensor, dim: int, dtype: torch.dtype | None, impl: str, scale: float, log: bool,
               zero_masked: bool) -> torch.Tensor:
    return api.forward(x, dim, dtype, impl, scale, log, zero_masked)


@softmax_op.register_fake
def _softmax_fake(x, dim, dtype, impl, scale, log, zero_masked):
    api._normalize_dim(dim, x.dim())
    if dtype is None and not x.is_floating_point():
        raise TypeError(f"softmax needs a floating-point input, got {x.dtype}; pass dtype= to cast it first")
    return torch.empty_like(x, dtype=dtype or x.dtype)


@torch.library.custom_op("tritonsoftmax::softmax_backward", mutates_args=())
def softmax_backward_op(dy: torch.Tensor, y: torch.Tensor, dim: int, impl: str, scale: float, log: bool,
                        input_dtype: torch.dtype) -> torch.Tensor:
    return api.backward(dy, y, dim, impl, scale, log, input_dtype)


@softmax_backward_op.register_fake
def _softmax_backward_fake(dy, y, dim, impl, scale, log, input_dtype):
    return torch.empty_like(y, dtype=input_dtype)


def _setup_context(ctx, inputs, output):
    x, dim, dtype, impl, scale, log, zero_masked = inputs
    ctx.save_for_backward(output)
    ctx.args = (dim, impl, scale, log, x.dtype)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    dim, impl, scale, log, input_dtype = ctx.args
    return softmax_backward_op(dy, y, dim, impl, scale, log, input_dtype), None, None, None, None, None, None


softmax_op.register_autograd(_backward, setup_context=_setup_context)
