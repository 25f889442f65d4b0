"""Dispatcher rules, config generation and device descriptions, on synthetic devices."""

import pytest
import torch
from shipped_tables import sm90_launch_modes
from synthetic_devices import GFX942, GFX1201, SM75, SM89, SM90, meta_problem

from tritonsoftmax import dispatch
from tritonsoftmax.config import LaunchConfig, m_bucket, n_bucket, next_power_of_2
from tritonsoftmax.device import gpu_slug, warp_size_for_arch
from tritonsoftmax.kernels import ALL_FAMILY_NAMES, FAMILY_NAMES, constexprs, family, fused, gluon_available
from tritonsoftmax.kernels.sizing import chunks
from tritonsoftmax.layout import whole_vectors
from tritonsoftmax.policy import policy_for

SM90_RELOAD = policy_for(SM90).reload  # the H200's measured reload configs (tune_cache/cuda/sm_90.yaml)
DEVICES = [SM90, GFX942, GFX1201]


def test_buckets_are_powers_of_two_and_coarse_powers_of_four():
    assert [n_bucket(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [1, 2, 4, 1024, 1024, 2048]
    assert [m_bucket(m) for m in (1, 2, 4, 5, 4096, 5000, 10**6)] == [1, 4, 4, 16, 4096, 16384, 16384]


def test_fused_capacity_follows_register_file():
    assert dispatch.fused_capacity(SM90) == 16384
    assert dispatch.fused_capacity(GFX942) == 32768
    assert dispatch.fused_capacity(GFX1201) == 16384


def test_fused_takes_many_rows_just_past_16k_held_with_a_small_tail():
    """16392 fp32 (backward) is held as 16384 + 8 elements (row_tail), like a 16384 row, and so is 16385 off
    16 bytes (its whole groups in 16388 positions); a tail over 1/64 of the 32768 block and few rows stay
    with coop."""
    assert dispatch.choose(4096, 16392, torch.float32, SM90, backward=True).impl == "fused"
    assert dispatch.choose(4096, 16896, torch.float32, SM90, backward=True).impl == "fused", "a tail of 512"
    assert dispatch.choose(4096, 16904, torch.float32, SM90, backward=True).impl == "coop", "a tail of 1024"
    assert dispatch.choose(4096, 16385, torch.float32, SM90, backward=True, aligned=False).impl == "fused"
    assert dispatch.choose(4096, 16897, torch.float32, SM90, backward=True, aligned=False).impl == "coop", \
        "off 16 bytes, 16900 positions: a tail of 1024"
    assert dispatch.choose(263, 16392, torch.float32, SM90, backward=True).impl == "coop", "few rows"
    assert dispatch.choose(264, 16392, torch.float32, SM90, backward=True).impl == "fused"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_rows_held_with_a_tail_get_a_one_row_config_for_the_held_half(dtype):
    """Many aligned rows just past a power of two (row_tail) run fused with one row a program and warps for
    32 values a thread of the held half, not the bucket's entry; 16-bit rows of 8200 leave smem's one-chunk
    rule, and 16-bit rows of 16392 and 16896 run smem (smem_held_rows)."""

    def held(M, N, backward=False, aligned=True, device=SM90):
        return dispatch.held_row_config(dispatch.Shape(M, N, dtype, device, backward, aligned))

    def any_tail(N, backward, aligned=True):  # the policy's held_tails (and held_rows) also mark the config HELD
        shape = dispatch.Shape(4096, N, dtype, SM90, backward, aligned)
        return {"HELD": 1} if dispatch.held_tails(shape) or dispatch.held_rows_warps(shape) else {}

    for N, warps in ((16392, 16), (16896, 16), (8200, 8), (4104, 4), (2056, 2), (2112, 2)):
        for backward in (False, True):
            c = held(4096, N, backward)
            want_config = LaunchConfig.make(warps, BLOCK_N=next_power_of_2(N), ROWS=1, **any_tail(N, backward))
            assert c == want_config, (N, backward, c)
            want = "smem" if N > 16384 and dtype != torch.float32 else "fused"
            assert dispatch.choose(4096, N, dtype, SM90, backward).impl == want, (N, backward)
    for N, warps in ((16388, 16), (8196, 8), (4100, 4), (2100, 2)):  # off 16 bytes: the realigned path's tail
        for backward in (False, True):
            c = held(4096, N, backward, aligned=False)
            want_config = LaunchConfig.make(warps, BLOCK_N=next_power_of_2(N), ROWS=1, **any_tail(N, backward, False))
            assert c == want_config, (N, backward, c)
            assert dispatch.choose(4096, N, dtype, SM90, backward, aligned=False).impl == "fused", (N, backward)
    for M, N, aligned, why in ((4096, 16384, True, "fills its block"), (4096, 16904, True, "a tail of 1024"),
                               (4096, 16900, False, "16904 positions: a tail of 1024"), (263, 16392, True, "few rows"),
                               (4096, 32776, True, "held half beyond fused_capacity")):
        assert held(M, N, aligned=aligned) is None, why
    for N, why in ((2113, "a tail of 128: past 1/64 of 4096"), (1030, "a block under held_min_block")):
        for backward in (False, True):  # held only where the policy's held_tails holds any tail
            assert (held(4096, N, backward) is None) == (not any_tail(N, backward)), (why, backward)
    assert held(4096, 16392, device=GFX942) is None, "measured on the H200 only"
    if dtype != torch.float32:
        assert dispatch.choose(4096, 16904, dtype, SM90).impl == "smem", "no tail: smem's one chunk"
        assert dispatch.choose(4096, 20000, dtype, SM90, aligned=False).impl == "online", "no tail: online"


def test_held_tails_hold_any_tail_in_the_policys_blocks_only():
    """The policy's held_tails (H200: forward 16-bit blocks 1K-8K and fp32 1K-16K, backward 16-bit 8K and fp32
    1K-16K) hold many rows as half the block plus any shorter tail (HELD), with warps for 32 values a thread of
    what is held; a tail as long as the half, few rows, blocks outside the range: no held config. The default
    policy (a GPU with no table) holds the forward's only."""

    def held(N, dtype, backward=False, M=4096, device=SM90):
        return dispatch.held_row_config(dispatch.Shape(M, N, dtype, device, backward, True))

    bf16, f32 = torch.bfloat16, torch.float32
    assert held(1152, bf16) == LaunchConfig.make(2, BLOCK_N=2048, ROWS=1, HELD=1), "1024 + 128: 36 threads"
    assert held(4480, bf16) == LaunchConfig.make(8, BLOCK_N=8192, ROWS=1, HELD=1), "4096 + 512"
    assert held(4480, bf16, backward=True) == LaunchConfig.make(8, BLOCK_N=8192, ROWS=1, HELD=1), "below held_rows"
    assert held(4800, bf16, backward=True) == LaunchConfig.make(4, BLOCK_N=8192, ROWS=1, HELD=1), "held_rows' warps"
    assert held(1152, bf16, backward=True) is None, "the 16-bit backward of 2K blocks: not held"
    assert held(1152, f32, backward=True) == LaunchConfig.make(2, BLOCK_N=2048, ROWS=1, HELD=1)
    assert held(9600, f32) == LaunchConfig.make(16, BLOCK_N=16384, ROWS=1, HELD=1)
    assert held(9600, bf16) is None, "16-bit 16K blocks: smem's one chunk"
    assert held(1537, bf16) is None, "1024 + 1024 is the block"
    assert held(1152, bf16, M=100) is None, "few rows"
    assert held(320, bf16) is None, "several rows a program"
    for device in (SM89, SM75):  # no table: the default policy
        assert held(1152, bf16, device=device)["HELD"] == 1
        assert held(1152, bf16, backward=True, device=device) is None
    assert dispatch.resolve("auto", 4096, 1152, bf16, SM90, False, True, True).config["HELD"] == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_held_rows_give_many_aligned_rows_up_to_their_length_the_measured_warps(dtype):
    """The H200 policy's held_rows: the 16-bit forward of rows of 8193-9216 held as 8192 + a tail on 8 warps (not
    smem's one chunk), the 16-bit backward of rows of 4800-7360 on 4 warps (rows past 6144, whose tail is the half,
    as the whole block, TAIL 0). Shorter and longer rows, rows off 16 bytes, few rows, other dtypes and GPUs
    without the entry keep the other rules."""

    def shape(M, N, backward=False, aligned=True, device=SM90, dt=dtype):
        return dispatch.Shape(M, N, dt, device, backward, aligned)

    for N in (8193, 8704, 9024, 9216):
        assert dispatch.held_row_config(shape(4096, N)) == LaunchConfig.make(8, BLOCK_N=16384, ROWS=1, HELD=1), N
        assert dispatch.choose(4096, N, dtype, SM90).impl == "fused", N
    assert dispatch.fused_held(shape(4096, 9024)) == 9216
    assert constexprs.row_tail(9024, 16384, any_tail=True) == 1024
    for N in (4800, 6144, 6720, 7360):
        assert dispatch.held_row_config(shape(4096, N, True)) == LaunchConfig.make(4, BLOCK_N=8192, ROWS=1, HELD=1), N
        assert dispatch.choose(4096, N, dtype, SM90, backward=True).impl == "fused", N
    assert constexprs.row_tail(6720, 8192, any_tail=True) == 0, "a tail as long as the half: the whole block"
    assert dispatch.held_row_config(shape(4096, 9280)) is None
    assert dispatch.choose(4096, 9280, dtype, SM90).impl == "smem", "past the forward's longest row: smem"
    assert dispatch.held_row_config(shape(4096, 7361, True)) is None, "past the backward's longest row: the table"
    assert dispatch.held_rows_warps(shape(4096, 4792, True)) == 0, "short of the backward's shortest row"
    assert dispatch.held_row_config(shape(4096, 4480, True)).num_warps == 8, "held_tails' warps"
    assert dispatch.held_rows_warps(shape(4096, 9020, aligned=False)) == 0, "rows off 16 bytes: not measured"
    assert dispatch.held_row_config(shape(100, 9024)) is None, "few rows"
    assert dispatch.held_rows_warps(shape(4096, 9024, dt=torch.float32)) == 0, "fp32: held_tails' warps"
    for device in (SM89, GFX942):  # no held_rows in the default policy
        assert dispatch.held_rows_warps(shape(4096, 9024, device=device)) == 0


def test_held_rows_measured_on_an_amd_gpu_hold_its_rows_there(monkeypatch):
    """held_rows is measured data (python -m tritonsoftmax.tune --held-rows writes it on the GPU it ran on), so a
    table that has it holds many rows on its warps on AMD too, where the heuristic held forms stay off."""
    import dataclasses

    real = dispatch.policy_for
    measured = {"fwd": {2: {8192: (4352, 6144, 4)}}}
    monkeypatch.setattr(dispatch, "policy_for", lambda dev: dataclasses.replace(real(dev), held_rows=measured)
                        if dev is GFX942 else real(dev))
    bf16 = torch.bfloat16

    def held(N, M=4096, device=GFX942):
        return dispatch.held_row_config(dispatch.Shape(M, N, bf16, device, False, True))

    assert held(4480) == LaunchConfig.make(4, BLOCK_N=8192, ROWS=1, HELD=1)
    assert held(6208) is None and held(4480, M=64) is None, "past its longest row; few rows"
    assert held(4480, device=GFX1201) is None, "another AMD GPU: no table, no held rows"


def test_held_pieces_hold_rows_in_three_pieces_where_the_policy_says(monkeypatch):
    """A policy's held_pieces (no shipped table has one yet) holds many aligned rows as half the block, a power of
    two and a shorter tail (HELD 2) where that saves positions over half plus one tail, with warps for what that
    holds; rows off 16 bytes, rows a third piece does not shorten and blocks outside its range keep the rules
    without it."""
    import dataclasses

    real = dispatch.policy_for
    monkeypatch.setattr(dispatch, "policy_for",
                        lambda dev: dataclasses.replace(real(dev), held_pieces={"fwd": {2: (4096, 8192)}}))
    bf16 = torch.bfloat16

    def held(N, aligned=True, backward=False):
        return dispatch.held_row_config(dispatch.Shape(4096, N, bf16, SM90, backward, aligned))

    assert held(6464) == LaunchConfig.make(8, BLOCK_N=8192, ROWS=1, HELD=2), "4096 + 2048 + 512: 6656 held"
    assert dispatch.fused_held(dispatch.Shape(4096, 6464, bf16, SM90, False, True)) == 6656
    assert held(3200) == LaunchConfig.make(4, BLOCK_N=4096, ROWS=1, HELD=2), "2048 + 1024 + 128"
    assert held(6464, aligned=False) is None, "realigned rows: two pieces at most (the tail is the half)"
    assert held(4480) == LaunchConfig.make(8, BLOCK_N=8192, ROWS=1, HELD=2), "4096 + 256 + 128: the row exactly"
    assert held(6144) == LaunchConfig.make(8, BLOCK_N=8192, ROWS=1, HELD=1), "4096 + 2048: two pieces hold it"
    assert held(6464, backward=True) == LaunchConfig.make(4, BLOCK_N=8192, ROWS=1, HELD=1), "backward: held_rows"
    assert constexprs.row_pieces(1600, 2048)[0] and not dispatch.held_pieces(
        dispatch.Shape(4096, 1600, bf16, SM90, False, True)), "a 2K block: outside the range"
    monkeypatch.setattr(dispatch, "policy_for", real)
    assert held(6464) is None, "the shipped sm_90 policy holds no three pieces"


def test_plan_gives_rows_held_with_a_tail_the_held_config_over_the_tables_entry(monkeypatch):
    """On an H200 (the shipped sm_90 table), bf16 4096x16392 through fused runs 16 warps, one row a program, though
    the 32K bucket's entry is a pipelined 32-warp config (on rows off 16 bytes too); a row that fills its block,
    or has no small tail, keeps the entry."""
    monkeypatch.setattr(dispatch, "device_info", lambda device: SM90)
    dispatch.clear_cache()
    try:
        dev = torch.device("cpu")
        p = dispatch.plan("fused", 4096, 16392, torch.bfloat16, torch.bfloat16, dev)
        assert (p.impl, p.config, p.from_store) == ("fused", LaunchConfig.make(16, BLOCK_N=32768, ROWS=1), True)
        assert dispatch.plan("auto", 4096, 16392, torch.bfloat16, torch.bfloat16, dev).impl == "smem"
        full = dispatch.plan("fused", 4096, 32768, torch.bfloat16, torch.bfloat16, dev)
        entry = dispatch.stored(SM90, fused.FAMILY, torch.bfloat16, 32768, 4096)
        assert entry is not None and full.config == entry.config != p.config
        off = dispatch.plan("fused", 4096, 16392, torch.bfloat16, torch.bfloat16, dev, aligned=False)
        assert off.config == p.config, "realigned rows are held with a tail too"
        whole = dispatch.plan("fused", 4096, 20000, torch.bfloat16, torch.bfloat16, dev, aligned=False)
        assert whole.config == entry.config, "a realigned row without a tail holds the whole block"
    finally:
        dispatch.clear_cache()


@pytest.mark.parametrize("itemsize", sorted(SM90_RELOAD["rows"]))
def test_backward_of_many_rows_that_fill_their_block_gets_the_reload_config(itemsize):
    """The backward of the table's element count (2^24; 16-bit: 12M 1K, 2^25 8K, 10M 16K) or more (16-bit 32K: at
    most 3 x 2^24) of aligned rows that fill at least 15/16 (16-bit 32K: 31/32) of their block, in the blocks of
    the H200 policy's reload rows, runs fused-bwd with RELOAD, the table's rows and warps and 32 registers a thread;
    one row fewer (or one more than the most), a row one element shorter than that, the forward, rows off 16 bytes,
    AMD, 1536 threads an SM and the blocks the table leaves out get None."""
    dtype = {2: torch.bfloat16, 4: torch.float32}[itemsize]

    def reload(M, N, backward=True, aligned=True, device=SM90, dt=dtype, dense=False):
        return dispatch.reload_row_config(dispatch.Shape(M, N, dt, device, backward, aligned, dense))

    for block, (rows, warps, elements, most) in SM90_RELOAD["rows"][itemsize].items():
        want = LaunchConfig.make(warps, BLOCK_N=block, ROWS=rows, RELOAD=1).with_options(maxnreg=32)
        assert elements == {(2, 1024): 3 * 2**22, (2, 8192): 2**25, (2, 16384): 5 * 2**21}.get((itemsize, block), 2**24)
        assert most == {(2, 32768): 3 * 2**24}.get((itemsize, block)), block
        shortest = dispatch.reload_shortest(SM90_RELOAD, itemsize, block)
        assert shortest == block - block // (32 if (itemsize, block) == (2, 32768) else 16), block
        fewest = -(-elements // shortest)
        many = most // block if most else 65536
        assert reload(elements // block, block) == want, block
        assert reload(fewest, shortest) == want, block
        assert reload(fewest, shortest - 1) is None, (block, "fills less than 15/16 (31/32) of the block")
        assert reload(fewest - 1, shortest) is None, (block, "too few elements")
        assert reload(many, block) == want, block
        assert reload(many, block, backward=False) is None, "forward"
        assert reload(many, block, aligned=False) is None, "rows off 16 bytes: the realigned path ignores RELOAD"
        assert reload(many, block, device=GFX942) is None, "measured on the H200 only"
        assert reload(many, block, device=SM89) is None, "1536 threads an SM: one 32-warp program, three of 16"
        smem_block = block > policy_for(SM90).smem_one_chunk["reload_over_smem_max_n"]  # the 16-bit 32K block: smem-bwd
        assert dispatch.choose(many, block, dtype, SM90, backward=True).impl == ("smem" if smem_block else "fused")
        if most:
            assert reload(most // shortest, shortest) == want, block
            assert reload(most // shortest + 1, shortest) is None, (block, "too many elements")
            assert reload(many + 1, block) is None, (block, "too many elements, rows not dense")
            assert reload(many, block, dense=True) == want, (block, "dense rows within the bound: the capped config")
            rows, warps = SM90_RELOAD["dense_rows"][itemsize][block]
            dense = LaunchConfig.make(warps, BLOCK_N=block, ROWS=rows, RELOAD=1, DENSE=1)
            assert reload(many + 1, block, dense=True) == dense, block
            assert reload(65536, block, dense=True) == dense, block
            assert reload(65536, block - 8, dense=True) is None, (block, "DENSE rows are exactly the block")
            for kwargs in ({"backward": False}, {"aligned": False}, {"device": GFX942}, {"device": SM89}):
                assert reload(65536, block, dense=True, **kwargs) is None, (block, kwargs)
    for block in (512,) + ((8192, 16384, 32768) if itemsize == 4 else ()):
        assert reload(65536, block) is None, (block, "not in the table")
    if itemsize == 2:
        for dt in (torch.bfloat16, torch.float16):
            assert dispatch.choose(4096, 16384, dt, SM90, backward=True).impl == "fused", "was smem's one chunk"
            assert dispatch.choose(4096, 12000, dt, SM90, backward=True).impl == "smem", "fills 0.73 of the block"
            assert dispatch.choose(600, 16384, dt, SM90, backward=True).impl == "smem", "9.8M elements"
            assert reload(640, 16384, dt=dt) is not None, "10M elements"
            assert reload(16384, 1000, dt=dt) is not None and reload(12288, 1000, dt=dt) is None, "1K block: 12M"
            assert reload(2100, 8104, dt=dt) is None, "8K block: 17M elements, under 2^25"
            assert reload(4096, 8192, dt=dt) is not None, "2^25 elements"
            assert reload(1024, 32000, dt=dt) is not None, "32000 fills 31/32 of the 32K block, 32M elements"
            assert reload(4096, 32768, dt=dt) is None and reload(300, 32768, dt=dt) is None, "too many, too few"
            assert reload(1536, 32768, dt=dt) is not None and reload(1537, 32768, dt=dt) is None, "1536 rows at most"


def test_plan_gives_the_backward_of_rows_that_fill_their_block_the_reload_config(monkeypatch):
    """On an H200 (the shipped sm_90 table) the backward through auto and through fused takes reload_row_config's
    config over the table's entry; the forward of the same shape keeps the entry."""
    monkeypatch.setattr(dispatch, "device_info", lambda device: SM90)
    dispatch.clear_cache()
    try:
        dev = torch.device("cpu")
        for impl, M, N in (("auto", 65536, 2048), ("fused", 65536, 2048), ("auto", 4096, 16384)):
            p = dispatch.plan(impl, M, N, torch.bfloat16, torch.bfloat16, dev, backward=True)
            want = dispatch.reload_row_config(dispatch.Shape(M, N, torch.bfloat16, SM90, True))
            assert want is not None and (p.impl, p.config, p.from_store) == ("fused", want, True), (impl, M, N)
        assert dispatch.plan("auto", 4096, 32768, torch.bfloat16, torch.bfloat16, dev, backward=True,
                             dense=True).impl == "smem", "smem-bwd where it copies the rows"
        monkeypatch.setattr(dispatch, "gluon_available", lambda: False)
        dispatch.clear_cache()
        dense = dispatch.plan("auto", 4096, 32768, torch.bfloat16, torch.bfloat16, dev, backward=True, dense=True)
        strided = dispatch.plan("auto", 4096, 32768, torch.bfloat16, torch.bfloat16, dev, backward=True)
        assert dense.config["DENSE"] == 1 and dense.impl == "fused", dense
        assert "DENSE" not in dict(strided.config.meta) and "RELOAD" not in dict(strided.config.meta), strided
        fwd = dispatch.plan("auto", 65536, 2048, torch.bfloat16, torch.bfloat16, dev)
        entry = dispatch.stored(SM90, fused.FAMILY, torch.bfloat16, 2048, 65536)
        assert entry is not None and fwd.config == entry.config and "RELOAD" not in dict(fwd.config.meta)
    finally:
        dispatch.clear_cache()


def test_fused_takes_rows_of_32k_only_when_many_rows_fill_the_gpu():
    assert dispatch.choose(264, 32768, torch.float32, SM90).impl == "fused"
    assert dispatch.choose(263, 32768, torch.float32, SM90).impl != "fused"
    assert dispatch.choose(8, 32768, torch.float32, SM90).impl == "coop"


@pytest.mark.parametrize("M,N,fp32_fwd,fp32_bwd,bf16_fwd,bf16_bwd", [
    (1, 8388608, "split", "split", "split", "split"), (1, 2097152, "split", "smem", "split", "smem"),
    (32, 152064, "smem", "smem", "coop", "smem"), (16, 152064, "coop", "coop", "coop", "smem"),
    (1, 131072, "coop", "coop", "coop", "coop"),
    (8, 131072, "coop", "coop", "coop", "coop"), (4, 1048576, "coop", "coop", "coop", "smem"),
    (8, 1048576, "coop", "smem", "smem", "smem"), (40, 131072, "coop", "coop", "coop", "smem"),
    (48, 131072, "smem", "smem", "smem", "smem"), (128, 131072, "smem", "smem", "smem", "smem"),
    (263, 65536, "smem", "smem", "smem", "smem"), (2, 4194304, "split", "split", "smem", "split"),
    (2, 4194312, "split", "split", "split", "split"), (8, 1048572, "coop", "smem", "split", "coop"),
    (24, 1048576, "smem", "smem", "smem", "smem"),
    (8, 32768, "coop", "coop", "coop", "coop"), (8, 16384, "fused", "fused", "fused", "fused")])
def test_few_long_rows_go_to_coop_when_they_fit_at_once_or_read_once_in_fp32_or_backward_else_smem_or_split(
        M, N, fp32_fwd, fp32_bwd, bf16_fwd, bf16_bwd):
    for backward, fp32, bf16 in ((False, fp32_fwd, bf16_fwd), (True, fp32_bwd, bf16_bwd)):
        assert dispatch.choose(M, N, torch.float32, SM90, backward).impl == fp32
        assert dispatch.choose(M, N, torch.bfloat16, SM90, backward).impl == bf16
        assert dispatch.choose(M, N, torch.float16, SM90, backward).impl == bf16
    assert dispatch.choose(264, 131072, torch.bfloat16, SM90).impl == "smem", "264 rows fill the H200's 132 SMs"
    assert dispatch.choose(264, 65536, torch.bfloat16, SM90).impl == "smem", "many 16-bit rows of 64K"
    assert dispatch.choose(264, 65536, torch.bfloat16, SM90, aligned=False).impl == "online"
    assert dispatch.choose(264, 131072, torch.bfloat16, SM90, aligned=False).impl == "coop"
    assert dispatch.choose(263, 65536, torch.bfloat16, SM90, aligned=False).impl == "split", "smem needs aligned rows"
    assert dispatch.choose(263, 65540, torch.bfloat16, SM90).impl == "split", "smem needs whole 16-byte vectors"


def test_few_16bit_rows_of_one_chunk_an_sm_go_to_coop_backward_only_with_a_tuned_coop_config(tmp_path, monkeypatch):
    """At most 132 x 8192 elements on the H200; the shipped table holds coop-bwd configs there. Without
    one (a user table alone) the rows stay with smem, and one entry serves only its own dtype."""
    for dtype in (torch.bfloat16, torch.float16):
        for M, N in [(1, 65536), (16, 65536), (8, 131072), (4, 262144), (2, 524288), (1, 1048576), (9, 120000)]:
            assert dispatch.choose(M, N, dtype, SM90, backward=True).impl == "coop", (dtype, M, N)
            assert dispatch.choose(M, N, dtype, SM90).impl != "smem" or M * N > 132 * 8192
        for M, N in [(32, 65536), (16, 131072), (8, 262144), (2, 1048576), (1, 2097152)]:
            assert dispatch.choose(M, N, dtype, SM90, backward=True).impl == "smem", (dtype, M, N)
        assert dispatch.choose(8, 131072, dtype, GFX942, backward=True).impl not in ("coop", "smem")
    h200 = policy_for(SM90)  # the measured policy stays; only the table's entries go
    monkeypatch.setattr(dispatch, "policy_for", lambda device: h200)
    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(dispatch.tuning, "shipped_dir", lambda: None)
    dispatch.clear_cache()
    try:
        assert dispatch.choose(8, 131072, torch.bfloat16, SM90, backward=True).impl == "smem"
        config = LaunchConfig.make(2, BLOCK=4096, BLOCK_G=32, TILES=1)
        dispatch.tuning.record(tmp_path, SM90, [("coop-bwd", torch.bfloat16, 131072, 8, config, 0.005)])
        dispatch.clear_cache()
        assert dispatch.choose(8, 131072, torch.bfloat16, SM90, backward=True).impl == "coop"
        assert dispatch.choose(8, 131072, torch.float16, SM90, backward=True).impl == "smem"
        assert dispatch.choose(16, 131072, torch.bfloat16, SM90, backward=True).impl == "smem", "2M elements"
        assert dispatch.choose(8, 131072, torch.float32, SM90, backward=True).impl == "coop"
    finally:
        dispatch.clear_cache()


@pytest.mark.parametrize("M,N,impl", [
    (1, 524288, "coop"), (2, 524288, "coop"), (4, 524288, "coop"), (8, 524288, "coop"), (16, 524288, "smem"),
    (4096, 524288, "smem"), (1, 1048576, "smem"), (3, 1048576, "coop"), (4096, 262144, "coop"),
    (2, 262144, "coop"), (1, 524289, "coop"), (4096, 524290, "coop"), (1, 524292, "smem")])
def test_fp32_backward_of_rows_from_512k_goes_to_smem_unless_coop_holds_all_and_reads_once(M, N, impl):
    """Rows of 524289 and 524290 fp32 elements are not whole 16-byte vectors, which smem copies: coop
    keeps them. One or two rows of 524288 coop-bwd holds in 4096-element chunks (coop._chunk); a
    1048576-element row it would hold only in 8192-element chunks of dy and y, and re-reads."""
    shape = dispatch.Shape(M, N, torch.float32, SM90, backward=True)
    assert dispatch.choose(M, N, torch.float32, SM90, backward=True).impl == impl
    if impl == "coop" and N >= policy_for(SM90).smem_fp32_min_n and dispatch.smem_takes(shape):
        assert dispatch.coop_holds_all(shape) and not dispatch.coop_rereads(shape)


@pytest.mark.parametrize("M,N,impl", [
    (32, 524288, "smem"), (16, 524288, "coop"), (16, 1048576, "smem"), (8, 1048576, "coop"), (200, 1048576, "smem"),
    (8, 2097152, "smem"), (4, 2097152, "split"), (1, 1048576, "coop"), (200, 262144, "smem"),
    (8, 4194304, "split"), (32, 524289, "coop"), (264, 1048576, "smem")])
def test_few_fp32_rows_from_512k_go_to_smem_beyond_twice_what_coop_holds(M, N, impl):
    """The forward: 16M elements and up (more than 2 x 5.4M), rows of the 512K-2M buckets; 8M stays on
    coop or split, the 4M bucket (unmeasured) on split; 524289 fp32 elements are not whole 16-byte
    vectors; 264 rows are many rows (smem's many-row rule); 200 rows of 262144 take the cluster rule
    (test_few_fp32_rows_of_32k_to_256k_beyond_what_coop_holds_go_to_smem_clusters)."""
    assert dispatch.choose(M, N, torch.float32, SM90).impl == impl
    assert dispatch.choose(M, N, torch.float32, GFX942).impl not in ("smem", "coop")


@pytest.mark.skipif(not gluon_available(), reason="smem needs triton's Gluon")
@pytest.mark.parametrize("M,N,want,backward", [
    (40, 152064, (15, 10), True), (64, 152064, (15, 10), True), (256, 152064, (15, 10), True),
    (48, 131072, (16, 8), True), (100, 65536, (16, 4), True), (200, 262144, (16, 16), False),
    (160, 100000, (14, 7), True), (200, 40000, (14, 3), True), (64, 163840, (16, 10), True),
    (64, 163844, (15, 11), False), (16, 262144, None, False), (64, 65536, None, False),
    (264, 152064, None, False), (64, 524288, None, False), (64, 152065, None, False),
    (32, 152064, (15, 10), True), (18, 152064, (15, 10), False), (20, 152064, (15, 10), False),
    (21, 152064, (15, 10), True), (32, 140000, (16, 9), True), (32, 163840, (16, 10), True),
    (17, 152064, None, False), (32, 163841, None, False), (24, 200000, None, False), (32, 131072, None, False),
    (40, 131072, None, False)])
def test_few_fp32_rows_of_32k_to_256k_beyond_what_coop_holds_go_to_smem_clusters(M, N, want, backward):
    """Few fp32 rows past coop's 5.4M elements at once on the H200: smem, each row 16 chunks (or fewer whole
    1024-element groups) in one cluster of 4-warp programs; the backward too where the chunks hold at most 10240
    elements. Rows past the 131072 bucket (coop's 8K chunks more than a cluster) from half of coop's hold (2.7M
    elements: 18 rows of 152064, not 17; the backward from 0.58 of it, 21 rows, not 20) in chunks of at most 10240
    (not 32x163841 or 24x200000). Not where coop holds the rows otherwise (16x262144, 64x65536, 32x131072: coop's
    clusters), not for many rows, the 512K bucket, rows that are no whole 16-byte vectors, 16-bit rows, or GPUs
    without clusters."""
    shape = dispatch.Shape(M, N, torch.float32, SM90)
    config = dispatch.smem_fp32_cluster_config(shape)
    if want is None:
        assert config is None
        return
    assert dispatch.choose(M, N, torch.float32, SM90).impl == "smem"
    back = dispatch.smem_fp32_cluster_config(dispatch.Shape(M, N, torch.float32, SM90, backward=True))
    assert (back == config) if backward else back is None
    assert dispatch.choose(M, N, torch.float32, SM90, backward=True).impl == ("smem" if backward else "coop")
    assert (chunks(N, dict(config.meta)), config["TILES"]) == want and config["BLOCK"] == 1024
    assert config["CLUSTER"] == 1 and config["BLOCK_G"] == 16 and config.num_warps == 4
    run = family("smem").dispatched_form(meta_problem(M, N), config, SM90, sm90_launch_modes())
    assert chunks(N, dict(run.meta)) == want[0] and run["TILES"] == want[1], "the cut keeps the ruled chunks"
    for other in (dispatch.Shape(M, N, torch.bfloat16, SM90), dispatch.Shape(M, N, torch.bfloat16, SM90, backward=True),
                  dispatch.Shape(M, N, torch.float32, SM89), dispatch.Shape(M, N, torch.float32, GFX942)):
        assert dispatch.smem_fp32_cluster_config(other) is None, other


@pytest.mark.parametrize("M,N,want", [
    (4096, 65536, (8, 8, 8)), (4096, 50257, (7, 8, 8)), (264, 40000, (5, 8, 8)), (4096, 100352, (13, 8, 16)),
    (1024, 151936, (15, 10, 16)), (4096, 163840, (16, 10, 16)), (4096, 163841, None), (4096, 262144, None),
    (4096, 32768, None)])
def test_the_backward_of_many_fp32_rows_of_32k_to_160k_goes_to_smem_clusters(M, N, want):
    """Many fp32 rows (backward, dispatch.smem_fp32_cluster_config): chunks of 8K, 16 a row where that takes more, up
    to 16 x 10240 elements; odd rows too; not the forward, 16-bit rows or GPUs
    without clusters, nor rows past 160K or in the 32K bucket (fused's and coop's rules)."""
    aligned = whole_vectors(N, 4)
    shape = dispatch.Shape(M, N, torch.float32, SM90, True, aligned, True)
    config = dispatch.smem_fp32_cluster_config(shape)
    if want is None:
        assert config is None and dispatch.choose(M, N, torch.float32, SM90, True, aligned, True).impl != "smem"
        return
    assert (chunks(N, dict(config.meta)), config["TILES"], config["BLOCK_G"]) == want, config
    assert config["CLUSTER"] == 1 and config["BLOCK"] == 1024 and config.num_warps == 4
    assert dispatch.choose(M, N, torch.float32, SM90, True, aligned, True).impl == "smem"
    assert dispatch.ruled_config("smem", shape) == config
    for other in (dispatch.Shape(M, N, torch.float32, SM90, False, aligned, True),
                  dispatch.Shape(M, N, torch.bfloat16, SM90, True, aligned, True),
                  dispatch.Shape(M, N, torch.float32, SM89, True, aligned, True)):
        assert dispatch.smem_fp32_cluster_config(other) is None, other


def test_ruled_config_is_the_one_place_a_rule_fixes_a_config():
    """plan() and the tuner's notice read the same function: fused's held rows and RELOAD rows, smem's fp32
    cluster rows; no other family."""
    held = dispatch.Shape(4096, 16392, torch.bfloat16, SM90)
    assert dispatch.ruled_config("fused", held) == dispatch.held_row_config(held) is not None
    reload = dispatch.Shape(4096, 16384, torch.bfloat16, SM90, backward=True)
    assert dispatch.ruled_config("fused", reload) == dispatch.reload_row_config(reload) is not None
    few = dispatch.Shape(64, 152064, torch.float32, SM90)
    assert dispatch.ruled_config("smem", few) == dispatch.smem_fp32_cluster_config(few)
    assert gluon_available() <= (dispatch.ruled_config("smem", few) is not None)
    for name in ("coop", "online", "split", "tile"):
        assert dispatch.ruled_config(name, few) is None and dispatch.ruled_config(name, held) is None


@pytest.mark.skipif(not gluon_available(), reason="smem needs triton's Gluon")
def test_plan_gives_few_fp32_rows_the_cluster_config(monkeypatch):
    """The ruled config reaches the launch as the dispatcher's own (from_store: cut and capped), for auto and for
    impl="smem"; other shapes keep the table or the heuristic."""
    monkeypatch.setattr(dispatch, "device_info", lambda device: SM90)
    dispatch.clear_cache()
    try:
        dev = torch.device("cpu")
        for impl in ("auto", "smem"):
            p = dispatch.plan(impl, 64, 152064, torch.float32, torch.float32, dev)
            assert (p.impl, p.from_store, p.config["TILES"], p.config["CLUSTER"]) == ("smem", True, 10, 1)
        assert dispatch.plan("smem", 16, 152064, torch.float32, torch.float32, dev).config != p.config
        assert dispatch.plan("auto", 16, 152064, torch.float32, torch.float32, dev).impl == "coop"
    finally:
        dispatch.clear_cache()


@pytest.mark.parametrize("M,N,forward16,backward16", [
    (300, 12000, "fused", "smem"), (923, 16384, "fused", "fused"), (924, 16384, "smem", "fused"),
    (600, 16384, "fused", "smem"),
    (300, 24576, "smem", "smem"), (264, 32768, "smem", "smem"), (263, 32768, "split", "coop"),
    (4096, 8200, "fused", "fused"), (4096, 8704, "fused", "smem"), (4096, 9600, "smem", "smem"),
    (4096, 8192, "fused", "fused"), (4096, 12004, "fused", "fused")])
def test_many_16bit_rows_of_8k_to_32k_go_to_smem_as_one_chunk(M, N, forward16, backward16):
    """16K-bucket forwards from 7 rows an SM (924 on the H200); 32K forward and backward; 263 rows are few rows;
    12004 bf16 elements are not whole 16-byte vectors; 8200 is held by fused as 8192 + 8 (held_row_config), the
    forward of 8704 as 8192 + 1024 (the policy's held_rows), 9600 is past held_rows' rows; the backward of 640+
    rows of 16384 goes to fused with RELOAD (reload_row_config)."""
    for dtype in (torch.bfloat16, torch.float16):
        assert dispatch.choose(M, N, dtype, SM90).impl == forward16
        assert dispatch.choose(M, N, dtype, SM90, backward=True).impl == backward16
    assert dispatch.choose(M, N, torch.float32, SM90).impl != "smem"


@pytest.mark.parametrize("device", [GFX942, GFX1201], ids=lambda d: d.arch)
def test_cooperative_kernels_are_not_picked_on_amd(device):
    for M, N in [(1, 131072), (4, 1048576), (4096, 65536), (4096, 262144)]:
        for backward in (False, True):
            assert dispatch.choose(M, N, torch.float32, device, backward).impl not in ("coop", "smem")
    for M, N in [(8, 1048576), (128, 131072), (4096, 65536)]:  # smem's few- and many-row 16-bit rules
        assert dispatch.choose(M, N, torch.bfloat16, device).impl not in ("coop", "smem")


def test_every_rule_says_why():
    assert all(rule.why for rule in dispatch.RULES)
    assert dispatch.RULES[-1].holds(dispatch.Shape(1, 10**9, torch.float32, SM90))


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.arch)
def test_tile_widths_of_the_walking_families(device):
    """Online alone tries 16384-wide tiles on long rows (16-bit 4096x65536 ran 3-5 % faster on the
    H200); split tries one-tile chunks of 8192 (its pass 2 then loads the tile before the partials);
    short rows never get a tile wider than their power of two."""
    widths = {name: {c["BLOCK"] for c in family(name).configs(device, 4096, 65536)} for name in ("online", "tile")}
    assert 16384 in widths["online"] and max(widths["tile"]) == 8192
    assert all(c["BLOCK"] <= 2048 for c in family("online").configs(device, 4096, 1500))
    split_8m = [c for c in family("split").configs(device, 1, 8388608) if c["BLOCK"] == 8192]
    assert split_8m and all(c["BLOCK_G"] * c["TILES"] * 8192 >= 8388608 for c in split_8m)
    if device.sm_count >= 128:  # 8 programs an SM want 1024 chunks: one 8192-wide tile each
        assert all(c["TILES"] == 1 and c["BLOCK_G"] == 1024 for c in split_8m)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.arch)
@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("M,N", [(1, 1), (8, 2048), (4096, 256), (4096, 16384), (4, 1048576)])
def test_generated_configs_are_valid_for_the_device(name, device, M, N):
    fam = family(name)
    if name == "fused" and N > fused.MAX_N:
        return
    configs = fam.configs(device, M, N)
    assert configs, "an empty search space"
    for c in configs + [fam.heuristic(device, M, N)]:
        assert c.num_warps * device.warp_size <= device.max_threads_per_program
        assert c.num_warps & (c.num_warps - 1) == 0
        options = dict(c.options)
        if device.is_hip:
            assert set(options) <= {"waves_per_eu"}
        else:
            assert not options, "AMD-only options emitted for CUDA"
        if name == "fused":
            assert c["BLOCK_N"] == next_power_of_2(N)
            assert c["ROWS"] * c["BLOCK_N"] <= max(c["BLOCK_N"], fused.MAX_TILE)
        else:
            assert c["BLOCK"] & (c["BLOCK"] - 1) == 0


def test_hip_search_space_has_waves_per_eu_variants():
    configs = family("online").configs(GFX942, 4096, 65536)
    assert any(dict(c.options).get("waves_per_eu") for c in configs)
    assert not any(c.options for c in family("online").configs(SM90, 4096, 65536))


def test_fused_heuristic_keeps_programs_for_few_rows():
    assert family("fused").heuristic(SM90, 8, 256)["ROWS"] == 1
    assert family("fused").heuristic(SM90, 65536, 256)["ROWS"] > 1


@pytest.mark.parametrize("device", [SM90, GFX942, GFX1201], ids=lambda d: d.arch)
def test_fused_forward_heuristic_gives_many_long_rows_a_program_each_with_32_values_a_thread(device):
    """Many rows (two programs an SM or more) of 1024 elements or more: one row a program, 32 values a thread (up to
    32 warps or a program's most threads); fewer rows keep tiles of several warps, and the backward (two tensors
    held) keeps its own."""
    fwd, bwd = family("fused").heuristic, fused.BWD_FAMILY.heuristic
    for N in (1024, 1500, 4096, 16384, 65536):
        c = fwd(device, 4096, N)
        block = next_power_of_2(N)
        assert c["ROWS"] == 1 and c["BLOCK_N"] == block, (N, c)
        most = min(32, device.max_threads_per_program // device.warp_size)
        assert c.num_warps == min(most, max(1, block // (32 * device.warp_size))), (N, c)
    assert fwd(device, 2 * device.sm_count - 1, 1024) == bwd(device, 2 * device.sm_count - 1, 1024)
    assert fwd(device, 4096, 512) == bwd(device, 4096, 512)
    assert bwd(device, 4096, 1024)["ROWS"] == 4


def test_decision_is_cached_per_shape():
    from tritonsoftmax.device import device_info

    dev = torch.device("cpu")
    a = dispatch.plan("auto", 8, 2048, torch.float32, torch.float32, dev)
    b = dispatch.plan("auto", 8, 2048, torch.float32, torch.float32, dev)
    c = dispatch.plan("auto", 8, 65536, torch.float32, torch.float32, dev)
    assert a is b and a.impl == "fused"
    assert c is not a and c.impl == dispatch.choose(8, 65536, torch.float32, device_info(dev)).impl


def test_autotune_switch_decides_between_autotuner_and_heuristic(monkeypatch):
    from conftest import DEVICE

    from tritonsoftmax.device import device_info
    from tritonsoftmax.kernels import tile

    x = torch.randn(8, 5000, device=DEVICE)
    y = torch.empty_like(x)
    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "0")
    assert tile.launch(x, y) == family("tile").heuristic(device_info(x.device), 8, 5000)
    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "1")
    if DEVICE == "cpu":  # on a GPU this would run the (slow) autotuner; test_gpu.py covers that
        assert tile.launch(x, y) is None


def test_launch_config_round_trips():
    c = LaunchConfig.make(8, 2, {"waves_per_eu": 2}, BLOCK=4096)
    assert LaunchConfig.from_dict(c.as_dict()) == c
    assert LaunchConfig.from_triton(c.to_triton()) == c
    with pytest.raises(ValueError, match="malformed"):
        LaunchConfig.from_dict({"BLOCK": 4096})


def test_device_names_and_warp_sizes():
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("AMD Instinct MI300X") == "mi300x"
    assert warp_size_for_arch("gfx942") == 64 and warp_size_for_arch("gfx90a") == 64
    assert warp_size_for_arch("gfx1201") == 32 and warp_size_for_arch("sm_90") == 32


@pytest.mark.parametrize("triton_version,numpy_version,conflict", [
    ("3.6.0", "2.4.0", True), ("3.6.1+git1a2b", "2.4.6", True), ("3.6.0", "2.3.5", False),
    ("3.7.0", "2.4.6", False), ("3.9.0", "3.0.0", False), ("3.10.0", "2.4.0", False)])
def test_interpreter_says_when_its_triton_and_numpy_cannot_run_the_kernels(triton_version, numpy_version, conflict,
                                                                           monkeypatch):
    """triton 3.6's interpreter calls int() on one-element arrays, which numpy 2.4 refuses: that pair is named with
    the fix, warned once when the interpreter's device is first asked for, and every other pair passes."""
    import warnings

    import numpy
    import triton

    from tritonsoftmax import device

    why = device.interpreter_numpy_conflict(triton_version, numpy_version)
    assert (why is not None) == conflict
    if conflict:
        assert triton_version in why and numpy_version in why and "numpy<2.4" in why
    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(numpy, "__version__", numpy_version)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    device._check_interpreter_numpy.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            device.device_info(torch.device("cpu"))
            device.device_info(torch.device("cpu"))
        assert [str(w.message) for w in seen] == ([f"tritonsoftmax: {why}"] if conflict else [])
    finally:
        device._check_interpreter_numpy.cache_clear()


@pytest.mark.parametrize("N,fp32,bf16", [
    (4097, "fused", "fused"), (8193, "fused", "fused"), (12345, "fused", "fused"), (16383, "fused", "fused"),
    (16385, "fused", "fused"), (20001, "fused", "online"), (32767, "fused", "online"), (32769, "coop", "online"),
    (65537, "coop", "coop")])
def test_many_16bit_rows_off_16_bytes_leave_fused_in_the_32k_bucket(N, fp32, bf16):
    """Rows that start off 16 bytes run realigned; in the 32K bucket the realigned online beats the
    realigned fused kernel for 16-bit rows, save rows just past 16K that fused holds as half a block plus a
    tail."""
    assert dispatch.choose(4096, N, torch.float32, SM90, aligned=False).impl == fp32
    assert dispatch.choose(4096, N, torch.bfloat16, SM90, aligned=False).impl == bf16
    assert dispatch.choose(4096, N, torch.float16, SM90, aligned=False).impl == bf16
    aligned_fwd = dispatch.choose(4096, N, torch.float32, SM90).impl
    assert aligned_fwd == ("fused" if N <= 32768 else "coop"), "aligned rows keep the fused rule"
    backward_off = dispatch.choose(4096, N, torch.float32, SM90, True, aligned=False).impl
    backward_on = dispatch.choose(4096, N, torch.float32, SM90, True).impl
    tail = dispatch.fused_held(dispatch.Shape(4096, N, torch.float32, SM90, True)) < next_power_of_2(N)
    assert backward_off == backward_on or (tail and backward_on == "fused"), (
        "the backward keeps its rules, but for aligned rows held with a tail (16385 on padded rows)")
    assert dispatch.choose(4096, N, torch.float32, GFX942, aligned=False).impl == dispatch.choose(
        4096, N, torch.float32, GFX942).impl, "measured on the H200 only"


def test_few_rows_off_16_bytes_keep_their_rules():
    for M in (1, 8, 200):
        for dtype in (torch.float32, torch.bfloat16):
            assert (dispatch.choose(M, 20001, dtype, SM90, aligned=False).impl
                    == dispatch.choose(M, 20001, dtype, SM90).impl)


def test_sm90_dispatch_matches_the_golden_file():
    """Every line of tests/data/dispatch_sm90.txt (family and config for a shape on the H200) is what the dispatcher
    gives now. A change that moves a decision must regenerate the file (python tests/dispatch_golden.py --write) and
    commit the diff on purpose."""
    from dispatch_golden import GOLDEN, lines

    want = GOLDEN.read_text().splitlines()
    got = lines()
    moved = [f"{w}  ->  {g.split(' ', 5)[5]}" for w, g in zip(want, got, strict=False) if w != g]
    assert len(got) == len(want) and not moved, f"{len(moved)} decisions moved, e.g.:\n" + "\n".join(moved[:20])


def _shapes():
    """Row lengths from 1 to 2**23 (the golden grid's), a few row counts, every dtype, both directions, contiguous
    rows and rows on a padded stride."""
    from dispatch_golden import row_lengths

    for N in row_lengths():
        for M in (1, 64, 4096):
            if M * N > 2**28:
                continue
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                aligned = whole_vectors(N, dtype.itemsize)
                for backward in (False, True):
                    for dense in (True, False):
                        yield M, N, dtype, backward, aligned or not dense, dense


@pytest.mark.parametrize("device", [SM90, SM89, GFX942, GFX1201], ids=lambda d: d.arch)
def test_every_shape_gets_a_plan_its_family_can_run_on_the_device(device):
    """Capabilities: fused only for rows it holds, the cooperative families (coop, smem) only on CUDA, smem only for
    rows it can copy on an sm_80+ GPU with Gluon, cluster configs only where the GPU has CTA clusters."""
    from tritonsoftmax.kernels import exchange
    from tritonsoftmax.kernels.fused import MAX_N

    for M, N, dtype, backward, aligned, dense in _shapes():
        p = dispatch.resolve("auto", M, N, dtype, device, backward, aligned, dense)
        shape = dispatch.Shape(M, N, dtype, device, backward, aligned, dense)
        where = (M, N, dtype, backward, aligned, dense, p.impl)
        assert p.impl in ALL_FAMILY_NAMES, where
        assert p.impl != "fused" or N <= MAX_N, where
        assert p.impl not in ("coop", "smem") or device.backend == "cuda", where
        assert p.impl != "smem" or dispatch.smem_copies(shape), where
        assert p.config is None or not dict(p.config.meta).get("CLUSTER") or exchange.has_clusters(device), where


def test_without_a_table_every_plan_comes_from_the_default_policy(monkeypatch):
    """With no shipped and no user table, the H200 gets the default policy (no measured value), none of the measured
    special cases fires, and no config comes from a table: only the rules written in device quantities decide."""
    from tritonsoftmax.policy import Policy, default_policy

    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE_SHIPPED", "0")
    dispatch.clear_cache()
    try:
        pol = policy_for(SM90)
        assert pol.source == () and vars(pol) == vars(default_policy(SM90))
        assert pol.reload is None and pol.smem_one_chunk is None and pol.smem_fp32_cluster is None
        assert pol.coop_resident_per_sm == SM90.regs_per_sm // (96 * 128) and pol.smem_min_n == 2 * 16384
        assert Policy.off_align_online_bucket is None and pol.off_align_online_bucket is None
        measured = (dispatch.realigned_16bit_rows, dispatch.smem_one_chunk_rows, dispatch.smem_held_rows,
                    dispatch.coop_tuned_16bit_backward, dispatch.smem_few_fp32_rows, dispatch.reload_row_config,
                    dispatch.smem_fp32_cluster_config)
        for M, N, dtype, backward, aligned, dense in _shapes():
            shape = dispatch.Shape(M, N, dtype, SM90, backward, aligned, dense)
            assert not any(rule(shape) for rule in measured), (M, N, dtype, backward, aligned, dense)
            p = dispatch.resolve("auto", M, N, dtype, SM90, backward, aligned, dense)
            assert p.config is None or p.config == dispatch.held_row_config(shape), (M, N, p)
    finally:
        monkeypatch.delenv("TRITONSOFTMAX_TUNE_CACHE_SHIPPED")
        dispatch.clear_cache()


def test_an_arch_file_policy_overrides_the_default_key_by_key(tmp_path, monkeypatch):
    """A user's table with a ``policy:`` mapping changes only the keys it names; unknown keys warn and are ignored."""
    import yaml

    from tritonsoftmax import tuning

    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE", str(tmp_path))
    path = tuning.table_path(tmp_path, GFX1201)
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"schema": tuning.SCHEMA, "entries": {},
                                    "policy": {"few_rows_per_sm": 3, "smem_fp32_few_rows": {"beyond": 2, "max_n": 64},
                                               "no_such_threshold": 1}}))
    dispatch.clear_cache()
    try:
        with pytest.warns(RuntimeWarning, match="no_such_threshold"):
            pol = policy_for(GFX1201)
        assert pol.few_rows_per_sm == 3 and pol.smem_fp32_few_rows == {"beyond": 2, "max_n": 64}
        assert pol.fused_programs_per_sm == policy_for(SM89).fused_programs_per_sm
        assert dispatch.few_rows(dispatch.Shape(3 * 64 - 1, 4096, torch.float32, GFX1201))
        assert not dispatch.few_rows(dispatch.Shape(3 * 64, 4096, torch.float32, GFX1201))
    finally:
        dispatch.clear_cache()


def test_plans_carry_the_arch_policys_launch_modes_to_the_launch(monkeypatch):
    """The launch modes a launch picks for itself (stagger, per-word departure, smem's backward clusters) are
    measured bounds from the arch's policy: an H200 plan carries the shipped ones and its launch gets them through
    execute; a GPU with no table gets none (every such mode off)."""
    from tritonsoftmax import execute
    from tritonsoftmax.kernels.launch_modes import NO_MODES, LaunchModes
    from tritonsoftmax.layout import matrix_problem

    h200 = sm90_launch_modes()
    assert h200.stagger and h200.per_word and h200.smem_bwd_cluster
    assert dispatch.resolve("coop", 8, 131072, torch.float32, SM90).modes == h200
    assert dispatch.resolve("coop", 8, 131072, torch.float32, SM89).modes == NO_MODES
    monkeypatch.setattr(dispatch, "device_info", lambda device: SM90)
    dispatch.clear_cache()
    try:
        x = torch.zeros(8, 131072)
        launch = execute.prepare_launch(matrix_problem(x, x), x, x, "coop", {"LOG": 0, "ZERO_MASKED": 0}, False)
        assert launch.modes == h200
    finally:
        dispatch.clear_cache()
    with pytest.raises(TypeError, match="unknown launch modes"):
        LaunchModes.from_values({"stager": {}})
