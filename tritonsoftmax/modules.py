"""``nn.Module`` wrappers: drop-ins for ``torch.nn.Softmax`` / ``torch.nn.LogSoftmax``."""

from __future__ import annotations

import torch
from torch import nn

from .api import log_softmax, softmax


class Softmax(nn.Module):
    """``tritonsoftmax.softmax`` over ``dim`` as a module.

    Example::

        >>> attn = tritonsoftmax.Softmax(dim=-1, scale=0.125)(scores)
    """

    def __init__(self, dim: int = -1, *, scale: float | None = None, zero_masked_rows: bool = False,
                 impl: str = "auto"):
        super().__init__()
        self.dim, self.scale, self.zero_masked_rows, self.impl = dim, scale, zero_masked_rows, impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, self.dim, scale=self.scale, zero_masked_rows=self.zero_masked_rows, impl=self.impl)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, scale={self.scale}, zero_masked_rows={self.zero_masked_rows}, impl={self.impl!r}"


class LogSoftmax(nn.Module):
    """``tritonsoftmax.log_softmax`` over ``dim`` as a module.

    Example::

        >>> logp = tritonsoftmax.LogSoftmax(dim=-1)(logits)
    """

    def __init__(self, dim: int = -1, *, scale: float | None = None, impl: str = "auto"):
        super().__init__()
        self.dim, self.scale, self.impl = dim, scale, impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(x, self.dim, scale=self.scale, impl=self.impl)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, scale={self.scale}, impl={self.impl!r}"
