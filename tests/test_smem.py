"""The smem family (a Gluon kernel): compiled for sm_90 on any machine, run on the GPU only.

Gluon has no interpreter, so the CPU part compiles the kernel for sm_90 with the installed triton
and checks what the compiler made of it (16-byte copies into shared memory, 16-byte stores, the
fence-free word exchange in the single launch and no atomics in two phases), plus the dispatcher's
rule and the launch's checks. The gpu-marked part runs it."""

import re

import pytest
import torch
from conftest import DEVICE, HAS_GPU
from exchange_checks import assert_exchange_of_phase
from shipped_tables import sm90_launch_modes
from softmax_ref import (
    TOL,
    assert_grad_close,
    assert_log_softmax_close,
    assert_softmax_close,
    coop_scratch_ready,
    grad_reference,
    poisoned_like,
    random_input,
)
from synthetic_devices import GFX942, SM75, SM89, SM90, meta_problem

import tritonsoftmax
from tritonsoftmax import dispatch
from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import coop, gluon_available, sizing, smem_launch
from tritonsoftmax.kernels.sizing import chunks
from tritonsoftmax.layout import matrix_problem, whole_vectors
from tritonsoftmax.policy import launch_modes, policy_for

MODES = sm90_launch_modes()  # the launch modes the H200's policy gives its launches

pytestmark = pytest.mark.skipif(not gluon_available(), reason="this triton has no Gluon with the NVIDIA backend")
FLAGS = {"LOG": 0, "ZERO_MASKED": 0}


def smem():
    from tritonsoftmax.kernels import smem as module

    return module


PER_WORD = {"PER_WORD": 1, "BLOCK_G": 128}  # exchange.depart's PER_WORD, BLOCK_G >= the 4 warps' threads (CoopLaunch)
FLAG_CASES = ({}, {"LOG": 1, "ZERO_MASKED": 1}, {"PHASE": 1}, {"PHASE": 2}, {"RESIDENT": 1}, PER_WORD)
CASES = [("fwd", dt, dt, flags) for dt in ("bf16", "fp16", "fp32") for flags in FLAG_CASES]
CASES.append(("fwd", "bf16", "fp32", {}))
CASES += [("bwd", dt, dt, {k: v for k, v in flags.items() if k != "ZERO_MASKED"})
          for dt in ("bf16", "fp16", "fp32") for flags in FLAG_CASES]
COPY = r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10"  # a 16-byte copy


@pytest.fixture(scope="module")
def compiled_sm90() -> dict:
    """Every case of CASES compiled for sm_90 by tests/smem_compile.py, in one process of its own
    (the forward with its heuristic config at 4096x65536, the backward with its own)."""
    import json

    from compile_scripts import run_compile_script

    configs = {"fwd": smem_launch.heuristic(SM90, 4096, 65536), "bwd": smem_launch.bwd_heuristic(SM90, 4096, 65536)}
    cases = [[k, dt, out, dict(configs[k].meta), configs[k].num_warps, flags] for k, dt, out, flags in CASES]
    results = run_compile_script("smem_compile.py", json.dumps(cases))
    found = {(k, dt, out, json.dumps(flags)): r for (k, dt, out, flags), r in zip(CASES, results, strict=True)}
    return {"config": configs["fwd"], "bwd_config": configs["bwd"], **found}


@pytest.mark.parametrize("dtype,bits", [("bf16", 16), ("fp16", 16), ("fp32", 32)])
@pytest.mark.parametrize("flags", FLAG_CASES, ids=["softmax", "log", "phase1", "phase2", "resident", "per-word"])
def test_compiles_for_sm90_to_16_byte_copies_and_stores(compiled_sm90, dtype, bits, flags):
    import json

    config = compiled_sm90["config"]
    compiled = compiled_sm90[("fwd", dtype, dtype, json.dumps(flags))]
    ptx = compiled["ptx"]
    threads = config.num_warps * 32
    vectors = config["TILES"] * config["BLOCK"] * bits // 128 // threads  # 16-byte vectors a thread holds
    assert len(re.findall(COPY, ptx)) == vectors
    assert not re.search(r"cp\.async\.ca", ptx), "every copy 16 bytes wide (cp.async.cg)"
    assert compiled["shared"] >= config["TILES"] * config["BLOCK"] * bits // 8
    stores = len(re.findall(r"st\.global[^\n]*\.v4", ptx))
    assert stores == (0 if flags.get("PHASE") == 1 else vectors), "16-byte output stores"
    assert_exchange_of_phase(ptx, flags.get("PHASE", 0), per_word=flags.get("PER_WORD", 0))


@pytest.mark.parametrize("dtype,op", [("bf16", "bf16x2"), ("fp16", "f16x2"), ("fp32", "f32")])
def test_first_pass_takes_the_max_of_raw_values_with_their_sign_flipped(compiled_sm90, dtype, op):
    """16-bit: the first pass's max takes two lanes an instruction, on the loaded values with the sign
    bit xor-ed for a negative scale, never converted; fp32: no multiply by the scale before the max."""
    config = compiled_sm90["config"]
    ptx = compiled_sm90[("fwd", dtype, dtype, "{}")]["ptx"]
    per_thread = config["TILES"] * config["BLOCK"] // (config.num_warps * 32)
    pairs = per_thread // (2 if op != "f32" else 1)
    flipped_max = re.findall(rf"xor\.b32 t, %r\d+, %r\d+; max\.{op} %r\d+, %r\d+, t;", ptx)
    assert len(flipped_max) == 2 * pairs, "one per register, in the masked and the unmasked copy of the pass"


@pytest.mark.parametrize("dtype,bits", [("bf16", 16), ("fp16", 16), ("fp32", 32)])
@pytest.mark.parametrize("flags", [{}, {"LOG": 1}, {"PHASE": 1}, {"PHASE": 2}, {"RESIDENT": 1}, PER_WORD],
                         ids=["softmax", "log", "phase1", "phase2", "resident", "per-word"])
def test_backward_compiles_to_16_byte_copies_of_dy_and_y_and_16_byte_stores(compiled_sm90, dtype, bits, flags):
    import json

    config = compiled_sm90["bwd_config"]
    compiled = compiled_sm90[("bwd", dtype, dtype, json.dumps(flags))]
    ptx = compiled["ptx"]
    vectors = config["TILES"] * config["BLOCK"] * bits // 128 // (config.num_warps * 32)
    assert len(re.findall(COPY, ptx)) == 2 * vectors
    assert not re.search(r"cp\.async\.ca", ptx), "every copy 16 bytes wide (cp.async.cg)"
    assert compiled["shared"] >= 2 * config["TILES"] * config["BLOCK"] * bits // 8, "dy and y both held"
    stores = len(re.findall(r"st\.global[^\n]*\.v4", ptx))
    assert stores == (0 if flags.get("PHASE") == 1 else vectors), "16-byte dx stores"
    assert_exchange_of_phase(ptx, flags.get("PHASE", 0), per_word=flags.get("PER_WORD", 0))


@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_no_copy_or_store_carries_a_cache_hint(compiled_sm90, which):
    """Plain output stores: nothing reads the input again, so evict_first on the output buys no L2 room."""
    ptx = compiled_sm90[(which, "bf16", "bf16", "{}")]["ptx"]
    stores = re.findall(r"st\.global\S*", ptx)
    assert stores and not any("evict" in st or "cache_hint" in st for st in stores), sorted(set(stores))
    assert not re.search(r"cache_hint|createpolicy|evict", ptx)


def test_bf16_in_fp32_out_keeps_16_byte_stores(compiled_sm90):
    config = compiled_sm90["config"]
    ptx = compiled_sm90[("fwd", "bf16", "fp32", "{}")]["ptx"]
    per_thread = config["TILES"] * config["BLOCK"] // (config.num_warps * 32)
    assert len(re.findall(r"st\.global[^\n]*\.v4", ptx)) == per_thread // 4


@pytest.mark.parametrize("which", ["FAMILY", "BWD_FAMILY"])
def test_every_config_fits_and_covers_its_bucket(which):
    mod = smem()
    fam = getattr(mod, which)
    most = smem_launch.max_chunk_elements(SM90, fam.held)
    assert most == (32768 if fam.held == 1 else 16384), "128 KB: fp32 x, or fp32 dy and y"
    for M in (1, 8, 4096):
        for N in (32769, 65536, 131072, 262144, 1048576, smem_launch.max_row(SM90, fam.held)):
            for config in fam.configs(SM90, M, N) + [fam.heuristic(SM90, M, N)]:
                chunk = config["TILES"] * config["BLOCK"]
                assert chunk <= most, (M, N, config)
                g = -(-N // chunk)
                assert g <= SM90.sm_count and config["BLOCK_G"] >= g, (M, N, config)


def test_backward_heuristic_narrows_chunks_for_few_rows_and_for_fp32():
    """64 KB of dy and y (16K elements in 16-bit, 8K in fp32) once the rows give 4 programs an SM,
    down to 4K elements for fewer (more programs for few rows)."""
    shapes = [(4096, 65536), (32, 152064), (8, 131072), (1, 131072), (1, 2**21)]
    for dtype, want in ((torch.bfloat16, [16384, 16384, 4096, 4096, 16384]),
                        (torch.float32, [8192, 8192, 4096, 4096, 16384])):
        got = [smem_launch.bwd_heuristic(SM90, M, N, dtype) for M, N in shapes]
        assert [c["TILES"] * c["BLOCK"] for c in got] == want, "a 2M row needs 16K chunks: one chunk an SM"


@pytest.mark.parametrize("dtype,chunk", [(torch.bfloat16, 16384), (torch.float32, 8192)], ids=str)
def test_a_backward_launch_sizes_its_chunks_by_the_dtype(dtype, chunk):
    dy = torch.empty(4096, 65536, dtype=dtype, device="meta")
    launch = smem().BWD_FAMILY.prepare(matrix_problem(dy, dy), None, SM90, flags={"LOG": 0})
    assert launch.config["TILES"] * launch.config["BLOCK"] == chunk
    forward = smem().FAMILY.prepare(matrix_problem(dy, dy), None, SM90, flags=FLAGS)
    assert forward.config["TILES"] * forward.config["BLOCK"] == 16384, "the forward's 16K chunks in every dtype"


@pytest.mark.parametrize("N,chunk,warps", [(8200, 16384, 4), (16384, 16384, 4), (24576, 32768, 8), (32768, 32768, 8),
                                           (32776, 16384, 4), (65536, 16384, 4)])
def test_forward_heuristic_makes_rows_of_up_to_32k_one_chunk(N, chunk, warps):
    """One chunk a row (G = 1: the kernel then skips the exchange) up to the 32K bucket, 16K chunks beyond."""
    c = smem_launch.heuristic(SM90, 4096, N)
    assert (c["TILES"] * c["BLOCK"], c.num_warps) == (chunk, warps)
    assert (c["BLOCK_G"] == 1) == (N <= 32768)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("M", [4096, 264, 8])
def test_forward_heuristic_gives_every_dtype_16k_chunks_beyond_32k(M, dtype):
    """The bucket's config is the same in every dtype and row count (a launch cuts it to the row: balanced_config)."""
    for N in (40960, 50176, 65536, 2**20 + 4096):
        c = smem_launch.heuristic(SM90, M, N, dtype)
        assert (c["TILES"] * c["BLOCK"], c.num_warps) == (16384, 4), N


@pytest.mark.parametrize("N,itemsize,want", [
    (50264, 2, (5, 10, 1024)), (36864, 2, (3, 12, 1024)), (40960, 2, (4, 10, 1024)), (73728, 2, (6, 12, 1024)),
    (131080, 2, (10, 13, 1024)), (12008, 2, (1, 12, 1024)), (36864, 4, (3, 12, 1024))], ids=str)
def test_balanced_config_cuts_a_row_into_even_chunks(N, itemsize, want):
    """G or G + 1 chunks of the fewest 1024-element copy groups, whichever allocates less."""
    base = smem_launch.heuristic(SM90, 4096, N)
    c = smem_launch.balanced_config(base, N, itemsize, SM90)
    assert (chunks(N, dict(c.meta)), c["TILES"], c["BLOCK"]) == want
    assert c.num_warps == base.num_warps and c["BLOCK_G"] >= chunks(N, dict(c.meta))


@pytest.mark.parametrize("N", [65536, 262144, 32768, 16384, 2**20])
def test_balanced_config_keeps_a_config_whose_chunks_fill_the_row(N):
    for itemsize in (2, 4):
        base = smem_launch.heuristic(SM90, 4096, N)
        assert smem_launch.balanced_config(base, N, itemsize, SM90) == base


def test_balanced_config_never_allocates_more_and_stays_within_the_limits():
    """Over many row lengths and both directions' configs: the row covered, the chunk no longer than the
    config's, less shared memory a row or the config itself, BLOCK_G enough, G within the SM count, and copy
    groups the warps can fill with 16-byte vectors (16-bit 8 warps: 2048)."""
    for N in list(range(8200, 300000, 4104)) + [32776, 98312, 131080, 1048584]:
        for itemsize in (2, 4):
            dtype = torch.float32 if itemsize == 4 else torch.bfloat16
            for base in (smem_launch.heuristic(SM90, 4096, N, dtype), smem_launch.bwd_heuristic(SM90, 4096, N, dtype),
                         smem_launch.bwd_heuristic(SM90, 8, N, dtype)):
                c = smem_launch.balanced_config(base, N, itemsize, SM90)
                g, g_base = chunks(N, dict(c.meta)), chunks(N, dict(base.meta))
                chunk, base_chunk = c["TILES"] * c["BLOCK"], base["TILES"] * base["BLOCK"]
                assert chunk <= base_chunk and g * chunk <= g_base * base_chunk, (N, base, c)
                assert g in (g_base, g_base + 1) and g <= SM90.sm_count and c["BLOCK_G"] >= g, (N, base, c)
                assert c["BLOCK"] >= c.num_warps * 32 * 16 // itemsize, (N, c)
                assert (c == base) == (g * chunk == g_base * base_chunk), (N, base, c)
                led = smem_launch.balanced_config(base, N, itemsize, SM90, lead=112 // itemsize)
                g_led, led_chunk = chunks(N, dict(led.meta)), led["TILES"] * led["BLOCK"]
                if "LEAD" in dict(led.meta):  # chunks() counts LEAD + N
                    assert g_led * led_chunk <= g * chunk and led_chunk <= base_chunk, (N, base, led)
                    assert g_led <= SM90.sm_count and led["BLOCK_G"] >= g_led, (N, base, led)
                else:
                    assert led == c, (N, base, led)
    wide = LaunchConfig.make(8, BLOCK=2048, TILES=16, BLOCK_G=1)
    assert dict(smem_launch.balanced_config(wide, 20008, 2, SM90).meta) == {"BLOCK": 2048, "TILES": 10, "BLOCK_G": 1}


@pytest.mark.parametrize("N,itemsize,want", [
    (50264, 2, (5, 10, 56)), (131080, 2, (10, 13, 56)), (20008, 2, (1, 10, 56)), (12008, 2, (1, 12, 56)),
    (50180, 4, (5, 10, 28)), (65528, 2, (4, 8, None)), (32760, 2, (1, 16, None))], ids=str)
def test_balanced_config_starts_chunks_on_lines_when_that_allocates_no_more(N, itemsize, want):
    """Rows off 128-byte lines (line_lead) get LEAD when lead + N cut evenly allocates no more than N
    (50264: 5 chunks of 10K either way); 65528 and 32760 would need another chunk, so they keep none."""
    base = smem_launch.heuristic(SM90, 4096, N)
    c = smem_launch.balanced_config(base, N, itemsize, SM90, lead=112 // itemsize)
    assert (chunks(N, dict(c.meta)), c["TILES"], dict(c.meta).get("LEAD")) == want
    assert chunks(N, dict(c.meta)) * c["TILES"] * c["BLOCK"] >= N + dict(c.meta).get("LEAD", 0)


def test_line_lead_is_set_for_rows_off_128_byte_lines_only():
    for dtype, N, lead in ((torch.bfloat16, 50264, 56), (torch.float32, 50180, 28), (torch.bfloat16, 50176, 0),
                           (torch.float32, 50176, 0), (torch.float16, 12000, 56)):
        x = torch.empty(8, N, dtype=dtype, device="meta")
        assert smem_launch.line_lead(matrix_problem(x, x)) == lead, (dtype, N)
    padded = torch.empty(8, 50304, dtype=torch.bfloat16, device="meta")[:, :50264]
    assert smem_launch.line_lead(matrix_problem(padded, padded)) == 0, "rows padded to whole lines"


def test_odd_rows_take_the_odd_lead_where_input_and_output_share_a_layout():
    """Rows off 16-byte boundaries or not whole vectors: odd_lead (LINE_BYTES less one element: not a multiple of
    the vector, which is how the kernels tell the form) when x and y sit alike; else 0 (SmemLaunch then runs coop)."""
    for dtype, N, lead in ((torch.bfloat16, 50257, 63), (torch.float16, 12345, 63), (torch.float32, 100003, 31),
                           (torch.bfloat16, 65540, 63)):
        x = torch.empty(8, N, dtype=dtype, device="meta")
        assert smem_launch.line_lead(matrix_problem(x, x)) == lead == smem_launch.odd_lead(dtype.itemsize), (dtype, N)
        assert lead % (16 // dtype.itemsize), "not a multiple of the 16-byte vector"
    odd = torch.empty(8, 50258, dtype=torch.bfloat16, device="meta")[:, :50257]
    assert smem_launch.line_lead(matrix_problem(odd, odd)) == 63, "padded odd rows, one layout"
    assert smem_launch.line_lead(matrix_problem(odd, torch.empty(8, 50257, dtype=torch.bfloat16, device="meta"))) == 0
    cols = torch.empty(50257, 8, dtype=torch.bfloat16, device="meta").t()
    assert smem_launch.line_lead(matrix_problem(cols, cols)) == 0, "strided columns"
    x = torch.empty(8, 50257, dtype=torch.bfloat16, device="meta")
    assert smem_launch.odd_rows_fit(matrix_problem(x, x), 2, 2)
    assert not smem_launch.odd_rows_fit(matrix_problem(x, x), 2, 4)


def test_dense_odd_rows_go_to_smem_where_it_copies(monkeypatch):
    """The dispatcher gives smem rows off 16-byte boundaries when they are dense (contiguous rows of one element
    size: the odd-row form takes them), as it gives aligned ones; not other unaligned layouts, nor AMD. (The sm_89
    runs with the H200's policy: what changes is that it has no CTA clusters.)"""
    h200 = policy_for(SM90)
    monkeypatch.setattr(dispatch, "policy_for", lambda device: h200)
    bf = torch.bfloat16
    assert dispatch.choose(4096, 50257, bf, SM90, False, aligned=False, dense=True).impl == "smem"
    assert dispatch.choose(4096, 100003, bf, SM90, True, aligned=False, dense=True).impl == "smem"
    assert dispatch.choose(4096, 50257, bf, SM90, False, aligned=False, dense=False).impl != "smem"
    assert dispatch.choose(4096, 50257, bf, GFX942, False, aligned=False, dense=True).impl != "smem"
    assert dispatch.choose(4096, 50264, bf, SM90, False, aligned=True, dense=True).impl == "smem"
    # forward odd rows the odd lead pushes past their bucket too (their chunks cut so that the lead adds none),
    # and those of the 32K bucket that online takes when they are not dense
    for N in (12345, 16383, 20001, 32767):
        assert dispatch.choose(4096, N, bf, SM90, False, aligned=False, dense=True).impl == "smem", N
    assert dispatch.choose(4096, 32767, bf, SM90, False, aligned=False, dense=False).impl == "online"
    assert dispatch.choose(4096, 16383, bf, SM90, True, aligned=False, dense=True).impl == "smem"
    # without CTA clusters (an sm_89) the chunks a lead adds would exchange through the workspace: as before
    assert dispatch.choose(4096, 16383, bf, SM89, False, aligned=False, dense=True).impl == "fused"
    for N in (20001, 32767):
        assert dispatch.choose(4096, N, bf, SM89, False, aligned=False, dense=True).impl == "online", N
    assert dispatch.choose(4096, 12345, bf, SM89, False, aligned=False, dense=True).impl == "smem"
    assert dispatch.choose(4096, 32000, bf, SM89, True, aligned=True, dense=True).impl == "fused", "32K backward"
    assert dispatch.choose(4096, 16000, bf, SM89, True, aligned=True, dense=True).impl == "smem"
    # few fp32 odd rows: the forward takes the cluster rule, the backward stays on coop-bwd (0.935 x there)
    f32 = torch.float32
    assert dispatch.smem_fp32_cluster_config(dispatch.Shape(64, 100003, f32, SM90, False, False, True)) is not None
    assert dispatch.smem_fp32_cluster_config(dispatch.Shape(64, 100003, f32, SM90, True, False, True)) is None
    assert dispatch.choose(64, 100003, f32, SM90, True, aligned=False, dense=True).impl == "coop"


def test_odd_rows_compile_to_16_byte_copies_and_stores():
    """The odd-row form, compiled for sm_90: every copy 16 bytes wide (whole vectors, the row's first and last
    with its neighbours' elements), every tile's store 16 bytes wide (whole vectors only), and one element store
    a thread more than the aligned form, for the row's two partial vectors (_edge_lanes: an element-masked copy
    of every tile's store spilled 248-280 bytes a thread); forward and backward."""
    import json

    from compile_scripts import run_compile_script

    cases = [("fwd", "bf16", 16, {"BLOCK": 2048, "TILES": 4, "BLOCK_G": 8, "LEAD": 63}, 4),
             ("fwd", "fp16", 16, {"BLOCK": 1024, "TILES": 13, "BLOCK_G": 8, "LEAD": 63, "CLUSTER": 1}, 4),
             ("fwd", "fp32", 32, {"BLOCK": 1024, "TILES": 12, "BLOCK_G": 4, "LEAD": 31}, 4),
             ("bwd", "bf16", 16, {"BLOCK": 2048, "TILES": 4, "BLOCK_G": 8, "LEAD": 63}, 4),
             ("bwd", "fp32", 32, {"BLOCK": 1024, "TILES": 8, "BLOCK_G": 8, "LEAD": 31}, 4)]
    compile_cases = [[which, dt, dt, {**meta, "LEAD": lead}, nw, {}, {"maxnreg": 64}]
                     for which, dt, _, meta, nw in cases for lead in (meta["LEAD"], 0)]
    results = run_compile_script("smem_compile.py", json.dumps(compile_cases))
    for (which, _, bits, meta, nw), got, aligned in zip(cases, results[::2], results[1::2], strict=True):
        per_thread = meta["TILES"] * meta["BLOCK"] // (nw * 32)
        vectors = per_thread * bits // 128
        held = 2 if which == "bwd" else 1
        ptx = got["ptx"]
        assert len(re.findall(COPY, ptx)) == held * vectors and not re.search(r"cp\.async\.ca", ptx), (which, meta)
        assert len(re.findall(r"st\.global[^\n]*\.v4", ptx)) == vectors, (which, meta)
        elements = [len(re.findall(rf"st\.global\.b{bits} \[", p["ptx"])) for p in (got, aligned)]
        assert elements[0] - elements[1] == 1, (which, meta, elements)  # beside the exchange's own


def test_balanced_configs_compile_to_16_byte_copies_and_stores():
    """Copy groups of 1024 (2048 for 16-bit at 8 warps) and tile counts that are no power of two, as
    balanced_config gives them, with and without LEAD, compiled for sm_90: every copy and store 16 bytes
    wide, forward and backward."""
    import json

    from compile_scripts import run_compile_script

    cases = [("fwd", "bf16", 16, {"BLOCK": 1024, "TILES": 13, "BLOCK_G": 8}, 4),
             ("fwd", "fp32", 32, {"BLOCK": 1024, "TILES": 12, "BLOCK_G": 4}, 4),
             ("fwd", "fp16", 16, {"BLOCK": 2048, "TILES": 10, "BLOCK_G": 1}, 8),
             ("bwd", "fp16", 16, {"BLOCK": 1024, "TILES": 10, "BLOCK_G": 8}, 4),
             ("fwd", "bf16", 16, {"BLOCK": 1024, "TILES": 10, "BLOCK_G": 8, "LEAD": 56}, 4),
             ("fwd", "fp32", 32, {"BLOCK": 1024, "TILES": 13, "BLOCK_G": 4, "LEAD": 28}, 4),
             ("bwd", "bf16", 16, {"BLOCK": 1024, "TILES": 10, "BLOCK_G": 8, "LEAD": 56}, 4)]
    caps = [smem_launch.register_cap(LaunchConfig.make(nw, **meta), bits // 8, 2 if which == "bwd" else 1, SM90)
            for which, _, bits, meta, nw in cases]
    compile_cases = [[which, dt, dt, meta, nw, {}, {"maxnreg": cap} if nw == 4 else {}]
                     for (which, dt, _, meta, nw), cap in zip(cases, caps, strict=True)]
    results = run_compile_script("smem_compile.py", json.dumps(compile_cases))
    for (which, _, bits, meta, nw), got, cap in zip(cases, results, caps, strict=True):
        vectors = meta["TILES"] * meta["BLOCK"] * bits // 128 // (nw * 32)
        held = 2 if which == "bwd" else 1
        copies = re.findall(COPY, got["ptx"])
        assert len(copies) == held * vectors and not re.search(r"cp\.async\.ca", got["ptx"]), (which, meta)
        assert len(re.findall(r"st\.global[^\n]*\.v4", got["ptx"])) == vectors, (which, meta)
        assert got["shared"] >= held * meta["TILES"] * meta["BLOCK"] * bits // 8
        assert re.findall(r"\.maxnreg (\d+)", got["ptx"]) == ([str(cap)] if nw == 4 else []), "4 warps: the cap"


def test_a_staggered_config_compiles_to_16_byte_copies_after_one_timed_wait():
    """STAGGER (staggered; in halves or groups) adds one %clock64 wait loop before the copies, whose 0 the late rows'
    window takes, so that the compiler still knows the copies 16 bytes wide (an offset it cannot see through made
    them 4-byte copies); without it the kernel has no such loop."""
    import json

    from compile_scripts import run_compile_script

    meta = {"BLOCK": 1024, "TILES": 10, "BLOCK_G": 16, "CLUSTER": 1}
    waits = ({"STAGGER": 5000}, {"STAGGER": 1000, "STAGGER_GROUPS": 8}, {"STAGGER": 0})
    cases = [["fwd", "fp32", "fp32", {**meta, **wait}, 4, {}, {"maxnreg": 96}] for wait in waits]
    halves, groups, plain = run_compile_script("smem_compile.py", json.dumps(cases))
    vectors = 10 * 1024 * 32 // 128 // 128
    for got, loops in ((halves, 1), (groups, 1), (plain, 0)):
        ptx = got["ptx"]
        assert len(re.findall(COPY, ptx)) == vectors and not re.search(r"cp\.async\.ca", ptx)
        assert len(re.findall(r"st\.global[^\n]*\.v4", ptx)) == vectors
        assert ptx.count("%clock64") == 2 * loops and ptx.count("nanosleep") == loops
        assert ptx.find("%clock64") < ptx.find("cp.async") or not loops


@pytest.mark.parametrize("dtype,M,N,want", [
    (torch.float32, 32, 152064, (1000, 8)),   # 0.73 of a wave in cluster mode: 8 groups of 4 rows (2.4 MB)
    (torch.float32, 24, 152064, (1000, 8)),   # 3 rows (1.8 MB) a group
    (torch.float32, 20, 152064, (1500, 4)),   # 8 groups would hold 2 rows (1.2 MB): 4 of 5
    (torch.float32, 38, 152064, (1000, 8)),   # 0.86 of a wave: under the H200 max_grouped_wave
    (torch.float32, 44, 131072, None),        # 0.89 of a wave
    (torch.bfloat16, 48, 152064, (1000, 8)),
    (torch.bfloat16, 32, 200000, (1500, 4)),
    (torch.bfloat16, 96, 65536, (1500, 4)),
    (torch.bfloat16, 16, 524288, (4500, None)),  # resident, not a cluster: halves, 8.4 MB early
    (torch.bfloat16, 24, 400000, (5000, None)),  # 9.6 MB early: capped
    (torch.float32, 64, 152064, None),    # 1.45 waves
    (torch.float32, 48, 131072, None),    # 0.97 of a wave
    (torch.bfloat16, 8, 1048576, None),   # 0.97 of a wave (8 programs an SM under the cap of 64)
    (torch.bfloat16, 4096, 16384, None),  # many waves
], ids=str)
def test_forward_staggers_the_late_rows_of_a_launch_under_a_wave(dtype, M, N, want):
    """staggered, through dispatched_form (what auto runs): STAGGER where the launch fills at most
    the H200 bounds' max_wave of what the SMs hold and its early half reads for min_cycles; in cluster mode the rows
    wait in the most groups (STAGGER_GROUPS, up to max_groups) that read for min_group_cycles each,
    else in halves; a group's bytes over stagger.bytes_per_cycle in whole stagger.STEPs, capped. Never for the
    backward."""
    mod = smem()
    problem = meta_problem(M, N, dtype)
    rule = dispatch.choose(M, N, dtype, SM90, False, True, True)
    assert rule.impl == "smem"
    shape = dispatch.Shape(M, N, dtype, SM90, False, True, True)
    entry = dispatch.stored(SM90, mod.FAMILY, dtype, N, M)
    config = dispatch.ruled_config("smem", shape) or (entry.config if entry else smem_launch.heuristic(SM90, M, N))
    got = dict(mod.FAMILY.dispatched_form(problem, config, SM90, MODES).meta)
    assert (None if "STAGGER" not in got else (got["STAGGER"], got.get("STAGGER_GROUPS"))) == want, got
    assert "STAGGER" not in dict(mod.BWD_FAMILY.dispatched_form(problem, config, SM90, MODES).meta)


def test_stagger_needs_a_register_cap_two_rows_an_nvidia_gpu_and_enough_bytes():
    """staggered groups the rows of a cluster launch only (a resident one waits in halves), and leaves alone what it
    cannot count (no register cap: 8 warps), a single row (no late half), AMD, and launches whose early half reads in
    under min_cycles."""
    capped = LaunchConfig.make(4, options={"maxnreg": 96}, BLOCK=1024, TILES=10, BLOCK_G=16, CLUSTER=1)

    assert smem_launch.staggered(capped, meta_problem(32, 152064), SM90, MODES.stagger)["STAGGER"] == 1000
    assert smem_launch.staggered(capped, meta_problem(32, 152064), SM90, MODES.stagger)["STAGGER_GROUPS"] == 8
    resident = capped.with_meta(CLUSTER=0)
    got = dict(smem_launch.staggered(resident, meta_problem(32, 152064), SM90, MODES.stagger).meta)
    assert got == {**dict(resident.meta), "STAGGER": 5000}
    assert smem_launch.staggered(capped, meta_problem(32, 152064), GFX942, MODES.stagger) == capped
    uncapped = LaunchConfig.make(8, BLOCK=1024, TILES=10, BLOCK_G=16, CLUSTER=1)
    assert smem_launch.staggered(uncapped, meta_problem(32, 152064), SM90, MODES.stagger) == uncapped
    assert smem_launch.staggered(capped, meta_problem(1, 152064), SM90, MODES.stagger) == capped
    small = LaunchConfig.make(4, options={"maxnreg": 64}, BLOCK=1024, TILES=2, BLOCK_G=16, CLUSTER=1)
    # 256 KB early: ~146 cycles
    assert smem_launch.staggered(small, meta_problem(4, 32768), SM90, MODES.stagger) == small


@pytest.mark.parametrize("tiles,block,itemsize,held,cap", [
    (13, 1024, 2, 1, 64),   # 26 KB: 8 programs an SM by shared memory, 8 by 64 registers
    (4, 2048, 2, 1, 64),    # 16 KB: 13 by shared memory; the cap never goes under 64
    (14, 1024, 2, 1, 72),   # 28 KB: 7 programs, 65536 / (7 x 128) = 73
    (8, 2048, 2, 1, 80),    # 32 KB: 6
    (16, 1024, 4, 1, 168),  # fp32 64 KB: 3
    (7, 1024, 2, 2, 72),    # the backward's two 14 KB chunks: 7
    (8, 2048, 2, 2, 168),   # two 32 KB chunks: 3
    (32, 1024, 4, 1, 255),  # 128 KB: one program, 512 registers a thread would fit; ptxas gives at most 255
])
def test_register_cap_leaves_the_programs_that_shared_memory_allows(tiles, block, itemsize, held, cap):
    """A 4-warp config's maxnreg: the register file over the programs its chunks' shared memory lets onto an SM,
    at least 64 and more for larger chunks, which spill under 64 in cluster mode with LEAD."""
    four = LaunchConfig.make(4, BLOCK=block, TILES=tiles, BLOCK_G=16)
    capped = smem_launch.register_capped(four, itemsize, held, SM90)
    assert capped.meta == four.meta and dict(capped.options) == {"maxnreg": cap}
    assert capped.launch_kwargs()["maxnreg"] == cap
    programs = sizing.resident_programs(SM90, cap, 4, tiles * block * itemsize * held)
    assert programs == sizing.resident_programs(SM90, 1, 4, tiles * block * itemsize * held) or cap == 64
    assert smem_launch.register_capped(capped, itemsize, held, SM90) == capped


def test_register_cap_leaves_other_warp_counts_and_named_caps_alone():
    four = LaunchConfig.make(4, BLOCK=1024, TILES=13, BLOCK_G=16)
    for other in (LaunchConfig.make(8, BLOCK=2048, TILES=10, BLOCK_G=1), LaunchConfig.make(2, BLOCK=2048, TILES=4),
                  four.with_options(maxnreg=96)):
        assert smem_launch.register_capped(other, 2, 1, SM90) == other


@pytest.mark.parametrize("meta,N,lead,want,ticketed_g", [
    ({"BLOCK": 2048, "TILES": 4, "BLOCK_G": 2}, 14400, 0, (2, 4, 2048), 3),     # G + 1 would be 3 x 5 x 1024
    ({"BLOCK": 2048, "TILES": 4, "BLOCK_G": 2}, 9000, 56, (2, 5, 1024), 3),     # ... 3 x 3 x 1024
    ({"BLOCK": 2048, "TILES": 4, "BLOCK_G": 8}, 60000, 56, (8, 4, 2048), 9),    # ... 9 x 7 x 1024
    ({"BLOCK": 2048, "TILES": 8, "BLOCK_G": 8}, 66808, 56, (6, 11, 1024), 6),   # G + 1 in 11 x 1024: taken
    ({"BLOCK": 2048, "TILES": 4, "BLOCK_G": 16}, 100000, 56, (14, 7, 1024), 14),  # G 13 is past 8: taken
    ({"BLOCK": 2048, "TILES": 8, "BLOCK_G": 16}, 256000, 0, (16, 8, 2048), 17),   # 17 x 15 x 1024: no cluster
    ({"BLOCK": 1024, "TILES": 10, "BLOCK_G": 16}, 154403, 0, (16, 10, 1024), 17),  # 17 x 9 x 1024: no cluster
], ids=str)
def test_a_cluster_config_of_up_to_8_chunks_takes_no_extra_chunk_under_8192_elements(meta, N, lead, want, ticketed_g):
    """balanced_config gives a cluster-mode config G + 1 chunks a row only in chunks of CLUSTER_CUT_MIN_CHUNK
    elements or more, or when G is past CLUSTER_CUT_MAX_G, and never
    past the largest cluster (16 chunks to 17 would leave cluster mode); the same config out of cluster mode takes
    G + 1 wherever that allocates less."""
    c = smem_launch.balanced_config(LaunchConfig.make(4, CLUSTER=1, **meta), N, 2, SM90, lead)
    got = dict(c.meta)
    assert (chunks(N, got), c["TILES"], c["BLOCK"]) == want and got["CLUSTER"] == 1 and c["BLOCK_G"] >= want[0]
    assert want[0] * c["TILES"] * c["BLOCK"] >= N + got.get("LEAD", 0)
    ticketed = smem_launch.balanced_config(LaunchConfig.make(4, **meta), N, 2, SM90, lead)
    assert chunks(N, dict(ticketed.meta)) == ticketed_g, ticketed


def test_an_odd_lead_adds_no_chunk_on_a_tie_and_cuts_a_one_chunk_config_into_a_cluster():
    """balanced_config over an odd row's window (N + odd_lead): on a tie in shared memory it keeps the chunks the
    row without its lead needs (bf16 4096x16383 under the 16K entry: 2 x 9 x 1024, not 3 x 6 x 1024), unless they
    would pass max_chunk_elements; where the lead saves memory with more chunks it takes them (32767 under the 32K
    entry: 3 x 11 x 1024 against 2 x 17 x 1024). A one-chunk config that the lead still cuts runs its chunks as a
    CTA cluster where the device has clusters, not on an sm_89; an aligned row of the same configs is left as it
    was."""
    entry16k = LaunchConfig.make(4, BLOCK=2048, BLOCK_G=2, CLUSTER=1, TILES=4)
    got = smem_launch.balanced_config(entry16k, 16383, 2, SM90, smem_launch.odd_lead(2))
    assert (chunks(16383, dict(got.meta)), got["TILES"], got["BLOCK"], got["LEAD"]) == (2, 9, 1024, 63), got
    entry32k = LaunchConfig.make(4, BLOCK=2048, BLOCK_G=2, CLUSTER=1, TILES=8)
    got = smem_launch.balanced_config(entry32k, 32767, 2, SM90, smem_launch.odd_lead(2))
    assert (chunks(32767, dict(got.meta)), got["TILES"], got["BLOCK"]) == (3, 11, 1024), got
    one = smem_launch.heuristic(SM90, 4096, 32767)  # one 32K chunk, 8 warps: a 33K chunk would not fit
    assert one["BLOCK_G"] == 1 and "CLUSTER" not in dict(one.meta)
    got = smem_launch.balanced_config(one, 32767, 2, SM90, smem_launch.odd_lead(2))
    assert (chunks(32767, dict(got.meta)), got["TILES"], got["BLOCK"], got["CLUSTER"]) == (2, 9, 2048, 1), got
    unclustered = smem_launch.balanced_config(one, 32767, 2, SM89, smem_launch.odd_lead(2))
    assert "CLUSTER" not in dict(unclustered.meta), "no clusters"
    small = smem_launch.heuristic(SM90, 4096, 16383)  # one 16K chunk: the 16383 row's window fits one chunk of 17K
    got = smem_launch.balanced_config(small, 16383, 2, SM90, smem_launch.odd_lead(2))
    assert (chunks(16383, dict(got.meta)), got["TILES"], got["BLOCK"]) == (1, 17, 1024), got
    back = smem_launch.balanced_config(small, 16383, 2, SM90, smem_launch.odd_lead(2), held=2)  # dy and y: 16K at most
    assert chunks(16383, dict(back.meta)) == 2
    assert back["TILES"] * back["BLOCK"] <= smem_launch.max_chunk_elements(SM90, 2)
    assert smem_launch.balanced_config(entry16k, 16384, 2, SM90) == entry16k
    assert smem_launch.balanced_config(one, 32768, 2, SM90) == one


@pytest.mark.parametrize("meta,N,cap", [
    ({"BLOCK": 2048, "TILES": 8, "BLOCK_G": 16, "CLUSTER": 1}, 126000, 72),  # cut to 9 x 14 x 1024: 28 KB
    ({"BLOCK": 2048, "TILES": 8, "BLOCK_G": 8, "CLUSTER": 1}, 110000, 80),   # 7 x 16384 as it is: 32 KB
    ({"BLOCK": 2048, "TILES": 8, "BLOCK_G": 16, "CLUSTER": 1}, 118000, 64),  # 9 x 13 x 1024: 26 KB
    ({"BLOCK": 2048, "TILES": 4, "BLOCK_G": 8, "CLUSTER": 1}, 63000, 64),    # 8 x 8192: 16 KB
    ({"BLOCK": 2048, "TILES": 8, "BLOCK_G": 16}, 126000, 72),                # ticketed
], ids=str)
def test_a_cluster_config_keeps_lead_under_the_cap_its_chunks_allow(meta, N, cap):
    """dispatched_form keeps LEAD for rows off 128-byte lines in every mode and caps registers by the chunks'
    shared memory: under that cap the cluster forms with LEAD spill nothing."""
    mod = smem()
    x = torch.empty(4096, N, dtype=torch.bfloat16, device="meta")
    problem = matrix_problem(x, x)
    assert smem_launch.line_lead(problem) == 56
    config = LaunchConfig.make(4, **meta)
    got = mod.FAMILY.dispatched_form(problem, config, SM90, MODES)
    assert got["LEAD"] == 56 and got.launch_kwargs()["maxnreg"] == cap, got
    assert got == smem_launch.register_capped(smem_launch.balanced_config(config, N, 2, SM90, 56), 2, 1, SM90), got
    back = mod.BWD_FAMILY.dispatched_form(problem, config, SM90, MODES)
    want = smem_launch.register_capped(smem_launch.balanced_config(config, N, 2, SM90, 56, held=2), 2, 2, SM90)
    assert back["LEAD"] == 56 and back == want


def test_a_launch_balances_the_dispatchers_config_and_keeps_an_explicit_one():
    """The heuristic's config and a stored one are cut to the row (dispatched_form); a config the caller names
    runs as given. The tuner names each config's dispatched_form, so it times what a stored entry will run."""
    x = torch.empty(4096, 50264, dtype=torch.bfloat16, device="meta")
    base = smem_launch.heuristic(SM90, 4096, 50264)
    heuristic = smem().FAMILY.prepare(matrix_problem(x, x), None, SM90, flags=FLAGS, two_phase=False)
    stored = smem().FAMILY.prepare(matrix_problem(x, x), base, SM90, from_store=True, flags=FLAGS, two_phase=False)
    explicit = smem().FAMILY.prepare(matrix_problem(x, x), base, SM90, flags=FLAGS, two_phase=False)
    want = smem_launch.register_capped(smem_launch.balanced_config(base, 50264, 2, SM90, lead=56), 2, 1, SM90)
    assert heuristic.config == stored.config == want and want.meta != base.meta and want["LEAD"] == 56
    assert dict(want.options) == {"maxnreg": 64}
    assert explicit.config == base
    assert smem().FAMILY.dispatched_form(matrix_problem(x, x), base, SM90, MODES) == want
    assert heuristic._may_give_up and stored._may_give_up and not explicit._may_give_up


def test_rule_takes_aligned_long_rows_on_nvidia_only(monkeypatch):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for N in (32776, 50176, 65536, 262144, 2**20):
            assert dispatch.choose(4096, N, dtype, SM90).impl == "smem", (dtype, N)
        assert dispatch.choose(4096, 32768, dtype, SM90).impl == (
            "fused" if dtype == torch.float32 else "smem"), "32K rows: fp32 fused, 16-bit one smem chunk"
        assert dispatch.choose(4096, 16384, dtype, SM90, aligned=False).impl == "fused"
        assert dispatch.choose(4096, 8192, dtype, SM90).impl == "fused"
        assert dispatch.choose(200, 16384, dtype, SM90).impl != "smem", "few rows keep fused"
        assert dispatch.choose(4096, 16384, dtype, GFX942).impl == "fused"
        assert dispatch.choose(4096, 65536, dtype, SM90, aligned=False).impl != "smem"
        assert dispatch.choose(4096, 65536, dtype, SM90, backward=True).impl == "smem", "fp32 in clusters (<= 160K)"
        assert dispatch.choose(4096, 262144, dtype, SM90, backward=True).impl == (
            "coop" if dtype == torch.float32 else "smem"), "the fp32 backward of 256K rows stays on coop"
        assert dispatch.choose(8, 131072, dtype, SM90).impl in ("coop", "split"), "few rows keep their rules"
        assert dispatch.choose(4096, 65536, dtype, SM75).impl != "smem", "cp.async needs sm_80"
        assert dispatch.choose(4096, 65536, dtype, GFX942).impl != "smem"
        assert dispatch.choose(4096, 8 * 2**20, dtype, SM90).impl != "smem", "longer than one chunk per SM"
    assert dispatch.choose(4096, 65540, torch.bfloat16, SM90).impl != "smem", "N not whole 16-byte vectors"
    assert dispatch.choose(4096, 65540, torch.float32, SM90).impl == "smem"
    monkeypatch.setattr(dispatch, "gluon_available", lambda: False)
    assert dispatch.choose(4096, 65536, torch.bfloat16, SM90).impl != "smem"


@pytest.mark.skipif(HAS_GPU, reason="what the CPU says")
def test_cpu_call_says_it_needs_an_nvidia_gpu():
    x = random_input((4, 65536), torch.float32, DEVICE)
    with pytest.raises(RuntimeError, match="NVIDIA sm_80"):
        tritonsoftmax.softmax(x, impl="smem")


def test_refuses_a_chunk_larger_than_shared_memory():
    x = torch.empty(1, 8 * 2**20)
    with pytest.raises(ValueError, match="does not fit in shared memory"):
        smem().FAMILY.prepare(matrix_problem(x, x), None, SM90, flags=FLAGS)
    x = torch.empty(1, 4 * 2**20)  # one 32K chunk an SM in the forward, two tensors' chunks in the backward
    smem().FAMILY.prepare(matrix_problem(x, x), None, SM90, flags=FLAGS)
    with pytest.raises(ValueError, match="smem-bwd config .* does not fit in shared memory"):
        smem().BWD_FAMILY.prepare(matrix_problem(x, x), None, SM90, flags={"LOG": 0})


@pytest.mark.skipif(HAS_GPU, reason="the interpreter stands in for a kernel that fails to compile")
def test_a_kernel_that_fails_on_its_first_call_hands_over_to_coop_with_one_warning():
    """Under the interpreter the Gluon kernel cannot run, as on a triton or GPU where it would not
    compile: a dispatcher-chosen launch (no config) warns once and runs coop's kernel for good; an
    explicit config raises (the tuner must not time coop under smem's name)."""
    x = random_input((2, 8192), torch.float32, DEVICE, seed=4)
    launch = smem().FAMILY.prepare(matrix_problem(x, x), None, SM90, flags=FLAGS)
    y = poisoned_like(x)
    with pytest.warns(RuntimeWarning, match="smem kernel failed"):
        launch(x, y, 1.0)
    assert launch.smem_error and launch.fallbacks == 1
    assert_softmax_close(y, x)
    y2 = poisoned_like(x)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch(x, y2, 1.0)
    assert launch.fallbacks == 2 and torch.equal(y, y2)
    explicit = smem().FAMILY.prepare(matrix_problem(x, x), smem_launch.heuristic(SM90, 2, 8192), SM90, flags=FLAGS)
    with pytest.raises(Exception):  # noqa: B017 - whatever the interpreter raises for a Gluon kernel
        explicit(x, poisoned_like(x), 1.0)
    assert explicit.fallbacks == 0


@pytest.mark.skipif(HAS_GPU, reason="the interpreter stands in for a kernel that fails to compile")
def test_a_backward_that_fails_on_its_first_call_hands_over_to_coops_backward():
    y = torch.softmax(random_input((2, 8192), torch.float32, DEVICE, seed=5), -1)
    dy = random_input((2, 8192), torch.float32, DEVICE, seed=6)
    launch = smem().BWD_FAMILY.prepare(matrix_problem(dy, dy), None, SM90, flags={"LOG": 0})
    dx = poisoned_like(dy)
    with pytest.warns(RuntimeWarning, match="smem-bwd kernel failed"):
        launch(dy, dx, y, 1.0)
    assert launch.smem_error and launch.fallbacks == 1 and launch._coop.launches[0].family is coop.BWD_FAMILY
    assert (dx.double() - grad_reference(dy, y)).abs().max().item() <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_rows_of_one_element_run_coop_without_starting_the_smem_kernel(dtype):
    """Triton 3.6 fails to lower the smem kernels with N specialised to 1 (an LLVM assertion in
    ConvertTritonGPUToLLVM, its reproducer printed to stderr), which the odd-row form would
    otherwise take at N = 1: such rows go to coop like any layout smem cannot take, forward and backward, with no
    warning, for a heuristic and an explicit config alike."""
    import warnings

    device = device_info(torch.device(DEVICE)) if HAS_GPU else SM90
    x = random_input((7, 1), dtype, DEVICE, seed=9)
    dy = random_input((7, 1), dtype, DEVICE, seed=10)
    y_saved = torch.ones_like(x)
    for config in (None, smem_launch.heuristic(device, 7, 1, dtype)):
        launch = smem().FAMILY.prepare(matrix_problem(x, x), config, device, flags=FLAGS)
        back = smem().BWD_FAMILY.prepare(matrix_problem(dy, dy), None, device, flags={"LOG": 0})
        y, dx = poisoned_like(x), poisoned_like(dy)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            launch(x, y, 1.0)
            back(dy, dx, y_saved, 1.0)
        assert launch.fallbacks == 1 and launch.smem_error is None
        assert back.fallbacks == 1 and back.smem_error is None
        assert torch.equal(y, torch.ones_like(x)) and torch.equal(dx, torch.zeros_like(dy))


# --- on the GPU ---

@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 65536), (300, 50176), (64, 262144), (1000, 40960), (8, 131072),
                                 (2, 1048576), (1, 131072), (17, 32776), (300, 50264), (64, 131080)])
def test_matches_float64(M, N, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=N + M)
    y = poisoned_like(x)
    launch = smem().FAMILY.prepare(matrix_problem(x, y), None, device_info(x.device), flags=FLAGS)
    launch(x, y, 1.0)
    assert launch.fallbacks == 0
    assert_softmax_close(y, x)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype,M,N,groups", [
    (torch.float32, 24, 152064, 8), (torch.bfloat16, 48, 152064, 8), (torch.float16, 16, 400000, None),
    (torch.bfloat16, 96, 100000, 8), (torch.float32, 20, 152064, 4), (torch.float32, 30, 152064, 8),
    (torch.float32, 28, 200000, 8),  # 0.85 of a wave
], ids=str)
def test_staggered_launches_through_auto_match_float64(dtype, M, N, groups):
    """One-wave shapes whose late rows wait (staggered; in halves, 4 or 8 groups; 30 rows in 8 groups of 4, the last
    of 2; 96x100000 bf16 with LEAD, its rows off 128-byte lines), softmax and log_softmax through auto, every element
    against float64 with the output poisoned first."""
    x = random_input((M, N), dtype, DEVICE, seed=M + N)
    plan = dispatch.plan("auto", M, N, dtype, dtype, x.device, False, True, True)
    assert plan.impl == "smem"
    launch = plan.family.prepare(matrix_problem(x, x), plan.config, plan.device, plan.from_store, FLAGS,
                                 modes=plan.modes)
    assert launch.config["STAGGER"] > 0 and dict(launch.config.meta).get("STAGGER_GROUPS") == groups, launch.config
    y = poisoned_like(x)
    launch(x, y, 1.0)
    assert launch.fallbacks == 0
    assert_softmax_close(y, x)
    assert_softmax_close(tritonsoftmax.softmax(x), x)
    assert_log_softmax_close(tritonsoftmax.log_softmax(x), x)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scale", [-1.0, 0.0, 3.0])
def test_any_scale_with_a_masked_last_chunk(scale, dtype):
    x = random_input((264, 40968), dtype, DEVICE, seed=11)  # 2 x 16384 + 8200: the last chunk is half empty
    y = poisoned_like(x)
    smem().launch(x, y, scale=scale)
    want = torch.softmax(x.double() * scale, -1)
    assert (y.double() - want).abs().max().item() <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("config", [
    LaunchConfig.make(4, BLOCK=2048, TILES=4, BLOCK_G=8), LaunchConfig.make(8, BLOCK=8192, TILES=4, BLOCK_G=2),
    LaunchConfig.make(8, BLOCK=2048, TILES=16, BLOCK_G=2)], ids=str)
def test_every_kind_of_config(config):
    x = random_input((513, 65536), torch.bfloat16, DEVICE, seed=5)
    y = poisoned_like(x)
    smem().launch(x, y, config)
    assert_softmax_close(y, x)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scale", [0.25, -0.5])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("N", [50176, 12000])
def test_scale_log_and_extreme_values(N, log, scale, dtype):
    """50176 = 3 x 16384 + 1024: each row's last chunk is masked, and a negative scale must not turn
    its masked lanes into +inf; 12000: the row is one masked 16K chunk (no exchange). The first pass
    takes max or min (negative scale) of the raw values, 16-bit lanes two at a time: inf, -inf and NaN
    must come out as the float64 reference has them."""
    x = random_input((300, N), torch.float32, DEVICE, seed=7) * 100  # exp overflows without the max
    x[1] = float("-inf")
    x[2, ::3] = float("-inf")
    x[3, N // 2 + 345] = float("inf")
    x[4, 777] = float("nan")
    x[5, -1] = float("inf")  # in the masked last chunk
    x[6] = float("inf")
    x = x.to(dtype)
    got = poisoned_like(x)
    smem().launch(x, got, scale=scale, log=log, zero_masked_rows=True)
    ref = (torch.log_softmax if log else torch.softmax)(x.double() * scale, -1)
    if scale > 0:
        ref[1] = 0.0  # zero_masked_rows: the row's max is -inf
    else:
        ref[6] = 0.0  # all -inf after the scale
    assert torch.equal(got.isnan(), ref.isnan()), "NaN exactly where the reference has them"
    keep = ~ref.isnan() & (got.double() != ref)  # log_softmax of -inf is -inf in both
    err = (got[keep].double() - ref[keep]).abs()
    if log:
        assert (err <= 1e-3 + 2.0 ** -7 * ref[keep].abs()).all()
    else:
        assert err.max().item() <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype,N,lead", [(torch.bfloat16, 50264, 56), (torch.float16, 12008, 56),
                                          (torch.float32, 50180, 28)], ids=str)
@pytest.mark.parametrize("scale", [1.0, -0.5])
@pytest.mark.parametrize("log", [False, True])
def test_rows_off_lines_start_their_chunks_on_lines(dtype, N, lead, scale, log):
    """Rows whose starts take all eight 16-byte offsets within a 128-byte line: each chunk window starts up
    to LEAD elements before its row (balanced_config, line_lead). The lanes before a row hold the copy's
    zero fill: a row whose values all fall below 0 after the scale, maxima in a row's first and last
    element and a -inf row (zero_masked_rows) must come out as float64 has them; forward and backward."""
    M = 64
    x = random_input((M, N), torch.float32, DEVICE, scale=1.0, seed=N)
    x[0, 0] = 40.0 / scale  # 40 after the scale: the row's max, in its first element
    x[1, -1] = 40.0 / scale
    x[2] = -(x[2].abs() + 1.0) / scale  # every value below 0 after the scale: a zero-filled lane would win
    x[3] = float("-inf") if scale > 0 else float("inf")  # -inf after the scale
    x = x.to(dtype)
    y = poisoned_like(x)
    flags = {"LOG": int(log), "ZERO_MASKED": 1}
    launch = smem().FAMILY.prepare(matrix_problem(x, y), None, device_info(x.device), flags=flags)
    launch(x, y, scale)
    assert launch.config["LEAD"] == lead and launch.fallbacks == 0
    want = (torch.log_softmax if log else torch.softmax)(x.double() * scale, -1)
    want[3] = 0.0
    err = (y.double() - want).abs() / (want.abs().clamp(min=1) if log else 1)
    assert err.max().item() <= TOL[dtype]
    for r, c in ((0, 0), (1, N - 1)):
        assert float(y[r, c].double().exp() if log else y[r, c]) > 0.99

    saved, dy = saved_output_and_gradient(M, N, dtype, seed=N, log=log)
    dx = poisoned_like(dy)
    back = smem().BWD_FAMILY.prepare(matrix_problem(dy, dx), None, device_info(dy.device), flags={"LOG": int(log)})
    back(dy, dx, saved, scale)
    assert back.config["LEAD"] == lead and back.fallbacks == 0
    assert_grad_close(dx, dy, saved, scale, log)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("case", ["padded-aligned", "padded-odd", "offset-base", "odd-n", "strided-cols"])
def test_layouts_it_cannot_copy_run_coop_and_the_rest_run_smem(case):
    M, N = 64, 65536
    if case == "padded-aligned":
        x = random_input((M, N + 8), torch.bfloat16, DEVICE)[:, :N]  # rows 16 bytes apart: smem
    elif case == "padded-odd":
        x = random_input((M, N + 1), torch.bfloat16, DEVICE)[:, :N]
    elif case == "offset-base":
        x = random_input((M * N + 1,), torch.bfloat16, DEVICE)[1:].view(M, N)
    elif case == "odd-n":
        x = random_input((M, N + 4), torch.bfloat16, DEVICE)
    else:
        x = random_input((N, M), torch.bfloat16, DEVICE).t()
    y = poisoned_like(x)
    launch = smem().FAMILY.prepare(matrix_problem(x, y), None, device_info(x.device), flags=FLAGS)
    launch(x, y, 1.0)
    # odd-n: contiguous x and y of one layout, which the odd-row form takes; padded-odd: y (full_like) is contiguous,
    # x is not, so their rows sit differently against 16-byte boundaries
    assert launch.fallbacks == (0 if case in ("padded-aligned", "odd-n") else 1)
    assert_softmax_close(y, x)


def padded_rows(M: int, N: int, pad: int, values: torch.Tensor | None, dtype: torch.dtype):
    """(rows, buffer): M rows of N at a row stride of N + pad in a buffer with 64 elements to spare after them,
    holding ``values`` (M x N) or NaN everywhere."""
    buffer = torch.full((M * (N + pad) + 64,), float("nan"), dtype=dtype, device=DEVICE)
    rows = buffer[:M * (N + pad)].view(M, N + pad)[:, :N]
    if values is not None:
        rows.copy_(values)
    return rows, buffer


def assert_only_rows_written(rows: torch.Tensor, buffer: torch.Tensor) -> None:
    outside = torch.ones_like(buffer, dtype=torch.bool)
    M, N = rows.shape
    stride = rows.stride(0)
    for r in range(M):
        outside[r * stride:r * stride + N] = False
    assert buffer[outside].isnan().all(), f"{int((~buffer[outside].isnan()).sum())} elements written outside the rows"


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("M,N,pad", [(64, 100003, 0), (37, 50257, 0), (33, 65536, 3), (24, 12345, 5),
                                     (4, 1000001, 0), (16, 65538, 0)])
@pytest.mark.parametrize("log", [False, True])
def test_odd_rows_run_smem_and_write_nothing_outside_them(dtype, M, N, pad, log):
    """Rows that start on any element (odd N, or an odd pad between rows) run the odd-row form: the copies take
    whole vectors, so a row's first and last hold its neighbours' elements. Maxima of 60 at the head of row 5 and
    the tail of row 6 sit in vectors rows 4 and 7 copy: counted there, they would move those rows' softmax. A row
    whose values all fall below 0, maxima at a row's ends and a -inf row, as in the LEAD test; every element
    against float64, and nothing written outside the rows (the gaps and the 64 elements after them stay NaN);
    forward and backward."""
    x = random_input((M, N), torch.float32, DEVICE, scale=1.0, seed=N + pad)
    x[0, 0] = 40.0
    x[1, -1] = 40.0
    x[2] = -(x[2].abs() + 1.0)
    x[3] = float("-inf")
    if M > 7:
        x[5, :8] = 60.0
        x[6, -8:] = 60.0
    x, _ = padded_rows(M, N, pad, x.to(dtype), dtype)
    y, y_buffer = padded_rows(M, N, pad, None, dtype)
    info = device_info(x.device)
    flags = {"LOG": int(log), "ZERO_MASKED": 1}
    launch = smem().FAMILY.prepare(matrix_problem(x, y), None, info, flags=flags)
    launch(x, y, 1.0)
    assert launch.config["LEAD"] == smem_launch.odd_lead(x.element_size()) and launch.fallbacks == 0
    want = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
    want[3] = 0.0
    err = (y.double() - want).abs() / (want.abs().clamp(min=1) if log else 1)
    assert err.max().item() <= TOL[dtype]
    assert_only_rows_written(y, y_buffer)

    saved, dy = saved_output_and_gradient(M, N, dtype, seed=N, log=log)
    if M > 7:
        dy[5, :8] = 1e4  # in rows 4 and 7's copied vectors: counted there, they would swamp those rows' sums
        dy[6, -8:] = 1e4
    saved, _ = padded_rows(M, N, pad, saved, dtype)
    dy, _ = padded_rows(M, N, pad, dy, dtype)
    dx, dx_buffer = padded_rows(M, N, pad, None, dtype)
    back = smem().BWD_FAMILY.prepare(matrix_problem(dy, dx), None, info, flags={"LOG": int(log)})
    back(dy, dx, saved, 1.0)
    assert back.config["LEAD"] == smem_launch.odd_lead(dy.element_size()) and back.fallbacks == 0
    for r in (4, 7, 8) if M > 8 else range(M):
        assert_grad_close(dx[r:r + 1], dy[r:r + 1], saved[r:r + 1], 1.0, log)
    assert_grad_close(dx, dy, saved, 1.0, log)
    assert_only_rows_written(dx, dx_buffer)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 50257), (64, 100003)])
def test_dense_odd_rows_run_smem_through_auto_and_autograd(dtype, M, N):
    plan = dispatch.plan("auto", M, N, dtype, dtype, torch.device(DEVICE), False, False, True)
    assert plan.impl == "smem"
    assert_auto_softmax_and_gradient_match(M, N, dtype)


def assert_auto_softmax_and_gradient_match(M: int, N: int, dtype: torch.dtype) -> None:
    """tritonsoftmax.softmax of a fresh random M x N input and its gradient through autograd, against float64."""
    x = random_input((M, N), dtype, DEVICE, seed=N).requires_grad_()
    y = tritonsoftmax.softmax(x, -1)
    assert_softmax_close(y.detach(), x.detach())
    dy = random_input((M, N), dtype, DEVICE, seed=N + 1)
    y.backward(dy)
    assert_grad_close(x.grad, dy, y.detach())


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 16383), (1024, 20001), (4096, 32767), (1024, 32000), (300, 32768)])
def test_16bit_rows_of_the_16k_and_32k_buckets_run_smem_through_auto_both_ways(dtype, M, N):
    """Dense 16-bit rows of the 16K and 32K buckets, odd (chunks cut so that the lead adds none on a tie, or two
    in a cluster) and aligned, forward and backward (the 32K backward as two chunks of dy and y in a cluster)."""
    aligned = whole_vectors(N, dtype.itemsize)
    for backward in (False, True):
        plan = dispatch.plan("auto", M, N, dtype, dtype, torch.device(DEVICE), backward, aligned, True)
        assert plan.impl == "smem", (backward, plan)
    assert_auto_softmax_and_gradient_match(M, N, dtype)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 65536), (8, 131072), (3, 1000000)])
def test_cooperative_equals_two_phase_and_survives_repeats(M, N, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=M)
    info = device_info(x.device)
    two = poisoned_like(x)
    smem().FAMILY.prepare(matrix_problem(x, two), None, info, flags=FLAGS, two_phase=True)(x, two, 1.0)
    y = poisoned_like(x)
    launch = smem().FAMILY.prepare(matrix_problem(x, y), None, info, flags=FLAGS)
    for _ in range(20):
        launch(x, y, 1.0)
    torch.cuda.synchronize()
    assert launch.mode == ("ticketed" if M == 4096 else "resident")
    assert torch.equal(y, two)
    assert_softmax_close(y, x)
    assert coop_scratch_ready(x.device, M)


@pytest.mark.gpu
@pytest.mark.needs("smem")
def test_more_than_2_pow_31_elements():
    M, N = 32769, 65536  # 2^31 + 65536 elements, bf16: 4 GiB in, 4 GiB out
    x = torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16).normal_(0, 3)
    y = torch.full_like(x, float("nan"))
    smem().launch(x, y)
    worst = 0.0
    for r in range(0, M, 1024):
        ref = torch.softmax(x[r:r + 1024].double(), -1)
        worst = max(worst, (y[r:r + 1024].double() - ref).abs().max().item())
    assert worst <= TOL[torch.bfloat16], f"max abs error {worst}"


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_auto_runs_smem_forward_and_backward(dtype):
    """512x65536 through autograd: smem forward and smem-bwd (16-bit; fp32 by the many-row rule of
    dispatch.smem_fp32_cluster_config, in cluster mode)."""
    x = random_input((512, 65536), dtype, DEVICE, seed=9).requires_grad_()
    assert dispatch.plan("auto", 512, 65536, dtype, dtype, x.device).impl == "smem"
    back = dispatch.plan("auto", 512, 65536, dtype, dtype, x.device, backward=True)
    assert back.family is smem().BWD_FAMILY
    y = tritonsoftmax.softmax(x)
    assert_softmax_close(y.detach(), x.detach())
    dy = random_input((512, 65536), dtype, DEVICE, seed=10)
    y.backward(dy)
    assert_grad_close(x.grad, dy, y.detach())


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("M,N,impl", [(2, 1048576, "smem"), (16, 524288, "smem"), (4, 1048576, "coop")])
def test_auto_runs_the_fp32_backward_of_rows_from_512k_through_smem_unless_coop_holds_all(M, N, impl):
    """Through autograd, as a user calls it: the forward as before, the backward by dispatch's
    SMEM_FP32_MIN_N rule (2x1M: coop would re-read; 16x512K: more than coop holds at once)."""
    x = random_input((M, N), torch.float32, DEVICE, seed=M + 5).requires_grad_()
    back = dispatch.plan("auto", M, N, torch.float32, torch.float32, x.device, backward=True)
    assert back.impl == impl
    assert back.family is (smem().BWD_FAMILY if impl == "smem" else coop.BWD_FAMILY)
    y = tritonsoftmax.softmax(x)
    assert_softmax_close(y.detach(), x.detach())
    dy = random_input((M, N), torch.float32, DEVICE, seed=M + 6)
    y.backward(dy)
    assert_grad_close(x.grad, dy, y.detach())


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("M,N,impl", [(24, 1048576, "smem"), (8, 2097152, "smem"), (16, 524288, "coop")])
def test_auto_runs_few_fp32_rows_from_512k_through_smem_beyond_twice_what_coop_holds(M, N, impl):
    x = random_input((M, N), torch.float32, DEVICE, seed=M + 7)
    assert dispatch.plan("auto", M, N, torch.float32, torch.float32, x.device).impl == impl
    assert_softmax_close(tritonsoftmax.softmax(x), x)
    got = tritonsoftmax.log_softmax(x).double()
    torch.testing.assert_close(got, torch.log_softmax(x.double(), -1), atol=2e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("M,N,dtype,forward_impl,backward_impl", [
    (600, 16384, torch.bfloat16, "fused", "smem"), (1024, 16384, torch.float16, "smem", "fused"),
    (264, 24576, torch.float16, "smem", "smem"),
    (1024, 12000, torch.bfloat16, "smem", "smem"), (300, 12000, torch.float16, "fused", "smem"),
    (1024, 20008, torch.bfloat16, "smem", "smem")], ids=str)
def test_auto_runs_many_16bit_rows_of_8k_to_32k_as_one_smem_chunk(M, N, dtype, forward_impl, backward_impl):
    """The forward of the 32K bucket and of the 16K bucket from 7 rows an SM, the backward of the 16K
    bucket: one chunk a row, no exchange; save the backward of 10M+ elements of rows that fill the 16K block
    (1024x16384), which runs fused-bwd with RELOAD (dispatch.reload_row_config). The backward of the 32K bucket:
    two chunks of dy and y."""
    x = random_input((M, N), dtype, DEVICE, seed=N).requires_grad_()
    fwd = dispatch.plan("auto", M, N, dtype, dtype, x.device)
    assert fwd.impl == forward_impl
    back = dispatch.plan("auto", M, N, dtype, dtype, x.device, backward=True)
    assert back.impl == backward_impl
    for p in (fwd, back):
        if p.impl == "smem":
            chunks_a_row = 2 if p is back and N > 16384 else 1
            assert p.family.default_config(p.device, matrix_problem(x.detach(), x.detach()))["BLOCK_G"] == chunks_a_row
    y = tritonsoftmax.softmax(x)
    assert_softmax_close(y.detach(), x.detach())
    dy = random_input((M, N), dtype, DEVICE, seed=N + 1)
    y.backward(dy)
    assert_grad_close(x.grad, dy, y.detach())
    ref = torch.log_softmax(x.detach().double(), -1)
    got = tritonsoftmax.log_softmax(x.detach()).double()
    assert ((got - ref).abs() <= 1e-3 + 2.0 ** -7 * ref.abs()).all()


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("N", [16392, 16896])
def test_auto_runs_many_16bit_rows_just_past_16k_through_smem(N, dtype):
    """Rows fused would hold as half a block plus a tail run smem both ways (smem_held_rows): one
    balanced chunk forward, two backward, each starting on a line (16392; 16896 rows lie on lines)."""
    M = 1024
    x = random_input((M, N), dtype, DEVICE, seed=N).requires_grad_()
    for backward in (False, True):
        p = dispatch.plan("auto", M, N, dtype, dtype, x.device, backward=backward)
        assert p.impl == "smem", backward
    y = tritonsoftmax.softmax(x)
    assert_softmax_close(y.detach(), x.detach())
    dy = random_input((M, N), dtype, DEVICE, seed=N + 1)
    y.backward(dy)
    assert_grad_close(x.grad, dy, y.detach())


def saved_output_and_gradient(M: int, N: int, dtype: torch.dtype, seed: int, log: bool = False):
    x = random_input((M, N), torch.float32, DEVICE, seed=seed)
    y = (torch.log_softmax if log else torch.softmax)(x, -1).to(dtype)
    return y, random_input((M, N), dtype, DEVICE, seed=seed + 1)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 65536), (300, 50176), (8, 131072), (1, 131072), (32, 152064),
                                 (2, 2097152), (17, 32776), (300, 50264), (64, 131080)])
def test_backward_matches_float64(M, N, dtype):
    if dtype == torch.float32 and N == 2097152:
        N = 1048576  # two fp32 chunks of 16K an SM: rows up to 2M
    y, dy = saved_output_and_gradient(M, N, dtype, seed=M + N)
    dx = poisoned_like(dy)
    launch = smem().BWD_FAMILY.prepare(matrix_problem(dy, dx), None, device_info(dy.device), flags={"LOG": 0})
    launch(dy, dx, y, 1.0)
    assert launch.fallbacks == 0
    assert_grad_close(dx, dy, y)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scale", [-0.5, 0.0, 3.0])
@pytest.mark.parametrize("log", [False, True])
def test_backward_log_and_scale_with_a_masked_last_chunk(log, scale, dtype):
    y, dy = saved_output_and_gradient(264, 40968, dtype, seed=12, log=log)  # the last chunk is half empty
    dx = poisoned_like(dy)
    smem().launch_backward(dy, y, dx, scale=scale, log=log)
    if scale:
        assert_grad_close(dx, dy, y, scale, log)
    else:
        assert torch.equal(dx, torch.zeros_like(dx))


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("case", ["padded-aligned", "padded-odd", "offset-base", "odd-n"])
def test_backward_layouts_it_cannot_copy_run_coops_backward(case):
    M, N = 64, 65536 + (4 if case == "odd-n" else 0)
    y, dy = saved_output_and_gradient(M, N, torch.bfloat16, seed=3)

    def placed(t):  # dy and y share one layout, as the kernels read them with one set of strides
        if case == "padded-aligned":  # rows 16 bytes apart: smem
            return t.new_empty(M, N + 8)[:, :N].copy_(t)
        if case == "padded-odd":
            return t.new_empty(M, N + 1)[:, :N].copy_(t)
        if case == "offset-base":
            return t.new_empty(M * N + 1)[1:].view(M, N).copy_(t)
        return t

    y, dy = placed(y), placed(dy)
    dx = poisoned_like(dy)
    launch = smem().BWD_FAMILY.prepare(matrix_problem(dy, dx), None, device_info(dy.device), flags={"LOG": 0})
    launch(dy, dx, y, 1.0)
    assert launch.fallbacks == (0 if case in ("padded-aligned", "odd-n") else 1)  # odd-n: the odd-row form
    assert_grad_close(dx, dy, y)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N", [(4096, 65536), (8, 131072), (3, 1000000)])
def test_backward_cooperative_equals_two_phase_and_survives_repeats(M, N, dtype):
    y, dy = saved_output_and_gradient(M, N, dtype, seed=M)
    info = device_info(dy.device)
    two = poisoned_like(dy)
    smem().BWD_FAMILY.prepare(matrix_problem(dy, two), None, info, flags={"LOG": 0}, two_phase=True)(dy, two, y, 1.0)
    dx = poisoned_like(dy)
    launch = smem().BWD_FAMILY.prepare(matrix_problem(dy, dx), None, info, flags={"LOG": 0},
                                       modes=launch_modes(policy_for(info)))
    for _ in range(20):
        launch(dy, dx, y, 1.0)
    torch.cuda.synchronize()
    if M == 4096:  # many rows; the 16-bit ones in cluster mode by dispatch's rule (smem_launch.backward_cluster)
        assert launch.mode == ("ticketed" if dtype == torch.float32 else "cluster")
    else:
        assert launch.mode == "resident"
    assert torch.equal(dx, two)
    assert_grad_close(dx, dy, y)
    assert coop_scratch_ready(dy.device, M)


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("M,N,dtype", [(8, 1048576, torch.bfloat16), (48, 131072, torch.float16),
                                       (2, 4194304, torch.bfloat16), (100, 65536, torch.float16)], ids=str)
def test_auto_runs_smem_for_few_16bit_rows_beyond_coops_capacity(M, N, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=M)
    assert dispatch.plan("auto", M, N, dtype, dtype, x.device).impl == "smem"
    assert_softmax_close(tritonsoftmax.softmax(x), x)
    fp32 = dispatch.plan("auto", M, N, torch.float32, torch.float32, x.device).impl
    cluster_max_n = policy_for(SM90).smem_fp32_cluster["max_n"]
    assert (fp32 == "smem") == (N <= cluster_max_n), "fp32 rows: smem by the cluster rule only"


@pytest.mark.gpu
@pytest.mark.needs("smem")
@pytest.mark.parametrize("dtype,N", [(torch.bfloat16, 50264), (torch.float32, 65536)], ids=str)
def test_zero_masked_rows_leave_rows_with_nan_nan(dtype, N):
    """zero_masked_rows zeroes the rows of all -inf only, those whose sum is 0: a row of NaN, of NaN and -inf
    interleaved, or of a chunk of -inf before a chunk of NaN (partials of max -inf, one with a sum of 0 and one
    with NaN) stays NaN, as torch gives; a row of -inf gives 0."""
    M = 8
    x = random_input((M, N), torch.float32, DEVICE, seed=N)
    x[1] = float("nan")
    x[2, ::2], x[2, 1::2] = float("nan"), float("-inf")
    x[3] = float("-inf")
    x[4, :N // 2], x[4, N // 2:] = float("-inf"), float("nan")
    x = x.to(dtype)
    y = poisoned_like(x)
    launch = smem().FAMILY.prepare(matrix_problem(x, y), None, device_info(x.device),
                                   flags={"LOG": 0, "ZERO_MASKED": 1})
    launch(x, y, 1.0)
    assert launch.fallbacks == 0
    assert y[[1, 2, 4]].isnan().all(), [r for r in (1, 2, 4) if not y[r].isnan().all()]
    assert (y[3] == 0).all()
    keep = [0, 5, 6, 7]
    assert (y[keep].double() - torch.softmax(x[keep].double(), -1)).abs().max().item() <= TOL[dtype]
