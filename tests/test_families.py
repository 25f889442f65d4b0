"""Every kernel family (and auto) against the float64 reference over shapes, dtypes and configs."""

import pytest
import torch
from conftest import DEVICE
from shipped_tables import sm90_entries
from softmax_ref import assert_softmax_close, coop_scratch_ready, poisoned_like, random_input

import tritonsoftmax
from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import FAMILY_NAMES, coop, exchange, family, fused, online, split, tile

LAUNCHERS = {"fused": fused.launch, "tile": tile.launch, "online": online.launch, "split": split.launch,
             "coop": coop.launch}
NS = [1, 2, 3, 17, 128, 1000, 1024, 4097, 20000]
MS = [1, 3, 64]
DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("impl", FAMILY_NAMES)
def test_family_launcher_matches_reference(impl, N, M, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=N * 7 + M)
    y = poisoned_like(x)
    LAUNCHERS[impl](x, y)
    assert_softmax_close(y, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M,N", [(1, 1), (3, 17), (64, 1000), (3, 4097), (1, 20000)])
def test_auto_matches_reference(M, N, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=N + M)
    assert_softmax_close(tritonsoftmax.softmax(x), x)


# Two or more explicit configs per family: several tiles per row, several rows per program.
EXPLICIT = {
    "fused": [LaunchConfig.make(1, BLOCK_N=128, ROWS=8), LaunchConfig.make(4, BLOCK_N=256, ROWS=1),
              LaunchConfig.make(2, BLOCK_N=128, ROWS=2),
              LaunchConfig.make(2, BLOCK_N=128, ROWS=2, STAGES=3, PER_SM=1)],  # persistent, pipelined
    "tile": [LaunchConfig.make(1, BLOCK=32), LaunchConfig.make(2, 2, BLOCK=64)],
    "online": [LaunchConfig.make(1, BLOCK=32), LaunchConfig.make(2, 2, BLOCK=64)],
    "split": [LaunchConfig.make(1, BLOCK=32, TILES=2, BLOCK_G=4), LaunchConfig.make(2, BLOCK=16, TILES=1, BLOCK_G=16)],
    "coop": [LaunchConfig.make(1, BLOCK=32, TILES=1, BLOCK_G=8), LaunchConfig.make(2, BLOCK=16, TILES=2, BLOCK_G=4)],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M,N", [(5, 100), (16, 128), (7, 33)])
@pytest.mark.parametrize("impl,config", [(k, c) for k, cs in EXPLICIT.items() for c in cs],
                         ids=lambda v: str(v).replace(" ", ""))
def test_explicit_config_is_used_and_correct(impl, config, M, N, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=M * N)
    y = poisoned_like(x)
    used = LAUNCHERS[impl](x, y, config)
    assert used == config
    assert_softmax_close(y, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_pipelined_programs_loop_over_more_rows_than_programs(dtype):
    from tritonsoftmax.device import device_info

    sms = device_info(torch.device(DEVICE)).sm_count
    x = random_input((3 * sms + 5, 1000), dtype, DEVICE, seed=11)
    y = poisoned_like(x)
    config = LaunchConfig.make(4, BLOCK_N=1024, ROWS=1, STAGES=3, PER_SM=1)
    assert fused.launch(x, y, config) == config
    assert_softmax_close(y, x)


def test_fused_pipelined_configs_only_for_long_rows_and_many_rows():
    from test_dispatch import SM90

    def pipelined(M, N):
        return [c for c in fused.FAMILY.configs(SM90, M, N) if dict(c.meta).get("STAGES", 1) > 1]

    long_many = pipelined(4096, 32768)
    assert long_many and all(c.num_warps >= 16 for c in long_many)
    assert fused.FAMILY.grid(4096, 32768, dict(long_many[0].meta), SM90) == (SM90.sm_count,)
    assert fused.FAMILY.grid(100, 32768, dict(long_many[0].meta), SM90) == (100,)
    assert not pipelined(4096, 8192) and not pipelined(SM90.sm_count, 32768)
    plain = [c for c in fused.FAMILY.configs(SM90, 4096, 16384) if dict(c.meta).get("STAGES", 1) == 1]
    assert 32 in {c.num_warps for c in plain}  # 16 elements a thread (bf16 backward: 3909 vs 3087 GB/s at 16)
    # Many short rows of 256- and 512-element blocks: four-row tiles, two stages.
    for N in (200, 256, 300, 512):
        short = pipelined(16384, N)
        assert {(c.num_warps, c["PER_SM"]) for c in short} == set(fused.SHORT_PIPELINED), N
        assert all(c["ROWS"] == 4 and c["STAGES"] == 2 for c in short)
    assert not pipelined(SM90.sm_count, 300) and not pipelined(16384, 100) and not pipelined(16384, 1000)
    assert not [c for c in fused.BWD_FAMILY.configs(SM90, 16384, 300) if dict(c.meta).get("STAGES", 1) > 1]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N", [300, 256])
def test_fused_short_pipelined_configs_loop_over_more_tiles_than_programs(N, dtype):
    info = device_info(torch.device(DEVICE))
    M = 4 * 32 * info.sm_count + 7  # more four-row tiles than 32 programs an SM, the last tile partial
    x = random_input((M, N), dtype, DEVICE, seed=N)
    short = [c for c in fused.FAMILY.configs(info, M, N) if dict(c.meta).get("STAGES", 1) == 2]
    assert len(short) == len(fused.SHORT_PIPELINED)
    for config in short:
        assert fused.FAMILY.grid(M, N, dict(config.meta), info)[0] < (M + 3) // 4
        y = poisoned_like(x)
        assert fused.launch(x, y, config) == config
        assert_softmax_close(y, x)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("impl", FAMILY_NAMES)
def test_every_config_in_a_search_space_names_only_its_kernels_parameters(impl, backward):
    """A config with a meta-parameter its kernel lacks fails in Triton's autotuner (the fused
    backward was once offered the forward's pipelined STAGES/PER_SM configs)."""
    from test_dispatch import GFX942, SM90

    from tritonsoftmax.kernels import backward_family

    fam = backward_family(impl) if backward else family(impl)
    kernels = [p.kernel for p in getattr(fam, "passes", ())] or [fam.kernel]
    for device in (SM90, GFX942):
        for M, N in ((4096, 256), (4096, 16384), (4096, 32768), (8, 1048576)):
            if impl == "fused" and N > fused.MAX_N:
                continue
            for config in fam.configs(device, M, N):
                for kernel in kernels:
                    assert set(dict(config.meta)) <= set(kernel.arg_names), (config, kernel.fn.__name__)


def test_fused_rejects_config_shorter_than_row():
    x = random_input((2, 300), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="BLOCK_N"):
        fused.launch(x, poisoned_like(x), LaunchConfig.make(1, BLOCK_N=128, ROWS=1))


def test_fused_rejects_rows_too_long_for_chip():
    x = torch.empty(1, fused.MAX_N + 1, device=DEVICE)
    with pytest.raises(ValueError, match="online"):
        tritonsoftmax.softmax(x, impl="fused")


@pytest.mark.parametrize("impl", FAMILY_NAMES)
def test_launcher_writes_into_strided_output(impl):
    x = random_input((6, 300), torch.float32, DEVICE)
    big = torch.full((6, 700), float("nan"), device=DEVICE)
    y = big[:, 100:400]
    LAUNCHERS[impl](x, y)
    assert_softmax_close(y, x)
    assert big[:, :100].isnan().all() and big[:, 400:].isnan().all(), "wrote outside the output view"


def test_split_rejects_config_with_too_few_partial_slots():
    x = random_input((2, 300), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="BLOCK_G"):
        split.launch(x, poisoned_like(x), LaunchConfig.make(1, BLOCK=32, TILES=1, BLOCK_G=4))


def test_split_chunk_of_all_neg_inf_does_not_poison_row():
    x = random_input((3, 256), torch.float32, DEVICE)
    x[:, 64:128] = float("-inf")  # exactly one whole chunk of the config below
    x[2] = float("-inf")  # and a row of all -inf: NaN like torch
    y = poisoned_like(x)
    split.launch(x, y, LaunchConfig.make(1, BLOCK=32, TILES=2, BLOCK_G=4))
    assert_softmax_close(y, x)


def test_online_masked_prefix_does_not_poison_row():
    # The first tiles of the row are all -inf (a masked prefix); the running max is -inf there.
    x = random_input((2, 200), torch.float32, DEVICE)
    x[:, :100] = float("-inf")
    for impl in FAMILY_NAMES:
        y = poisoned_like(x)
        LAUNCHERS[impl](x, y, EXPLICIT[impl][0] if impl != "fused" else None)
        assert_softmax_close(y, x)


def test_family_registry_names_match_modules():
    for name in FAMILY_NAMES:
        assert family(name).name == name


def test_coop_rejects_config_with_too_few_partial_slots():
    x = random_input((2, 300), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="BLOCK_G"):
        coop.launch(x, poisoned_like(x), LaunchConfig.make(1, BLOCK=32, TILES=1, BLOCK_G=4))


@pytest.mark.parametrize("regs,warps,shared,per_sm", [
    (32, 16, 0, 4), (63, 4, 0, 8), (102, 8, 0, 2),  # coop kernels: the H200 driver's limit
    (89, 4, 0, 5), (40, 4, 0, 12), (32, 4, 0, 16),  # registers in 256-per-warp units; 2048 threads an SM
    (16, 1, 0, 32),  # at most 32 programs an SM
    (40, 8, 100000, 2),  # shared memory: 2 x (100000 + 1024) fits in 227 KB, 3 do not
    (255, 32, 0, 0),  # does not fit at all
])
def test_resident_programs_estimate(regs, warps, shared, per_sm):
    from test_dispatch import SM90

    from tritonsoftmax.kernels.sizing import resident_programs

    assert resident_programs(SM90, regs, warps, shared) == per_sm


def test_coop_single_launch_is_ticketed_until_a_gpu_says_resident():
    """The interpreter runs the two-launch mode; a single launch starts "ticketed" and turns
    "resident" only after its first call compiled the cooperative kernel on a CUDA device."""
    from test_dispatch import GFX942, SM90

    from tritonsoftmax.layout import matrix_problem

    x = torch.empty(8, 4096)
    config = LaunchConfig.make(4, BLOCK=1024, TILES=1, BLOCK_G=4)
    assert coop.FAMILY.prepare(matrix_problem(x, x), config, SM90, two_phase=True).mode == "two-phase"
    cuda = coop.FAMILY.prepare(matrix_problem(x, x), config, SM90, two_phase=False)
    assert cuda.mode == "ticketed" and cuda._resident is not None
    assert dict(cuda._resident.config.options)["launch_cooperative_grid"] == 1
    assert cuda.config.options == ()  # what the tuner stores stays the plain config
    hip = coop.FAMILY.prepare(matrix_problem(x, x), config, GFX942, two_phase=False)
    assert hip.mode == "ticketed" and hip._resident is None  # no cooperative launch on AMD here
    many = torch.empty(4096, 65536)  # 4096 x 8 programs of 4 warps: more than 16 an SM could ever hold
    big = coop.FAMILY.prepare(matrix_problem(many, many), LaunchConfig.make(4, BLOCK=8192, TILES=1, BLOCK_G=8), SM90,
                              two_phase=False)
    assert big.programs == 4096 * 8 and big._resident is None  # the cooperative variant is not even compiled


def test_split_imports_and_runs_without_triton_nvidia_extras():
    """A triton built without its NVIDIA backend (ROCm builds) has no triton.language.extra.cuda:
    the package still imports, and split (whose PDL branches are compiled out) still runs."""
    import os
    import subprocess
    import sys

    code = ("import sys, triton\n"  # triton imports whichever extras its build has, then ours looks
            "sys.modules['triton.language.extra.cuda'] = None  # makes its import fail\n"
            "import torch, tritonsoftmax\n"
            "x = torch.randn(3, 5000, dtype=torch.float64).float()\n"
            "y = tritonsoftmax.softmax(x, impl='split')\n"
            "assert (y.double() - torch.softmax(x.double(), -1)).abs().max().item() < 1e-6\n"
            "print('ok')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_split_second_pass_is_a_dependent_launch_on_sm90_only():
    """On sm_90+ pass 2 is a programmatic dependent launch (launch_pdl; it waits in-kernel for pass 1);
    elsewhere, and when PDL=0 is asked for, the two passes are plain launches."""
    import dataclasses

    from test_dispatch import GFX942, SM90

    from tritonsoftmax.device import INTERPRETER
    from tritonsoftmax.kernels.sizing import supports_pdl
    from tritonsoftmax.layout import matrix_problem

    sm80 = dataclasses.replace(SM90, arch="sm_80")
    assert supports_pdl(SM90) and not supports_pdl(sm80) and not supports_pdl(GFX942)
    assert not supports_pdl(INTERPRETER)
    x = torch.empty(2, 1 << 20)
    problem = matrix_problem(x, x)
    on = split.FAMILY.prepare(problem, None, SM90)
    assert on.pdl and dict(on._second.config.options)["launch_pdl"] == 1
    assert on._first.config.options == () and on._first.flags["PDL"] == 1 and on._second.flags["PDL"] == 1
    assert on.config.options == ()  # what the tuner stores stays the plain config
    for device, flags in ((sm80, None), (GFX942, None), (INTERPRETER, None), (SM90, {"PDL": 0})):
        off = split.FAMILY.prepare(problem, None, device, flags=flags)
        assert not off.pdl and off._second.config.options == off.config.options
        assert off._first.flags["PDL"] == 0 and off._second.flags["PDL"] == 0


def test_coop_refuses_more_programs_a_row_than_can_run_together():
    from test_dispatch import SM90

    from tritonsoftmax.layout import matrix_problem

    x = torch.empty(2, 133 * 1024)
    config = LaunchConfig.make(4, BLOCK=1024, TILES=1, BLOCK_G=256)  # 133 programs a row, 132 SMs
    with pytest.raises(ValueError, match="SM count"):
        coop.FAMILY.prepare(matrix_problem(x, x), config, SM90, two_phase=False)
    coop.FAMILY.prepare(matrix_problem(x, x), config, SM90, two_phase=True)  # no waiting: any G


@pytest.mark.parametrize("M,N,fwd_block,bwd_block", [
    (1, 300000, 4096, 4096), (1, 524288, 4096, 4096), (2, 524288, 4096, 4096), (8, 524288, 8192, 8192),
    (1, 1048576, 8192, 2048), (2, 1048576, 8192, 4096), (1, 152064, 2048, 2048), (1, 2097152, 4096, 4096)])
def test_coop_heuristic_holds_what_it_can_without_a_second_read(M, N, fwd_block, bwd_block):
    """Few rows would want narrow chunks (COOP_PROGRAMS_PER_SM programs an SM), but a row that fits in max_chunks
    chunks of COOP_CHUNK / held tensors elements is held (TILES 1) rather than cut narrower and read twice; the
    backward holds dy and y, so its chunks stop at half (1x1048576: 2048 x 4 tiles). 1x2097152 fits nowhere."""
    from test_dispatch import SM90

    fwd, bwd = coop._heuristic(SM90, M, N), coop._bwd_heuristic(SM90, M, N)
    assert (fwd["BLOCK"], bwd["BLOCK"]) == (fwd_block, bwd_block)
    for config in (fwd, bwd):
        fits = config["BLOCK"] * SM90.sm_count >= N
        assert (config["TILES"] == 1) == fits, config


@pytest.mark.parametrize("impl", FAMILY_NAMES)
def test_inputs_near_the_float32_limit(impl):
    """Values within float32's range but past what x * log2(e) can hold (> 2.36e38): one element of 3e38, a
    row of equal -3e38 (uniform), a row alternating +-3e38, and one with 3e38 at both ends of several chunks.
    Exponents kept in log2 units (x * log2(e) before the max) turn the first two into NaN."""
    x = random_input((4, 200), torch.float32, DEVICE)
    x[0, 5] = 3e38
    x[1] = -3e38
    x[2, ::2], x[2, 1::2] = 3e38, -3e38
    x[3, ::31] = 3e38
    y = poisoned_like(x)
    LAUNCHERS[impl](x, y, EXPLICIT[impl][0] if impl != "fused" else None)
    assert_softmax_close(y, x)


@pytest.mark.parametrize("G", [1, 3])
def test_coop_chunk_of_all_neg_inf_does_not_poison_row(G):
    x = random_input((3, 96), torch.float32, DEVICE)
    x[:, 32:64] = float("-inf")  # exactly one whole chunk (G = 3) or a third of the only one
    x[2] = float("-inf")  # and a row of all -inf: NaN like torch
    y = poisoned_like(x)
    coop.launch(x, y, LaunchConfig.make(1, BLOCK=32 if G == 3 else 128, TILES=1, BLOCK_G=4))
    assert_softmax_close(y, x)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype,N,layout,full", [
    (torch.float32, 128, "rows", 1), (torch.float32, 100, "rows", 0),  # whole chunks; a partial last chunk
    (torch.float16, 128, "rows", 0),  # 2-byte inputs keep their masks
    (torch.float32, 2048, "off16", 0),  # rows off 16 bytes (ALIGN > 1 from ALIGN_MIN_N on)
    (torch.float32, 128, "columns", 1)])  # strided columns
def test_coop_whole_chunks_go_without_masks(dtype, N, layout, full, log):
    """FULL (constexprs.whole_chunks): the forward's held chunks of 4-byte rows that BLOCK divides load and
    store without masks; it is set where the rule says and the result is right either way, also for a value of
    3e38 times a scale that is not a power of two (compiled for a GPU, an unrounded product there would turn
    its row NaN: row_ops.load_scaled)."""
    from tritonsoftmax.layout import matrix_problem

    base = random_input((5, N + 1), dtype, DEVICE, seed=N)  # a row stride of N + 1: rows off 16 bytes
    x = {"rows": base[:, :N].contiguous(), "off16": base[:, :N],
         "columns": random_input((N, 5), dtype, DEVICE, seed=N).t()}[layout]
    x[1, 3] = 3e38 if dtype == torch.float32 else 6e4
    x[2] = float("-inf")
    y = poisoned_like(base)[:, :N] if layout == "off16" else poisoned_like(x)  # realigned: one layout
    config = LaunchConfig.make(1, BLOCK=max(32, N // 4), TILES=1, BLOCK_G=4)
    launch = coop.FAMILY.prepare(matrix_problem(x, y), config, device_info(x.device),
                                 flags={"LOG": int(log), "ZERO_MASKED": 0})
    launch(x, y, 0.37)
    assert [run.flags["FULL"] for run in launch.launches] == [full] * len(launch.launches)
    z = x.double() * 0.37
    ref = torch.log_softmax(z, -1) if log else torch.softmax(z, -1)
    assert torch.equal(y.isnan(), ref.isnan())
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert ((y.double() - ref).nan_to_num(0).abs() / ref.nan_to_num(0).abs().clamp(min=1)).max().item() <= tol


@pytest.mark.parametrize("log", [False, True])
def test_coop_cooperative_launch_runs_and_leaves_its_counters_ready(log):
    """The single cooperative launch (ticket, word exchange, scratch left zeroed for the next launch).
    Under the interpreter programs run one after another, so there it runs with one program a row
    (G = 1); the GPU suite runs it with many programs a row."""
    from tritonsoftmax.device import device_info
    from tritonsoftmax.layout import matrix_problem

    M, N = 6, 200
    G = 1 if DEVICE == "cpu" else 4
    config = LaunchConfig.make(2, BLOCK=256 // G, TILES=1, BLOCK_G=G)
    x = random_input((M, N), torch.float32, DEVICE, seed=4)
    for _ in range(3):  # each next launch must find the counters where it expects them
        y = poisoned_like(x)
        launch = coop.FAMILY.prepare(matrix_problem(x, y), config, device_info(x.device),
                                     flags={"LOG": int(log), "ZERO_MASKED": 0}, two_phase=False)
        assert len(launch.launches) == 1
        launch(x, y, 1.0)
        ref = torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)
        assert (y.double() - ref).abs().max().item() <= 1e-5
    assert coop_scratch_ready(x.device, M)


@pytest.mark.parametrize("two_phase", [False, True])
def test_coop_launches_leave_the_scratch_zeroed(two_phase):
    """Every launch must leave the exchange words and counters at 0, where the next one expects
    them (a stale non-zero word would pass for a partner's partial): the single launch through
    its last departer (on the CPU rows are one chunk, so it exchanges nothing), two phases
    through the host. Forward and backward on one buffer, twice, each checked."""
    from tritonsoftmax.layout import matrix_problem

    M, N = 3, 200
    G = 1 if DEVICE == "cpu" and not two_phase else 4
    config = LaunchConfig.make(2, BLOCK=256 // G, TILES=1, BLOCK_G=G)
    info = device_info(torch.device(DEVICE))
    x = random_input((M, N), torch.float32, DEVICE, seed=9)
    dy = random_input((M, N), torch.float32, DEVICE, seed=10)
    ref = torch.softmax(x.double(), -1)
    dref = ref * (dy.double() - (dy.double() * ref).sum(-1, keepdim=True))
    for _ in range(2):
        y = poisoned_like(x)
        coop.FAMILY.prepare(matrix_problem(x, y), config, info, flags={"LOG": 0, "ZERO_MASKED": 0},
                            two_phase=two_phase)(x, y, 1.0)
        assert (y.double() - ref).abs().max().item() <= 1e-5
        assert coop_scratch_ready(x.device, M)
        dx = poisoned_like(x)
        coop.BWD_FAMILY.prepare(matrix_problem(dy, dx), config, info, flags={"LOG": 0},
                                two_phase=two_phase)(dy, dx, y.clone(), 1.0)
        assert (dx.double() - dref).abs().max().item() <= 1e-5
        assert coop_scratch_ready(x.device, M)


def test_clear_caches_releases_the_coop_buffers():
    x = random_input((2, 64), torch.float32, DEVICE)
    coop.launch(x, poisoned_like(x))
    assert exchange._scratch
    tritonsoftmax.clear_caches()
    assert not exchange._scratch


HINTED = [("online", LaunchConfig.make(2, BLOCK=32)), ("split", LaunchConfig.make(1, BLOCK=32, TILES=2, BLOCK_G=4)),
          ("coop", LaunchConfig.make(2, BLOCK=16, TILES=2, BLOCK_G=4))]


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("impl,config", HINTED, ids=[k for k, _ in HINTED])
def test_l2_eviction_hints_change_no_result(impl, config, backward):
    """HINTS=1 (the default: evict_last on the first read, evict_first on the last) and HINTS=0
    (plain loads, what AMD gets) run the same arithmetic."""
    from tritonsoftmax.device import device_info
    from tritonsoftmax.kernels import backward_family
    from tritonsoftmax.layout import matrix_problem

    x = random_input((5, 100), torch.float32, DEVICE, seed=5)
    y = torch.softmax(x.double(), -1).float()
    outs = []
    for hints in (0, 1):
        out = poisoned_like(x)
        if backward:
            fam = backward_family(impl)
            fam.prepare(matrix_problem(x, out), config, device_info(x.device),
                        flags={"LOG": 0, "HINTS": hints})(x, out, y, 1.0)
        else:
            fam = family(impl)
            fam.prepare(matrix_problem(x, out), config, device_info(x.device),
                        flags={"LOG": 0, "ZERO_MASKED": 0, "HINTS": hints})(x, out, 1.0)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    if backward:
        ref = (y.double() * (x.double() - (x.double() * y.double()).sum(-1, keepdim=True))).float()
        torch.testing.assert_close(outs[1], ref, rtol=1e-5, atol=1e-6)
    else:
        assert_softmax_close(outs[1], x)


@pytest.mark.parametrize("log", [False, True])
def test_fused_one_row_tiles_on_strided_rows(log):
    """One-row tiles (the heuristic's choice from 4K elements) over rows with a column stride and
    rows interleaved inside the softmax dim (INNER > 1): the 1-D row path's offsets."""
    op = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
    ref = torch.log_softmax if log else torch.softmax
    for x, dim in ((random_input((3, 4100, 2), torch.float32, DEVICE), 1),
                   (random_input((4100, 3), torch.float16, DEVICE).t(), -1)):
        assert fused.FAMILY.heuristic(device_info(x.device), x.numel() // x.shape[dim], x.shape[dim])["ROWS"] == 1
        y = op(x, dim, impl="fused")
        want = ref(x.double(), dim)
        tol = 1e-5 if x.dtype == torch.float32 else 2e-3
        assert torch.allclose(y.double(), want, atol=tol, rtol=tol), (y.double() - want).abs().max()


def test_row_tail_covers_rows_just_past_a_power_of_two_only():
    from tritonsoftmax.kernels import constexprs

    assert constexprs.row_tail(16392, 32768) == 8, "16384 + 8 elements held instead of 32768"
    assert constexprs.row_tail(16384 + 512, 32768) == 512, "a tail of 1/64 of the block"
    assert constexprs.row_tail(16384 + 513, 32768) == 0, "a tail past 1/64 of the block"
    assert constexprs.row_tail(2049, 4096) == 1
    assert constexprs.row_tail(1030, 2048) == 8
    assert constexprs.row_tail(520, 1024) == 0, "blocks under TAIL_MIN_BLOCK"
    assert constexprs.row_tail(16384, 32768) == 0, "the row fits the first half"
    assert constexprs.row_tail(16392, 65536) == 0, "a block past next_pow2(N): the row fits its first half"


TAIL_CASES = [(torch.float32, 2052, 4), (torch.float16, 2056, 8), (torch.bfloat16, 4104, 8),
              (torch.float32, 16392, 8), (torch.float16, 16400, 16)]


@pytest.mark.parametrize("stages", [1, 2], ids=["one-tile", "persistent"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype,N,tail", TAIL_CASES, ids=[f"{str(d)[6:]}-{n}" for d, n, _ in TAIL_CASES])
def test_fused_tail_rows_match_reference(dtype, N, tail, log, padded, stages):
    """Rows held as BLOCK_N // 2 + TAIL elements (row_tail): the row's max in the tail, a row of -inf
    (zero_masked_rows) and a padded row stride that the tail must not write into; forward (one tile a
    program, or persistent programs, one an SM, looping over twice as many rows) and backward."""
    from softmax_ref import assert_grad_close

    from tritonsoftmax.config import next_power_of_2
    from tritonsoftmax.kernels import backward_family
    from tritonsoftmax.layout import matrix_problem

    config = LaunchConfig.make(4, BLOCK_N=next_power_of_2(N), ROWS=1)
    forward_config = config if stages == 1 else LaunchConfig.make(4, BLOCK_N=next_power_of_2(N), ROWS=1,
                                                                  STAGES=stages, PER_SM=1)
    cols = N + 8 if padded else N
    rows = 4 if stages == 1 else 2 * device_info(torch.device(DEVICE)).sm_count + 1  # PER_SM 1: programs loop
    x = random_input((rows, cols), dtype, DEVICE, seed=N)[:, :N]
    x[0, N - 1] = 40.0  # the row's max, in the tail
    x[2] = float("-inf")
    out = poisoned_like(random_input((rows, cols), dtype, DEVICE))
    y = out[:, :N]
    flags = {"LOG": int(log), "ZERO_MASKED": 1}
    fwd = family("fused").prepare(matrix_problem(x, y), forward_config, device_info(x.device), flags=flags)
    fwd(x, y, 1.0)
    assert fwd.flags["TAIL"] == tail and fwd.flags["ALIGN"] == 1
    want = torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)
    want[2] = 0.0  # zero_masked_rows: zeros for softmax and log_softmax alike
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}[dtype]
    got = y.double()
    assert torch.equal(got[2], want[2].to(got.device)), "the -inf row"
    keep = [r for r in range(rows) if r != 2]
    err = (got[keep] - want[keep].to(got.device)).abs() / want[keep].to(got.device).abs().clamp(min=1)
    assert err.max().item() <= tol, "log_softmax relative to its magnitude (bf16: 0.25 apart at -40)"
    assert torch.isnan(out[:, N:]).all(), "the padding stays untouched"
    assert float(y[0, N - 1].double().exp() if log else y[0, N - 1]) > 0.99

    probs = torch.softmax(random_input((4, cols), dtype, DEVICE, seed=1).float(), -1)
    ys = (probs.log() if log else probs).to(dtype)[:, :N]  # dy's layout, padded or not
    dy = random_input((4, cols), dtype, DEVICE, seed=2)[:, :N]
    out = poisoned_like(random_input((4, cols), dtype, DEVICE))
    dx = out[:, :N]
    back = backward_family("fused").prepare(matrix_problem(dy, dx), config, device_info(dy.device),
                                            flags={"LOG": int(log)})
    assert ys.stride() == dy.stride()
    back(dy, dx, ys, 1.0)
    assert back.flags["TAIL"] == tail
    assert_grad_close(dx, dy, ys, log=log)
    assert torch.isnan(out[:, N:]).all()


def test_row_tail_of_a_realigned_row_counts_its_whole_groups():
    from tritonsoftmax.kernels import constexprs

    assert constexprs.row_tail(4100, 8192, 8) == 8, "16-bit 4100 off 16 bytes: groups in 4104 positions"
    assert constexprs.row_tail(4100, 8192) == 4
    assert constexprs.row_tail(16387, 32768, 4) == 4, "fp32: 16388 positions"
    assert constexprs.row_tail(2049, 4096, 8) == 8, "at least one group"
    assert constexprs.row_tail(4096 + 64, 8192, 8) == 64, "1/128 of the block"
    assert constexprs.row_tail(4096 + 122, 8192, 8) == 128, "128 positions of whole groups: 1/64 of the block"
    assert constexprs.row_tail(4096 + 129, 8192, 8) == 0, "past 1/64 of the block"
    assert constexprs.row_tail(4096, 8192, 8) == 0, "the row fits the first half"


# (dtype, N, row stride, TAIL, ALIGN): rows that start off 16 bytes, held as BLOCK_N // 2 + TAIL window positions.
REALIGNED_TAIL_CASES = [(torch.float16, 4100, 4100, 8, 8), (torch.bfloat16, 2052, 2061, 8, 8),
                        (torch.float32, 2050, 2050, 4, 4), (torch.float32, 16387, 16391, 4, 4),
                        (torch.bfloat16, 4160, 4163, 64, 8)]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype,N,stride,tail,align", REALIGNED_TAIL_CASES,
                         ids=[f"{str(c[0])[6:]}-{c[1]}-stride{c[2]}" for c in REALIGNED_TAIL_CASES])
def test_fused_realigned_tail_rows_match_reference(dtype, N, stride, tail, align, log):
    """Rows off 16-byte boundaries held as BLOCK_N // 2 + TAIL window positions plus their partial end
    groups (held_row_lanes): eight rows, so their starts take several offsets within 16 bytes; the row's
    max in its last element, in its first, a row of -inf (zero_masked_rows) and the elements between
    rows (a stride past N) never written; forward and backward."""
    from softmax_ref import assert_grad_close

    from tritonsoftmax.config import next_power_of_2
    from tritonsoftmax.kernels import backward_family
    from tritonsoftmax.layout import matrix_problem

    rows = 8
    config = LaunchConfig.make(4, BLOCK_N=next_power_of_2(N), ROWS=1)
    x = random_input((rows, stride), dtype, DEVICE, seed=N)[:, :N]
    x[0, N - 1] = 40.0  # the max in the tail piece or the tail group
    x[1, 0] = 40.0  # the max in the head group
    x[2] = float("-inf")
    out = poisoned_like(random_input((rows, stride), dtype, DEVICE))
    y = out[:, :N]
    fwd = family("fused").prepare(matrix_problem(x, y), config, device_info(x.device),
                                  flags={"LOG": int(log), "ZERO_MASKED": 1})
    fwd(x, y, 1.0)
    assert (fwd.flags["ALIGN"], fwd.flags["TAIL"]) == (align, tail)
    want = torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)
    want[2] = 0.0
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}[dtype]
    got = y.double()
    assert torch.equal(got[2], want[2].to(got.device)), "the -inf row"
    keep = [r for r in range(rows) if r != 2]
    err = (got[keep] - want[keep].to(got.device)).abs() / want[keep].to(got.device).abs().clamp(min=1)
    assert err.max().item() <= tol
    assert torch.isnan(out[:, N:]).all(), "the elements between rows stay untouched"
    for r, c in ((0, N - 1), (1, 0)):
        assert float(y[r, c].double().exp() if log else y[r, c]) > 0.99

    probs = torch.softmax(random_input((rows, stride), dtype, DEVICE, seed=1).float(), -1)
    ys = (probs.log() if log else probs).to(dtype)[:, :N]
    dy = random_input((rows, stride), dtype, DEVICE, seed=2)[:, :N]
    out = poisoned_like(random_input((rows, stride), dtype, DEVICE))
    dx = out[:, :N]
    back = backward_family("fused").prepare(matrix_problem(dy, dx), config, device_info(dy.device),
                                            flags={"LOG": int(log)})
    back(dy, dx, ys, 1.0)
    assert (back.flags["ALIGN"], back.flags["TAIL"]) == (align, tail)
    assert_grad_close(dx, dy, ys, log=log)
    assert torch.isnan(out[:, N:]).all()


RELOAD_CASES = [(torch.float32, 8192, 1, 8192), (torch.bfloat16, 8000, 1, 8192), (torch.float16, 300, 4, 512),
                (torch.float32, 100, 8, 128)]
RELOAD_IDS = [f"{str(d)[6:]}-{n}-R{r}" for d, n, r, _ in RELOAD_CASES]


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype,N,rows,block", RELOAD_CASES, ids=RELOAD_IDS)
def test_fused_backward_reload_matches_reference(dtype, N, rows, block, log, padded):
    """RELOAD loads the tile twice (evict_last for the sum, evict_first for the write): one- and several-row
    tiles, softmax and log_softmax, scale -0.5, a row that is one spike, dense and padded rows whose padding
    stays untouched; the same result as the one-load kernel's config without it."""
    from softmax_ref import assert_grad_close

    from tritonsoftmax.kernels import backward_family
    from tritonsoftmax.layout import matrix_problem

    M, cols = 5, N + (8 if padded else 0)
    x = random_input((M, cols), dtype, DEVICE, seed=N + rows)
    x[1, N // 2] = 60.0  # y is one spike in row 1
    probs = torch.softmax(x.float(), -1)
    ys = (torch.log_softmax(x.float(), -1) if log else probs).to(dtype)[:, :N]
    dy = random_input((M, cols), dtype, DEVICE, seed=N + 1)[:, :N]
    plain = LaunchConfig.make(4, BLOCK_N=block, ROWS=rows)
    results = {}
    for config in (plain.with_meta(RELOAD=1), plain):
        out = poisoned_like(random_input((M, cols), dtype, DEVICE))
        dx = out[:, :N]
        back = backward_family("fused").prepare(matrix_problem(dy, dx), config, device_info(dy.device),
                                                flags={"LOG": int(log)})
        back(dy, dx, ys, -0.5)
        assert back.flags.get("TAIL", 0) == 0 and (rows > 1 or back.flags["ALIGN"] == 1), "the plain path"
        assert_grad_close(dx, dy, ys, scale=-0.5, log=log)
        assert torch.isnan(out[:, N:]).all(), "the padding stays untouched"
        results[config] = dx.clone()
    torch.testing.assert_close(results[plain.with_meta(RELOAD=1)], results[plain], rtol=0, atol=0)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_backward_dense_matches_reference_and_refuses_other_layouts(dtype, log):
    """DENSE (contiguous rows of exactly BLOCK_N, no mask, row r at r * BLOCK_N): one- and two-row tiles,
    softmax and log_softmax, scale -0.5, a row that is one spike, against float64 and bit for bit against
    RELOAD; a padded layout, a row shorter than the block or a row count not a multiple of ROWS raise."""
    from softmax_ref import assert_grad_close

    from tritonsoftmax.kernels import backward_family
    from tritonsoftmax.layout import matrix_problem

    M, N = 6, 64
    x = random_input((M, N), dtype, DEVICE, seed=11)
    x[1, N // 2] = 60.0
    ys = (torch.log_softmax if log else torch.softmax)(x.float(), -1).to(dtype)
    dy = random_input((M, N), dtype, DEVICE, seed=12)
    family = backward_family("fused")
    for rows in (1, 2):
        results = {}
        for meta in ({"RELOAD": 1, "DENSE": 1}, {"RELOAD": 1}):
            dx = poisoned_like(dy)
            back = family.prepare(matrix_problem(dy, dx), LaunchConfig.make(2, BLOCK_N=N, ROWS=rows, **meta),
                                  device_info(dy.device), flags={"LOG": int(log)})
            back(dy, dx, ys, -0.5)
            assert_grad_close(dx, dy, ys, scale=-0.5, log=log)
            results[len(meta)] = dx
        torch.testing.assert_close(results[2], results[1], rtol=0, atol=0)
    dense = LaunchConfig.make(2, BLOCK_N=N, ROWS=2, RELOAD=1, DENSE=1)
    padded = random_input((M, N + 8), dtype, DEVICE)[:, :N]
    short = dy[:, : N - 8]
    for a, b in ((padded, torch.empty_like(dy)), (dy, padded), (short, torch.empty_like(short)),
                 (dy[:5], torch.empty_like(dy[:5]))):
        with pytest.raises(ValueError, match="DENSE"):
            family.prepare(matrix_problem(a, b), dense, device_info(dy.device), flags={"LOG": 0})


def test_fused_backward_reload_configs_only_for_long_rows():
    """One-row configs of blocks of RELOAD_MIN_N and longer come with and without RELOAD; shorter blocks,
    rows held as half a block plus a tail (where RELOAD does nothing) and several-row configs never carry it."""
    from synthetic_devices import SM90

    for N in (256, fused.RELOAD_MIN_N // 2, fused.RELOAD_MIN_N // 2 + 1, 8200, 16392):
        assert not [c for c in fused.BWD_FAMILY.configs(SM90, 4096, N) if dict(c.meta).get("RELOAD")], N
    for N in (fused.RELOAD_MIN_N // 2 + 1000, fused.RELOAD_MIN_N, 16384, 32768):
        configs = fused.BWD_FAMILY.configs(SM90, 4096, N)
        one_row = [c for c in configs if c["ROWS"] == 1 and not dict(c.meta).get("RELOAD")]
        reload = [c for c in configs if dict(c.meta).get("RELOAD")]
        assert one_row and {c.with_meta(RELOAD=1) for c in one_row} == set(reload), N
        assert not [c for c in fused.FAMILY.configs(SM90, 4096, N) if dict(c.meta).get("RELOAD")], "forward: none"


def test_fused_small_tiles_give_short_rows_more_programs_at_2_to_8_values_a_thread():
    """Several-row tiles of 512 and 1024 elements join the 2K-8K ones for blocks under 1024 (odd short rows want
    more programs), each with 2-8 values a thread,
    on 32-wide warps and on AMD's 64-wide wavefronts; none where M has too few rows to fill one."""
    import triton
    from synthetic_devices import GFX942, SM90

    for device in (SM90, GFX942):
        for N in (5, 13, 16, 50, 256, 512, 1024):
            block = triton.next_power_of_2(N)
            small = [c for c in fused.FAMILY.configs(device, 4096, N) if c["ROWS"] > 1 and c["ROWS"] * block
                     < min(fused.TILES) and dict(c.meta).get("STAGES", 1) == 1 and not dict(c.meta).get("I32")]
            tiles = {c["ROWS"] * block for c in small}
            assert tiles == {t for t in fused.SMALL_TILES if t > block}, (device.arch, N, tiles)
            for c in small:
                per_thread = c["ROWS"] * block / (c.num_warps * device.warp_size)
                assert 2 <= per_thread <= 8 or (c.num_warps == 1 and per_thread < 2), (device.arch, N, c)
            assert small == [c for c in fused.BWD_FAMILY.configs(device, 4096, N) if c["ROWS"] > 1
                             and c["ROWS"] * block < min(fused.TILES) and not dict(c.meta).get("I32")], "shared"
    assert LaunchConfig.make(4, BLOCK_N=16, ROWS=32) in fused.FAMILY.configs(SM90, 4096, 13)
    assert not [c for c in fused.FAMILY.configs(SM90, 3, 13) if c["ROWS"] > 4]


SMALL_TILE_CASES = [(13, LaunchConfig.make(4, BLOCK_N=16, ROWS=32)), (5, LaunchConfig.make(4, BLOCK_N=8, ROWS=64)),
                    (50, LaunchConfig.make(4, BLOCK_N=64, ROWS=8))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("N,config", SMALL_TILE_CASES, ids=[f"N{n}" for n, _ in SMALL_TILE_CASES])
def test_fused_small_tile_configs_match_reference_forward_and_backward(N, config, dtype):
    """The small-tile configs the H200 table now holds (bucket 8, 16 and 64 entries), on odd rows whose last program
    is partial (M not a multiple of ROWS), forward and backward (softmax and log_softmax, scale -0.5)."""
    M = 3 * config["ROWS"] + 5
    _fused_forward_and_backward_match(random_input((M, N), dtype, DEVICE, seed=N), config, dy_seed=N + 1)


def _fused_forward_and_backward_match(x: torch.Tensor, config: LaunchConfig, dy_seed: int) -> None:
    """fused.launch, then fused.launch_backward (softmax and log_softmax, scale -0.5), with ``config`` over the rows of
    the 2-D ``x``: each output poisoned first, launched with exactly ``config``, every element checked."""
    from softmax_ref import assert_grad_close

    y = poisoned_like(x)
    assert fused.launch(x, y, config) == config
    assert_softmax_close(y, x)
    dy = random_input(tuple(x.shape), x.dtype, DEVICE, seed=dy_seed)
    for log in (False, True):
        ys = (torch.log_softmax(x.float(), -1) if log else torch.softmax(x.float(), -1)).to(x.dtype)
        dx = poisoned_like(ys)
        assert fused.launch_backward(dy, ys, dx, config, scale=-0.5, log=log) == config
        assert_grad_close(dx, dy, ys, scale=-0.5, log=log)


def test_fused_i32_configs_are_several_row_tiles_at_32_values_a_thread():
    """32-bit offsets (I32) come only with several-row tiles of I32_TILES elements at 32 values a thread (one
    wavefront where a 64-wide one holds fewer), never with one-row configs; the backward shares them."""
    import triton
    from synthetic_devices import GFX942, SM90

    for device in (SM90, GFX942):
        for N in (5, 13, 160, 256, 600, 1500, 4096):
            block = triton.next_power_of_2(N)
            for fam in (fused.FAMILY, fused.BWD_FAMILY):
                i32 = [c for c in fam.configs(device, 16384, N) if dict(c.meta).get("I32")]
                assert {c["ROWS"] * block for c in i32} == {t for t in fused.I32_TILES if t > block}, (N, i32)
                for c in i32:
                    per_thread = c["ROWS"] * block / (c.num_warps * device.warp_size)
                    assert c["ROWS"] > 1 and (per_thread == 32 or (c.num_warps == 1 and per_thread < 32)), (N, c)
    assert LaunchConfig.make(1, BLOCK_N=256, ROWS=4, I32=1) in fused.BWD_FAMILY.configs(SM90, 16384, 160)


I32_CASES = [(160, LaunchConfig.make(1, BLOCK_N=256, ROWS=4, I32=1)), (13, LaunchConfig.make(2, BLOCK_N=16, ROWS=128,
                                                                                             I32=1))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("N,config", I32_CASES, ids=[f"N{n}" for n, _ in I32_CASES])
def test_fused_i32_configs_match_reference_on_strided_rows(N, config, dtype):
    """I32 configs on rows with a padded row stride, on a transposed (column-strided) input, and on inner rows (softmax
    over dim 1 of a 3-D tensor), each with a partial last program: forward, and backward (softmax and log_softmax,
    scale -0.5) for the 2-D layouts."""
    from tritonsoftmax.layout import row_problem

    M = 2 * config["ROWS"] + 3
    padded = random_input((M, N + 8), dtype, DEVICE, seed=N)[:, :N]
    transposed = random_input((N, M), dtype, DEVICE, seed=N + 1).t()
    for x in (padded, transposed):
        _fused_forward_and_backward_match(x, config, dy_seed=N + 2)
    x3 = random_input((3, N, config["ROWS"] // 2 + 1), dtype, DEVICE, seed=N + 3)
    y3 = poisoned_like(x3)
    problem = row_problem(x3, y3, 1)
    assert problem.inner > 1
    launch = fused.FAMILY.prepare(problem, config, device_info(x3.device), flags={"LOG": 0, "ZERO_MASKED": 0})
    assert launch(x3, y3, 1.0) == config
    assert_softmax_close(y3, x3, dim=1)


def test_i32_configs_fall_back_to_64_bit_offsets_where_an_offset_would_not_fit():
    """A stored or explicit I32 config on a problem whose tiles would compute an offset past 2**31 - 1 runs in 64-bit
    (PreparedLaunch); at the boundary, exactly. The runtime autotuner caches its pick per (N_BUCKET, M_BUCKET) and
    prunes only on a new key, so such problems get a negative M_BUCKET, and the pruning drops I32 configs there."""
    from synthetic_devices import SM90

    from tritonsoftmax.kernels.kernel_family import pruned_for_key
    from tritonsoftmax.layout import RowProblem, RowStrides, offsets_fit_int32

    config = LaunchConfig.make(1, BLOCK_N=256, ROWS=4, I32=1)
    # Tiles of 4 rows of 256 columns over M rows of stride 256: the last padded row starts at (ceil(M/4)*4 - 1)*256.
    limit_rows = 2**31 // 256  # rows 0 .. limit_rows - 1 have every offset < 2**31
    contiguous = RowStrides(256, 0, 1)
    assert offsets_fit_int32(limit_rows, 1, contiguous, 4, 256)
    assert not offsets_fit_int32(limit_rows + 1, 1, contiguous, 4, 256)
    assert not offsets_fit_int32(limit_rows - 1, 1, RowStrides(256, 0, 2), 4, 256), "column stride counts"
    assert not offsets_fit_int32(8, 1, RowStrides(2**29, 0, 1), 4, 256)
    assert offsets_fit_int32(8, 1, RowStrides(-256, 0, 1), 4, 256)
    for M, fits in ((limit_rows, True), (limit_rows + 1, False)):
        problem = RowProblem(M, 200, 1, contiguous, contiguous, torch.bfloat16)
        wide_out = RowProblem(8, 200, 1, contiguous, RowStrides(2**29, 0, 1), torch.bfloat16)
        for fam in (fused.FAMILY, fused.BWD_FAMILY):
            launched = fam.prepare(problem, config, SM90, flags={"LOG": 0}).config
            assert launched == (config if fits else config.with_meta(I32=0)), (M, fam.name)
            assert fam.prepare(wide_out, config, SM90, flags={"LOG": 0}).config == config.with_meta(I32=0), "output"
    plain = LaunchConfig.make(1, BLOCK_N=256, ROWS=4)
    big = RowProblem(limit_rows * 4, 200, 1, contiguous, contiguous, torch.bfloat16)
    assert fused.FAMILY.prepare(big, plain, SM90, flags={"LOG": 0}).config == plain
    # The autotuner's key: positive where every I32 tile fits (at most bound_rows rows of bound_cols columns).
    bound_rows, bound_cols = fused.FAMILY.i32_bounds
    near = limit_rows - 2 * bound_rows  # a multiple of bound_rows: its last tile ends at row near - 1
    assert (near - 1) * 256 + bound_cols - 1 < 2**31 and near % bound_rows == 0
    for M, sign in ((16384, 1), (near, 1), (limit_rows + 1, -1), (limit_rows * 4, -1)):
        tail = fused.FAMILY.prepare(RowProblem(M, 200, 1, contiguous, contiguous, torch.bfloat16), None, SM90,
                                    flags={"LOG": 0}).tail
        assert tail[-1] * sign > 0 and abs(tail[-1]) == 16384, (M, tail[-1])
    space = fused.FAMILY.configs(SM90, 16384, 200)
    triton_configs = [c.to_triton() for c in space]
    assert {LaunchConfig.from_triton(c) for c in pruned_for_key(triton_configs, set(space), 16384)} == set(space)
    kept = {LaunchConfig.from_triton(c) for c in pruned_for_key(triton_configs, set(space), -16384)}
    assert kept == {c for c in space if not dict(c.meta).get("I32")} and kept != set(space)


def test_runtime_autotuner_prunes_i32_configs_for_keys_whose_offsets_could_wrap(monkeypatch):
    """The fused autotuner's pruning (what runs on a GPU on each new key) reads the key's M_BUCKET: I32 configs stay
    for a positive one and go for a negative one, which PreparedLaunch passes where they could wrap."""
    from synthetic_devices import SM90

    from tritonsoftmax.kernels import kernel_family

    monkeypatch.setattr(kernel_family, "interpreter_active", lambda: False)
    tuner = fused.FAMILY._make_autotuner(SM90)
    named = {"M": 16384, "N": 200, "M_BUCKET": 16384}
    space = set(fused.FAMILY.configs(SM90, 16384, 200))
    kept = {LaunchConfig.from_triton(c) for c in tuner.early_config_prune(tuner.configs, named)}
    assert kept == space and any(dict(c.meta).get("I32") for c in kept)
    kept = {LaunchConfig.from_triton(c) for c in tuner.early_config_prune(tuner.configs, {**named, "M_BUCKET": -16384})}
    assert kept == {c for c in space if not dict(c.meta).get("I32")}


@pytest.mark.parametrize("name,dtype,n,m,config", sm90_entries(("fused", "fused-bwd")),
                         ids=lambda v: v if isinstance(v, str) else str(v).replace(" ", ""))
def test_every_shipped_fused_entry_is_exact_on_a_short_row_of_its_bucket_and_a_partial_last_tile(name, dtype, n, m,
                                                                                                  config):
    """Each fused / fused-bwd config the sm_90 table ships, launched exactly as stored (on the GPU: compiled) on rows
    one element short of its bucket's top (the top itself for buckets 1 and 2) and 2 x ROWS + 1 of them, so that the
    last tile is partial: every element of the forward (fused) or of the backward at scale -0.5 (fused-bwd) checked."""
    from softmax_ref import assert_grad_close

    dt = getattr(torch, dtype)
    N = n - 1 if n > 2 else n
    x = random_input((2 * config["ROWS"] + 1, N), dt, DEVICE, seed=n + m)
    if name == "fused":
        y = poisoned_like(x)
        assert fused.launch(x, y, config) == config
        assert_softmax_close(y, x)
    else:
        ys = torch.softmax(x.float(), -1).to(dt)
        dy = random_input(tuple(x.shape), dt, DEVICE, seed=n * 3 + m)
        dx = poisoned_like(ys)
        assert fused.launch_backward(dy, ys, dx, config, scale=-0.5) == config
        assert_grad_close(dx, dy, ys, scale=-0.5)


def test_coop_forward_heuristic_runs_few_cluster_sized_rows_as_clusters():
    """Few rows (under two an SM) of 2-16 COOP_CHUNK chunks: one cluster a row of 8-warp COOP_CHUNK programs where
    the GPU has clusters (sm_90), the register-chunk config elsewhere (sm_89) and for many rows or longer ones."""
    from synthetic_devices import SM89, SM90

    from tritonsoftmax.kernels import exchange

    for M, N in ((1, 16384), (8, 65536), (263, 131072)):
        c = coop.FAMILY.heuristic(SM90, M, N)
        assert (c["BLOCK"], c.num_warps, c["CLUSTER"]) == (coop.COOP_CHUNK, 8, 1), (M, N, c)
        assert exchange.cluster_mode(c, -(-N // coop.COOP_CHUNK), SM90, False)
        assert "CLUSTER" not in dict(coop.FAMILY.heuristic(SM89, M, N).meta)
    for M, N in ((264, 131072), (1, 262144), (1, 8192)):
        assert "CLUSTER" not in dict(coop.FAMILY.heuristic(SM90, M, N).meta), (M, N)
