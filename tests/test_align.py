"""Rows that start off a 16-byte boundary (a row length that is not a multiple of 16 bytes): the
forward kernels' realigned path (ALIGN > 1, row_ops.row_window) and the rule that turns it on. Rows on
16-byte boundaries whose length is not a multiple of 16 elements: the fused kernels' VEC declaration
(constexprs.row_vec)."""

import json
import re

import pytest
import torch
from compile_scripts import run_compile_script
from conftest import DEVICE
from softmax_ref import assert_softmax_close, grad_reference, poisoned_like, random_input

from tritonsoftmax.config import LaunchConfig, next_power_of_2
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import backward_family, constexprs, family
from tritonsoftmax.layout import RowProblem, RowStrides, matrix_problem

REALIGNED = [
    ("fused", LaunchConfig.make(2, BLOCK_N=256, ROWS=2)),
    ("fused", LaunchConfig.make(1, BLOCK_N=256, ROWS=1)),
    ("fused", LaunchConfig.make(2, BLOCK_N=256, ROWS=1, STAGES=2, PER_SM=1)),  # persistent rows
    ("online", LaunchConfig.make(2, BLOCK=32)),
    ("split", LaunchConfig.make(1, BLOCK=32, TILES=2, BLOCK_G=4)),
    ("split", LaunchConfig.make(1, BLOCK=64, TILES=1, BLOCK_G=4)),
    ("coop", LaunchConfig.make(2, BLOCK=64, TILES=1, BLOCK_G=4)),
    ("coop", LaunchConfig.make(2, BLOCK=16, TILES=2, BLOCK_G=16)),
]
IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in c.meta)}" for name, c in REALIGNED]


def _problem(N: int, x_outer: int, y_outer: int | None = None, col: int = 1) -> RowProblem:
    return RowProblem(4, N, 1, RowStrides(x_outer, 0, col), RowStrides(y_outer or x_outer, 0, col))


def test_row_align_turns_on_for_rows_off_16_bytes_only():
    assert constexprs.row_align(_problem(2051, 2051), 4, 4) == 4
    assert constexprs.row_align(_problem(2051, 2051), 2, 2) == 8
    assert constexprs.row_align(_problem(2051, 2051), 2, 4) == 8, "the narrower dtype sets the group"
    assert constexprs.row_align(_problem(2052, 2052), 4, 4) == 1, "2052 fp32 = 8208 bytes: every row is aligned"
    assert constexprs.row_align(_problem(2052, 2052), 2, 2) == 8, "2052 fp16 = 4104 bytes: not a multiple of 16"
    assert constexprs.row_align(_problem(2051, 2056), 4, 4) == 1, "a padded row stride keeps rows aligned"
    assert constexprs.row_align(_problem(2051, 2051, 2052), 4, 4) == 1, "x and y in different layouts"
    assert constexprs.row_align(_problem(2051, 2051, col=2), 4, 4) == 1, "strided columns"
    short = constexprs.ALIGN_MIN_N - 1
    assert constexprs.row_align(_problem(short, short), 4, 4) == 1, "short rows keep the plain path"


@pytest.mark.parametrize("N", [7, 203, 250])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("impl,config", REALIGNED, ids=IDS)
def test_realigned_path_matches_reference(impl, config, dtype, N):
    """Every row of an odd-length matrix starts at a different offset within its 16-byte group;
    N = 250 puts some rows' tail group past the 256-wide window, N = 7 has rows that start and
    end inside one group. The plain path (ALIGN = 1) and the realigned one both match float64."""
    x = random_input((9, N), dtype, DEVICE, seed=N)
    x[4] = float("-inf")  # an all -inf row: NaN like torch (the zero_masked case is below)
    vec = 16 // x.element_size()
    for align in (1, vec):
        y = poisoned_like(x)
        fam = family(impl)
        fam.prepare(matrix_problem(x, y), config, device_info(x.device),
                    flags={"LOG": 0, "ZERO_MASKED": 0, "ALIGN": align})(x, y, 1.0)
        assert_softmax_close(y, x)


@pytest.mark.parametrize("impl,config", REALIGNED, ids=IDS)
def test_realigned_path_log_softmax_zero_masked_and_scale(impl, config):
    x = random_input((6, 203), torch.float32, DEVICE, seed=3)
    x[2] = float("-inf")
    y = poisoned_like(x)
    family(impl).prepare(matrix_problem(x, y), config, device_info(x.device),
                         flags={"LOG": 0, "ZERO_MASKED": 1, "ALIGN": 4})(x, y, 0.5)
    expect = torch.softmax(x.double() * 0.5, -1)
    expect[2] = 0.0
    torch.testing.assert_close(y.double(), expect, rtol=0, atol=2e-6)
    y = poisoned_like(x)
    family(impl).prepare(matrix_problem(x, y), config, device_info(x.device),
                         flags={"LOG": 1, "ZERO_MASKED": 0, "ALIGN": 4})(x, y, 0.5)
    ok = torch.arange(6) != 2
    torch.testing.assert_close(y[ok].double(), torch.log_softmax(x[ok].double() * 0.5, -1), rtol=0, atol=1e-5)


CHOSEN = [("fused", LaunchConfig.make(4, BLOCK_N=4096, ROWS=1)), ("online", LaunchConfig.make(4, BLOCK=512)),
          ("split", LaunchConfig.make(4, BLOCK=256, TILES=2, BLOCK_G=8)),
          ("coop", LaunchConfig.make(4, BLOCK=512, TILES=1, BLOCK_G=8))]


@pytest.mark.parametrize("M", [3, 1], ids=["rows-off-16-bytes", "one-row"])
@pytest.mark.parametrize("impl,config", CHOSEN, ids=[name for name, _ in CHOSEN])
def test_a_launch_of_odd_rows_chooses_the_realigned_path(impl, config, M):
    """Three rows of 2051 start off 16 bytes; one row of 2051 starts aligned but is not whole groups."""
    x = random_input((M, 2051), torch.float16, DEVICE, seed=M)
    y = poisoned_like(x)
    prepared = family(impl).prepare(matrix_problem(x, y), config, device_info(x.device),
                                    flags={"LOG": 0, "ZERO_MASKED": 0})
    prepared(x, y, 1.0)
    launches = getattr(prepared, "launches", None) or [getattr(prepared, "_first", prepared),
                                                       getattr(prepared, "_second", prepared)]
    assert all(p.flags["ALIGN"] == 8 for p in launches)
    assert_softmax_close(y, x)


def test_row_align_turns_on_for_a_single_row_of_partial_groups():
    """One row starts where its tensor starts (aligned), but an N that is not whole 16-byte groups
    leaves masked loads one element wide: the realigned path (tail group) takes it."""
    def one(N):
        return RowProblem(1, N, 1, RowStrides(0, 0, 1), RowStrides(0, 0, 1))

    assert constexprs.row_align(one(2051), 4, 4) == 4
    assert constexprs.row_align(one(100003), 2, 2) == 8
    assert constexprs.row_align(one(2052), 4, 4) == 1, "whole fp32 groups: VEC declares them"
    assert constexprs.row_align(one(2052), 2, 2) == 8, "2052 fp16 is half a group short"
    assert constexprs.row_align(one(2047), 2, 2) == 1, "short rows keep the plain path"
    assert constexprs.row_align(_problem(2051, 2056), 4, 4) == 1, "several padded rows: unchanged"


def test_rows_aligned_is_about_every_row_of_both_tensors():
    assert _problem(2048, 2048).rows_aligned(4, 4)
    assert not _problem(2051, 2051).rows_aligned(4, 4)
    assert _problem(2052, 2052).rows_aligned(4, 4) and not _problem(2052, 2052).rows_aligned(2, 2)
    assert not _problem(2048, 2048, 2051).rows_aligned(4, 4), "the output's rows count too"
    assert not _problem(2048, 2048, col=2).rows_aligned(4, 4)


def test_the_dispatcher_hears_whether_rows_are_aligned(monkeypatch):
    import tritonsoftmax
    from tritonsoftmax import dispatch

    seen = []
    real = dispatch.plan

    def spy(*args, **kwargs):
        seen.append(args[7] if len(args) >= 8 else kwargs.get("aligned", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "plan", spy)
    tritonsoftmax.clear_caches()
    for N in (2048, 2051):
        x = random_input((2, N), torch.float32, DEVICE)
        assert_softmax_close(tritonsoftmax.softmax(x), x)
    assert seen == [True, False]


BACKWARD = [(name, c) for name, c in REALIGNED if "STAGES" not in dict(c.meta)]


@pytest.mark.parametrize("log", [0, 1], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("N", [203, 250])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("impl,config", BACKWARD, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in c.meta)}"
                                                        for n, c in BACKWARD])
def test_realigned_backward_matches_reference(impl, config, dtype, N, log):
    """The backward kernels' realigned path (dy, y and dx in one layout) against float64."""
    x = random_input((9, N), torch.float32, DEVICE, seed=N + log)
    y = (torch.log_softmax(x, -1) if log else torch.softmax(x, -1)).to(dtype)
    dy = random_input((9, N), dtype, DEVICE, seed=7)
    ref = grad_reference(dy, y, log=bool(log))
    rtol, atol = {torch.float32: (0, 1e-5), torch.float16: (2e-3, 4e-3)}[dtype]  # fp16 dx rounds at |dx| ~ 30
    for align in (1, 16 // y.element_size()):
        dx = poisoned_like(y)
        backward_family(impl).prepare(matrix_problem(dy, dx), config, device_info(y.device),
                                      flags={"LOG": log, "ALIGN": align})(dy, dx, y, 1.0)
        torch.testing.assert_close(dx.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("impl,config", CHOSEN, ids=[name for name, _ in CHOSEN])
def test_a_backward_of_odd_rows_chooses_the_realigned_path(impl, config):
    y = torch.softmax(random_input((3, 2051), torch.float32, DEVICE), -1)
    dy = random_input((3, 2051), torch.float32, DEVICE, seed=1)
    dx = poisoned_like(y)
    prepared = backward_family(impl).prepare(matrix_problem(dy, dx), config, device_info(y.device), flags={"LOG": 0})
    prepared(dy, dx, y, 1.0)
    launches = getattr(prepared, "launches", None) or [getattr(prepared, "_first", prepared),
                                                       getattr(prepared, "_second", prepared)]
    assert all(p.flags["ALIGN"] == 4 for p in launches)
    torch.testing.assert_close(dx.double(), grad_reference(dy, y), rtol=0, atol=1e-6)


@pytest.mark.parametrize("impl,config", CHOSEN, ids=[name for name, _ in CHOSEN])
def test_realigned_path_is_exact_when_the_base_pointer_is_off_16_bytes(impl, config):
    """The window is computed from element offsets, assuming a 16-byte aligned base; from any other
    base (a view at storage offset 3) the result is still exact, only not vectorised."""
    storage = random_input((3 * 2051 + 3,), torch.float16, DEVICE, seed=11)
    x = storage[3:].view(3, 2051)
    y = poisoned_like(x)
    family(impl).prepare(matrix_problem(x, y), config, device_info(x.device),
                         flags={"LOG": 0, "ZERO_MASKED": 0, "ALIGN": 8})(x, y, 1.0)
    assert_softmax_close(y, x)


def test_row_vec_declares_the_widest_vectors_rows_are_made_of():
    assert constexprs.row_vec(_problem(200, 200), 4, 4) == 4, "800-byte rows of 200 fp32"
    assert constexprs.row_vec(_problem(136, 136), 2, 2) == 8, "272-byte rows of 136 bf16"
    assert constexprs.row_vec(_problem(200, 200), 4, 2) == 4, "the wider dtype sets the vector"
    assert constexprs.row_vec(_problem(100, 100), 2, 2) == 4, "200-byte rows start on 8 bytes: 8-byte vectors"
    assert constexprs.row_vec(_problem(102, 102), 2, 2) == 2, "204-byte rows start on 4 bytes"
    assert constexprs.row_vec(_problem(101, 101), 2, 2) == 1, "odd N"
    assert constexprs.row_vec(_problem(202, 202), 4, 4) == 2, "N whole 8-byte vectors only"
    assert constexprs.row_vec(_problem(200, 208), 4, 4) == 4, "a padded row stride"
    assert constexprs.row_vec(_problem(200, 202), 4, 4) == 2, "a row stride off 16 bytes"
    assert constexprs.row_vec(_problem(200, 201), 4, 4) == 1, "an odd row stride"
    assert constexprs.row_vec(_problem(200, 200, 202), 4, 4) == 2, "the output's stride counts too"
    assert constexprs.row_vec(_problem(200, 200, col=2), 4, 4) == 1, "strided columns"
    assert constexprs.row_vec(_problem(200, 200), 8, 8) == 2
    assert constexprs.row_vec(_problem(256, 256), 4, 4) == 1, "Triton knows 256 and its strides are multiples of 16"
    assert constexprs.row_vec(_problem(256, 264), 4, 4) == 4, "a row stride of 264 it does not"
    assert constexprs.row_vec(_problem(256, 260), 2, 2) == 4, "260 bf16 = 520 bytes"


VEC_CASES = [(torch.float32, 200, 4), (torch.float16, 136, 8), (torch.float32, 1000, 4), (torch.float16, 2056, 8),
             (torch.float16, 100, 4), (torch.float32, 202, 2), (torch.float16, 2054, 2)]


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype,N,vec", VEC_CASES, ids=[f"{str(d)[6:]}-{n}" for d, n, _ in VEC_CASES])
def test_fused_vec_path_matches_reference_and_writes_no_padding(dtype, N, vec, rows):
    """A row stride padded past N (N + 8 elements): the declared vectors must not reach the padding.
    fp16 2054: VEC 2 together with the realigned one-row path (ALIGN 8) and the plain several-row one."""
    config = LaunchConfig.make(2, BLOCK_N=next_power_of_2(N), ROWS=rows)
    for padded in (False, True):
        cols = N + 8 if padded else N
        x = random_input((5, cols), dtype, DEVICE, seed=N + rows)[:, :N]
        x[2] = float("-inf")
        out = poisoned_like(random_input((5, cols), dtype, DEVICE))
        y = out[:, :N]
        prepared = family("fused").prepare(matrix_problem(x, y), config, device_info(x.device),
                                           flags={"LOG": 0, "ZERO_MASKED": 0})
        prepared(x, y, 1.0)
        assert prepared.flags["VEC"] == vec
        assert prepared.flags["ALIGN"] == (8 if N == 2054 else 1), "2054 fp16 rows start off 16 bytes: realigned"
        assert_softmax_close(y, x)
        assert torch.isnan(out[:, N:]).all(), "the padding stays untouched"
        yb = torch.softmax(random_input((5, cols), dtype, DEVICE, seed=2).float(), -1).to(dtype)[:, :N]
        dy = random_input((5, cols), dtype, DEVICE, seed=3)[:, :N]
        assert dy.stride() == yb.stride()
        out = poisoned_like(random_input((5, cols), dtype, DEVICE))
        dx = out[:, :N]
        back = backward_family("fused").prepare(matrix_problem(dy, dx), config, device_info(yb.device),
                                                flags={"LOG": 0})
        back(dy, dx, yb, 1.0)
        assert back.flags["VEC"] == vec
        rtol, atol = {torch.float32: (0, 1e-5), torch.float16: (2e-3, 4e-3)}[dtype]
        torch.testing.assert_close(dx.double(), grad_reference(dy, yb), rtol=rtol, atol=atol)
        assert torch.isnan(out[:, N:]).all()


ROW_KERNELS = {  # (module, kernel): the constexprs without a default; whether it stores rows
    ("fused", "_softmax_fused_fwd_kernel"): ({"LOG": 0, "ZERO_MASKED": 0, "BLOCK_N": 256, "ROWS": 8}, True),
    ("fused", "_softmax_fused_bwd_kernel"): ({"LOG": 0, "BLOCK_N": 256, "ROWS": 8}, True),
    ("online", "_softmax_online_fwd_kernel"): ({"LOG": 0, "ZERO_MASKED": 0, "BLOCK": 1024}, True),
    ("online", "_softmax_online_bwd_kernel"): ({"LOG": 0, "BLOCK": 1024}, True),
    ("tile", "_softmax_tile_fwd_kernel"): ({"LOG": 0, "ZERO_MASKED": 0, "BLOCK": 1024}, True),
    ("split", "_softmax_split_stats_kernel"): ({"LOG": 0, "ZERO_MASKED": 0, "BLOCK": 1024, "TILES": 2,
                                                "BLOCK_G": 16}, False),
    ("split", "_softmax_split_write_kernel"): ({"LOG": 0, "ZERO_MASKED": 0, "BLOCK": 1024, "TILES": 2,
                                                "BLOCK_G": 16}, True),
    ("split", "_softmax_split_bwd_partial_kernel"): ({"LOG": 0, "BLOCK": 1024, "TILES": 2, "BLOCK_G": 16}, False),
    ("split", "_softmax_split_bwd_write_kernel"): ({"LOG": 0, "BLOCK": 1024, "TILES": 2, "BLOCK_G": 16}, True),
    ("coop", "_softmax_coop_fwd_kernel"): ({"LOG": 0, "ZERO_MASKED": 0, "BLOCK": 1024, "TILES": 1, "BLOCK_G": 64,
                                            "PHASE": 0}, True),
    ("coop", "_softmax_coop_bwd_kernel"): ({"LOG": 0, "BLOCK": 1024, "TILES": 1, "BLOCK_G": 64, "PHASE": 0}, True),
}
VEC_DTYPES = (("fp32", 4), ("bf16", 8))


@pytest.fixture(scope="module")
def row_kernel_ptx() -> dict:
    cases = [[mod, name, dtype, {**const, "VEC": v}] for (mod, name), (const, _) in ROW_KERNELS.items()
             for dtype, vec in VEC_DTYPES for v in (1, vec)]
    ptxs = run_compile_script("kernel_compile.py", json.dumps(cases))
    return {(name, dtype, c["VEC"]): ptx for (_, name, dtype, c), ptx in zip(cases, ptxs, strict=True)}


def _global_ops(ptx: str, op: str) -> tuple[int, int]:
    """(16-byte, scalar) global loads or stores in ``ptx``."""
    lines = [line for line in ptx.splitlines() if f"{op}.global" in line]
    return sum(".v4." in line for line in lines), sum(".v2." not in line and ".v4." not in line for line in lines)


@pytest.mark.parametrize("dtype,vec", VEC_DTYPES)
@pytest.mark.parametrize("kernel", [name for _, name in ROW_KERNELS], ids=lambda n: n[9:-7])
def test_rows_of_whole_vectors_load_and_store_16_bytes_at_a_time(row_kernel_ptx, kernel, dtype, vec):
    """Triton knows a 32-bit argument's divisibility by 16 only: rows of 200 fp32 are read one element
    a load unless VEC says N and the row strides are whole vectors. The scalar loads left with VEC are
    the exchange's workspace words (split, coop); a few scalar stores are coop's words."""
    stores_rows = next(s for (_, name), (_, s) in ROW_KERNELS.items() if name == kernel)
    declared, plain = row_kernel_ptx[(kernel, dtype, vec)], row_kernel_ptx[(kernel, dtype, 1)]
    wide_ld, scalar_ld = _global_ops(declared, "ld")
    assert wide_ld > 0 and scalar_ld <= 2, (wide_ld, scalar_ld)
    assert _global_ops(plain, "ld")[0] == 0 and _global_ops(plain, "ld")[1] > 2
    if stores_rows:
        wide_st, scalar_st = _global_ops(declared, "st")
        assert wide_st > 0 and scalar_st < _global_ops(plain, "st")[1], (wide_st, scalar_st)
        assert _global_ops(plain, "st")[0] == 0


NARROW_VECTORS = {4: "ld.global.v2.b32", 2: "ld.global.b32"}  # VEC bf16 elements: the one row load width


@pytest.mark.parametrize("vec", sorted(NARROW_VECTORS))
def test_rows_on_8_or_4_byte_boundaries_load_8_or_4_bytes_at_a_time(vec):
    """Rows of 100 bf16 (200 bytes) start on 8-byte boundaries: row_vec gives VEC 4, and the fused
    kernels' loads and stores are 8 bytes wide instead of 2; 102 bf16, VEC 2: 4 bytes."""
    cases = [["fused", name, "bf16", {**const, "VEC": vec}] for (mod, name), (const, _) in ROW_KERNELS.items()
             if mod == "fused"]
    for ptx in run_compile_script("kernel_compile.py", json.dumps(cases)):
        ops = [word for line in ptx.splitlines() for word in line.split() if ".global." in word]
        loads = {op for op in ops if op.startswith("ld.")}
        stores = {op for op in ops if op.startswith("st.")}
        assert loads == {NARROW_VECTORS[vec]}, loads
        assert stores == {NARROW_VECTORS[vec].replace("ld.", "st.")}, stores


def test_fused_backward_reload_loads_the_tile_twice_with_distinct_eviction_hints():
    """RELOAD (one row of 16384 bf16, 32 warps' worth of columns, and a several-row tile): the first loads
    are evict_last, the second evict_first, as many of each as the one-load kernel has loads; without
    RELOAD no load carries a hint (so the compiler is free to keep the row in registers)."""
    base = {"LOG": 0, "VEC": 8}
    shapes = [{"BLOCK_N": 16384, "ROWS": 1}, {"BLOCK_N": 512, "ROWS": 4}]
    cases = [["fused", "_softmax_fused_bwd_kernel", "bf16", {**base, **shape, **reload}]
             for shape in shapes for reload in ({}, {"RELOAD": 1})]
    ptxs = run_compile_script("kernel_compile.py", json.dumps(cases))
    for plain, twice in zip(ptxs[::2], ptxs[1::2], strict=True):
        loads = [line for line in plain.splitlines() if "ld.global" in line]
        assert loads and not [line for line in loads if "evict" in line]
        first = [line for line in twice.splitlines() if "ld.global.L1::evict_last" in line]
        second = [line for line in twice.splitlines() if "ld.global.L1::evict_first" in line]
        assert len(first) == len(second) == len(loads), (len(first), len(second), len(loads))
        lines = twice.splitlines()
        assert max(lines.index(line) for line in first) < min(lines.index(line) for line in second)


def test_fused_i32_tiles_compile_for_sm_90_with_32_bit_offset_arithmetic():
    """I32 several-row tiles (fused forward and backward, 4 rows of 256 bf16) compile for sm_90 (the interpreter
    cannot tell: triton 3.6 once refused two return types in _tile_offsets), and their offsets stay 32-bit until
    the address: no 64-bit shift scales an offset by the element size, and fewer 64-bit adds than without I32."""
    kernels = (("_softmax_fused_fwd_kernel", {"ZERO_MASKED": 0}), ("_softmax_fused_bwd_kernel", {}))
    cases = [["fused", name, "bf16", {"LOG": 0, **extra, "BLOCK_N": 256, "ROWS": 4, "I32": i32}]
             for name, extra in kernels for i32 in (0, 1)]
    ptxs = run_compile_script("kernel_compile.py", json.dumps(cases))
    for plain, narrow in zip(ptxs[::2], ptxs[1::2], strict=True):
        def ops(ptx, op):
            return sum(line.split()[0] == op for line in ptx.splitlines() if line.strip())

        assert ops(plain, "shl.b64") > 0 and ops(narrow, "shl.b64") == 0
        assert ops(narrow, "add.s64") < ops(plain, "add.s64")


@pytest.mark.parametrize("block,mid,tail", [(8192, 2048, 512), (16384, 2048, 1024)], ids=["6464", "10816"])
def test_fused_rows_in_three_pieces_compile_for_sm_90_and_load_what_they_hold(block, mid, tail):
    """MID (a row of 6464 bf16 in an 8192 block as 4096 + 2048 + 512 positions; 10816 in 16384 as 8192 + 2048 +
    1024) compiles for sm_90 forward and backward, one row and two rows a program (the interpreter cannot tell), and
    loads (half + MID + TAIL) / block of what the whole block loads: the pieces' loads, none for the block's empty
    end."""
    base = {"LOG": 0, "BLOCK_N": block}
    kernels = (("_softmax_fused_fwd_kernel", {"ZERO_MASKED": 0}), ("_softmax_fused_bwd_kernel", {}))
    cases = [["fused", name, "bf16", {**base, **extra, "ROWS": rows, **pieces}]
             for name, extra in kernels for rows in (1, 2) for pieces in ({}, {"MID": mid, "TAIL": tail})]
    ptxs = run_compile_script("kernel_compile.py", json.dumps(cases))
    for whole, pieces in zip(ptxs[::2], ptxs[1::2], strict=True):
        loads = [ptx.count("ld.global") for ptx in (whole, pieces)]
        assert loads[1] * block == loads[0] * (block // 2 + mid + tail), loads


def test_folded_pieces_reduce_once_across_the_program():
    """FOLD (a bf16 row of 1536 as 1024 + 512 on 2 warps: the tail spans the layout's 8 x 64 elements): the half
    folds onto the tail in registers, so the max and the sum cross the program's warps once each (fewer barriers,
    half the shuffles), with the same loads and one exp an element either way (the compiled sm_90 PTX)."""
    base = {"LOG": 0, "ZERO_MASKED": 0, "BLOCK_N": 2048, "ROWS": 1, "TAIL": 512, "VEC": 8}
    cases = [["fused", "_softmax_fused_fwd_kernel", "bf16", {**base, "FOLD": fold}] for fold in (0, 1)]
    plain, folded = run_compile_script("kernel_compile.py", json.dumps(cases))
    assert folded.count("bar.sync") < plain.count("bar.sync")
    assert 2 * folded.count("shfl.sync") == plain.count("shfl.sync")
    assert folded.count("ld.global") == plain.count("ld.global")
    assert folded.count("ex2.approx") == plain.count("ex2.approx") == (1024 + 512) // 64


# PTX opcodes of arithmetic on loaded values: conversions from 16-bit floats and fp32 arithmetic.
FLOAT_OPS = ("cvt.f32", "fma.rn.f32", "mul.f32", "max.f32", "sub.f32", "add.f32")
PTX_REG = re.compile(r"%[a-z]+[0-9]+")


def float_ops_on_loaded_values(body: list[str]) -> list[int]:
    """Indices of the PTX lines ``body`` (one instruction each) that are FLOAT_OPS with an operand computed from a
    global load: registers a load writes, and those written from them, followed in program order (arithmetic on
    kernel arguments alone, such as a scale times a constant, is not on a loaded value)."""
    loaded: set[str] = set()
    hits = []
    for i, line in enumerate(body):
        words = line.rstrip(";").split(None, 1)
        if words[0].startswith("@"):
            words = words[1].split(None, 1)
        if len(words) < 2 or words[0].startswith("st."):
            continue
        op, operands = words
        if operands.startswith("{"):
            dest_text, _, src_text = operands[1:].partition("}")
        else:
            dest_text, _, src_text = operands.partition(",")
        dests, srcs = PTX_REG.findall(dest_text), PTX_REG.findall(src_text)
        if op.startswith("ld.global") or loaded.intersection(srcs):
            loaded.update(dests)
            if op.startswith(FLOAT_OPS) and not op.startswith("ld."):
                hits.append(i)
    return hits


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("rows,mid,tail", [(1, 0, 1024), (1, 1024, 512), (2, 0, 1024), (2, 1024, 512)],
                         ids=["two-pieces", "three-pieces", "two-rows", "two-rows-three-pieces"])
def test_held_pieces_load_before_any_arithmetic(dtype, rows, mid, tail):
    """A forward or backward that holds its rows in pieces (half + TAIL, half + MID + TAIL; one row and several)
    issues every piece's load before the first arithmetic on a loaded value (the compiled sm_90 PTX): a load placed
    after a piece's conversion or scaling would wait for the loads before it, and its latency would go unhidden."""
    kernels = (("_softmax_fused_fwd_kernel", {"ZERO_MASKED": 0}), ("_softmax_fused_bwd_kernel", {}))
    cases = [["fused", name, dtype, {"LOG": 0, **extra, "BLOCK_N": 16384, "ROWS": rows, "MID": mid, "TAIL": tail,
                                     "VEC": 16 // (4 if dtype == "fp32" else 2)}]
             for name, extra in kernels]
    for ptx in run_compile_script("kernel_compile.py", json.dumps(cases)):
        body = [line.strip() for line in ptx.splitlines() if line.strip() and not line.strip().startswith((".", "//"))]
        loads = [i for i, line in enumerate(body) if "ld.global" in line]
        floats = float_ops_on_loaded_values(body)
        assert loads and floats and max(loads) < min(floats), (loads[-3:], floats[:3])
