"""DeviceInfo of GPUs the CPU tests reason about without having them (H200, an sm_89, T4, MI300X): dispatch
rules, heuristics and launch set-up are functions of these numbers; ``meta_problem`` gives them a contiguous M x N
problem without memory."""

import torch

from tritonsoftmax.device import DeviceInfo
from tritonsoftmax.layout import RowProblem, matrix_problem

# The H200's clocks as its driver reports them: 1.98 GHz SMs, HBM at 3201 MHz (double data rate) on 6016 bits.
SM90 = DeviceInfo("cuda", "sm_90", "NVIDIA H200", 32, 132, 232448, 65536, 60 * 2**20, sm_clock_khz=1980000,
                  dram_bytes_per_s=3201000 * 1000 * 2 * 6016 // 8)
SM89 = DeviceInfo("cuda", "sm_89", "an sm_89 GPU", 32, 128, 232448, 65536, 60 * 2**20, max_threads_per_sm=1536)
SM75 = DeviceInfo("cuda", "sm_75", "NVIDIA T4", 32, 40, 65536, 65536, 4 * 2**20)
GFX942 = DeviceInfo("hip", "gfx942", "AMD Instinct MI300X", 64, 304, 65536, 131072, 4 * 2**20)
GFX1201 = DeviceInfo("hip", "gfx1201", "AMD Radeon RX 9070 XT", 32, 64, 65536, 98304, 8 * 2**20)


def meta_problem(M: int, N: int, dtype: torch.dtype = torch.float32) -> RowProblem:
    """The problem of a contiguous M x N ``dtype`` tensor written in place, on the meta device (no memory)."""
    x = torch.empty(M, N, dtype=dtype, device="meta")
    return matrix_problem(x, x)
