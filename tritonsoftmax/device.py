"""What the target device is: the only module that asks the driver.

Everything else receives a :class:`DeviceInfo`, so tests can hand in a synthetic sm_90, gfx942
(CDNA, wave64) or gfx1201 (RDNA, wave32) and check what the dispatcher and config generators do.
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """A small description of one GPU (or of the Triton interpreter on the CPU).

    backend: "cuda", "hip" or "interpreter".
    arch: "sm_90", "gfx942", "gfx1201", ... ("cpu" for the interpreter).
    warp_size: threads per warp/wavefront (32 on NVIDIA and RDNA, 64 on CDNA/GCN).
    sm_count: streaming multiprocessors (NVIDIA) or compute units (AMD).
    shared_mem_per_block: the most shared memory/LDS one program may use, bytes.
    regs_per_sm: 32-bit registers per SM/CU.
    l2_bytes: last-level cache size, bytes (0 when unknown).
    max_threads_per_sm: threads one SM/CU can hold at once.
    sm_clock_khz: the SMs' clock, kHz (0 when unknown).
    dram_bytes_per_s: peak DRAM bandwidth, bytes a second (0 when unknown).
    """

    backend: str
    arch: str
    name: str
    warp_size: int
    sm_count: int
    shared_mem_per_block: int
    regs_per_sm: int
    l2_bytes: int = 0
    max_threads_per_program: int = 1024
    max_threads_per_sm: int = 2048
    sm_clock_khz: int = 0
    dram_bytes_per_s: int = 0

    @property
    def is_hip(self) -> bool:
        return self.backend == "hip"

    @property
    def sm_version(self) -> int:
        """NVIDIA compute capability as one number ("sm_90a" -> 90); 0 off NVIDIA."""
        digits = "".join(ch for ch in self.arch[3:] if ch.isdigit()) if self.arch.startswith("sm_") else ""
        return int(digits) if self.backend == "cuda" and digits else 0

    @property
    def slug(self) -> str:
        """Short name for result folders: "NVIDIA H200" -> "h200"."""
        return gpu_slug(self.name)


def interpreter_active() -> bool:
    """True when Triton kernels run on the CPU under ``TRITON_INTERPRET=1``."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "2.4.0rc1" -> (2, 4, 0), "3.6.0+git" -> (3, 6, 0)."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def interpreter_numpy_conflict(triton_version: str, numpy_version: str) -> str | None:
    """Why the Triton interpreter of ``triton_version`` cannot run these kernels with ``numpy_version``, or None.
    triton 3.6's interpreter turns a one-element array into a Python int with ``int()``, which numpy 2.4 refuses
    for arrays of one dimension or more, so every loop bound or index a kernel computes fails; triton 3.7 on
    converts such arrays itself."""
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (f"triton {triton_version}'s interpreter fails with numpy {numpy_version} (int() of a one-element "
                "array, which numpy 2.4 refuses): install numpy<2.4, or triton>=3.7")
    return None


@functools.cache
def _check_interpreter_numpy() -> None:
    """Warn once when this process's triton and numpy cannot run the kernels under the interpreter."""
    import numpy
    import triton

    why = interpreter_numpy_conflict(triton.__version__, numpy.__version__)
    if why:
        warnings.warn(f"tritonsoftmax: {why}", RuntimeWarning, stacklevel=3)


def warp_size_for_arch(arch: str) -> int:
    """Threads per wavefront implied by an arch name (used when the driver does not say).

    gfx9xx (GCN/CDNA: MI100, MI200, MI300) run wave64; gfx10xx-gfx12xx (RDNA) run wave32;
    every NVIDIA arch is 32.
    """
    if arch.startswith("gfx9"):
        return 64
    return 32


def gpu_slug(name: str) -> str:
    """"NVIDIA H200" -> "h200", "AMD Instinct MI300X" -> "mi300x", "Radeon RX 9070 XT" -> "rx-9070-xt"."""
    words = [w for w in name.lower().replace("_", " ").split() if w not in ("nvidia", "amd", "instinct", "radeon")]
    slug = "-".join(w for w in words if w.isalnum() or "-" in w)
    return slug or "unknown"


INTERPRETER = DeviceInfo(
    backend="interpreter",
    arch="cpu",
    name="Triton interpreter (CPU)",
    warp_size=32,
    sm_count=max(1, os.cpu_count() or 1),
    shared_mem_per_block=228 * 1024,
    regs_per_sm=65536,
)


@functools.cache
def _gpu_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip is not None:
        arch = props.gcnArchName.split(":")[0]
        backend = "hip"
    else:
        arch = f"sm_{props.major}{props.minor}"
        backend = "cuda"
    warp = getattr(props, "warp_size", 0) or warp_size_for_arch(arch)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    regs = getattr(props, "regs_per_multiprocessor", 0) or 65536
    return DeviceInfo(
        backend=backend,
        arch=arch,
        name=props.name,
        warp_size=int(warp),
        sm_count=int(props.multi_processor_count),
        shared_mem_per_block=int(smem or 48 * 1024),
        regs_per_sm=int(regs),
        l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
        max_threads_per_sm=int(getattr(props, "max_threads_per_multi_processor", 0) or 2048),
        sm_clock_khz=int(getattr(props, "clock_rate", 0) or 0),
        # double data rate: two transfers a memory clock, bus width in bits
        dram_bytes_per_s=int(getattr(props, "memory_clock_rate", 0) or 0) * 1000 * 2
        * int(getattr(props, "memory_bus_width", 0) or 0) // 8,
    )


def cuda_index(device: torch.device) -> int:
    """The index of a GPU device (the current one for a plain "cuda")."""
    return device.index if device.index is not None else torch.cuda.current_device()


def device_info(device: torch.device) -> DeviceInfo:
    """The :class:`DeviceInfo` of a tensor's device (cached per device; CPU means the interpreter)."""
    if device.type == "cpu":
        if interpreter_active():
            _check_interpreter_numpy()
        return INTERPRETER
    return _gpu_info(cuda_index(device))
