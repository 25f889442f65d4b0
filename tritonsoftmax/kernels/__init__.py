"""Kernel families, one module each, loaded on first use.

Loading is lazy so that ``import tritonsoftmax`` stays cheap and so that the self-check can turn
the Triton interpreter on before any ``@triton.jit`` kernel is defined.
"""

from __future__ import annotations

import importlib

FAMILY_NAMES = ("fused", "tile", "online", "split")

_loaded: dict = {}


def family(name: str):
    """The :class:`~tritonsoftmax.kernels._common.Family` called ``name`` (imports its module once)."""
    fam = _loaded.get(name)
    if fam is None:
        if name not in FAMILY_NAMES:
            raise ValueError(f"unknown kernel family {name!r}; choose from {', '.join(FAMILY_NAMES)}")
        fam = importlib.import_module(f"{__name__}.{name}").FAMILY
        _loaded[name] = fam
    return fam
