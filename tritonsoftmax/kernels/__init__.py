"""Kernel families, one module each, loaded on first use.

Loading is lazy so that ``import tritonsoftmax`` stays cheap and so that the self-check can turn
the Triton interpreter on before any ``@triton.jit`` kernel is defined.
"""

from __future__ import annotations

import functools
import importlib

FAMILY_NAMES = ("fused", "tile", "online", "split", "coop")
# Families written in Gluon (Triton's explicit-layout dialect): NVIDIA only, no interpreter, so they
# are kept apart from the families every test runs on the CPU.
GLUON_FAMILY_NAMES = ("smem",)
ALL_FAMILY_NAMES = FAMILY_NAMES + GLUON_FAMILY_NAMES
SMEM_MIN_SM = 80  # cp.async, which the smem kernels copy with, came with sm_80

_loaded: dict = {}
# The backward of each forward family: tile's is online's (both are the two-pass looped kernel).
_BACKWARD_MODULE = {"fused": "fused", "tile": "online", "online": "online", "split": "split", "coop": "coop",
                    "smem": "smem"}


def family(name: str):
    """The forward :class:`~tritonsoftmax.kernels.kernel_family.Family` called ``name`` (imports its module once)."""
    return _load(name, name, "FAMILY")


def backward_family(name: str):
    """The backward Family of forward family ``name`` (``fused-bwd``, ``online-bwd``, ``split-bwd``, ``coop-bwd``,
    ``smem-bwd``)."""
    return _load(f"{name}:bwd", _BACKWARD_MODULE.get(name, name), "BWD_FAMILY")


def _load(key: str, name: str, attr: str):
    fam = _loaded.get(key)
    if fam is None:
        if name not in ALL_FAMILY_NAMES:
            raise ValueError(f"unknown kernel family {name!r}; choose from {', '.join(ALL_FAMILY_NAMES)}")
        fam = getattr(importlib.import_module(f"{__name__}.{name}"), attr)
        _loaded[key] = fam
    return fam


@functools.cache
def gluon_available() -> bool:
    """Whether this triton can build the Gluon families (Gluon with its NVIDIA backend, and the
    copy instruction under one of the names it has had)."""
    try:
        family("smem")
    except (ImportError, AttributeError):
        return False
    return True
