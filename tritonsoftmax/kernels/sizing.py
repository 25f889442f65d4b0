"""How a config sizes itself on a device: chunks and grids, warps for a tile, resident programs
an SM, backend launch options."""

from __future__ import annotations

import triton

from ..config import LaunchConfig
from ..device import DeviceInfo


def chunks(N: int, meta: dict) -> int:
    """G: programs (chunks of TILES x BLOCK elements) per row for a split, coop or smem config; a smem
    config's LEAD adds to the row (its chunks start up to LEAD elements before it)."""
    return triton.cdiv(N + meta.get("LEAD", 0), meta["BLOCK"] * meta["TILES"])


def chunk_grid(M: int, N: int, meta: dict, device: DeviceInfo) -> tuple[int]:
    """The grid of the split and coop kernels: one program per chunk of every row."""
    return (M * chunks(N, meta),)


def warp_choices(device: DeviceInfo, elements: int, min_per_thread: int = 8,
                 max_per_thread: int = 32, max_warps: int = 16) -> list[int]:
    """num_warps values (up to ``max_warps`` and the device's threads per program) that give each
    thread between min and max elements of a program's tile."""
    out = []
    nw = 1
    while nw <= max_warps and nw * device.warp_size <= device.max_threads_per_program:
        per_thread = elements / (nw * device.warp_size)
        if min_per_thread <= per_thread <= max_per_thread or (per_thread < min_per_thread and nw == 1):
            out.append(nw)
        nw *= 2
    return out or [min(max_warps, device.max_threads_per_program // device.warp_size)]


def heuristic_warps(device: DeviceInfo, elements: int, per_thread: int = 16, max_warps: int = 16) -> int:
    """One num_warps for a tile of ``elements``: about ``per_thread`` elements a thread, 1..max_warps warps."""
    nw = 1
    while nw < max_warps and nw * 2 * device.warp_size <= device.max_threads_per_program \
            and elements > per_thread * nw * device.warp_size:
        nw *= 2
    return nw


def with_backend_options(device: DeviceInfo, configs: list[LaunchConfig]) -> list[LaunchConfig]:
    """Add AMD's ``waves_per_eu`` variants on HIP; CUDA configs carry no backend options."""
    if not device.is_hip:
        return configs
    out = list(configs)
    for c in configs:
        for waves in (1, 2):
            out.append(c.with_options(waves_per_eu=waves))
    return out


def supports_pdl(device: DeviceInfo) -> bool:
    """Programmatic dependent launch (a kernel starting while the one before it ends; Triton's
    ``launch_pdl`` with ``gdc_wait``/``gdc_launch_dependents``): NVIDIA sm_90 and later."""
    return device.sm_version >= 90


REG_ALLOC_UNIT = 256  # NVIDIA allocates registers per warp in units of this many
MAX_PROGRAMS_PER_SM = 32  # NVIDIA's limit on resident blocks per SM (sm_80 .. sm_90)
SMEM_RESERVED_PER_PROGRAM = 1024  # shared memory the driver keeps per block (sm_80 and later)


def resident_programs(device: DeviceInfo, n_regs: int, num_warps: int, shared_bytes: int) -> int:
    """How many programs of a compiled NVIDIA kernel (``n_regs`` registers a thread, ``num_warps``
    warps, ``shared_bytes`` of shared memory) one SM holds at once: the least of the thread,
    register (per-warp units of REG_ALLOC_UNIT), shared-memory and block limits. Shared memory is
    counted against one program's maximum (a little under the SM's), so the estimate errs low."""
    threads = num_warps * device.warp_size
    by_threads = device.max_threads_per_sm // threads
    regs_per_warp = -(-max(n_regs, 1) * device.warp_size // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by_regs = (device.regs_per_sm // regs_per_warp) // num_warps
    by_smem = device.shared_mem_per_block // (shared_bytes + SMEM_RESERVED_PER_PROGRAM) if shared_bytes else by_threads
    return max(0, min(by_threads, by_regs, by_smem, MAX_PROGRAMS_PER_SM))


