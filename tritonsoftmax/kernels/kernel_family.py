"""A kernel family: its raw kernel, its search space, its heuristic config, its grid, and the
``triton.autotune`` wrapper built from them.

A forward kernel's signature::

    kernel(x_ptr, y_ptr, [ws_ptr,] scale, M, N, INNER,
           stride_x_outer, stride_x_inner, stride_x_col,      # the input
           stride_y_outer, stride_y_inner, stride_y_col,      # the output
           N_BUCKET, M_BUCKET, LOG, ZERO_MASKED, <tuned constexprs>)

and a backward kernel's::

    kernel(dy_ptr, dx_ptr, [ws_ptr,] y_ptr, scale, M, N, INNER,
           <3 strides of dy and y (one layout)>, <3 strides of dx>,
           N_BUCKET, M_BUCKET, LOG, <tuned constexprs>)

"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import triton

from ..config import LaunchConfig
from ..device import DeviceInfo, interpreter_active
from ..layout import RowProblem
from .launch_modes import NO_MODES, LaunchModes
from .launches import PreparedLaunch

KEY = ["N_BUCKET", "M_BUCKET"]  # plus the tensors' dtypes, which triton.autotune adds itself


def interpreter_bench(kernel_call, quantiles=None):
    """Wall-clock timing for the interpreter (no driver to time with); quantiles all equal."""
    start = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def gpu_bench(kernel_call, quantiles=None):
    """Short-budget ``do_bench`` for autotuning: enough to rank configs of a memory-bound kernel."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


@dataclass
class Family:
    """A kernel family: its raw kernel, search space, heuristic and grid.

    configs(device, M, N) -> every config worth trying for that shape on that device.
    heuristic(device, M, N) -> the config used without tuning (the interpreter's only config).
    grid(M, N, meta, device) -> launch grid for a config's meta-parameters on that device.
    """

    name: str
    kernel: object
    configs: Callable[[DeviceInfo, int, int], list[LaunchConfig]]
    heuristic: Callable[[DeviceInfo, int, int], LaunchConfig]
    grid: Callable[[int, int, dict, DeviceInfo], tuple[int, ...]]
    _autotuned: dict = field(default_factory=dict)
    # Families with I32 configs (32-bit offsets): (rows, columns) no tile of theirs exceeds, which PreparedLaunch
    # checks a problem's offsets against, whatever the config (see its M_BUCKET key).
    i32_bounds: tuple[int, int] | None = None
    grid_from_m: ClassVar[bool] = False  # chunks (and so the grid) sized from M: see tuning.lookup

    def prepare(self, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                from_store: bool = False, flags: dict[str, int] | None = None,
                modes: LaunchModes = NO_MODES) -> PreparedLaunch:
        """A :class:`PreparedLaunch` of this family for ``problem``. ``modes``: the arch's bounds of the launch
        modes a launch picks for itself (launch_modes; only the coop-form families have any)."""
        return PreparedLaunch(self, problem, config, device, from_store, flags)

    def dispatched_form(self, problem: RowProblem, config: LaunchConfig, device: DeviceInfo,
                        modes: LaunchModes = NO_MODES) -> LaunchConfig:
        """The config a launch runs when the dispatcher hands it ``config`` (stored or the heuristic's): as it
        is, unless the family reshapes configs to the row (smem); the tuner times this form."""
        return config

    def autotuned(self, device: DeviceInfo):
        """The ``triton.autotune`` wrapper of the kernel for one device (built once per device)."""
        tuner = self._autotuned.get(device)
        if tuner is None:
            tuner = self._make_autotuner(device)
            self._autotuned[device] = tuner
        return tuner

    def _make_autotuner(self, device: DeviceInfo):
        def prune(configs, named_args, **kwargs):
            M, N = named_args["M"], named_args["N"]
            if interpreter_active():
                return [self.heuristic(device, M, N).to_triton()]
            kept = pruned_for_key(configs, set(self.configs(device, M, N)), named_args["M_BUCKET"])
            return kept or [self.heuristic(device, M, N).to_triton()]

        # The superset over every bucket; `prune` keeps those valid for the shape at hand.
        space: list[LaunchConfig] = []
        for n in (2**k for k in range(0, 24)):
            for m in (1, 4096):
                for c in self.configs(device, m, n):
                    if c not in space:
                        space.append(c)
        triton_configs = [c.to_triton() for c in space]
        bench = interpreter_bench if interpreter_active() else gpu_bench
        return triton.autotune(configs=triton_configs, key=KEY, prune_configs_by={"early_config_prune": prune},
                               do_bench=bench)(self.kernel)


def pruned_for_key(configs: list, wanted: set[LaunchConfig], m_bucket_key: int) -> list:
    """The ``triton.Config``s of ``configs`` that are in ``wanted`` (the search space of the shape at hand), less
    those with 32-bit offsets (I32) where the key's M_BUCKET is negative: a problem whose offsets could pass
    2**31 - 1 (PreparedLaunch)."""
    return [c for c in configs
            if LaunchConfig.from_triton(c) in wanted and (m_bucket_key > 0 or not c.kwargs.get("I32"))]


