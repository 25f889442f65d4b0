"""The tuning tables the package ships, read entry by entry (tests that check every shipped config)."""

from pathlib import Path

import yaml

from tritonsoftmax.config import LaunchConfig

REPO = Path(__file__).resolve().parent.parent


def sm90_entries(families: tuple[str, ...] | None = None) -> list[tuple]:
    """(family name, dtype name, N key, M key, LaunchConfig) of every entry of tune_cache/cuda/sm_90.yaml (of
    ``families`` only, when given)."""
    doc = yaml.safe_load((REPO / "tune_cache" / "cuda" / "sm_90.yaml").read_text())
    return [(name, dtype, n, m, LaunchConfig.from_dict(entry["config"]))
            for name, by_dtype in doc["entries"].items() if families is None or name in families
            for dtype, by_n in by_dtype.items() for n, by_m in by_n.items() for m, entry in by_m.items()]


def sm90_launch_modes():
    """The launch modes (kernels/launch_modes.py) the H200's shipped policy gives its launches."""
    from synthetic_devices import SM90

    from tritonsoftmax.policy import launch_modes, policy_for

    return launch_modes(policy_for(SM90))
