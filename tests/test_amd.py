"""AMD by construction, checked on the CPU with synthetic gfx942 (CDNA, wave64) and gfx1201 (RDNA,
wave32) targets: configs, tuning-table paths, the HIP reference's hipcc command, packaging."""

import importlib
import re
from pathlib import Path

import pytest
import torch

from tritonsoftmax import dispatch, tuning
from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import DeviceInfo
from tritonsoftmax.kernels import FAMILY_NAMES, coop, family, fused, online, split
from tritonsoftmax.kernels.launches import PreparedLaunch
from tritonsoftmax.layout import matrix_problem

REPO = Path(__file__).resolve().parent.parent
GFX942 = DeviceInfo("hip", "gfx942", "AMD Instinct MI300X", 64, 304, 65536, 131072)
GFX1201 = DeviceInfo("hip", "gfx1201", "AMD Radeon RX 9070 XT", 32, 64, 65536, 98304)
SM90 = DeviceInfo("cuda", "sm_90", "NVIDIA H200", 32, 132, 232448, 65536)


@pytest.mark.parametrize("device", [GFX942, GFX1201], ids=lambda d: d.arch)
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_amd_configs_respect_wavefront_size_and_carry_waves_per_eu(name, device):
    for N in (1, 256, 2048, 16384, 65536, 1048576):
        if name == "fused" and N > 65536:
            continue
        configs = family(name).configs(device, 4096, N)
        assert all(c.num_warps * device.warp_size <= 1024 for c in configs), "more than 1024 threads"
        assert family(name).heuristic(device, 4096, N).num_warps * device.warp_size <= 1024
        assert any(dict(c.options).get("waves_per_eu") for c in configs)
        assert set().union(*(dict(c.options) for c in configs)) <= {"waves_per_eu"}


def test_wave64_halves_the_warps_for_the_same_elements_per_thread():
    on_cdna = family("online").heuristic(GFX942, 4096, 65536)
    on_cuda = family("online").heuristic(SM90, 4096, 65536)
    assert on_cdna.num_warps * 64 == on_cuda.num_warps * 32


def test_cuda_configs_never_carry_amd_options():
    for name in FAMILY_NAMES:
        assert not any(c.options for c in family(name).configs(SM90, 4096, 4096))


def test_dispatch_on_amd_uses_the_register_file_and_cu_count():
    assert dispatch.choose(4096, 32768, torch.float32, GFX942, backward=True).impl == "fused"  # 128K registers
    assert dispatch.choose(4096, 32768, torch.float32, SM90, backward=True).impl == "coop"
    assert dispatch.choose(4096, 65536, torch.float32, GFX942).impl == "fused"
    assert dispatch.choose(4096, 65536, torch.float32, SM90).impl == "smem"
    assert dispatch.choose(300, 65536, torch.float32, GFX942).impl == "split"  # 304 CUs: 300 rows is few
    assert dispatch.choose(300, 65536, torch.float32, SM90).impl == "smem"
    assert dispatch.choose(300, 65536, torch.bfloat16, GFX942, backward=True).impl == "split"


def test_nvidia_only_load_hints_stay_behind_hints_and_off_on_amd():
    """L2 eviction hints live in two helpers (row_ops.load_f32, row_ops.store_out), only under
    EVICT != 0, and every kernel that can emit them gets HINTS=0 on a HIP device; no cache
    modifiers anywhere."""
    for path in (REPO / "tritonsoftmax" / "kernels").glob("*.py"):
        source = path.read_text()
        assert not re.search(r"cache_modifier|\.cg\b|\.cs\b", source), path.name
        uses = len(re.findall(r"eviction_policy=", source))
        assert uses == (3 if path.name == "row_ops.py" else 0), path.name
    x = torch.randn(4, 64)
    problem = matrix_problem(x, torch.empty_like(x))
    hinted = [f for f in (online.FAMILY, online.BWD_FAMILY, coop.FAMILY, coop.BWD_FAMILY, *split.FAMILY.passes,
                          *split.BWD_FAMILY.passes, fused.BWD_FAMILY) if "HINTS" in f.kernel.arg_names]
    assert len(hinted) == 9
    for fam in hinted:
        config = fam.heuristic(GFX942, 4, 64)
        assert PreparedLaunch(fam, problem, config, GFX942, flags={"LOG": 0}).flags["HINTS"] == 0
        assert "HINTS" not in PreparedLaunch(fam, problem, config, SM90, flags={"LOG": 0}).flags  # default 1
    for N in (8192, 16384, 32768):  # fused-bwd's RELOAD configs: CUDA only
        assert any(dict(c.meta).get("RELOAD") for c in fused.BWD_FAMILY.configs(SM90, 4096, N))
        assert not any(dict(c.meta).get("RELOAD") for c in fused.BWD_FAMILY.configs(GFX942, 4096, N))


def test_hip_tables_live_under_hip_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(tuning, "shipped_dir", lambda: None)
    tuning.forget()
    config = LaunchConfig.make(4, options={"waves_per_eu": 2}, BLOCK=4096)
    path = tuning.record(tmp_path, GFX942, [("online", torch.float32, 65536, 4096, config, 0.1)])
    assert path == tmp_path / "hip" / "gfx942.yaml"
    assert tuning.lookup(GFX942, "online", torch.float32, 65536, 4096).config == config
    assert tuning.lookup(GFX1201, "online", torch.float32, 65536, 4096) is None  # another arch
    tuning.forget()


def test_no_amd_table_is_shipped():
    assert not list((REPO / "tune_cache").glob("hip/*.yaml")), "ship no table for a GPU we have not measured"


def test_hip_reference_prefers_hipcc_and_targets_the_gfx_arch(monkeypatch, tmp_path):
    build = importlib.import_module("hip_reference.build")
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/opt/rocm/bin/{name}")
    assert build.find_compiler() == ("hipcc", "/opt/rocm/bin/hipcc")
    cmd = build.command("hipcc", "/opt/rocm/bin/hipcc", "gfx942", tmp_path / "out")
    assert "--offload-arch=gfx942" in cmd and "-x" not in cmd
    nvcc = build.command("nvcc", "/usr/bin/nvcc", "sm_90", tmp_path / "out")
    assert "-arch=sm_90" in nvcc and "cu" in nvcc


def test_hip_portability_header_assumes_no_warp_size():
    header = (REPO / "hip_reference" / "hip_compat.h").read_text()
    source = (REPO / "hip_reference" / "softmax.hip").read_text()
    assert "hip/hip_runtime.h" in header
    for text in (header, source):
        assert not re.search(r"warpSize|__shfl|\b32\s*\*\s*threadIdx|WARP_SIZE", text)


def test_triton_is_not_a_hard_dependency():
    tomllib = pytest.importorskip("tomllib")

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.split(">")[0].split("=")[0].strip() == "triton" for dep in meta["dependencies"]), \
        "a plain triton requirement would replace ROCm's triton"
    assert any(dep.startswith("triton") for dep in meta["optional-dependencies"]["cpu"])
