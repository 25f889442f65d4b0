"""Fused rows held as half a block plus a tail at any length (HELD): the tail each length gets, and every
element against float64, forward and backward, one-row and several-row tiles, on and off 16-byte boundaries; and
rows that fill their block (WHOLE) without column masks."""

import pytest
import torch
from conftest import DEVICE
from softmax_ref import assert_grad_close, poisoned_like, random_input

from tritonsoftmax.config import LaunchConfig, next_power_of_2
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import backward_family, constexprs, family
from tritonsoftmax.layout import matrix_problem

FWD_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("N,block,align,tail", [
    (1152, 2048, 1, 128),   # 1024 + 128
    (1025, 2048, 1, 1),     # one past a power of two
    (1535, 2048, 1, 512),   # 1024 + 512 covers it
    (1537, 2048, 1, 0),     # the tail would be the whole half: no saving
    (1023, 1024, 1, 0),     # one short of a power of two: 512 + 512 is the block
    (320, 512, 1, 64),
    (65, 128, 1, 1),
    (3, 4, 1, 1),
    (1152, 2048, 8, 128),   # a realigned 16-bit row: its whole groups in 1152 positions
    (1154, 2048, 8, 256),   # ... in 1160 positions: past 1024 + 128
    (1152, 4096, 1, 0),     # a block past next_pow2(N): the row fits its first half
])
def test_any_tail_holds_the_row_in_half_the_block_plus_a_power_of_two(N, block, align, tail):
    assert constexprs.row_tail(N, block, align, any_tail=True) == tail
    held = constexprs.held_length(N, block, align, any_tail=True)
    assert held == (block // 2 + tail if tail else block)
    assert held >= -(-N // align) * align, "the held positions cover the row's whole groups"


def test_without_held_only_small_tails_on_long_blocks():
    assert constexprs.row_tail(1152, 2048) == 0, "a tail of 1/16 of the block needs HELD"
    assert constexprs.row_tail(2049, 4096) == 1


# (dtype, N, rows a program): one past, one short of and a tail past a power of two, short and long rows
HELD_CASES = [
    (torch.float32, 1025, 1), (torch.float16, 1152, 1), (torch.bfloat16, 4480, 1), (torch.float32, 1023, 1),
    (torch.float16, 320, 4), (torch.bfloat16, 65, 8), (torch.float32, 1152, 2), (torch.float32, 2047, 2),
    (torch.bfloat16, 9024, 1), (torch.float16, 6720, 1),  # the H200's held_rows: 8192 + 1024; a tail of the half
]


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype,N,rows", HELD_CASES, ids=[f"{str(d)[6:]}-{n}-r{r}" for d, n, r in HELD_CASES])
def test_fused_held_rows_match_reference(dtype, N, rows, log, padded):
    """A HELD config over M rows (not a multiple of ROWS): the row's max in its tail, a row of -inf
    (zero_masked_rows), a padded row stride (one-row tiles of 16-bit rows then take the realigned path)
    that nothing may write into; forward and backward, every element."""
    _check_held(dtype, N, rows, log, padded, 1)


@pytest.mark.parametrize("N,block,align,pieces", [
    (6464, 8192, 1, (2048, 512)),   # 4096 + 2048 + 512
    (6145, 8192, 1, (2048, 1)),     # one past three quarters
    (7168, 8192, 1, (2048, 1024)),  # 4096 + 2048 + 1024
    (7169, 8192, 1, (0, 0)),        # the tail would be a quarter: the whole block
    (6144, 8192, 1, (0, 2048)),     # three quarters exactly: half + a 2048 tail (two pieces)
    (3200, 4096, 1, (1024, 128)),
    (1600, 2048, 1, (512, 64)),
    (6464, 8192, 8, (0, 0)),        # realigned rows: two pieces at most (this one none)
    (3, 4, 1, (0, 1)),              # 2 + 1: one tail holds it
    (4480, 8192, 1, (256, 128)),    # before three quarters: 4096 + 256 + 128, not 4096 + 512
    (10816, 16384, 1, (2048, 1024)),  # 8192 + 2048 + 1024, not 8192 + 4096
    (9920, 16384, 1, (0, 2048)),    # 8192 + 1024 + 1024 would hold no fewer than 8192 + 2048
    (4099, 8192, 1, (2, 1)),        # 4096 + 2 + 1
])
def test_three_pieces_hold_the_row_in_half_a_power_of_two_and_a_tail(N, block, align, pieces):
    assert constexprs.row_pieces(N, block, align) == pieces
    mid, tail = pieces
    held = constexprs.held_length(N, block, align, pieces=True)
    assert held == (block // 2 + mid + tail if mid else block // 2 + tail if tail else block)
    assert held >= -(-N // align) * align


# (dtype, N, rows a program): rows past three quarters of their block and before them, one-row and several-row tiles
THREE_PIECE_CASES = [(torch.float32, 6464, 1), (torch.bfloat16, 3200, 1), (torch.float16, 1600, 2),
                     (torch.float32, 6145, 2), (torch.bfloat16, 7168, 1), (torch.float32, 100, 4),
                     (torch.bfloat16, 10816, 1), (torch.float32, 4480, 2), (torch.float16, 4099, 1)]


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype,N,rows", THREE_PIECE_CASES,
                         ids=[f"{str(d)[6:]}-{n}-r{r}" for d, n, r in THREE_PIECE_CASES])
def test_fused_rows_in_three_pieces_match_reference(dtype, N, rows, log, padded):
    """A HELD 2 config: as the HELD test above, the row held as half, MID and tail wherever the launch
    can (realigned one-row tiles fall back to two pieces), forward and backward, every element."""
    _check_held(dtype, N, rows, log, padded, 2)


def _check_held(dtype, N, rows, log, padded, held):
    block = next_power_of_2(N)
    config = LaunchConfig.make(4, BLOCK_N=block, ROWS=rows, HELD=held)
    M = 3 * rows + 1
    cols = N + 3 if padded else N
    x = random_input((M, cols), dtype, DEVICE, seed=N)[:, :N]
    x[0, N - 1] = 40.0  # the row's max, in the tail
    x[2] = float("-inf")
    out = poisoned_like(random_input((M, cols), dtype, DEVICE))
    y = out[:, :N]
    fwd = family("fused").prepare(matrix_problem(x, y), config, device_info(x.device),
                                  flags={"LOG": int(log), "ZERO_MASKED": 1})
    fwd(x, y, 1.0)
    align = fwd.flags["ALIGN"]
    mid, tail = constexprs.row_pieces(N, block, align) if held == 2 else (0, constexprs.row_tail(N, block, align,
                                                                                                  any_tail=True))
    assert (fwd.flags["MID"], fwd.flags["TAIL"]) == (mid, tail)
    want = torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)
    want[2] = 0.0
    got = y.double()
    assert torch.equal(got[2], want[2].to(got.device)), "the -inf row"
    keep = [r for r in range(M) if r != 2]
    err = (got[keep] - want[keep].to(got.device)).abs() / want[keep].to(got.device).abs().clamp(min=1)
    assert err.max().item() <= FWD_TOL[dtype]
    assert torch.isnan(out[:, N:]).all(), "the padding stays untouched"

    probs = torch.softmax(random_input((M, cols), dtype, DEVICE, seed=1).float(), -1)
    ys = (probs.log() if log else probs).to(dtype)[:, :N]
    dy = random_input((M, cols), dtype, DEVICE, seed=2)[:, :N]
    out = poisoned_like(random_input((M, cols), dtype, DEVICE))
    dx = out[:, :N]
    back = backward_family("fused").prepare(matrix_problem(dy, dx), config, device_info(dy.device),
                                            flags={"LOG": int(log)})
    back(dy, dx, ys, 1.0)
    align = back.flags["ALIGN"]
    mid, tail = constexprs.row_pieces(N, block, align) if held == 2 else (0, constexprs.row_tail(N, block, align,
                                                                                                  any_tail=True))
    assert (back.flags["MID"], back.flags["TAIL"]) == (mid, tail)
    assert_grad_close(dx, dy, ys, log=log)
    assert torch.isnan(out[:, N:]).all()


def test_several_row_tiles_hold_no_tail_unless_asked():
    x = random_input((8, 1152), torch.float32, DEVICE)
    y = torch.empty_like(x)
    plain = family("fused").prepare(matrix_problem(x, y), LaunchConfig.make(4, BLOCK_N=2048, ROWS=2),
                                    device_info(x.device), flags={"LOG": 0, "ZERO_MASKED": 0})
    plain(x, y, 1.0)
    assert plain.flags["TAIL"] == 0
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-6)


# (dtype, N, rows a program, HELD): one row with a tail, one row in three pieces, several rows with a tail and in
# three pieces
RAW_CASES = [(torch.float32, 1152, 1, 1), (torch.bfloat16, 4480, 1, 2), (torch.float16, 1152, 2, 1),
             (torch.float32, 6464, 2, 2)]
EXTREME_SCALES = [1.0, 0.37, -0.5, 0.0]


def _extreme_rows(dtype, N, M, seed):
    """M rows of N: row 0 its max in the half; 1 a huge value in the half and a huge negative in the tail; 2 some
    -inf in the half and the tail; 3 a +inf in the half; 4 a NaN in the half; 5 all -inf; the rest random."""
    big = 6e4 if dtype == torch.float16 else 3e38
    x = random_input((M, N), torch.float32, "cpu", seed=seed)
    x[0, 7] = 40.0
    x[1, 3], x[1, N - 1] = big, -big
    x[2, ::5] = float("-inf")
    x[3, 11] = float("inf")
    x[4, 2] = float("nan")
    x[5] = float("-inf")
    return x.to(DEVICE, dtype)


def _scaled_reference(x, scales, log, zero_masked):
    """torch's softmax of x * scale in float64 (NaN where torch gives NaN), rows of all -inf 0 with zero_masked."""
    z = x.double() * scales.double()[:, None]
    want = torch.log_softmax(z, -1) if log else torch.softmax(z, -1)
    if zero_masked:
        want[(z == float("-inf")).all(-1)] = 0.0
    return want


def _assert_scaled_close(out, x, scales, log, zero_masked, dtype, what):
    """``out`` against _scaled_reference: NaN exactly where it is NaN, -inf where it is -inf once rounded to
    ``dtype`` (log-probabilities past the dtype's range), every other element within FWD_TOL."""
    want = _scaled_reference(x.cpu(), scales, log, zero_masked)
    got = out.double().cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: NaN where torch's is NaN"
    ok = ~torch.isnan(want)
    inf = torch.isinf(want.to(dtype))
    assert torch.equal(torch.isinf(got[ok]), inf[ok]), f"{what}: -inf where torch's is, in {dtype}"
    fin = ok & ~inf
    err = ((got - want).abs() / want.abs().clamp(min=1))[fin].max().item()
    assert err <= FWD_TOL[dtype], f"{what}: {err}"


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("per_row", [False, True], ids=["scale", "row-scales"])
@pytest.mark.parametrize("dtype,N,rows,held", RAW_CASES,
                         ids=[f"{str(d)[6:]}-{n}-r{r}-held{h}" for d, n, r, h in RAW_CASES])
def test_held_pieces_take_any_scale_and_extreme_values(dtype, N, rows, held, per_row, log):
    """Rows held in pieces: positive, negative and zero scales, one for all rows or one a row, with the max in the
    half, huge values, -inf, +inf and NaN in the half and a row of all -inf; every element against torch's float64
    softmax of x * scale (NaN where torch's is NaN)."""
    block = next_power_of_2(N)
    M = 4 * len(EXTREME_SCALES) * rows + 1
    x = _extreme_rows(dtype, N, M, seed=N)
    config = LaunchConfig.make(4, BLOCK_N=block, ROWS=rows, HELD=held)
    for i, s in enumerate(EXTREME_SCALES):
        scales = torch.tensor([EXTREME_SCALES[(r + i) % 4] for r in range(M)] if per_row else [s] * M)
        out = poisoned_like(x)
        flags = {"LOG": int(log), "ZERO_MASKED": 1, **({"ROW_SCALE": 1} if per_row else {})}
        fwd = family("fused").prepare(matrix_problem(x, out), config, device_info(x.device), flags=flags)
        fwd(x, out, scales.to(DEVICE, torch.float32) if per_row else s)
        assert fwd.flags["TAIL"] > 0 and fwd.flags["ALIGN"] == 1, "the held form on the plain path"
        assert fwd.flags["MID"] > 0 or held == 1
        _assert_scaled_close(out, x, scales, log, True, dtype, f"scale {s}")
        if per_row:
            break  # the per-row scales already cycled through every sign


# (dtype, N, warps, HELD): tails that span a repetition of the layout (16 bytes a thread over 4 warps: 512 fp32,
# 1024 16-bit elements), so the half (and MID) fold onto them (FOLD), two and three pieces
FOLD_CASES = [(torch.float32, 1536, 4, 1), (torch.bfloat16, 3072, 4, 1), (torch.float32, 6464, 4, 2),
              (torch.bfloat16, 10816, 4, 2), (torch.float16, 9024, 4, 1)]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype,N,warps,held", FOLD_CASES,
                         ids=[f"{str(d)[6:]}-{n}-w{w}-held{h}" for d, n, w, h in FOLD_CASES])
def test_folded_pieces_match_reference(dtype, N, warps, held, log):
    """FOLD (constexprs.held_fold): a one-row tile whose tail spans its layout's repetition folds the half (and
    MID) onto the tail for one reduction a row (softmax; log_softmax is not folded by the launch, so the folded
    kernel is asked for); the extreme rows and scales of the test above, every element."""
    block = next_power_of_2(N)
    M = 9
    x = _extreme_rows(dtype, N, M, seed=N + 1)
    config = LaunchConfig.make(warps, BLOCK_N=block, ROWS=1, HELD=held)
    for s in (1.0, -0.5):
        out = poisoned_like(x)
        flags = {"LOG": int(log), "ZERO_MASKED": 1, **({"FOLD": 1} if log else {})}
        fwd = family("fused").prepare(matrix_problem(x, out), config, device_info(x.device), flags=flags)
        fwd(x, out, s)
        assert fwd.flags["FOLD"] == 1 and (fwd.flags["MID"] > 0) == (held == 2)
        _assert_scaled_close(out, x, torch.tensor([s] * M), log, True, dtype, f"scale {s}")


# (dtype, N, rows a program): rows that fill their block (WHOLE), one a program and several with M not a multiple
WHOLE_CASES = [(torch.float32, 1024, 1), (torch.bfloat16, 4096, 1), (torch.float16, 256, 4), (torch.float32, 128, 8)]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("dtype,N,rows", WHOLE_CASES, ids=[f"{str(d)[6:]}-{n}-r{r}" for d, n, r in WHOLE_CASES])
def test_rows_that_fill_their_block_go_without_column_masks(dtype, N, rows, log):
    """WHOLE (constexprs.whole_rows): N == BLOCK_N on the plain paths loads, reduces and stores without a column
    mask (several rows: by rows only, the last tile's rows past M loading 0 and storing nothing); the extreme rows
    under scales 1, 0.37, -0.5 and 0, every element, and nothing written past the last row."""
    M = 4 * rows + 1 if rows > 1 else 9
    x = _extreme_rows(dtype, N, M, seed=N + 2)
    base = poisoned_like(_extreme_rows(dtype, N, M + 3, seed=0))
    config = LaunchConfig.make(4, BLOCK_N=N, ROWS=rows)
    for s in EXTREME_SCALES:
        base.fill_(float("nan"))
        out = base[:M]
        fwd = family("fused").prepare(matrix_problem(x, out), config, device_info(x.device),
                                      flags={"LOG": int(log), "ZERO_MASKED": 1})
        fwd(x, out, s)
        assert fwd.flags["WHOLE"] == 1 and fwd.flags["TAIL"] == 0
        _assert_scaled_close(out, x, torch.tensor([s] * M), log, True, dtype, f"scale {s}")
        assert torch.isnan(base[M:]).all(), "the rows past M are not written"


def test_whole_rows_needs_a_row_that_fills_its_block():
    assert constexprs.whole_rows(1024, 1024, 0, 1, 1) == 1
    assert constexprs.whole_rows(1000, 1024, 0, 1, 1) == 0
    assert constexprs.whole_rows(1024, 2048, 0, 1, 1) == 0, "a block past the row"
    assert constexprs.whole_rows(1024, 1024, 0, 1, 8) == 0, "a realigned row holds its own lanes"
    assert constexprs.whole_rows(1024, 1024, 0, 4, 8) == 1, "several-row tiles keep the plain path"


def test_fold_needs_a_tail_that_spans_the_layout():
    assert constexprs.held_fold(4096, 1, 1, 2, 32, 16) == 1  # 8 bf16 a thread x 512 threads
    assert constexprs.held_fold(1024, 1, 1, 2, 32, 8) == 0   # a 2048-element repetition
    assert constexprs.held_fold(1024, 1, 1, 4, 32, 8) == 1   # 4 fp32 a thread x 256 threads
    assert constexprs.held_fold(4096, 2, 1, 2, 32, 4) == 0, "several-row tiles do not fold"
    assert constexprs.held_fold(4096, 1, 8, 2, 32, 4) == 0, "nor realigned rows"
    assert constexprs.held_fold(1024, 1, 1, 2, 64, 4) == 0, "wave64: 2048-element repetitions"
    assert constexprs.held_fold(4096, 1, 1, 2, 32, 16, log=True) == 0, "log_softmax stays unfolded"


def _close_large_values(dtype: torch.dtype, M: int, N: int, base: float, seed: int) -> torch.Tensor:
    """M rows of N values ``base`` plus 0 to 23 steps of the dtype's spacing at ``base``: large magnitudes whose
    differences are the dtype's smallest, the inputs where the half-log2 domain's product rounding (rounded at the
    value's magnitude, not at its distance from the row's max) shows most."""
    b = torch.tensor(base, dtype=dtype)
    step = (torch.nextafter(b, torch.tensor(float("inf"), dtype=dtype)) - b).double()
    g = torch.Generator().manual_seed(seed)
    return (base + torch.randint(0, 24, (M, N), generator=g).double() * step).to(dtype).to(DEVICE)


# (N, ROWS, HELD): one row in one block, several rows a program, one row held as half + tail, and as three pieces
DOMAIN_CASES = [(1000, 1, 0), (200, 4, 0), (4480, 1, 1), (4480, 1, 2), (1088, 2, 1)]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("base", [1.0, -300.0, 2000.0, -30000.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("N,rows,held", DOMAIN_CASES, ids=[f"{n}-r{r}-held{h}" for n, r, h in DOMAIN_CASES])
def test_16bit_rows_of_large_close_values_match_reference(N, rows, held, dtype, base, log):
    """The fused forward of 16-bit rows (the half-log2 domain, exp_domain.half_log2) at large magnitudes with the
    dtype's smallest differences, scales 1, 0.37 and -1.3: every element within the dtype's tolerance of torch's
    float64 softmax of x * scale (log_softmax relative where its magnitude passes 1)."""
    M = 3 * rows + 1
    x = _close_large_values(dtype, M, N, base, seed=N + int(abs(base)))
    config = LaunchConfig.make(4, BLOCK_N=next_power_of_2(N), ROWS=rows, **({"HELD": held} if held else {}))
    for s in (1.0, 0.37, -1.3):
        out = poisoned_like(x)
        fwd = family("fused").prepare(matrix_problem(x, out), config, device_info(x.device),
                                      flags={"LOG": int(log), "ZERO_MASKED": 0})
        fwd(x, out, s)
        assert (fwd.flags["TAIL"] > 0) == bool(held), "the held form exactly where the config asks for it"
        xs = x.cpu().double() * s
        want = torch.log_softmax(xs, -1) if log else torch.softmax(xs, -1)
        err = (out.cpu().double() - want).abs()
        if log:
            err = err / want.abs().clamp(min=1)
        assert err.max().item() <= FWD_TOL[dtype], f"scale {s}: {err.max().item()}"
