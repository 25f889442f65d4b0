"""The HIP reference: build, CPU reference, the driver's error paths, and (on a GPU) v0-v3."""

import importlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HAS_GPU

import hip_reference
from hip_reference import BuildError, HipReferenceError

build_mod = importlib.import_module("hip_reference.build")  # the module; the package exports build()

REPO = Path(__file__).resolve().parent.parent
HAS_COMPILER = bool(shutil.which("hipcc") or shutil.which("nvcc"))
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="neither hipcc nor nvcc on PATH")


def _inputs(M, N, scale=3.0, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, N, generator=g) * scale + offset


def _fake_binary(tmp_path, body: str) -> Path:
    path = tmp_path / "fake_softmax_ref"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@needs_compiler
def test_build_compiles_and_caches_by_source_hash():
    first = hip_reference.build()
    assert first.is_file() and os.access(first, os.X_OK)
    assert hip_reference.build() == first, "a second build of the same sources reuses the binary"


@needs_compiler
def test_build_command_prints_the_binary():
    run = subprocess.run([sys.executable, "-m", "hip_reference.build"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()).is_file()


@needs_compiler
@pytest.mark.parametrize("M,N", [(1, 1), (3, 17), (5, 1001), (2, 4096)])
def test_cpu_only_reference_matches_torch(M, N):
    x = _inputs(M, N, seed=N)
    result = hip_reference.run(x, cpu_only=True)
    assert result.versions == {}
    assert result.cpu.max_diff < 1e-6 and result.cpu.nonfinite == 0
    assert result.cpu.row_sum_dev < 1e-5


@needs_compiler
def test_cpu_reference_is_stable_on_large_values():
    x = _inputs(4, 300, scale=1.0, offset=500.0)  # exp(500) overflows float32; the reference must not
    assert hip_reference.run(x, cpu_only=True).cpu.max_diff < 1e-6


def test_missing_compiler_names_both(monkeypatch):
    monkeypatch.setattr(build_mod.shutil, "which", lambda name: None)
    with pytest.raises(BuildError, match="hipcc.*nvcc"):
        hip_reference.build()


@needs_compiler
def test_compiler_failure_is_reported(tmp_path, monkeypatch):
    broken = tmp_path / "softmax.hip"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(build_mod, "SOURCES", [broken, build_mod.SOURCES[1]])
    with pytest.raises(BuildError, match="failed"):
        hip_reference.build(force=True)


def test_binary_crash_is_reported_with_its_message(tmp_path):
    fake = _fake_binary(tmp_path, 'echo "error: hipMalloc failed: out of memory" >&2; exit 3')
    with pytest.raises(HipReferenceError, match="status 3.*hipMalloc failed"):
        hip_reference.run(_inputs(2, 8), binary=fake)


def test_binary_timeout_is_reported(tmp_path):
    fake = _fake_binary(tmp_path, "sleep 10")
    with pytest.raises(HipReferenceError, match="timed out after 0.5 s"):
        hip_reference.run(_inputs(2, 8), binary=fake, timeout=0.5)


def test_malformed_json_is_reported(tmp_path):
    fake = _fake_binary(tmp_path, 'echo "{not json"')
    with pytest.raises(HipReferenceError, match="other than its JSON report"):
        hip_reference.run(_inputs(2, 8), binary=fake)


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="float32"):
        hip_reference.run(torch.ones(2, 3, dtype=torch.float64), binary="unused")
    with pytest.raises(ValueError, match="v7"):
        hip_reference.run(torch.ones(2, 3), ("v7",), binary="unused")


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_GPU and HAS_COMPILER), reason="needs a GPU and a compiler")
@pytest.mark.parametrize("M,N", [(8, 2048), (7, 1001), (3, 4099), (32, 8192)])
def test_v1_to_v3_match_torch_on_the_gpu(M, N):
    x = _inputs(M, N, seed=M + N)
    result = hip_reference.run(x, iters=3)
    for v in ("v1", "v2", "v3"):
        check = result.versions[v].check
        assert check.nonfinite == 0 and check.max_diff < 1e-5, (v, check)
    assert result.versions["v0"].check.max_diff < 1e-5, "v0 is fine while exp does not overflow"


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_GPU and HAS_COMPILER), reason="needs a GPU and a compiler")
def test_v0_overflows_on_large_inputs_and_v1_does_not():
    x = _inputs(4, 1024, scale=2.0, offset=100.0)  # every value above 88: exp overflows in float32
    result = hip_reference.run(x, ("v0", "v1"), iters=2)
    assert result.versions["v0"].check.nonfinite > 0
    assert result.versions["v1"].check.nonfinite == 0 and result.versions["v1"].check.max_diff < 1e-5


@needs_compiler
@pytest.mark.skipif(HAS_GPU, reason="the binary's answer on a machine without a GPU")
def test_binary_says_no_gpu_clearly_without_one():
    run = subprocess.run([str(hip_reference.build()), "--m", "2", "--n", "8"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 3 and "no GPU device found (use --cpu-only" in run.stderr, run.stderr


@needs_compiler
def test_hip_compare_cpu_only_prints_the_error_tables_columns():
    run = subprocess.run([sys.executable, "-m", "bench.hip_compare", "--cpu-only"], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "| provider | max_diff | mean_diff | rel_err | row-sum deviation | status |" in run.stdout
    row = next(line for line in run.stdout.splitlines() if line.startswith("| CPU reference"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 6 and cells[-1] == "ok" and float(cells[1]) < 1e-6, row


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_GPU and HAS_COMPILER), reason="needs a GPU and a compiler")
def test_v0_and_v1_report_the_chapters_traffic_and_buffers():
    """v0 and v1 go through exp_out (3 buffers), v2 and v3 stage exp in the output (2); all issue 3 reads and 2
    writes of the tensor."""
    result = hip_reference.run(_inputs(8, 2048), iters=2)
    for item in result.raw["results"]:
        assert (item["reads"], item["writes"]) == (3, 2)
        assert item["buffers"] == (3 if item["version"] in ("v0", "v1") else 2), item
