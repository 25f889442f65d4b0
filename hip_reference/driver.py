"""Run the HIP reference binary through subprocess and verify its outputs against torch.softmax."""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

VERSIONS = ("v0", "v1", "v2", "v3")


class HipReferenceError(RuntimeError):
    """The binary crashed, timed out or printed something other than its JSON report."""


@dataclass(frozen=True)
class Check:
    """An output against torch.softmax of the float64 input, like the chapter's verification step."""

    max_diff: float
    mean_diff: float
    rel_err: float  # ||y - ref|| / ||ref|| over all elements
    row_sum_dev: float  # max |sum(row) - 1|
    nonfinite: int  # Inf/NaN elements in the output

    @classmethod
    def of(cls, y: torch.Tensor, x: torch.Tensor) -> Check:
        ref = torch.softmax(x.double(), -1)
        diff = (y.double() - ref).abs()
        return cls(max_diff=diff.max().item(), mean_diff=diff.mean().item(),
                   rel_err=(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref)).item(),
                   row_sum_dev=(y.double().sum(-1) - 1).abs().max().item(),
                   nonfinite=int((~torch.isfinite(y)).sum()))


@dataclass(frozen=True)
class VersionResult:
    version: str
    min_ms: float
    median_ms: float
    gbps: float  # (M*N*4 read + M*N*4 written) / median time
    check: Check
    output: torch.Tensor | None = None


@dataclass
class RunResult:
    m: int
    n: int
    compiler: str
    device: str | None
    cpu: Check  # the binary's own CPU reference against torch
    versions: dict[str, VersionResult] = field(default_factory=dict)
    raw: dict = field(default_factory=dict)


def _read(path: Path, shape: tuple[int, int]) -> torch.Tensor:
    data = np.fromfile(path, dtype=np.float32)
    if data.size != shape[0] * shape[1]:
        raise HipReferenceError(f"{path.name} holds {data.size} values, expected {shape[0] * shape[1]}")
    return torch.from_numpy(data).view(shape)


def run(x: torch.Tensor, versions: tuple[str, ...] = VERSIONS, *, cpu_only: bool = False, block: int = 256,
        warmup: int = 5, iters: int = 20, timeout: float = 120.0, binary: str | Path | None = None,
        keep_outputs: bool = False) -> RunResult:
    """Run the reference on ``x`` (a 2-D float32 tensor, any device) and check every output.

    ``binary`` defaults to :func:`hip_reference.build` (built on first use).
    Raises HipReferenceError when the binary fails, hangs past ``timeout`` or prints bad JSON.
    """
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"the HIP reference takes a 2-D float32 tensor, got {tuple(x.shape)} {x.dtype}")
    unknown = set(versions) - set(VERSIONS)
    if unknown:
        raise ValueError(f"unknown versions {sorted(unknown)}; choose from {VERSIONS}")
    if binary is None:
        from .build import build

        binary = build()
    xc = x.detach().to("cpu", torch.float32).contiguous()
    M, N = xc.shape
    with tempfile.TemporaryDirectory(prefix="hip_reference-") as tmp:
        tmp = Path(tmp)
        xc.numpy().tofile(tmp / "x.bin")
        version_arg = "all" if tuple(versions) == VERSIONS else None
        reports = []
        for v in ([version_arg] if version_arg else list(versions)):
            cmd = [str(binary), "--m", str(M), "--n", str(N), "--version", v, "--input", str(tmp / "x.bin"),
                   "--output-dir", str(tmp), "--block", str(block), "--warmup", str(warmup), "--iters", str(iters)]
            if cpu_only:
                cmd.append("--cpu-only")
            reports.append(_invoke(cmd, timeout))
            if cpu_only:
                break
        raw = reports[0]
        result = RunResult(m=M, n=N, compiler=raw.get("compiler", "?"), device=raw.get("device"),
                           cpu=Check.of(_read(tmp / "cpu.bin", (M, N)), xc), raw=raw)
        for report in reports:
            for item in report.get("results", []):
                y = _read(tmp / f"{item['version']}.bin", (M, N))
                result.versions[item["version"]] = VersionResult(
                    item["version"], item["min_ms"], item["median_ms"], item["gbps"], Check.of(y, xc),
                    y if keep_outputs else None)
    return result


def _invoke(cmd: list[str], timeout: float) -> dict:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HipReferenceError(f"{Path(cmd[0]).name} timed out after {timeout:g} s: {' '.join(cmd)}") from None
    except OSError as e:
        raise HipReferenceError(f"cannot run {cmd[0]}: {e}") from None
    if proc.returncode != 0:
        raise HipReferenceError(f"{Path(cmd[0]).name} exited with status {proc.returncode}: "
                                f"{proc.stderr.strip() or '(no message)'}")
    try:
        report = json.loads(proc.stdout)
        if not isinstance(report, dict):
            raise ValueError("not an object")
        return report
    except ValueError:
        raise HipReferenceError(f"{Path(cmd[0]).name} printed something other than its JSON report: "
                                f"{proc.stdout[:200]!r}") from None
