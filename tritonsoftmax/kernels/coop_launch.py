"""The cooperative launch form, :class:`CoopLaunch`: a row's programs started so that they can wait for
each other (cluster, resident, ticketed or two-phase). smem_launch.SmemLaunch runs smem's kernels on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..config import LaunchConfig, next_power_of_2
from ..device import DeviceInfo, interpreter_active
from ..layout import RowProblem
from . import sizing
from .exchange import WORD_FLOATS, cluster_mode, cluster_smem_bytes, max_chunks, per_word_departure, scratch
from .launch_modes import NO_MODES, LaunchModes
from .launches import Launch, PreparedLaunch
from .sizing import chunks
from .stagger import stagger_meta

if TYPE_CHECKING:
    from .coop import CoopFamily

COOPERATIVE_LAUNCH = {"launch_cooperative_grid": 1}  # CUDA launch option: every program resident at once


class CoopLaunch(Launch):
    """The coop kernel on one problem, ready to start again and again (see PreparedLaunch).

    One launch on a GPU; two launches (PHASE 1, then 2) under the interpreter or with
    ``two_phase``. On CUDA the single launch is a cooperative one (RESIDENT, no tickets) when the
    compiled kernel's occupancy holds every program at once, and a CTA-cluster launch (CLUSTER)
    where cluster_mode allows (``mode`` says which: "cluster", "resident", "ticketed" or
    "two-phase"; decided on the first call: a cluster or cooperative launch that fails to compile
    or start leaves the next mode, with the reason in ``cluster_error`` / ``resident_error``).
    Without a config it uses the heuristic
    (a waiting kernel is not something to hand to Triton's autotuner; ``python -m
    tritonsoftmax.tune --families coop`` times each config and stores the winner). A config is
    checked for enough partial slots (BLOCK_G >= G) and, for the single launch, for forward
    progress (G <= max_chunks)."""

    def __init__(self, family: CoopFamily, problem: RowProblem, config: LaunchConfig | None,
                 device: DeviceInfo, flags: dict[str, int] | None = None, two_phase: bool | None = None,
                 modes: LaunchModes = NO_MODES):
        self.problem, self.device, self.modes = problem, device, modes
        self.config = config or family.default_config(device, problem)
        g = chunks(problem.N, dict(self.config.meta))
        if two_phase is None:
            two_phase = interpreter_active()
        if not two_phase and g > max_chunks(device):
            raise ValueError(f"coop config {self.config}: {g} programs a row; at most {max_chunks(device)} "
                             f"(the SM count) can be guaranteed to run together on {device.name}")
        if next_power_of_2(g) > self.config["BLOCK_G"]:
            raise ValueError(f"coop config {self.config}: BLOCK_G must be >= the {g} chunks of a "
                             f"{problem.N}-element row")
        flags = dict(flags or {})
        # What the kernels run: the config, or with depart's PER_WORD a BLOCK_G of at least the
        # program's threads (no lane of the exchange replicated); __call__ returns the config.
        run = self.config
        self.resident_error = self.cluster_error = None
        self._resident = self._cluster = None
        self._idle_scratch = None  # cluster mode: the scratch pointers passed, which the kernel never touches
        if cluster_mode(run, g, device, two_phase):
            self._cluster = PreparedLaunch(family, problem, run, device, flags={**flags, "PHASE": 0},
                                           cluster=g, cluster_smem=cluster_smem_bytes(run["BLOCK_G"]))
        if "CLUSTER" in dict(run.meta):
            run = run.with_meta(CLUSTER=0)
        self.per_word = (family.departs_per_word and not two_phase
                         and per_word_departure(g, problem.M, device, modes.per_word))
        if self.per_word:
            flags["PER_WORD"] = 1
            run = run.with_meta(BLOCK_G=max(run["BLOCK_G"], run.num_warps * device.warp_size))
        phases = (1, 2) if two_phase else (0,)
        self.launches = [PreparedLaunch(family, problem, run, device, flags={**flags, "PHASE": p})
                         for p in phases]
        self.mode = "two-phase" if two_phase else "ticketed"
        self.programs = problem.M * g
        # What threads and the block limit alone allow (registers only lower it): beyond that the
        # cooperative variant is not even compiled (many rows, e.g. 4096 x G programs).
        at_most = sizing.resident_programs(device, 1, self.config.num_warps, 0) * device.sm_count
        if not two_phase and device.backend == "cuda" and self.programs <= at_most:
            cooperative = run.with_options(**COOPERATIVE_LAUNCH)
            self._resident = PreparedLaunch(family, problem, cooperative, device,
                                            flags={**flags, "PHASE": 0, "RESIDENT": 1})
        # The forward's late rows wait in a resident launch of under a wave (_first_resident_call), unless the
        # config names its own STAGGER.
        self.staggers = family.staggers and "STAGGER" not in dict(self.config.meta)
        self.ws_words = WORD_FLOATS * self.programs
        self.sync_words = 2 + (self.programs if self.per_word else problem.M)  # the departure counters

    @property
    def stagger(self) -> int:
        """The STAGGER the resident launch runs with (0 in any other mode, or before the first call)."""
        return dict(self.launches[0].config.meta).get("STAGGER", 0) if self.mode == "resident" else 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *extra) -> LaunchConfig:
        if self._idle_scratch is not None:  # cluster mode: no per-stream scratch lookup on the warm path
            self.launches[0](x, y, *self._idle_scratch, *extra)
            return self.config
        ws, sync = scratch(x.device, self.ws_words, self.sync_words)
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            try:
                cluster(x, y, ws, sync, *extra)
                self.launches, self.mode, self._resident = [cluster], "cluster", None
                self._idle_scratch = (ws, sync)
                return self.config
            except Exception as e:  # a launch the driver refuses starts nothing; the other modes remain
                self.cluster_error = f"{type(e).__name__}: {e}"
        if self._resident is not None:
            self._first_resident_call(x, y, ws, sync, extra)
            return self.config
        for launch in self.launches:
            launch(x, y, ws, sync, *extra)
        if len(self.launches) > 1:  # PHASE 2 leaves the words it read; the next single launch wants 0
            ws[:self.ws_words].zero_()
        return self.config

    def _first_resident_call(self, x: torch.Tensor, y: torch.Tensor, ws: torch.Tensor, sync: torch.Tensor,
                             extra: tuple) -> None:
        """First call on CUDA: the cooperative launch when all programs fit on the GPU at once (a
        cooperative launch beyond that is refused, so the estimate must not be high; on the H200 it
        matches the driver's limit). Should the driver refuse it anyway (an estimate off on another GPU),
        nothing ran: the ticketed launch takes over for good, and ``resident_error`` keeps the reason. In
        coop's forward (``staggers``) the late half of the rows waits (stagger.stagger_meta, in halves), so that
        DRAM is not idle while every program exchanges at once; cluster mode does not stagger."""
        resident, self._resident = self._resident, None
        try:
            compiled = resident.compile(x, y, ws, sync, *extra)
            per_sm = 0 if compiled is None else sizing.resident_programs(
                self.device, compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared)
            if self.programs <= per_sm * self.device.sm_count:
                meta = (stagger_meta(self.problem, self.programs, per_sm, self.device, self.modes.stagger)
                        if self.staggers else {})
                if meta:
                    resident = PreparedLaunch(resident.family, self.problem, resident.config.with_meta(**meta),
                                              self.device, flags=resident.flags)
                resident(x, y, ws, sync, *extra)
                self.launches, self.mode = [resident], "resident"
                return
        except Exception as e:  # a refused cooperative launch starts nothing; the ticketed one is always valid
            self.resident_error = f"{type(e).__name__}: {e}"
        for launch in self.launches:
            launch(x, y, ws, sync, *extra)
