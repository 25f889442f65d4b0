"""The C++ launch path (tritonsoftmax.native): its parameter plans, its build, and on a GPU that a recorded eager
step through it matches float64 torch, forward and backward, and that C++ started the kernels (its counts)."""

import struct
import sys

import pytest
import torch
from conftest import DEVICE, HAS_GPU
from softmax_ref import TOL, random_input

import tritonsoftmax
from tritonsoftmax import native

GRAD_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def test_parameter_plan_places_the_call_s_pointers_scale_and_fixed_values():
    # x, y, scale, M (i32), stride (i64), a constexpr, a float, a constexpr at the end
    sig = ["*fp32", "*bf16", "fp32", "i32", "i64", "constexpr", "fp32", "constexpr"]
    kinds, values = native.parameter_plan(sig, 3, (4096, 2**40, 7, 0.5, 1))
    assert kinds == [native.PTR_IN, native.PTR_OUT, native.SCALE, native.FIXED_INT, native.FIXED_INT,
                     native.FIXED_F32]
    assert values[3:5] == [4096, 2**40]
    assert values[5] == struct.unpack("<I", struct.pack("<f", 0.5))[0]


def test_parameter_plan_of_a_backward_takes_the_saved_output_third():
    kinds, _ = native.parameter_plan(["*fp16", "*fp16", "*fp16", "fp32", "i32"], 4, (8,))
    assert kinds == [native.PTR_IN, native.PTR_OUT, native.PTR_SAVED, native.SCALE, native.FIXED_INT]


@pytest.mark.parametrize("sig, leading, fixed", [
    (["*fp32", "*fp32", "fp32", "i32"], 3, ()),             # fewer values than parameters
    (["*fp32", "i32", "fp32", "i32"], 3, (1,)),             # the output is not a pointer
    (["*fp32", "*fp32", "fp64", "i32"], 3, (1,)),           # a scale that is not fp32
    (["*fp32", "*fp32", "fp32", "*fp32"], 3, (0,)),         # a fixed pointer
    (["*fp32", "*fp32", "fp32", ("i32", "i32")], 3, (1,)),  # a tuple parameter
    (["*fp32", "*fp32", "fp32", "i32"], 2, (1, 2)),         # no scale among the call's parameters
])
def test_parameter_plan_refuses_what_c_plus_plus_cannot_pass(sig, leading, fixed):
    assert native.parameter_plan(sig, leading, fixed) is None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The extension built into a fresh cache folder (what a first enable() does)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITONSOFTMAX_NATIVE_DIR", str(tmp_path_factory.mktemp("native-cache")))
    try:
        yield native.build()
    finally:
        mp.undo()


def test_extension_builds_and_loads(built):
    assert built.exists() and built.stat().st_size > 0
    mod = native.load()
    assert set(native.counts()) == {"forward", "backward", "forward_misses", "backward_misses"}
    assert callable(mod.softmax) and callable(mod.add_plan)


@pytest.mark.skipif(HAS_GPU, reason="what a machine without a CUDA driver does")
def test_enable_without_a_cuda_driver_warns_and_keeps_the_python_path(built):
    with pytest.warns(RuntimeWarning, match="driver"):
        assert native.enable() is False
    assert native.module is None
    x = torch.randn(4, 8)
    assert torch.allclose(tritonsoftmax.softmax(x), torch.softmax(x, -1))


def test_a_failed_build_warns_and_keeps_the_python_path(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONSOFTMAX_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    monkeypatch.delitem(sys.modules, native.NAME, raising=False)
    with pytest.warns(RuntimeWarning, match="failed"):
        assert native.enable() is False
    assert native.module is None


@pytest.fixture
def native_on():
    if not native.enable():
        pytest.fail("the C++ launch path did not turn on")
    try:
        yield native
    finally:
        native.disable()


def _step(fn, x, dim, scale, g):
    xg = x.detach().requires_grad_()
    y = fn(xg, dim, scale=scale)
    (dx,) = torch.autograd.grad(y, xg, g)
    return y, dx


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape, dim", [((8, 2048), -1), ((32, 8192), 1), ((3, 5, 1000), -1), ((64, 24), 0),
                                        ((7, 130), -1)])
@pytest.mark.parametrize("log", [False, True])
def test_recorded_step_through_cxx_matches_float64(native_on, dtype, shape, dim, log):
    fn = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
    scale = 0.7
    before = native.counts()
    for seed in range(3):  # the first call teaches C++ the forward, the second the backward, the third runs both
        x = random_input(shape, dtype, "cuda", seed=seed)
        g = random_input(shape, dtype, "cuda", seed=100 + seed)
        y, dx = _step(fn, x, dim, scale, g)
        xr = x.double().requires_grad_()
        yr = (torch.log_softmax if log else torch.softmax)(xr * scale, dim)
        (dxr,) = torch.autograd.grad(yr, xr, g.double())
        assert y.dtype == dtype and dx.dtype == dtype
        assert (y.double() - yr).abs().max().item() <= TOL[dtype] * (20 if log else 1)
        err = (dx.double() - dxr).abs().max().item() / max(1.0, dxr.abs().max().item())
        assert err <= GRAD_TOL[dtype], err
    after = native.counts()
    assert after["forward"] - before["forward"] >= 2  # C++ started the forwards after the first
    assert after["backward"] - before["backward"] >= 1  # and the last backward


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_cxx_path_plain_calls_strided_input_double_backward_and_cuda_graphs(native_on):
    x = random_input((64, 3000), torch.float32, "cuda")
    for _ in range(2):
        y = tritonsoftmax.softmax(x)  # nothing to record: C++ launches without autograd
    assert (y.double() - torch.softmax(x.double(), -1)).abs().max().item() <= TOL[torch.float32]
    xt = random_input((3000, 64), torch.float32, "cuda").t()  # rows strided
    for _ in range(2):
        yt = tritonsoftmax.softmax(xt, -1)
    assert (yt.double() - torch.softmax(xt.double(), -1)).abs().max().item() <= TOL[torch.float32]
    # double backward: the backward records (create_graph) and differentiates like torch's
    xs = random_input((16, 512), torch.float32, "cuda").requires_grad_()
    for _ in range(3):
        v = torch.randn_like(xs)
        (g1,) = torch.autograd.grad((tritonsoftmax.softmax(xs) * v).sum(), xs, create_graph=True)
        (h,) = torch.autograd.grad((g1 * g1).sum(), xs)
        xr = xs.detach().double().requires_grad_()
        (g1r,) = torch.autograd.grad((torch.softmax(xr, -1) * v.double()).sum(), xr, create_graph=True)
        (hr,) = torch.autograd.grad((g1r * g1r).sum(), xr)
        assert (h.double() - hr).abs().max().item() <= 1e-5 * max(1.0, hr.abs().max().item())
    # a CUDA graph of a forward and backward through C++, replayed on new data
    xg = random_input((32, 4096), torch.bfloat16, "cuda").requires_grad_()
    gg = random_input((32, 4096), torch.bfloat16, "cuda", seed=5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.autograd.grad(tritonsoftmax.softmax(xg), xg, gg)
    torch.cuda.current_stream().wait_stream(side)
    before = native.counts()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = tritonsoftmax.softmax(xg)
        (dg,) = torch.autograd.grad(yg, xg, gg)
    assert native.counts()["forward"] > before["forward"] and native.counts()["backward"] > before["backward"]
    for seed in range(2):
        with torch.no_grad():
            xg.copy_(random_input((32, 4096), torch.bfloat16, "cuda", seed=50 + seed))
        graph.replay()
        torch.cuda.synchronize()
        xr = xg.detach().double().requires_grad_()
        yr = torch.softmax(xr, -1)
        (dr,) = torch.autograd.grad(yr, xr, gg.double())
        assert (yg.double() - yr).abs().max().item() <= TOL[torch.bfloat16]
        assert (dg.double() - dr).abs().max().item() / max(1.0, dr.abs().max().item()) <= GRAD_TOL[torch.bfloat16]


class _FakeExtension:
    """Stands in for the extension on the CPU: records what api asks it and answers ``answer``."""

    def __init__(self, answer=None):
        self.calls, self.answer = [], answer

    def softmax(self, x, dim, scale, mode):
        self.calls.append((dim, scale, mode))
        return self.answer

    def clear(self):
        pass


@pytest.mark.parametrize("log", [False, True])
def test_api_asks_cxx_first_with_the_call_s_mode_and_falls_back_to_python(monkeypatch, log):
    fake = _FakeExtension()
    monkeypatch.setattr(native, "module", fake)
    x = torch.randn(3, 50)
    fn = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
    y = fn(x, 0, scale=0.5, impl="online")
    want = (torch.log_softmax if log else torch.softmax)(x.double() * 0.5, 0)
    assert (y.double() - want).abs().max().item() <= 1e-5
    assert fake.calls == [(0, 0.5, native.MODE_OF_IMPL["online"] + 2 * log)]
    if not log:
        tritonsoftmax.softmax(x, zero_masked_rows=True)
        assert fake.calls[-1] == (-1, 1.0, native.MODE_OF_IMPL["auto"] + 1)


def test_api_returns_what_cxx_started():
    fake = _FakeExtension(answer=torch.zeros(2, 3))
    mp = pytest.MonkeyPatch()
    mp.setattr(native, "module", fake)
    try:
        assert tritonsoftmax.softmax(torch.randn(2, 3)) is fake.answer
    finally:
        mp.undo()


def test_calls_cxx_cannot_take_stay_on_the_python_path(monkeypatch):
    from triton import knobs

    fake = _FakeExtension(answer=torch.zeros(()))  # would be returned, wrongly, if asked
    monkeypatch.setattr(native, "module", fake)
    x = torch.randn(4, 6)
    ref = torch.softmax(x, -1)
    outs = [tritonsoftmax.softmax(x, dtype=torch.float32),           # a dtype= cast
            tritonsoftmax.softmax(x, scale=torch.full((4, 1), 1.0)),  # one scale a row
            tritonsoftmax.softmax(x, scale=1)]                        # an int scale
    hook = lambda *a: None  # noqa: E731
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    outs.append(tritonsoftmax.softmax(x))                             # a profiler's launch hook installed
    for out in outs:
        assert torch.allclose(out, ref, atol=1e-6)
    assert fake.calls == []
    with pytest.raises(ValueError, match="unknown impl"):
        tritonsoftmax.softmax(x, impl="nope")


@pytest.fixture
def cxx_kernels(built, monkeypatch):
    """The extension as patch_torch() finds it with the C++ launch path on; without a CUDA driver (the CPU under the
    Triton interpreter) its aten kernels find no plan for CPU tensors and run the Python implementations."""
    monkeypatch.setattr(native, "module", native.load())
    yield native
    native.forget()


def test_patch_torch_with_the_cxx_path_registers_cxx_kernels_for_aten(cxx_kernels):
    """With the C++ launch path on, patch_torch() gives aten's softmax operators C++ kernels: every softmax and
    log_softmax torch computes inside the block reaches them (counted by C++, forward and backward: a launch where a
    plan serves the call, else a call into Python), results and gradients match float64, a float32 output of a
    16-bit input (half_to_float) and float64 go through Python, and on exit, also by an exception, torch's own kernels
    are back (C++ counts nothing more). On a GPU the second step starts its kernels from C++."""
    import torch.nn.functional as F

    def total(c):
        return c["forward"] + c["forward_misses"], c["backward"] + c["backward_misses"]

    target = torch.arange(6, device=DEVICE) * 7
    for step in range(2):
        x = random_input((6, 300), torch.float32, DEVICE, seed=step).requires_grad_()
        xd = x.detach().double().requires_grad_()
        before = native.counts()
        with tritonsoftmax.patch_torch():
            outs = [torch.softmax(x, -1), x.softmax(0), torch.nn.LogSoftmax(dim=1)(x), F.softmin(x, 1)]
            loss = F.cross_entropy(x, target)
            (loss + sum(o.sum() * 0.5 for o in outs)).backward()
        after = native.counts()
        assert total(after)[0] - total(before)[0] == 5, "four softmaxes and cross_entropy's log_softmax"
        assert total(after)[1] - total(before)[1] == 5, "their five backwards"
        if HAS_GPU and step == 1:
            assert after["forward"] - before["forward"] >= 1 and after["backward"] - before["backward"] >= 1
        want = [torch.softmax(xd, -1), xd.softmax(0), torch.log_softmax(xd, 1), torch.softmax(-xd, 1)]
        for got, ref in zip(outs, want, strict=True):
            torch.testing.assert_close(got.double(), ref.detach(), atol=1e-5, rtol=1e-5)
        (F.cross_entropy(xd, target) + sum(o.sum() * 0.5 for o in want)).backward()
        torch.testing.assert_close(x.grad.double(), xd.grad, atol=1e-5, rtol=1e-5)

    x16 = random_input((5, 70), torch.bfloat16, DEVICE, seed=2)
    d = torch.randn(5, 70, dtype=torch.float64, device=DEVICE)
    before = native.counts()
    with tritonsoftmax.patch_torch():
        y = torch._softmax(x16, -1, True)
        yd = torch.log_softmax(d, 0)
    assert y.dtype == torch.float32 and total(native.counts())[0] - total(before)[0] == 2
    assert (y.double() - torch.softmax(x16.double(), -1)).abs().max().item() <= 1e-6
    assert torch.allclose(yd, d - torch.logsumexp(d, 0, keepdim=True), atol=1e-15)

    with pytest.raises(RuntimeError, match="boom"):
        with tritonsoftmax.patch_torch():
            raise RuntimeError("boom")
    before = native.counts()
    z = random_input((3, 50), torch.float32, DEVICE, seed=3).requires_grad_()
    torch.softmax(z, 1).sum().backward()
    torch.log_softmax(z, 1)
    assert native.counts() == before, "after the block: torch's kernels"

    with tritonsoftmax.patch_torch():  # nested blocks: the inner one's exit leaves the outer one's kernels
        with tritonsoftmax.patch_torch():
            torch.softmax(z, 1)
        torch.softmax(z, 1)
    torch.softmax(z, 1)
    assert total(native.counts())[0] - total(before)[0] == 2, "two calls inside the blocks, none after"
