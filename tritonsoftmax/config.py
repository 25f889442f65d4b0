"""Launch configurations and the shape buckets that key tuning decisions.

A :class:`LaunchConfig` is plain data (constexpr meta-parameters, num_warps, num_stages and,
on AMD, backend options such as ``waves_per_eu``), so the same value can come from the
autotuner, the tuning cache (YAML), a test or a benchmark.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

_LAUNCH_OPTIONS = ("num_warps", "num_stages")
BACKEND_OPTIONS = ("waves_per_eu",)  # AMD-only launch options; never emitted for CUDA


def autotune_enabled() -> bool:
    """False when ``TRITONSOFTMAX_AUTOTUNE=0``: a launch without a config then uses the family's
    heuristic config instead of benchmarking every candidate on first use."""
    return os.environ.get("TRITONSOFTMAX_AUTOTUNE", "1") not in ("0", "")


def save_tuning_enabled() -> bool:
    """True when ``TRITONSOFTMAX_TUNE_SAVE=1``: autotuning winners are written to the user's tuning table."""
    return os.environ.get("TRITONSOFTMAX_TUNE_SAVE", "0") not in ("0", "")


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def n_bucket(n: int) -> int:
    """Row-length bucket: the next power of two. A new N inside a bucket reuses its tuning."""
    return next_power_of_2(n)


def m_bucket(m: int) -> int:
    """Coarse row-count bucket: powers of 4 up to 16384 (1, 4, 16, ..., 16384)."""
    b = 1
    while b < m and b < 16384:
        b *= 4
    return b


@dataclass(frozen=True)
class LaunchConfig:
    """One launch configuration of a kernel family.

    meta: constexpr meta-parameters as sorted (name, value) pairs, e.g. (("BLOCK", 4096),).
    options: backend launch options as sorted pairs, e.g. (("waves_per_eu", 2),) on AMD.
    """

    meta: tuple[tuple[str, int], ...]
    num_warps: int
    num_stages: int = 1
    options: tuple[tuple[str, int], ...] = ()

    @classmethod
    def make(cls, num_warps: int, num_stages: int = 1, options: Mapping[str, int] | None = None,
             **meta: int) -> LaunchConfig:
        return cls(tuple(sorted((k, int(v)) for k, v in meta.items())), int(num_warps), int(num_stages),
                   tuple(sorted((k, int(v)) for k, v in (options or {}).items())))

    def __getitem__(self, name: str) -> int:
        return dict(self.meta)[name]

    def with_options(self, **options: int) -> LaunchConfig:
        """The same config with these launch options added (or replaced), kept sorted as make() keeps them."""
        return LaunchConfig.make(self.num_warps, self.num_stages, {**dict(self.options), **options}, **dict(self.meta))

    def with_meta(self, **meta: int) -> LaunchConfig:
        """The same config with these meta-parameters added (or replaced)."""
        return LaunchConfig.make(self.num_warps, self.num_stages, dict(self.options), **{**dict(self.meta), **meta})

    def launch_kwargs(self) -> dict[str, int]:
        """Keyword arguments for ``kernel[grid](..., **kwargs)``."""
        return {**dict(self.meta), **dict(self.options), "num_warps": self.num_warps,
                "num_stages": self.num_stages}

    def as_dict(self) -> dict[str, int]:
        """Flat dict (the YAML form): meta, options, num_warps, num_stages."""
        return self.launch_kwargs()

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> LaunchConfig:
        """Inverse of :meth:`as_dict`. Raises ValueError on a malformed entry."""
        try:
            meta = {k: int(v) for k, v in d.items() if k not in _LAUNCH_OPTIONS + BACKEND_OPTIONS}
            options = {k: int(d[k]) for k in BACKEND_OPTIONS if k in d}
            return cls.make(int(d["num_warps"]), int(d.get("num_stages", 1)), options, **meta)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed launch config {dict(d)!r}: {e}") from None

    def to_triton(self):
        """The equivalent ``triton.Config`` (for ``triton.autotune``)."""
        import triton

        return triton.Config({**dict(self.meta), **dict(self.options)}, num_warps=self.num_warps,
                             num_stages=self.num_stages)

    @classmethod
    def from_triton(cls, cfg) -> LaunchConfig:
        kwargs = dict(cfg.kwargs)
        options = {k: kwargs.pop(k) for k in BACKEND_OPTIONS if k in kwargs}
        return cls.make(cfg.num_warps, cfg.num_stages, options, **kwargs)

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.meta + self.options]
        return ", ".join(parts + [f"num_warps={self.num_warps}", f"num_stages={self.num_stages}"])
