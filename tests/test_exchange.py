"""The row exchange of coop and smem compiled for real targets (on the CPU): what the single launch's
correctness rests on must survive the compiler (kernels/coop.py: publish_word, row_words, depart)."""

import json
import os
import re
import subprocess
import sys

import pytest
from exchange_checks import assert_fence_free_exchange

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [["fwd", {}], ["fwd", {"TILES": 4}], ["bwd", {}], ["fwd", {"RESIDENT": 1}], ["fwd", {"PHASE": 1}],
         ["fwd", {"PHASE": 2}]]


def _compile(target: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, os.path.join(HERE, "coop_compile.py"), target, json.dumps(CASES)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {json.dumps(case): asm for case, asm in zip(CASES, json.loads(done.stdout), strict=True)}


@pytest.fixture(scope="module")
def sm90() -> dict:
    return _compile("cuda:90")


@pytest.mark.parametrize("case", CASES[:4], ids=["fwd", "fwd-tiles", "bwd", "resident"])
def test_coop_single_launch_exchanges_words_without_a_fence(sm90, case):
    assert_fence_free_exchange(sm90[json.dumps(case)])


@pytest.mark.parametrize("case", CASES[4:], ids=["phase1", "phase2"])
def test_two_phases_have_no_atomics(sm90, case):
    assert "atom." not in sm90[json.dumps(case)]


@pytest.mark.parametrize("target", ["hip:gfx942:64", "hip:gfx90a:64", "hip:gfx1100:32"])
def test_coop_polls_with_atomics_on_amd(target):
    """Triton gives a volatile load no cache-coherence bits on AMD, so a poll by load could spin on a
    stale L1 line: there the words are polled with atomic adds of 0 (64-bit). Compiled only; nothing
    has run on AMD."""
    asm = _compile(target)
    for case in CASES[:4]:
        code = asm[json.dumps(case)]
        assert re.search(r"(global|buffer)_atomic_add_(x2|u64)", code), f"{case}: the words polled by 64-bit atomics"
        assert re.search(r"(global|buffer)_atomic_swap_(x2|b64)", code), f"{case}: the word published by an exchange"
    for case in CASES[4:]:
        assert "_atomic_" not in asm[json.dumps(case)]
