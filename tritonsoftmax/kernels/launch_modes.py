"""The measured bounds of the modes a launch picks for itself: the late rows' wait (STAGGER, stagger.py), the
word-by-word departure from the exchange (PER_WORD, exchange.per_word_departure) and the 16-bit smem backward in
CTA clusters (smem_launch.backward_cluster).

They are measurements of one GPU, so they are data: the arch's policy (``tune_cache/<backend>/<arch>.yaml``,
``launch_modes:``) holds them, the dispatcher hands them to a launch (``Family.prepare(..., modes=)``), and a launch
given none (:data:`NO_MODES`, the default policy) keeps every such mode off. Kernels and launches never read the
policy themselves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stagger:
    """When and how long the late rows of a launch wait (stagger.stagger_meta)."""

    read_share: float  # the early rows read at this share of the device's peak DRAM bandwidth
    max_wave: float  # the most of one wave (what the SMs hold at once) a launch waiting in halves fills ...
    max_grouped_wave: float  # ... and one waiting in more groups
    min_cycles: int  # no launch whose early half reads in fewer SM cycles waits (too little to overlap) ...
    max_cycles: int  # ... and no group waits longer than this (past the early rows' reads it only adds time)
    max_groups: int  # a grouped launch's rows wait in up to this many groups ...
    min_group_cycles: int  # ... each of which reads for at least this long


@dataclass(frozen=True)
class PerWord:
    """Which launches depart word by word (exchange.per_word_departure): rows of ``min_chunks`` to ``max_chunks``
    chunks, at least ``rows_per_sm`` rows an SM."""

    min_chunks: int
    max_chunks: int
    rows_per_sm: int


@dataclass(frozen=True)
class SmemBackwardCluster:
    """Which 16-bit smem backward launches on the heuristic's config run in cluster mode
    (smem_launch.backward_cluster): rows of at most ``max_chunks`` chunks, or at most ``max_programs`` programs in
    all."""

    max_chunks: int
    max_programs: int


@dataclass(frozen=True)
class LaunchModes:
    """The bounds of each self-chosen launch mode on one arch; None leaves that mode off."""

    stagger: Stagger | None = None
    per_word: PerWord | None = None
    smem_bwd_cluster: SmemBackwardCluster | None = None

    @classmethod
    def from_values(cls, values: dict | None) -> LaunchModes:
        """From a policy's ``launch_modes`` mapping ({"stagger": {...}, "per_word": {...}, "smem_bwd_cluster":
        {...}}, each optional); unknown keys raise TypeError, so a misspelt arch file does not pass silently."""
        values = values or {}
        unknown = set(values) - {"stagger", "per_word", "smem_bwd_cluster"}
        if unknown:
            raise TypeError(f"unknown launch modes: {', '.join(sorted(unknown))}")
        return cls(stagger=Stagger(**values["stagger"]) if values.get("stagger") else None,
                   per_word=PerWord(**values["per_word"]) if values.get("per_word") else None,
                   smem_bwd_cluster=(SmemBackwardCluster(**values["smem_bwd_cluster"])
                                     if values.get("smem_bwd_cluster") else None))


NO_MODES = LaunchModes()
