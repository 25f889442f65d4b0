"""Kernel families, one module each, loaded on first use.

Loading is lazy so that ``import tritonsoftmax`` stays cheap and so that the self-check can turn
the Triton interpreter on before any ``@triton.jit`` kernel is defined.
"""

from __future__ import annotations

import importlib

FAMILY_NAMES = ("fused", "tile", "online", "split")

_loaded: dict = {}
# The backward of each forward family: tile's is online's (both are the two-pass looped kernel).
_BACKWARD_MODULE = {"fused": "fused", "tile": "online", "online": "online", "split": "split"}


def family(name: str):
    """The :class:`~tritonsoftmax.kernels._common.Family` called ``name`` (imports its module once)."""
    fam = _loaded.get(name)
    if fam is None:
        if name not in FAMILY_NAMES:
            raise ValueError(f"unknown kernel family {name!r}; choose from {', '.join(FAMILY_NAMES)}")
        fam = importlib.import_module(f"{__name__}.{name}").FAMILY
        _loaded[name] = fam
    return fam


def backward_family(name: str):
    """The backward Family of forward family ``name`` (``fused-bwd``, ``online-bwd``, ``split-bwd``)."""
    key = f"{name}:bwd"
    fam = _loaded.get(key)
    if fam is None:
        if name not in FAMILY_NAMES:
            raise ValueError(f"unknown kernel family {name!r}; choose from {', '.join(FAMILY_NAMES)}")
        fam = importlib.import_module(f"{__name__}.{_BACKWARD_MODULE[name]}").BWD_FAMILY
        _loaded[key] = fam
    return fam
