"""A tensor of scales, one a row (a per-row temperature): torch.softmax(x * t, dim) in every family, forward and
backward, softmax and log_softmax, every element against float64; the shapes it takes and refuses."""

import pytest
import torch
from conftest import DEVICE
from softmax_ref import poisoned_like, random_input
from synthetic_devices import SM90

import tritonsoftmax
from tritonsoftmax import dispatch, execute
from tritonsoftmax.kernels import FAMILY_NAMES

IMPLS = ("auto",) + FAMILY_NAMES
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _temperatures(shape, seed=3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 + 0.1).to(DEVICE)


def _check(x, t, dim, impl, log):
    """Forward and backward through autograd against float64, relative to the largest magnitude."""
    op, ref = (tritonsoftmax.log_softmax, torch.log_softmax) if log else (tritonsoftmax.softmax, torch.softmax)
    xg = x.detach().clone().requires_grad_()
    y = op(xg, dim, scale=t, impl=impl)
    g = random_input(tuple(y.shape), x.dtype, DEVICE, seed=11)
    y.backward(g)
    xr = x.detach().double().requires_grad_()
    yr = ref(xr * t.double(), dim)
    yr.backward(g.double())
    tol = TOL[x.dtype]
    finite = torch.isfinite(yr)
    err = ((y.double() - yr).abs() / yr.abs().clamp(min=1))[finite].max().item()
    assert err <= tol, f"forward: {err}"
    gerr = (xg.grad.double() - xr.grad).abs().max().item() / max(1.0, xr.grad.abs().max().item())
    assert gerr <= tol, f"backward: {gerr}"


# (shape, dim, temperature shape): several short rows a program, a row held as half a block plus a tail, long
# rows (tile / online / split / coop chunks), rows inside the softmax dim (dim 1 of 3), a leading broadcast
CASES = [((6, 300), -1, (6, 1)), ((3, 1152), -1, (3, 1)), ((3, 5000), -1, (3, 1)), ((2, 700, 3), 1, (2, 1, 3)),
         ((2, 3, 40), -1, (3, 1))]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
@pytest.mark.parametrize("shape,dim,tshape", CASES, ids=[f"{'x'.join(map(str, s))}-dim{d}" for s, d, _ in CASES])
@pytest.mark.parametrize("impl", IMPLS)
def test_every_family_takes_one_scale_a_row(impl, shape, dim, tshape, log):
    x = random_input(shape, torch.float32, DEVICE, seed=sum(shape))
    _check(x, _temperatures(tshape), dim, impl, log)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("impl", ["fused", "online", "coop"])
def test_16bit_rows_off_16_bytes(impl, dtype):
    """Rows whose stride puts them off 16-byte boundaries (the realigned paths) with one scale each."""
    N = 2100
    x = random_input((4, N + 3), dtype, DEVICE, seed=5)[:, :N]
    _check(x, _temperatures((4, 1)), -1, impl, False)


def test_output_is_every_element_and_masked_rows_stay_zero():
    x = random_input((5, 200), torch.float32, DEVICE, seed=2)
    x[3] = float("-inf")
    t = _temperatures((5, 1))
    y = tritonsoftmax.softmax(x, -1, scale=t, zero_masked_rows=True)
    want = torch.softmax(x.double() * t.double(), -1)
    want[3] = 0.0
    assert torch.equal(y[3], torch.zeros_like(y[3]))
    assert (y.double() - want).abs().max().item() <= 1e-6


def test_a_float_scale_and_a_tensor_of_equal_scales_agree():
    x = random_input((4, 777), torch.float32, DEVICE, seed=9)
    a = tritonsoftmax.softmax(x, -1, scale=0.37)
    b = tritonsoftmax.softmax(x, -1, scale=torch.full((4, 1), 0.37, device=DEVICE))
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_double_backward_with_a_tensor_scale():
    x = random_input((3, 50), torch.float32, DEVICE, seed=4).requires_grad_()
    t = _temperatures((3, 1))
    g = random_input((3, 50), torch.float32, DEVICE, seed=6)
    (gx,) = torch.autograd.grad(tritonsoftmax.softmax(x, scale=t), x, g, create_graph=True)
    (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(torch.softmax(xr * t.double(), -1), xr, g.double(), create_graph=True)
    (ggr,) = torch.autograd.grad(gr.pow(2).sum(), xr)
    assert (ggx.double() - ggr).abs().max().item() <= 1e-5 * max(1.0, ggr.abs().max().item())


def test_torch_operator_path_takes_the_same_scales():
    """What torch.compile runs for a tensor scale (the operator's schema takes one float): the same result."""
    x = random_input((3, 2, 90), torch.float32, DEVICE, seed=7)
    t = _temperatures((3, 2, 1))
    got = execute.forward_torch(x, -1, None, t, True, False)
    torch.testing.assert_close(got.double(), torch.log_softmax(x.double() * t.double(), -1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tshape,why", [((4,), "size 1 along dim"), ((3, 1), "broadcast"), ((1, 4, 1, 1), "dims")])
def test_scales_of_the_wrong_shape_are_refused(tshape, why):
    x = random_input((4, 64), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="scale"):
        tritonsoftmax.softmax(x, -1, scale=torch.ones(tshape, device=DEVICE))


def test_scales_that_are_integers_or_want_a_gradient_are_refused():
    x = random_input((4, 64), torch.float32, DEVICE)
    with pytest.raises(TypeError, match="floating point"):
        tritonsoftmax.softmax(x, -1, scale=torch.ones(4, 1, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="no gradient"):
        tritonsoftmax.softmax(x, -1, scale=torch.ones(4, 1, device=DEVICE, requires_grad=True))
    with pytest.raises(TypeError, match="Python number or a tensor"):
        tritonsoftmax.softmax(x, -1, scale="0.5")


def test_rows_smem_would_run_go_to_coop_and_explicit_smem_refuses():
    """smem takes one scale for all rows: with a tensor, auto runs coop where it would run smem (bf16 4096 x 65536
    on an H200), and impl='smem' is refused with the alternatives."""
    plain = dispatch.resolve("auto", 4096, 65536, torch.bfloat16, SM90, False, True, True)
    scaled = dispatch.resolve("auto", 4096, 65536, torch.bfloat16, SM90, False, True, True, row_scale=True)
    assert plain.impl == "smem" and scaled.impl == "coop"
    with pytest.raises(ValueError, match="impl='smem' takes one scale"):
        dispatch.resolve("smem", 4096, 65536, torch.bfloat16, SM90, False, True, True, row_scale=True)


def test_kernel_output_has_no_unwritten_element():
    """The launch writes every element of a poisoned output (a direct family launch with ROW_SCALE)."""
    from tritonsoftmax.device import device_info
    from tritonsoftmax.kernels import family
    from tritonsoftmax.layout import matrix_problem

    x = random_input((7, 333), torch.float32, DEVICE, seed=8)
    y = poisoned_like(x)
    t = _temperatures((7,))
    launch = family("fused").prepare(matrix_problem(x, y), None, device_info(x.device),
                                     flags={"LOG": 0, "ZERO_MASKED": 0, "ROW_SCALE": 1})
    launch(x, y, t.float().contiguous())
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.double(), torch.softmax(x.double() * t.double()[:, None], -1), rtol=1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("tdtype", [torch.float32, torch.bfloat16], ids=str)
def test_warm_calls_reuse_the_launch_with_new_scales_and_still_check_them(tdtype):
    """A second call of one signature (input and scales alike) finds its prepared launch (on a GPU; the interpreter
    prepares every call) and reads the new call's scales; a warm call whose scales want a gradient is refused."""
    x = random_input((5, 3000), torch.float32, DEVICE, seed=4)
    key = execute._signature(x, -1, None, "auto", False, False)
    for seed in (3, 4, 5):
        t = _temperatures((5, 1), seed).to(tdtype)
        y = tritonsoftmax.softmax(x, scale=t)
        ref = torch.softmax(x.double() * t.double(), -1)
        assert (y.double() - ref).abs().max().item() <= TOL[torch.float32]
        assert (key + execute._scale_signature(t) in execute._prepared) == (DEVICE != "cpu")
    with pytest.raises(ValueError, match="no gradient"):
        tritonsoftmax.softmax(x, scale=t.clone().requires_grad_())
    y = torch.softmax(x.double() * t.double(), -1).float()
    bwd_key = ("bwd", y.shape, y.stride(), y.dtype, y.get_device(), -1, "auto", False) + execute._scale_signature(t)
    for seed in (6, 7):  # the backward likewise: its second call of a signature is warm, with the call's scales
        dy = random_input((5, 3000), torch.float32, DEVICE, seed=seed)
        dx = execute.backward(dy, y, -1, "auto", t, False, torch.float32)
        td = t.double()
        ref = td * y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True))
        assert (dx.double() - ref).abs().max().item() <= TOL[torch.float32]
        assert (bwd_key in execute._prepared) == (DEVICE != "cpu")
