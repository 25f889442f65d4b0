"""``with tritonsoftmax.patch_torch(): ...``: every softmax and log_softmax torch computes runs ours.

Inside the block the operator registry's implementations of ``aten::_softmax``, ``aten::_log_softmax``,
``aten::_softmax_backward_data`` and ``aten::_log_softmax_backward_data`` for GPU tensors (and, under the
Triton interpreter, CPU tensors) are ours. Every caller reaches them: ``torch.softmax``, ``F.softmax``,
``Tensor.softmax``, ``nn.Softmax``, ``F.softmin``, ``F.cross_entropy`` (log_softmax inside ATen), code that
imported a function by name; and torch's own autograd formulas call our backward. On exit (also on error) the
registrations are removed and torch's kernels are back.

What our kernels do not take (float64, 0-dim and empty tensors, torch.func transforms) is computed here from
other torch operators, never by calling the overridden ones (which would call back into this module).

With the C++ launch path on (``tritonsoftmax.native``), the registered kernels are C++'s: a call whose signature
the Python path has run before starts its kernel from C++, with no Python between torch's autograd node and the
launch; any other call runs the Python implementations below, which hand their launch to C++ for next time.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator

import torch

from . import execute, native
from .device import interpreter_active

OPERATORS = ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data")


def _ours_take(x: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether our kernels run this tensor (else the composite below computes it)."""
    return (x.dtype in execute.KERNEL_DTYPES and out_dtype in execute.KERNEL_DTYPES and x.dim() > 0
            and x.numel() > 0 and (x.device.type != "cpu" or interpreter_active())
            and not execute.functorch_active())


def _forward(log: bool):
    def impl(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        """aten::_softmax / _log_softmax: ``half_to_float`` returns float32 for a 16-bit input (torch's
        softmax(x, dtype=float32) on the GPU)."""
        out_dtype = torch.float32 if half_to_float else x.dtype
        if _ours_take(x, out_dtype):
            return execute.forward(x, dim, out_dtype if half_to_float else None, "auto", None, log, False)
        z = x.to(out_dtype)
        if log:
            return z - torch.logsumexp(z, dim, keepdim=True) if z.dim() else torch.zeros_like(z)
        e = torch.exp(z - torch.amax(z, dim, keepdim=True)) if z.dim() else torch.ones_like(z)
        return e / e.sum(dim, keepdim=True) if z.dim() else e

    return impl


def _backward(log: bool):
    def impl(grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
        """aten::_softmax_backward_data / _log_softmax_backward_data: the gradient of the input (of
        ``input_dtype``) from the incoming gradient and the saved output: execute.backward, which computes what our
        kernels do not take (float64, torch.func wrappers) with other torch operators."""
        if output.dim() == 0:
            return torch.zeros_like(output, dtype=input_dtype)
        return execute.backward(grad, output, dim, "auto", 1.0, log, input_dtype)

    return impl


IMPLS = {"_softmax": _forward(False), "_log_softmax": _forward(True),
         "_softmax_backward_data": _backward(False), "_log_softmax_backward_data": _backward(True)}


def _native_forward_miss(x: torch.Tensor, dim: int, half_to_float: bool, log: bool) -> torch.Tensor:
    """C++'s aten::_softmax / _log_softmax for a call no plan serves: ours, then its launch handed to C++."""
    y = IMPLS["_log_softmax" if log else "_softmax"](x, dim, half_to_float)
    if not half_to_float and x.dim() > 0:
        native.learn_forward(x, dim, "auto", log, False, native.MODE_OF_IMPL["auto"] + 2 * log)
    return y


def _native_backward_miss(grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype,
                          log: bool) -> torch.Tensor:
    """C++'s aten::_softmax_backward_data / _log_softmax_backward_data for a call no plan serves: ours, then (for
    a gradient of the output's dtype) its launch handed to C++."""
    if (native.module is not None and output.is_cuda and output.dim() > 0 and input_dtype == output.dtype
            and grad.dtype == output.dtype and output.dtype in execute.KERNEL_DTYPES
            and not execute.functorch_active()):
        return native.backward_miss(grad, output, dim % output.dim(), 1.0, native.MODE_OF_IMPL["auto"] + 2 * log)
    return IMPLS["_log_softmax_backward_data" if log else "_softmax_backward_data"](grad, output, dim, input_dtype)


@contextlib.contextmanager
def patch_torch() -> Iterator[None]:
    """Inside the block, every softmax and log_softmax torch computes on a GPU tensor (on a CPU tensor too under
    the Triton interpreter) runs tritonsoftmax, forward and backward, with torch's dtype rules; on exit (also on
    error) torch's kernels are back. Blocks nest: an inner block's exit leaves the outer block's kernels.

    Example::

        >>> with tritonsoftmax.patch_torch():
        ...     loss = F.cross_entropy(model(batch), target)   # its log_softmax runs tritonsoftmax
        ...     loss.backward()
    """
    _enter()
    try:
        yield
    finally:
        _exit()


# The blocks open now, and what removes their registrations: the outermost block registers and its exit removes
# them, since the registry takes one Python kernel a dispatch key (torch 2.11 raises on a second).
_depth = 0
_remove: Callable[[], None] | None = None
_lock = threading.Lock()


def _enter() -> None:
    global _depth, _remove
    with _lock:
        if _depth == 0:
            _remove = _register(["CUDA"] + (["CPU"] if interpreter_active() else []))
        _depth += 1


def _exit() -> None:
    global _depth, _remove
    with _lock:
        _depth -= 1
        if _depth == 0 and _remove is not None:
            _remove()
            _remove = None


def _register(keys: list[str]) -> Callable[[], None]:
    """Our kernels for aten's softmax operators on these dispatch keys: C++'s where the C++ launch path is on (plans
    C++ starts, else the Python implementations), else the Python implementations; returns what removes them."""
    mod = native.module
    if mod is not None:
        mod.patch_aten(keys, native.MODE_OF_IMPL["auto"], _native_forward_miss, _native_backward_miss)
        return mod.unpatch_aten
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore", UserWarning)
            for key in keys:
                for name in OPERATORS:
                    lib.impl(name, IMPLS[name], key)
    except BaseException:
        lib._destroy()
        raise
    return lib._destroy
