"""``with tritonsoftmax.patch_torch(): ...``: route torch's softmax calls on GPU tensors to ours."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from .api import log_softmax, softmax
from .execute import KERNEL_DTYPES

# (owner, attribute, log?) for every entry point that is rerouted.
TARGETS = [(torch, "softmax", False), (F, "softmax", False), (torch.Tensor, "softmax", False),
           (torch, "log_softmax", True), (F, "log_softmax", True), (torch.Tensor, "log_softmax", True)]


def _routed(original, log: bool):
    ours = log_softmax if log else softmax

    @functools.wraps(original)
    def wrapper(input, dim=None, *args, **kwargs):
        # Ours takes fp32/fp16/bf16 GPU tensors with an int dim and an optional dtype; anything
        # else (implicit dim, named dims, extra positional arguments, CPU tensors) stays torch's.
        if (args or set(kwargs) - {"dtype", "_stacklevel"} or not isinstance(dim, int) or isinstance(dim, bool)
                or not isinstance(input, torch.Tensor) or input.device.type == "cpu"
                or input.dtype not in KERNEL_DTYPES):
            return original(input, dim, *args, **kwargs)
        return ours(input, dim, dtype=kwargs.get("dtype"))

    return wrapper


@contextlib.contextmanager
def patch_torch() -> Iterator[None]:
    """Inside the block, ``torch.softmax``, ``F.softmax``, ``Tensor.softmax`` and the log variants
    run tritonsoftmax for GPU tensors; on exit (also on error) the originals are restored.

    Example::

        >>> with tritonsoftmax.patch_torch():
        ...     out = model(batch)      # the model's softmax calls run tritonsoftmax
    """
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in TARGETS]
    try:
        for (owner, name, log), (_, _, original) in zip(TARGETS, saved, strict=True):
            setattr(owner, name, _routed(original, log))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
