"""Late rows that wait (kernels/stagger.py): the rule, the wait compiled for sm_90 in coop's forward, which launches
take it, and (GPU) coop's resident launches that run it. The smem forward's use of it is in test_smem.py."""

import json

import pytest
import torch
import triton
import triton.language as tl
from compile_scripts import run_compile_script
from conftest import DEVICE
from shipped_tables import sm90_launch_modes
from softmax_ref import assert_log_softmax_close, assert_softmax_close, poisoned_like, random_input
from synthetic_devices import GFX942, SM90, meta_problem

import tritonsoftmax
from tritonsoftmax import dispatch
from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import coop, stagger
from tritonsoftmax.kernels.triton_launcher import COMPILE_OPTIONS
from tritonsoftmax.layout import matrix_problem

H200 = sm90_launch_modes().stagger  # the H200's measured stagger bounds (its policy's launch_modes)

FLAGS = {"LOG": 0, "ZERO_MASKED": 0}


@pytest.mark.parametrize("M,N,dtype,programs,per_sm,want", [
    (32, 152064, torch.float32, 512, 5, 5000),      # 9.7 MB early: capped at MAX_CYCLES
    (8, 262144, torch.float32, 1024, 19, 2000),     # 4.2 MB: 2330 cycles, in whole steps
    (16, 152064, torch.float32, 1200, 19, 2500),
    (48, 152064, torch.bfloat16, 480, 7, 4000),
    (8, 131072, torch.float32, 512, 19, 0),         # 2.1 MB: 1165 cycles, under MIN_CYCLES
    (32, 131072, torch.float32, 512, 4, 0),         # 0.97 of a wave
    (64, 152064, torch.float32, 960, 5, 0),         # 1.45 waves
    (1, 8388608, torch.float32, 64, 5, 0),          # one row: no late half
], ids=str)
def test_the_late_half_waits_for_the_early_halfs_bytes_in_a_launch_under_a_wave(M, N, dtype, programs, per_sm,
                                                                                  want):
    meta = stagger.stagger_meta(meta_problem(M, N, dtype), programs, per_sm, SM90, H200)
    assert meta == ({"STAGGER": want} if want else {})


@pytest.mark.parametrize("M,N,dtype,want", [
    (32, 152064, torch.float32, (1000, 8)),   # 4 rows a group, 2.4 MB: 1351 cycles
    (24, 152064, torch.float32, (1000, 8)),   # 3 rows, 1.8 MB: 1013
    (20, 152064, torch.float32, (1500, 4)),   # 8 groups of 2 rows would read 1.2 MB each: 4 of 5 rows
    (96, 65536, torch.bfloat16, (1500, 4)),   # 12 rows of 8 groups: 1.57 MB
    (4, 2097152, torch.bfloat16, (2000, 4)),  # one row a group: 4 groups at most for 4 rows
    (8, 262144, torch.float32, (1000, 4)),    # 8 groups of 1 row (1 MB) too small: 4 of 2 rows, 1165 cycles
    (8, 131072, torch.float32, None),          # the early half under MIN_CYCLES: no wait at all
], ids=str)
def test_a_grouped_launch_waits_in_the_most_groups_that_read_for_min_group_cycles(M, N, dtype, want):
    meta = stagger.stagger_meta(meta_problem(M, N, dtype), 512, 5, SM90, H200, grouped=True)
    assert (None if not meta else (meta["STAGGER"], meta.get("STAGGER_GROUPS"))) == want, meta


def test_groups_wait_in_launches_up_to_max_grouped_wave_and_halves_up_to_max_wave():
    """Groups wait in launches up to MAX_GROUPED_WAVE of a wave, halves up to MAX_WAVE; fuller launches do not wait."""
    problem, per_sm = meta_problem(32, 152064), 5
    full = per_sm * SM90.sm_count
    for fraction, grouped, staggers in ((0.86, True, True), (0.89, True, False), (0.79, False, True),
                                        (0.86, False, False)):
        meta = stagger.stagger_meta(problem, int(fraction * full), per_sm, SM90, H200, grouped=grouped)
        assert bool(meta) == staggers, (fraction, grouped, meta)
    # a grouped launch that can only have two groups is held to the halves' limit
    halves_only = meta_problem(2, 4 * 1048576)
    assert stagger.stagger_meta(halves_only, int(0.79 * full), per_sm, SM90, H200, grouped=True) == {"STAGGER": 5000}
    assert stagger.stagger_meta(halves_only, int(0.86 * full), per_sm, SM90, H200, grouped=True) == {}


def test_no_wait_off_nvidia():
    assert stagger.stagger_meta(meta_problem(32, 152064), 512, 5, GFX942, H200) == {}
    assert stagger.stagger_meta(meta_problem(32, 152064), 512, 5, GFX942, H200, grouped=True) == {}


@pytest.mark.parametrize("groups", [2, 4, 8])
def test_row_group_splits_the_rows_in_order_into_groups_of_cdiv_rows(groups):
    @triton.jit
    def rows_kernel(out_ptr, M, GROUPS: tl.constexpr):
        row = tl.program_id(0)
        tl.store(out_ptr + row, stagger.row_group(row, M, GROUPS))

    for M in (1, 2, 5, 8, 20, 30):
        out = torch.full((M,), -1, dtype=torch.int32, device=DEVICE)
        rows_kernel[(M,)](out, M, groups, **COMPILE_OPTIONS)
        per = -(-M // groups)
        assert out.tolist() == [r // per for r in range(M)], M
        assert max(out.tolist()) < groups
        if groups == 2:  # halves: the late rows are those with 2 * row >= M
            assert out.tolist() == [int(2 * r >= M) for r in range(M)], M


def test_coop_forward_compiles_the_wait_before_its_loads_and_keeps_them_16_bytes_wide():
    """STAGGER in coop's forward (fp32, whole 16-byte vectors, one held tile): one %clock64 loop before the row's
    first load, and as many 16-byte loads and stores as without it (the wait's 0 is added to the row's base as a
    multiple of 128 elements, which keeps what the compiler knows of its alignment)."""
    const = {"LOG": 0, "ZERO_MASKED": 0, "BLOCK": 1024, "TILES": 1, "BLOCK_G": 64, "PHASE": 0, "RESIDENT": 1,
             "VEC": 4}
    cases = [["coop", "_softmax_coop_fwd_kernel", "fp32", {**const, "STAGGER": cycles}] for cycles in (3000, 0)]
    waits, plain = run_compile_script("kernel_compile.py", json.dumps(cases))

    def wide(ptx, op):
        return sum(f"{op}.global" in line and ".v4." in line for line in ptx.splitlines())

    assert wide(waits, "ld") == wide(plain, "ld") > 0 and wide(waits, "st") == wide(plain, "st") > 0
    assert waits.count("nanosleep") == 1 and plain.count("nanosleep") == 0
    assert waits.find("%clock64") < waits.find("ld.global.v4")


def test_only_coops_forward_staggers_and_a_named_stagger_is_kept():
    """CoopLaunch staggers a resident launch of coop's forward only (smem staggers its forward in dispatched_form;
    no backward does), and never overrides a config that names STAGGER (so a probe or the tuner can time without)."""
    problem = meta_problem(8, 262144)
    config = LaunchConfig.make(1, BLOCK=2048, TILES=1, BLOCK_G=128)
    assert coop.FAMILY.prepare(problem, config, SM90, flags=FLAGS, two_phase=False).staggers
    assert not coop.FAMILY.prepare(problem, config.with_meta(STAGGER=0), SM90, flags=FLAGS, two_phase=False).staggers
    assert not coop.BWD_FAMILY.prepare(problem, config, SM90, flags={"LOG": 0}, two_phase=False).staggers
    from tritonsoftmax.kernels import gluon_available

    if gluon_available():
        from tritonsoftmax.kernels import smem

        assert not smem.FAMILY.staggers and not smem.BWD_FAMILY.staggers


@pytest.mark.needs("cooperative", "stagger")
@pytest.mark.gpu
@pytest.mark.parametrize("M,N,dtype", [(8, 262144, torch.float32), (2, 1048576, torch.float32),
                                       (16, 152064, torch.float32)], ids=str)
def test_coops_resident_launch_staggers_through_auto_and_matches_float64(M, N, dtype):
    """Shapes auto runs on coop, resident, under half a wave:
    the launch waits, and softmax and log_softmax match float64 in every element, the output poisoned first."""
    x = random_input((M, N), dtype, DEVICE, seed=M + N)
    plan = dispatch.plan("auto", M, N, dtype, dtype, x.device, False, True, True)
    assert plan.impl == "coop"
    launch = plan.family.prepare(matrix_problem(x, x), plan.config, device_info(x.device), plan.from_store, FLAGS,
                                 modes=plan.modes)
    y = poisoned_like(x)
    launch(x, y, 1.0)
    assert launch.mode == "resident" and launch.stagger >= H200.min_cycles, (launch.mode, launch.stagger)
    assert_softmax_close(y, x)
    y.fill_(float("nan"))
    launch(x, y, 1.0)  # the warm path runs the staggered kernel too
    assert_softmax_close(y, x)
    assert_softmax_close(tritonsoftmax.softmax(x), x)
    assert_log_softmax_close(tritonsoftmax.log_softmax(x), x)


def test_bytes_a_cycle_come_from_the_devices_clocks():
    """The early rows' read rate in bytes a cycle is READ_SHARE of peak DRAM bandwidth over the SM clock: 1800 on the
    H200 (4.81 TB/s, 1.98 GHz), twice that with half the clock; a device that does not say its clocks never waits."""
    import dataclasses

    assert stagger.bytes_per_cycle(SM90, H200.read_share) == 1800
    slow = dataclasses.replace(SM90, sm_clock_khz=SM90.sm_clock_khz // 2)
    assert stagger.bytes_per_cycle(slow, H200.read_share) == 3600
    unknown = dataclasses.replace(SM90, sm_clock_khz=0)
    assert stagger.bytes_per_cycle(unknown, H200.read_share) == 0
    problem = meta_problem(32, 152064)
    assert stagger.stagger_meta(problem, 512, 5, SM90, H200)
    assert stagger.stagger_meta(problem, 512, 5, unknown, H200) == {}
    # the same bytes take half the cycles at half the clock
    fast = stagger.stagger_meta(problem, 512, 5, SM90, H200)["STAGGER"]
    assert stagger.stagger_meta(problem, 512, 5, slow, H200)["STAGGER"] <= fast // 2 + stagger.STEP
