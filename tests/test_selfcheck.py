"""``python -m tritonsoftmax``, the first command the README gives, passes on this machine as a user runs it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def test_self_check_passes_with_no_environment_variable_set():
    """No TRITON_INTERPRET from the test session: on a CPU the command turns the interpreter on itself, so it
    checks our kernels (the dispatch lines and every family's checks run) rather than failing or comparing torch
    with torch."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITONSOFTMAX_AUTOTUNE")}
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "self-check passed" in out
    assert "FAIL" not in out and "ERROR" not in out
    for family in ("auto", "fused", "tile", "online", "split", "coop"):
        assert f"ok   {family} " in out, family
    assert out.count("self-check") == 1, "one process reports"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the C++ launch path needs an NVIDIA GPU")
def test_self_check_with_the_cxx_launch_path_on():
    """``python -m tritonsoftmax --native`` builds the C++ launch path, turns it on, and its gradient checks (run three
    times) pass through it."""
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax", "--native"], cwd=REPO, capture_output=True,
                         text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "C++ launch path: on" in out and "self-check passed" in out
