"""The one place a kernel is started. :class:`Launch` is what every launch form is (one family on one
problem, called again and again with new tensors); :class:`PreparedLaunch` starts one kernel, warm calls
straight to the compiled kernel. The other forms build on it: split.SplitLaunch (two kernels, the second a
dependent launch), coop_launch.CoopLaunch (cluster, resident, ticketed or two-phase) and
coop_launch.SmemLaunch (smem's kernels on coop's launch). Also the launchers every family module exposes."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import triton
from triton.runtime import driver

from ..config import LaunchConfig, autotune_enabled, m_bucket, n_bucket, next_power_of_2
from ..device import DeviceInfo, cuda_index, device_info
from ..layout import RowProblem, matrix_problem
from .constexprs import (
    check_dense,
    check_same_layout,
    held_fold,
    row_align,
    row_pieces,
    row_tail,
    row_vec,
    whole_chunks,
    whole_rows,
)
from .triton_launcher import (
    COMPILE_OPTIONS,
    PORTABLE_CLUSTER,
    WarmKernel,
    allow_cluster,
    constexpr_values,
    direct_start,
    hooked_runner,
    launch_hook_installed,
    raw_args,
    warm_kernel,
    warm_launcher,
)

if TYPE_CHECKING:
    from .kernel_family import Family


class Launch:
    """One family on one problem, ready to run again and again: ``launch(x, y, *extra)`` runs it on new
    tensors of the problem's layout and returns the config it ran (None where Triton's autotuner chose and
    has not said yet). ``extra``: what the family's kernel takes after ``y`` (the saved output of a backward,
    the scale). A form checks a config it is given when it is built (ValueError), and what it falls back to
    when a config the dispatcher chose cannot run is its own: the autotuner (PreparedLaunch), a later mode
    (CoopLaunch), coop's kernel (SmemLaunch)."""

    family: Family
    problem: RowProblem
    config: LaunchConfig | None
    device: DeviceInfo

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *extra: torch.Tensor | float) -> LaunchConfig | None:
        raise NotImplementedError


class PreparedLaunch(Launch):
    """One family on one RowProblem, ready to start again and again with new tensors.

    The first call goes through Triton's normal path (the autotuner when no config is known);
    it remembers the chosen config and the compiled kernel, so a warm call starts the compiled
    kernel directly: no autotuner, no argument binding, no specialisation work, tensors passed
    as addresses. A call whose pointers differ in 16-byte alignment from the first (which the
    compiled kernel assumed) takes Triton's normal path again. Kernels with an ALIGN parameter get
    it from row_align on the first call (rows that start off 16 bytes are realigned). A config
    from the tuning store that fails to compile or launch falls back to the autotuner with one
    warning.
    """

    def __init__(self, family: Family, problem: RowProblem, config: LaunchConfig | None, device: DeviceInfo,
                 from_store: bool = False, flags: dict[str, int] | None = None, cluster: int = 0,
                 cluster_smem: int = 0):
        if cluster and config is None:
            raise ValueError("a cluster launch needs a config")
        self.cluster, self.cluster_smem = cluster, cluster_smem
        if config is None and not autotune_enabled():
            config = family.heuristic(device, problem.M, problem.N)
        if config is not None and dict(config.meta).get("DENSE"):
            check_dense(problem, config)
        if config is not None and dict(config.meta).get("I32") and not problem.offsets_fit_int32(
                config["ROWS"], config["BLOCK_N"]):
            config = config.with_meta(I32=0)  # 32-bit offsets would wrap: the same config in 64-bit
        self.family, self.problem, self.config, self.device = family, problem, config, device
        self.from_store = from_store
        self.autotuned, self.autotuned_ms = False, None  # set when the first call autotuned: what the tuner chose
        self.flags = dict(flags or {})  # semantic constexprs (LOG, ZERO_MASKED, ALIGN, VEC, TAIL): not tuned
        if device.is_hip and "HINTS" in family.kernel.arg_names:
            self.flags["HINTS"] = 0  # L2 eviction hints are NVIDIA PTX: plain loads on AMD
        # The autotuner keys on (N_BUCKET, M_BUCKET) and prunes only on a key it has not seen; M_BUCKET is negative
        # where some I32 config's offsets could pass 2**31 - 1, so such problems get a key (and a pruning) of their own.
        narrow_ok = family.i32_bounds is None or problem.offsets_fit_int32(*family.i32_bounds)
        self.tail = (*problem.kernel_args(), n_bucket(problem.N), m_bucket(problem.M) * (1 if narrow_ok else -1))
        self._runner = self._warm = self._warm_kernel = None
        self._aligned = None
        self.direct = self.__call__  # what a warm caller calls: direct_start's closure once a kernel is kept

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *extra: torch.Tensor | float) -> LaunchConfig | None:
        """Run the kernel on ``x`` into ``y``; returns the config launched (None when the autotuner chose).

        ``extra``: the further arguments the family's kernel takes after ``y`` (a workspace, the
        saved output, the scale)."""
        args, aligned = raw_args(x, y, extra)
        if self._warm is not None and aligned == self._aligned:
            if not launch_hook_installed():
                self._warm(*args)
            else:  # a profiler's hooks are installed: Triton's runner calls them (with the tensors)
                self._runner(x, y, *extra, *self.tail, *self._meta)
            return self.config
        self._set_align(x, y)
        if self.config is None:
            return self._autotune(x, y, extra)
        try:
            self._launch_config(x, y, extra, aligned)
        except Exception as e:
            if not self.from_store:
                raise
            warnings.warn(f"tritonsoftmax: stored config ({self.config}) for {self.family.name} failed "
                          f"({type(e).__name__}: {e}); autotuning instead", RuntimeWarning, stacklevel=2)
            self.config, self.from_store = None, False
            for name in CONFIG_FLAGS:  # derived from the failed config: the autotuner's configs run without them
                if name in self.flags:
                    self.flags[name] = 0
            return self._autotune(x, y, extra)
        return self.config

    def compile(self, x: torch.Tensor, y: torch.Tensor, *extra: torch.Tensor | float):
        """Compile (without launching) what the first call with these arguments would launch, and
        load it on the device; returns Triton's CompiledKernel (n_regs, metadata), or None under
        the interpreter. Needs a config. The first call then finds it in Triton's cache."""
        self._set_align(x, y)
        kwargs, grid = self._kwargs_grid()
        compiled = self.family.kernel.warmup(x, y, *extra, *self.tail, grid=grid, **kwargs, **self.flags,
                                             **COMPILE_OPTIONS)
        if not hasattr(compiled, "packed_metadata"):
            return None
        compiled._init_handles()  # fills n_regs (triton 3.6-3.9)
        return compiled

    def _set_align(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Kernels with an ALIGN (VEC, TAIL, FULL) parameter get it from row_align (row_vec, row_tail,
        whole_chunks), once."""
        sizes = (x.element_size(), y.element_size())
        if "ALIGN" in self.family.kernel.arg_names and "ALIGN" not in self.flags:
            self.flags["ALIGN"] = row_align(self.problem, *sizes)
        if "VEC" in self.family.kernel.arg_names and "VEC" not in self.flags:
            self.flags["VEC"] = row_vec(self.problem, *sizes)
        if "TAIL" in self.family.kernel.arg_names and "TAIL" not in self.flags:
            meta = dict(self.config.meta) if self.config is not None else {}
            block_n = meta.get("BLOCK_N", next_power_of_2(self.problem.N))
            held = meta.get("HELD", 0)
            mid = 0
            if held == 2:  # half, a power of two and a shorter tail where those hold fewer positions
                mid, tail = row_pieces(self.problem.N, block_n, self.flags.get("ALIGN", 1))
            else:  # several-row tiles hold a tail only when the config asks (HELD); one-row tiles also small ones
                tail = row_tail(self.problem.N, block_n, self.flags.get("ALIGN", 1), any_tail=bool(held))
            self.flags["TAIL"] = tail if held or meta.get("ROWS", 1) == 1 else 0
            if "MID" in self.family.kernel.arg_names:
                self.flags["MID"] = mid
            if "FOLD" in self.family.kernel.arg_names and "FOLD" not in self.flags:  # 0 while autotuning
                self.flags["FOLD"] = 0 if self.config is None else held_fold(
                    self.flags["TAIL"], meta.get("ROWS", 1), self.flags.get("ALIGN", 1), sizes[0],
                    self.device.warp_size, self.config.num_warps, bool(self.flags.get("LOG", 0)))
            if "WHOLE" in self.family.kernel.arg_names and "WHOLE" not in self.flags:  # 0 while autotuning
                self.flags["WHOLE"] = 0 if self.config is None else whole_rows(
                    self.problem.N, block_n, self.flags["TAIL"], meta.get("ROWS", 1), self.flags.get("ALIGN", 1))
        if "FULL" in self.family.kernel.arg_names and "FULL" not in self.flags:
            self.flags["FULL"] = whole_chunks(self.problem, self.config, self.flags.get("ALIGN", 1), sizes[0])

    def _kwargs_grid(self) -> tuple[dict[str, int], tuple]:
        """The config's launch keyword arguments and the grid they give."""
        kwargs = self.config.launch_kwargs()
        return kwargs, self.family.grid(self.problem.M, self.problem.N, kwargs, self.device)

    def _launch_config(self, x: torch.Tensor, y: torch.Tensor, extra: tuple, aligned: bool) -> None:
        if self.cluster:
            self._start_clusters(x, y, extra, aligned)
            return
        kwargs, grid = self._kwargs_grid()
        compiled = self.family.kernel[grid](x, y, *extra, *self.tail, **kwargs, **self.flags, **COMPILE_OPTIONS)
        if hasattr(compiled, "packed_metadata"):  # a CompiledKernel (None under the interpreter)
            grid3 = tuple(grid) + (1,) * (3 - len(grid))
            runner = compiled[grid3]  # loads the module on the device
            self._keep(compiled, grid3, compiled.packed_metadata, runner, cuda_index(x.device), aligned, extra)

    def _keep(self, compiled, grid3: tuple, packed_metadata, runner: Callable, dev: int, aligned: bool,
              extra: tuple) -> None:
        """Remember a launched (or about to be launched) compiled kernel on GPU ``dev`` for warm calls:
        ``runner`` for calls with launch hooks installed, the warm launcher for the rest; ``extra`` (the first
        call's arguments after ``y``) says which call the direct start serves."""
        self._compiled = compiled  # kept for diagnostics (registers, spills)
        self._meta = constexpr_values(self.family.kernel, {**dict(self.config.meta), **self.flags})
        self._runner = runner
        self._warm = warm_launcher(compiled.run, grid3, compiled.function, packed_metadata, (*self.tail, *self._meta),
                                   driver.active.get_current_stream, dev)
        self._aligned = aligned
        tensors = len(extra) - 1 if extra and type(extra[-1]) is float else -1
        self.direct = direct_start(self._warm, aligned, self.__call__, tensors)
        self._warm_kernel = None if self.cluster else warm_kernel(
            compiled, grid3, packed_metadata, (*self.tail, *self._meta), tensors, aligned, self._warm.layout)

    @property
    def kept(self) -> bool:
        """Whether a compiled kernel is kept for warm calls (from the first call that did not autotune on)."""
        return self._warm is not None

    def warm_kernel(self) -> WarmKernel | None:
        """What a warm call starts, where it is one plain kernel launch a launcher outside Python can make
        (triton_launcher.warm_kernel); None before the first launch and for other forms."""
        return self._warm_kernel

    def _start_clusters(self, x: torch.Tensor, y: torch.Tensor, extra: tuple, aligned: bool) -> None:
        """Cluster mode (``cluster`` > 0, CUDA): the compiled kernel started as CTA clusters of
        ``cluster`` consecutive programs, with ``cluster_smem`` bytes of dynamic shared memory past
        what it uses (exchange.py's slots). Triton's own launch cannot: its num_ctas is also a
        compile option, which splits every tensor over the cluster. Its launcher (triton 3.6-3.9)
        takes the cluster size from the packed metadata's num_ctas and starts grid[0] x num_ctas
        programs, so the grid is the family's divided by ``cluster``."""
        compiled = self.compile(x, y, *extra)
        packed = getattr(compiled, "packed_metadata", None)
        if not (isinstance(packed, tuple) and len(packed) == 3):
            raise RuntimeError(f"cluster launch: unknown launch metadata {packed!r} (triton {triton.__version__})")
        num_warps, _, shared = packed
        packed = (num_warps, self.cluster, -(-shared // 16) * 16 + self.cluster_smem)
        if self.cluster > PORTABLE_CLUSTER:
            allow_cluster(compiled.function, packed[2], self.cluster)
        _, grid = self._kwargs_grid()
        if len(grid) != 1 or grid[0] % self.cluster:
            raise ValueError(f"cluster launch: grid {grid} is not whole clusters of {self.cluster}")
        grid3 = (grid[0] // self.cluster, 1, 1)
        dev = cuda_index(x.device)
        self._keep(compiled, grid3, packed, hooked_runner(compiled, grid3, packed, dev), dev, aligned, extra)
        self._warm(*raw_args(x, y, extra)[0])

    def _autotune(self, x: torch.Tensor, y: torch.Tensor, extra: tuple) -> None:
        M, N = self.problem.M, self.problem.N
        tuner = self.family.autotuned(self.device)
        tuner[lambda meta: self.family.grid(M, N, meta, self.device)](x, y, *extra, *self.tail, **self.flags,
                                                                      **COMPILE_OPTIONS)
        self.config = LaunchConfig.from_triton(tuner.best_config)
        timings = getattr(tuner, "configs_timings", None) or {}
        best = timings.get(tuner.best_config)
        self.autotuned = True
        self.autotuned_ms = best[0] if isinstance(best, (list, tuple)) else best
        return None


# Flags a launch derives from its config's meta and warps (_set_align), not from the problem alone: 0 while
# autotuning, whose configs differ in both (WHOLE promises the block is the row: another block would read past it).
CONFIG_FLAGS = ("FOLD", "WHOLE")


def launch_matrix(family: Family, x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None,
                  extra: tuple = (), flags: dict[str, int] | None = None) -> LaunchConfig | None:
    """What every family module's launcher does: run ``family`` once over the rows of the 2-D
    ``x2d`` into ``out2d`` (any strides), exactly ``config`` if given, else autotuned (or, with
    autotuning off, the heuristic). Returns the config launched, or None when the autotuner chose."""
    prepared = family.prepare(matrix_problem(x2d, out2d), config, device_info(x2d.device), flags=flags)
    return prepared(x2d, out2d, *extra)


def launch_forward(family: Family, x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None,
                   scale: float, log: bool, zero_masked_rows: bool) -> LaunchConfig | None:
    """What every family module's ``launch`` does: softmax (log_softmax with ``log``) of ``x2d``'s
    rows into ``out2d`` (same shape, any strides) with ``family``; see :func:`launch_matrix`."""
    return launch_matrix(family, x2d, out2d, config, (float(scale),),
                         {"LOG": int(log), "ZERO_MASKED": int(zero_masked_rows)})


def launch_backward(family: Family, dy2d: torch.Tensor, y2d: torch.Tensor, dx2d: torch.Tensor,
                    config: LaunchConfig | None, scale: float, log: bool) -> LaunchConfig | None:
    """What every family module's ``launch_backward`` does: dx into ``dx2d`` from the incoming
    gradient ``dy2d`` and the saved output ``y2d`` (one layout) with the backward ``family``."""
    check_same_layout(dy2d, y2d)
    return launch_matrix(family, dy2d, dx2d, config, (y2d, float(scale)), {"LOG": int(log)})


def family_launchers(family: Family, bwd_family: Family):
    """The module-level ``launch`` and ``launch_backward`` of a family module with no checks of its own."""

    def launch(x2d: torch.Tensor, out2d: torch.Tensor, config: LaunchConfig | None = None, *, scale: float = 1.0,
               log: bool = False, zero_masked_rows: bool = False) -> LaunchConfig | None:
        """Softmax (log_softmax with ``log``) over dim 1 of ``x2d`` into ``out2d`` (same shape, any strides);
        ``config`` runs exactly that config, else the family's own choice (autotuned or heuristic)."""
        return launch_forward(family, x2d, out2d, config, scale, log, zero_masked_rows)

    def launch_bwd(dy2d: torch.Tensor, y2d: torch.Tensor, dx2d: torch.Tensor, config: LaunchConfig | None = None,
                   *, scale: float = 1.0, log: bool = False) -> LaunchConfig | None:
        """dx of softmax (log_softmax with ``log``) over dim 1 into ``dx2d``, from ``dy2d`` and the saved
        output ``y2d`` (one layout)."""
        return launch_backward(bwd_family, dy2d, y2d, dx2d, config, scale, log)

    return launch, launch_bwd


