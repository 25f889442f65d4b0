"""DeviceInfo of GPUs the CPU tests reason about without having them (H200, an sm_89, T4, MI300X): dispatch
rules, heuristics and launch set-up are functions of these numbers."""

from tritonsoftmax.device import DeviceInfo

SM90 = DeviceInfo("cuda", "sm_90", "NVIDIA H200", 32, 132, 232448, 65536, 60 * 2**20)
SM89 = DeviceInfo("cuda", "sm_89", "an sm_89 GPU", 32, 128, 232448, 65536, 60 * 2**20, max_threads_per_sm=1536)
SM75 = DeviceInfo("cuda", "sm_75", "NVIDIA T4", 32, 40, 65536, 65536, 4 * 2**20)
GFX942 = DeviceInfo("hip", "gfx942", "AMD Instinct MI300X", 64, 304, 65536, 131072, 4 * 2**20)
