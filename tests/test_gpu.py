"""What only a GPU can check: bf16, long and huge rows, > 2^31 elements, the autotuner itself."""

import pytest
import torch
from conftest import DEVICE
from softmax_ref import TOL, assert_softmax_close, coop_scratch_ready, poisoned_like, random_input

import tritonsoftmax
from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import FAMILY_NAMES, coop, fused, online, split, tile

pytestmark = pytest.mark.gpu
LAUNCHERS = {"fused": fused.launch, "tile": tile.launch, "online": online.launch, "split": split.launch,
             "coop": coop.launch}


@pytest.mark.parametrize("M,N", [(1, 1), (3, 17), (64, 1000), (4096, 256), (8, 2048), (32, 8192), (7, 16384)])
@pytest.mark.parametrize("impl", FAMILY_NAMES)
def test_bf16_every_family(impl, M, N):
    x = random_input((M, N), torch.bfloat16, DEVICE, seed=M + N)
    y = poisoned_like(x)
    LAUNCHERS[impl](x, y)
    assert_softmax_close(y, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 4096), (1024, 16384), (64, 65536), (4, 1048576), (1, 8388608),
                                 (2, 3000017)])
@pytest.mark.parametrize("impl", ["auto", "tile", "online", "split", "coop"])
def test_long_rows(impl, M, N, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=N)
    assert_softmax_close(tritonsoftmax.softmax(x, impl=impl), x)


SMEM_HUGE_SCALED = pytest.mark.xfail(strict=True, reason=(
    "known limit: smem subtracts the max as fma(x, scale, -m), whose residual at the max overflows exp once "
    "|x * scale| reaches 2^31 with a scale that is not a power of two (docs/architecture.md, smem)"))
HUGE_SCALED_CASES = [(impl, N) for impl in FAMILY_NAMES for N in (2048, 65536)] + [
    pytest.param("smem", 65536, marks=[pytest.mark.needs("smem"), SMEM_HUGE_SCALED])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("impl,N", HUGE_SCALED_CASES)
def test_huge_values_times_a_scale_that_is_not_a_power_of_two(impl, N, dtype):
    """torch's softmax of x * 0.37 for values of +-3e38 (one in a row, a uniform row, alternating, one every 31):
    compiled, an unrounded x * scale before the max's subtraction leaves a residual at the max as large as half an
    ulp of 1.1e38, which turns the row NaN (row_ops.load_scaled)."""
    x = random_input((4, N), dtype, DEVICE, seed=N)
    x[0, 5] = 3e38
    x[1] = -3e38
    x[2, ::2], x[2, 1::2] = 3e38, -3e38
    x[3, ::31] = 3e38
    y = tritonsoftmax.softmax(x, scale=0.37, impl=impl)
    want = torch.softmax(x.double() * 0.37, -1)
    assert not y.isnan().any(), f"NaN in rows {sorted(set(y.isnan().nonzero()[:, 0].tolist()))}"
    err = ((y.double() - want).abs() / want.abs().clamp(min=1)).max().item()
    assert err <= TOL[dtype], f"max error {err}"


@pytest.mark.parametrize("M,N", [(1 << 20, 16), (300000, 3)])
def test_many_tiny_rows(M, N):
    x = random_input((M, N), torch.float16, DEVICE)
    assert_softmax_close(tritonsoftmax.softmax(x, impl="fused"), x)


@pytest.mark.parametrize("impl", ["online", "coop"])
def test_more_than_2_pow_31_elements(impl):
    M, N = 32769, 65536  # 2^31 + 65536 elements, bf16: 4 GiB in, 4 GiB out
    x = torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16).normal_(0, 3)
    y = torch.full_like(x, float("nan"))
    LAUNCHERS[impl](x, y)
    worst = 0.0
    for r in range(0, M, 1024):  # every element, a chunk of rows at a time
        ref = torch.softmax(x[r:r + 1024].double(), -1)
        worst = max(worst, (y[r:r + 1024].double() - ref).abs().max().item())
    assert worst <= TOL[torch.bfloat16], f"max abs error {worst}"


def test_i32_config_past_2_pow_31_elements_runs_in_64_bit_and_is_exact():
    """A fused config asking for 32-bit offsets (I32, as a table entry may) on 2^31 + 1280 elements: the launch runs
    it with 64-bit offsets, and every element of the forward and the backward is right (a wrapped offset would
    write the first rows' outputs from the last rows' inputs)."""
    from softmax_ref import assert_grad_close

    M, N = (1 << 23) + 5, 256
    config = LaunchConfig.make(1, BLOCK_N=256, ROWS=4, I32=1)
    x = torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16).normal_(0, 3)
    y = torch.full_like(x, float("nan"))
    assert fused.launch(x, y, config) == config.with_meta(I32=0)
    dy = torch.empty_like(x).normal_(0, 1)
    dx = torch.full_like(x, float("nan"))
    assert fused.launch_backward(dy, y, dx, config) == config.with_meta(I32=0)
    for r in range(0, M, 1 << 16):  # every element, a chunk of rows at a time
        rows = slice(r, r + (1 << 16))
        assert_softmax_close(y[rows], x[rows])
        assert_grad_close(dx[rows], dy[rows], y[rows])


def test_autotuner_keys_problems_that_could_wrap_32_bit_offsets_apart(monkeypatch):
    """triton.autotune caches its pick per (N_BUCKET, M_BUCKET) and prunes only on a new key: a problem past 2^31
    elements in the bucket of an earlier one gets a key of its own (a negative M_BUCKET), whose pruning leaves no I32
    config, so a cached I32 pick is never reused where its offsets would wrap. A family whose search space is one
    config with and one without I32."""
    import dataclasses

    from tritonsoftmax.kernels import launches

    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "1")
    pair = [LaunchConfig.make(1, BLOCK_N=256, ROWS=4, I32=1), LaunchConfig.make(1, BLOCK_N=256, ROWS=4)]
    family = dataclasses.replace(fused.FAMILY, name="fused-i32-pair", configs=lambda device, M, N: list(pair),
                                 _autotuned={})
    small = random_input((16384, 256), torch.bfloat16, DEVICE)
    y = poisoned_like(small)
    assert launches.launch_forward(family, small, y, None, 1.0, False, False) is None
    assert_softmax_close(y, small)
    tuner = family.autotuned(device_info(small.device))
    assert len(tuner.cache) == 1
    M = (1 << 23) + 5  # 2^31 + 1280 elements (bf16: 4 GiB)
    x = torch.empty(M, 256, device=DEVICE, dtype=torch.bfloat16).normal_(0, 3)
    y = torch.full_like(x, float("nan"))
    launches.launch_forward(family, x, y, None, 1.0, False, False)
    assert len(tuner.cache) == 2, "the large problem must not share the small one's key"
    (big_key,) = [k for k in tuner.cache if any(isinstance(v, int) and v < 0 for v in k)]
    assert not tuner.cache[big_key].kwargs.get("I32"), tuner.cache[big_key]
    for r in range(0, M, 1 << 16):
        assert_softmax_close(y[r:r + (1 << 16)], x[r:r + (1 << 16)])


def test_autotuner_runs_and_picks_a_config_from_the_search_space(monkeypatch):
    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "1")
    x = random_input((4096, 1000), torch.float32, DEVICE)
    y = poisoned_like(x)
    assert fused.launch(x, y) is None, "with autotuning on, the autotuner chooses"
    assert_softmax_close(y, x)
    info = device_info(x.device)
    best = LaunchConfig.from_triton(fused.FAMILY.autotuned(info).best_config)
    assert best in fused.FAMILY.configs(info, 4096, 1000)


def test_launch_hooks_fire_on_warm_calls():
    from triton import knobs

    hook = knobs.runtime.launch_enter_hook
    if not hasattr(hook, "add"):
        pytest.skip("this triton has no HookChain launch hooks")
    x = random_input((64, 1000), torch.float32, DEVICE)
    tritonsoftmax.softmax(x)  # cold, then warm below
    calls = []
    fn = lambda metadata: calls.append(metadata)  # noqa: E731
    hook.add(fn)
    try:
        y = tritonsoftmax.softmax(x)
    finally:
        hook.remove(fn)
    assert len(calls) == 1
    assert_softmax_close(y, x)


@pytest.mark.needs("cooperative")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 65536), (1, 131072), (8, 131072), (3, 2000003), (1, 8388608)])
def test_coop_cooperative_equals_two_phase_and_survives_repeats(M, N, dtype):
    """Many launches in a row (counters left ready by the kernels) and the cooperative result equal to
    the two-launch mode's, element for element: the same arithmetic, only the waiting differs. The config is
    coop's register-chunk one (4 warps, not cluster mode, which test_cluster checks)."""
    from tritonsoftmax.layout import matrix_problem

    x = random_input((M, N), dtype, DEVICE, seed=M)
    info = device_info(x.device)
    flags = {"LOG": 0, "ZERO_MASKED": 0}
    config = coop.shape_config(info, N, coop._chunk(info, M, N), 4)
    two = poisoned_like(x)
    coop.FAMILY.prepare(matrix_problem(x, two), config, info, flags=flags, two_phase=True)(x, two, 1.0)
    y = poisoned_like(x)
    launch = coop.FAMILY.prepare(matrix_problem(x, y), config, info, flags=flags, two_phase=False)
    for _ in range(20):
        launch(x, y, 1.0)
    torch.cuda.synchronize()
    if M == 4096:
        assert launch.mode == "ticketed"  # 4096 x G programs cannot all be resident
    elif M <= 8:
        assert launch.mode == "resident"  # a cooperative launch, program ids for tickets
    assert torch.equal(y, two)
    assert_softmax_close(y, x)
    assert coop_scratch_ready(x.device, M), "counters not left where the next launch expects them"


def test_coop_on_two_streams_at_once():
    x = random_input((512, 65536), torch.float32, DEVICE, seed=1)
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [poisoned_like(x) for _ in streams]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(5):
        for s, y in zip(streams, outs, strict=True):
            with torch.cuda.stream(s):
                coop.launch(x, y)
    torch.cuda.synchronize()
    for y in outs:
        assert_softmax_close(y, x)


def test_compiles_say_their_fp_fusion():
    """Every launch passes enable_fp_fusion explicitly (triton_launcher.COMPILE_OPTIONS), so triton 3.9's
    warning about its changing default never reaches a user (a fresh process: Triton warns once).
    On triton < 3.9 there is no such warning and this only checks that the option is accepted."""
    import os
    import subprocess
    import sys

    code = ("import torch, tritonsoftmax\n"
            "x = torch.randn(37, 3001, device='cuda')\n"
            "for impl in ('fused', 'online', 'split', 'coop'):\n"
            "    torch.testing.assert_close(tritonsoftmax.softmax(x, impl=impl), torch.softmax(x, -1))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FP_FUSION" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("M,N,config,tiles", [
    (1, 8388608, None, 2),
    (1, 8388608, LaunchConfig.make(8, BLOCK=8192, TILES=1, BLOCK_G=1024), 1),  # the H200 table's
    (4, 1048576, None, 1),
    (3, 300007, None, 1),
])
@pytest.mark.needs("pdl")
def test_split_dependent_launch_never_reads_stale_partials(M, N, config, tiles):
    """Pass 2 starts before pass 1 ends (PDL) and must wait for its partials: with the input changed
    before each launch, every result equals the two plain launches' result, element for element.
    With one-tile chunks pass 2 loads its tile before it waits; with two, after."""
    from tritonsoftmax.layout import matrix_problem

    xs = [random_input((M, N), torch.float32, DEVICE, seed=s) for s in (1, 2)]
    x = xs[0].clone()
    info = device_info(x.device)
    flags = {"LOG": 0, "ZERO_MASKED": 0}
    plain = split.FAMILY.prepare(matrix_problem(x, x), config, info, flags={**flags, "PDL": 0})
    dependent = split.FAMILY.prepare(matrix_problem(x, x), config, info, flags=flags)
    assert dependent.pdl, "sm_90+ runs pass 2 as a dependent launch"
    assert dependent.config["TILES"] == tiles
    junk = poisoned_like(x)
    for i in range(10):
        x.copy_(xs[i % 2])
        want, got = poisoned_like(x), poisoned_like(x)
        plain(x, want, 1.0)
        x.copy_(xs[(i + 1) % 2])
        plain(x, junk, 1.0)  # the workspace the allocator hands out next now holds the other input's partials
        x.copy_(xs[i % 2])
        dependent(x, got, 1.0)
        assert torch.equal(got, want)
    assert_softmax_close(got, x)


@pytest.mark.needs("cooperative")
def test_coop_refused_cooperative_launch_falls_back_to_tickets(monkeypatch):
    """Should the occupancy estimate be high (another GPU, another driver), the driver refuses the
    cooperative launch, nothing runs, and the ticketed launch takes over with the right result."""
    from tritonsoftmax.kernels import sizing
    from tritonsoftmax.layout import matrix_problem

    monkeypatch.setattr(sizing, "resident_programs", lambda *args: 10**6)
    x = random_input((4096, 65536), torch.float32, DEVICE, seed=3)
    y = poisoned_like(x)
    launch = coop.FAMILY.prepare(matrix_problem(x, y), None, device_info(x.device), flags={"LOG": 0, "ZERO_MASKED": 0})
    launch(x, y, 1.0)
    assert launch.mode == "ticketed" and "cooperative" in (launch.resident_error or "")
    assert_softmax_close(y, x)
    y2 = poisoned_like(x)
    launch(x, y2, 1.0)
    assert torch.equal(y, y2)
    assert coop_scratch_ready(x.device, 4096)
