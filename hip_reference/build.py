"""Build the HIP reference binary: hipcc when present (``--offload-arch`` from the device), else
nvcc (``-arch`` from the device; ``sm_90`` when no device is visible, as in CI). Binaries are
cached by a hash of the sources, the compiler and the target.

    python -m hip_reference.build [--arch sm_90|gfx942|...] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCES = [Path(__file__).with_name("softmax.hip"), Path(__file__).with_name("hip_compat.h")]
DEFAULT_NVCC_ARCH = "sm_90"


class BuildError(RuntimeError):
    """The reference binary could not be built (no compiler, or the compiler failed)."""


def find_compiler() -> tuple[str, str]:
    """("hipcc" | "nvcc", path). Raises BuildError naming both when neither is on PATH."""
    for name in ("hipcc", "nvcc"):
        path = shutil.which(name)
        if path:
            return name, path
    raise BuildError("neither hipcc (ROCm) nor nvcc (CUDA toolkit) was found on PATH; install one of them "
                     "to build hip_reference (the CPU reference alone needs a built binary too)")


def device_arch(kind: str) -> str | None:
    """The visible GPU's target for ``kind``'s compiler, or None when no matching GPU is visible."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        if kind == "hipcc":
            return props.gcnArchName.split(":")[0] if torch.version.hip else None
        return None if torch.version.hip else f"sm_{props.major}{props.minor}"
    except Exception:  # no torch, or a driver problem: build for the default target
        return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.environ.get("HIP_REFERENCE_CACHE", Path(base) / "tritonsoftmax" / "hip_reference"))


def command(kind: str, compiler: str, arch: str, out: Path) -> list[str]:
    src = str(SOURCES[0])
    if kind == "hipcc":
        return [compiler, "-O3", "-std=c++17", f"--offload-arch={arch}", src, "-o", str(out)]
    return [compiler, "-O3", "-std=c++17", f"-arch={arch}", "-x", "cu", src, "-o", str(out)]


def build(arch: str | None = None, force: bool = False, timeout: float = 600) -> Path:
    """Path to the built binary (built now if the cache has none for these sources and target)."""
    kind, compiler = find_compiler()
    arch = arch or device_arch(kind) or (DEFAULT_NVCC_ARCH if kind == "nvcc" else "native")
    digest = hashlib.sha256()
    for src in SOURCES:
        digest.update(src.read_bytes())
    digest.update(f"{kind}:{arch}".encode())
    out = cache_dir() / digest.hexdigest()[:16] / "softmax_ref"
    if out.is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"softmax_ref.{os.getpid()}.tmp")
    cmd = command(kind, compiler, arch, tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{kind} did not finish within {timeout:.0f} s: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        raise BuildError(f"{kind} failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hip_reference.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", help="target (sm_90, gfx942, gfx1201, ...); default: the visible device")
    ap.add_argument("--force", action="store_true", help="rebuild even if a cached binary exists")
    args = ap.parse_args(argv)
    try:
        print(build(args.arch, args.force))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
