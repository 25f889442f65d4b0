"""The row exchange of coop and smem compiled for real targets (on the CPU): what the single launch's
correctness rests on must survive the compiler (kernels/coop.py: publish_word, row_words, depart)."""

import json
import re

import pytest
import torch
from compile_scripts import run_compile_script
from conftest import DEVICE
from exchange_checks import assert_departure_without_wait, assert_fence_free_exchange
from shipped_tables import sm90_launch_modes
from softmax_ref import assert_grad_close, assert_softmax_close, coop_scratch_ready, poisoned_like, random_input
from synthetic_devices import SM90

from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import backward_family, coop, coop_launch, exchange, family, gluon_available
from tritonsoftmax.layout import matrix_problem
from tritonsoftmax.policy import launch_modes, policy_for

PER_WORD = {"PER_WORD": 1, "BLOCK_G": 256}  # BLOCK_G >= the 4 warps' threads, wave64 included (CoopLaunch)
CASES = [["fwd", {}], ["fwd", {"TILES": 4}], ["bwd", {}], ["fwd", {"RESIDENT": 1}],
         ["fwd", PER_WORD], ["fwd", {**PER_WORD, "TILES": 4}], ["bwd", PER_WORD], ["fwd", {**PER_WORD, "RESIDENT": 1}],
         ["fwd", {"PHASE": 1}], ["fwd", {"PHASE": 2}]]
SINGLE, PER_WORD_CASES, TWO_PHASES = CASES[:8], CASES[4:8], CASES[8:]
SINGLE_IDS = ["fwd", "fwd-tiles", "bwd", "resident", "per-word-fwd", "per-word-fwd-tiles", "per-word-bwd",
              "per-word-resident"]

H200 = sm90_launch_modes().per_word  # the H200's measured per-word departure bounds


def _compile(target: str) -> dict:
    asms = run_compile_script("coop_compile.py", target, json.dumps(CASES))
    return {json.dumps(case): asm for case, asm in zip(CASES, asms, strict=True)}


@pytest.fixture(scope="module")
def sm90() -> dict:
    return _compile("cuda:90")


@pytest.mark.parametrize("case", SINGLE, ids=SINGLE_IDS)
def test_coop_single_launch_exchanges_words_without_a_fence(sm90, case):
    assert_fence_free_exchange(sm90[json.dumps(case)])


@pytest.mark.parametrize("case", PER_WORD_CASES, ids=SINGLE_IDS[4:])
def test_per_word_departure_waits_for_nothing_before_the_stores(sm90, case):
    assert_departure_without_wait(sm90[json.dumps(case)])


def test_one_count_a_row_waits_for_its_result(sm90):
    """The check above can fail: the default departure (one scalar count a row) broadcasts the count's
    result behind a barrier before the stores, which is what PER_WORD removes."""
    with pytest.raises(AssertionError):
        assert_departure_without_wait(sm90[json.dumps(CASES[0])])


@pytest.mark.parametrize("case", TWO_PHASES, ids=["phase1", "phase2"])
def test_two_phases_have_no_atomics(sm90, case):
    assert "atom." not in sm90[json.dumps(case)]


WHOLE_CHUNKS = [["fwd", {"RESIDENT": 1, "FULL": 1}], ["fwd", {"RESIDENT": 1}]]


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942:64", "hip:gfx1100:32"])
def test_whole_chunks_load_and_store_without_predicates(target):
    """FULL (constexprs.whole_chunks): the held chunk's loads and stores (bf16) lose their predicates, and
    nothing else of the exchange changes; the same kernel without FULL keeps them (so the check can
    fail). On AMD compiled only, as everything there."""
    full, plain = run_compile_script("coop_compile.py", target, json.dumps(WHOLE_CHUNKS))
    if target.startswith("cuda"):
        masked_loads = r"@%p\d+ ld\.global\.(?!volatile)[\w.]+"
        assert not re.findall(masked_loads, full) and len(re.findall(masked_loads, plain)) >= 16
        masked_stores = r"@%p\d+ st\.global\.b16"
        assert not re.findall(masked_stores, full) and re.findall(masked_stores, plain)
        assert_fence_free_exchange(full)
    else:
        assert "_atomic_swap_" in full and "_atomic_swap_" in plain  # the word exchange, compiled for AMD


def test_whole_chunks_round_the_scaled_input_before_subtracting_the_max():
    """Without a mask's select between them, fp fusion would fuse x * scale into the subtraction of the max,
    fma(x, scale, -m), whose residual at the max overflows exp for |m| >= 2^31 with a scale that is not a power of
    two (row_ops.load_scaled): FULL's chunk subtracts as many rounded products (sub.f32) as the masked form, and
    its fmas are those products (a zero addend)."""
    full, plain = run_compile_script("coop_compile.py", "cuda:90", json.dumps(WHOLE_CHUNKS))
    held = 2048 // 128  # the chunk's elements a thread (BLOCK 2048, 4 warps)
    assert len(re.findall(r"\bsub\.f32", plain)) >= held, "the masked form subtracts each element"
    assert len(re.findall(r"\bsub\.f32", full)) >= held
    fmas = re.findall(r"fma\.rn\.f32\s+[^;]*;", full)
    assert fmas and all(f.rstrip(";").endswith("0f00000000") for f in fmas), fmas[:3]


@pytest.mark.parametrize("target", ["hip:gfx942:64", "hip:gfx90a:64", "hip:gfx1100:32"])
def test_coop_polls_with_atomics_on_amd(target):
    """Triton gives a volatile load no cache-coherence bits on AMD, so a poll by load could spin on a
    stale L1 line: there the words are polled with atomic adds of 0 (64-bit). LLVM may lower that
    idempotent add to a device-scope atomic load, a 64-bit load with the coherence bits (triton 3.6:
    glc on gfx90a and gfx1100; gfx942 and triton 3.9 keep the add): either is a poll that L1 cannot
    answer, and no 64-bit load of the single launch may lack the bits. Compiled only; nothing has run
    on AMD."""
    asm = _compile(target)
    for case in SINGLE:
        code = asm[json.dumps(case)]
        wide_loads = re.findall(r"(?:global|buffer)_load_(?:dwordx2|b64)[^\n]*", code)
        assert all(re.search(r"\b(glc|sc0|sc1)\b", load) for load in wide_loads), f"{case}: {wide_loads}"
        assert re.search(r"(global|buffer)_atomic_add_(x2|u64)", code) or wide_loads, \
            f"{case}: the words polled by 64-bit atomics or coherent 64-bit loads"
        assert re.search(r"(global|buffer)_atomic_swap_(x2|b64)", code), f"{case}: the word published by an exchange"
    for case in TWO_PHASES:
        assert "_atomic_" not in asm[json.dumps(case)]


# --- how a launch departs (exchange.per_word_departure) ---


def test_per_word_departure_for_many_rows_of_8_to_16_chunks():
    assert [exchange.per_word_departure(g, 4096, SM90, H200) for g in (2, 4, 7, 8, 16, 17, 64)] == \
        [False, False, False, True, True, False, False]
    assert exchange.per_word_departure(16, 4 * 132, SM90, H200)
    assert not exchange.per_word_departure(16, 4 * 132 - 1, SM90, H200)
    assert not exchange.per_word_departure(16, 4096, SM90, None), "no measured bounds (the default policy): off"


@pytest.mark.skipif(not gluon_available(), reason="this triton has no Gluon with the NVIDIA backend")
def test_a_per_word_launch_widens_block_g_and_counts_every_word():
    """What the kernels get: PER_WORD, a BLOCK_G of at least the program's threads (no replicated lane,
    so no result broadcast), and a reader counter for every word; what the tuner is told it ran: the
    config as given. Two phases never depart. (Shapes only: meta tensors, no launch.)"""
    from tritonsoftmax.kernels import smem

    x = torch.empty(4096, 262144, dtype=torch.bfloat16, device="meta")
    modes = sm90_launch_modes()
    launch = smem.FAMILY.prepare(matrix_problem(x, x), None, SM90, flags={"LOG": 0, "ZERO_MASKED": 0},
                                 two_phase=False, modes=modes)
    assert launch.per_word and launch.config["BLOCK_G"] == 16
    assert not smem.FAMILY.prepare(matrix_problem(x, x), None, SM90, two_phase=False).per_word, "no modes: off"
    assert launch.launches[0].config["BLOCK_G"] == 128 and launch.launches[0].flags["PER_WORD"] == 1
    assert launch.sync_words == 2 + 4096 * 16
    two = smem.FAMILY.prepare(matrix_problem(x, x), None, SM90, flags={"LOG": 0, "ZERO_MASKED": 0}, two_phase=True,
                              modes=modes)
    assert not two.per_word and "PER_WORD" not in two.launches[0].flags and two.sync_words == 2 + 4096
    few = torch.empty(64, 262144, dtype=torch.bfloat16, device="meta")
    assert not smem.FAMILY.prepare(matrix_problem(few, few), None, SM90, two_phase=False, modes=modes).per_word
    f32 = torch.empty(4096, 65536, dtype=torch.float32, device="meta")  # 8 chunks of coop's 8192
    config = LaunchConfig.make(8, BLOCK=8192, TILES=1, BLOCK_G=8)
    assert not coop.BWD_FAMILY.prepare(matrix_problem(f32, f32), config, SM90, two_phase=False, modes=modes).per_word


# (family, backward, dtype, M, N, config or None for the heuristic, forced): forced runs depart word by word
# whatever the family and the rule say (coop, few rows, rows of 2 or 64 chunks); the others take it from
# the rule.
GPU_CASES = [
    ("smem", False, torch.bfloat16, 600, 131072, None, False),
    ("smem", True, torch.bfloat16, 600, 262144, None, False),
    ("coop", False, torch.float32, 600, 65536, LaunchConfig.make(4, BLOCK=8192, TILES=1, BLOCK_G=8), True),
    ("coop", True, torch.float32, 600, 50000, LaunchConfig.make(4, BLOCK=4096, TILES=1, BLOCK_G=16), True),
    ("coop", False, torch.float32, 8, 131072, None, True),
    ("coop", True, torch.float32, 3, 200, LaunchConfig.make(2, BLOCK=128, TILES=1, BLOCK_G=2), True),
    ("smem", False, torch.bfloat16, 16, 1048576, None, True),
    ("smem", True, torch.float16, 5, 100000, None, True),
]


GPU_PARAMS = [pytest.param(*c, marks=[pytest.mark.needs("smem")] if c[0] == "smem" else []) for c in GPU_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize("name,backward,dtype,M,N,config,forced", GPU_PARAMS,
                         ids=[f"{c[0]}{'-bwd' if c[1] else ''}-{str(c[2])[6:]}-{c[3]}x{c[4]}{'-forced' if c[6] else ''}"
                              for c in GPU_CASES])
def test_per_word_departure_on_the_gpu(monkeypatch, name, backward, dtype, M, N, config, forced):
    """Three launches back to back on one buffer, each against float64 from a poisoned output, and the
    scratch all zero after each: the words' last readers must zero exactly their words and counters."""
    if forced:
        monkeypatch.setattr(coop_launch, "per_word_departure", lambda *args: True)
        monkeypatch.setattr(coop.CoopFamily, "departs_per_word", True)
    fam = backward_family(name) if backward else family(name)
    x = random_input((M, N), dtype, DEVICE, seed=M + N)
    info = device_info(x.device)
    y_saved = torch.softmax(x.double(), -1).to(dtype) if backward else None
    flags = {"LOG": 0} if backward else {"LOG": 0, "ZERO_MASKED": 0}
    for _ in range(3):
        out = poisoned_like(x)
        launch = fam.prepare(matrix_problem(x, out), config, info, flags=flags, two_phase=False,
                             modes=launch_modes(policy_for(info)))
        assert launch.per_word and launch.launches[0].flags["PER_WORD"] == 1
        if backward:
            launch(x, out, y_saved, 1.0)
            assert_grad_close(out, x, y_saved)
        else:
            launch(x, out, 1.0)
            assert_softmax_close(out, x)
        assert getattr(launch, "fallbacks", 0) == 0
        assert coop_scratch_ready(x.device, M)
