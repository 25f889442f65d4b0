"""Training and integration: gradients, log_softmax, scale, masked rows, the custom operators,
torch.compile, CUDA graphs, modules and patch_torch."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, HAS_GPU
from softmax_ref import TOL, assert_grad_close, poisoned_like, random_input
from synthetic_devices import SM90

import tritonsoftmax
from tritonsoftmax import dispatch
from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.kernels import FAMILY_NAMES, coop, fused, online, split
from tritonsoftmax.policy import policy_for

IMPLS = ("auto",) + FAMILY_NAMES
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _reference(x, dim, log=False, scale=1.0):
    xr = x.detach().double().requires_grad_()
    z = xr * scale
    return xr, (torch.log_softmax(z, dim) if log else torch.softmax(z, dim))


def _check_grads(x, dim=-1, log=False, scale=None, impl="auto"):
    x = x.detach().requires_grad_()
    fn = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
    y = fn(x, dim, scale=scale, impl=impl)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y)
    y.backward(g)
    xr, yr = _reference(x, dim, log, 1.0 if scale is None else scale)
    yr.backward(g.double())
    out_tol = TOL[x.dtype] * (20 if log else 1)  # log-probabilities are O(log N), not O(1)
    assert (y.double() - yr).abs().max().item() <= out_tol
    err = (x.grad.double() - xr.grad).abs().max().item()
    scale_of_grad = max(1.0, xr.grad.abs().max().item())
    assert err <= GRAD_TOL[x.dtype] * scale_of_grad, f"grad error {err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("M,N", [(3, 17), (4, 1000), (2, 5000), (1, 20000)])
@pytest.mark.parametrize("impl", IMPLS)
def test_softmax_gradients_match_torch(impl, M, N, dtype):
    _check_grads(random_input((M, N), dtype, DEVICE, seed=M + N), impl=impl)


@pytest.mark.parametrize("M,N", [(3, 17), (2, 5000)])
@pytest.mark.parametrize("impl", IMPLS)
def test_log_softmax_values_and_gradients(impl, M, N):
    _check_grads(random_input((M, N), torch.float32, DEVICE, seed=N), log=True, impl=impl)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_gradients_for_each_dim_and_strided_input(dim):
    x = random_input((5, 33, 7), torch.float32, DEVICE, seed=dim)
    _check_grads(x, dim)
    _check_grads(random_input((40, 30), torch.float32, DEVICE).t(), 1)  # transposed
    _check_grads(random_input((10, 64), torch.float32, DEVICE)[:, :50], -1)  # row-strided slice


@pytest.mark.parametrize("scale", [0.125, 3.0, -0.5])
@pytest.mark.parametrize("impl", IMPLS)
def test_scale_equals_scaling_the_input(impl, scale):
    x = random_input((4, 700), torch.float32, DEVICE, seed=3)
    torch.testing.assert_close(tritonsoftmax.softmax(x, scale=scale, impl=impl), torch.softmax(x * scale, -1),
                               atol=2e-6, rtol=0)
    _check_grads(x, scale=scale, impl=impl)
    _check_grads(x, log=True, scale=scale, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_masked_rows_give_zeros_and_zero_gradient(impl):
    x = random_input((4, 300), torch.float32, DEVICE)
    x[1] = float("-inf")
    x[2, :200] = float("-inf")
    x.requires_grad_()
    y = tritonsoftmax.softmax(x, zero_masked_rows=True, impl=impl)
    assert (y[1] == 0).all()
    ref = torch.softmax(x.detach(), -1)
    torch.testing.assert_close(y[[0, 2, 3]].detach(), ref[[0, 2, 3]], atol=2e-6, rtol=0)
    y.backward(torch.ones_like(y))
    assert (x.grad[1] == 0).all() and torch.isfinite(x.grad).all()
    assert tritonsoftmax.softmax(x.detach(), impl=impl)[1].isnan().all(), "the default stays torch's NaN"


@pytest.mark.parametrize("N", [100, 128, 3000, 20000])
@pytest.mark.parametrize("impl", IMPLS)
def test_zero_masked_rows_leave_rows_with_nan_nan(impl, N):
    """zero_masked_rows zeroes the rows of all -inf only: a row of NaN, of NaN and -inf, or of NaN among finite
    values stays NaN, as torch's softmax gives (a max passes NaN over, so a row with no finite value has the -inf
    max of a masked row: the sum, NaN there and 0 for a masked row, tells them apart)."""
    x = random_input((6, N), torch.float32, DEVICE, seed=N)
    x[1] = float("nan")
    x[2, ::2], x[2, 1::2] = float("nan"), float("-inf")
    x[3, 5] = float("nan")
    x[4] = float("-inf")
    y = tritonsoftmax.softmax(x, zero_masked_rows=True, impl=impl)
    assert y[[1, 2, 3]].isnan().all(), [r for r in (1, 2, 3) if not y[r].isnan().all()]
    assert (y[4] == 0).all()
    torch.testing.assert_close(y[[0, 5]], torch.softmax(x[[0, 5]], -1), atol=2e-6, rtol=0)


def test_scale_is_a_number_or_a_tensor_of_scales():
    """A 0-dim tensor broadcasts as torch's x * t does: the same scale for every row."""
    x = random_input((2, 3), torch.float32, DEVICE)
    torch.testing.assert_close(tritonsoftmax.softmax(x, scale=torch.tensor(2.0, device=DEVICE)),
                               tritonsoftmax.softmax(x, scale=2.0), rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="scale"):
        tritonsoftmax.softmax(x, scale=[2.0])


BWD = {"fused": fused.launch_backward, "online": online.launch_backward, "split": split.launch_backward,
       "coop": coop.launch_backward}
BWD_CONFIGS = {
    "fused": [LaunchConfig.make(1, BLOCK_N=128, ROWS=4), LaunchConfig.make(2, BLOCK_N=256, ROWS=1)],
    "online": [LaunchConfig.make(1, BLOCK=32), LaunchConfig.make(2, 2, BLOCK=64)],
    "split": [LaunchConfig.make(1, BLOCK=32, TILES=2, BLOCK_G=4), LaunchConfig.make(2, BLOCK=16, TILES=1,
                                                                                    BLOCK_G=16)],
    "coop": [LaunchConfig.make(1, BLOCK=32, TILES=2, BLOCK_G=2), LaunchConfig.make(2, BLOCK=16, TILES=1,
                                                                                   BLOCK_G=8)],
}


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("impl,config", [(k, c) for k, cs in BWD_CONFIGS.items() for c in cs],
                         ids=lambda v: str(v).replace(" ", ""))
def test_backward_launchers_with_explicit_configs(impl, config, log):
    x = random_input((7, 100), torch.float32, DEVICE, seed=5)
    xr, yr = _reference(x, -1, log)
    y = yr.detach().float()
    dy = random_input((7, 100), torch.float32, DEVICE, seed=6)
    yr.backward(dy.double())
    dx = poisoned_like(x)
    BWD[impl](dy, y, dx, config, log=log)
    assert (dx.double() - xr.grad).abs().max().item() <= 1e-5


def test_backward_launcher_rejects_different_layouts():
    y = random_input((4, 64), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="layout"):
        online.launch_backward(y.t().contiguous().t(), y, torch.empty_like(y))


def test_opcheck_both_operators():
    x = random_input((3, 50), torch.float32, DEVICE, seed=1).requires_grad_()
    torch.library.opcheck(torch.ops.tritonsoftmax.softmax.default, (x, -1, None, "auto", 0.5, False, False))
    torch.library.opcheck(torch.ops.tritonsoftmax.softmax.default, (x, 0, None, "online", 1.0, True, False))
    y = tritonsoftmax.softmax(x.detach())
    dy = random_input((3, 50), torch.float32, DEVICE, seed=2)
    torch.library.opcheck(torch.ops.tritonsoftmax.softmax_backward.default,
                          (dy, y, -1, "auto", 1.0, False, torch.float32))


def test_eager_calls_with_and_without_autograd_skip_the_operators(monkeypatch):
    from tritonsoftmax import ops

    calls = []
    for name in ("softmax_op", "softmax_backward_op"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    x = random_input((3, 50), torch.float32, DEVICE)
    tritonsoftmax.softmax(x)
    xg = x.clone().requires_grad_()
    tritonsoftmax.log_softmax(xg).backward(random_input((3, 50), torch.float32, DEVICE, seed=2))
    assert xg.grad is not None
    assert calls == [], "eager autograd runs ops.SoftmaxFunction, not the operators"


def test_torch_compile_traces_the_operator():
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    f = torch.compile(lambda t: tritonsoftmax.softmax(t, -1, scale=0.5), backend=recording_backend, fullgraph=True)
    x = random_input((4, 40), torch.float32, DEVICE).requires_grad_()
    y = f(x)
    assert len(graphs) == 1 and "tritonsoftmax.softmax" in graphs[0]
    assert (y.double() - torch.softmax(x.detach().double() * 0.5, -1)).abs().max().item() <= TOL[torch.float32]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", [1.0, 0.7])
@pytest.mark.parametrize("log", [False, True])
def test_double_backward_matches_float64(log, scale, impl):
    """create_graph=True records the backward; differentiating the gradient again (a gradient penalty: the grad of
    sum(gx * v)) gives torch's float64 second derivative, through dy and through y back into x; every family."""
    x = random_input((4, 33), torch.float32, DEVICE, seed=5).requires_grad_()
    g = random_input((4, 33), torch.float32, DEVICE, seed=6)
    v = random_input((4, 33), torch.float32, DEVICE, seed=7)
    op = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
    y = op(x, impl=impl, scale=scale)
    (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
    (ggx,) = torch.autograd.grad((gx * v).sum(), x)
    xr, yr = _reference(x, -1, log, scale)
    (gr,) = torch.autograd.grad(yr, xr, g.double(), create_graph=True)
    (ggr,) = torch.autograd.grad((gr * v.double()).sum(), xr)
    assert (gx.double() - gr).abs().max().item() <= GRAD_TOL[torch.float32] * max(1.0, gr.abs().max().item())
    assert (ggx.double() - ggr).abs().max().item() <= GRAD_TOL[torch.float32] * max(1.0, ggr.abs().max().item())


@pytest.mark.skipif(DEVICE == "cpu", reason="torch.compile of the interpreted kernels: run on a GPU")
@pytest.mark.parametrize("softmax", [torch.softmax, tritonsoftmax.softmax], ids=["torch", "ours"])
def test_double_backward_under_torch_compile_is_refused_as_for_torchs_softmax(softmax):
    """torch.compile's aot_autograd records no double backward for any operator: ours under it refuses exactly as
    torch's own softmax does (a RuntimeError naming double backward), rather than giving a wrong second derivative."""
    x = random_input((4, 33), torch.float32, DEVICE, seed=5).requires_grad_()
    f = torch.compile(lambda t: softmax(t, -1), fullgraph=True)
    (gx,) = torch.autograd.grad(f(x), x, torch.ones_like(x), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(gx.pow(2).sum(), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_double_backward_of_16bit_softmax_is_computed_in_float32(dtype):
    x = random_input((3, 40), dtype, DEVICE, seed=8).requires_grad_()
    g = random_input((3, 40), dtype, DEVICE, seed=9)
    (gx,) = torch.autograd.grad(tritonsoftmax.softmax(x), x, g, create_graph=True)
    (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
    xr, yr = _reference(x, -1)
    (gr,) = torch.autograd.grad(yr, xr, g.double(), create_graph=True)
    (ggr,) = torch.autograd.grad(gr.pow(2).sum(), xr)
    assert ggx.dtype == dtype
    assert (ggx.double() - ggr).abs().max().item() <= GRAD_TOL[dtype] * max(1.0, ggr.abs().max().item())


@pytest.mark.parametrize("log", [False, True])
def test_torch_func_transforms_run_torchs_softmax(log):
    """Under torch.func transforms the tensors are wrappers without storage (our kernels cannot read them, and
    autograd would not record them): vmap, grad and jacrev get torch's softmax, also where a plain call of vmap's
    per-sample shape came first (on a GPU that call leaves a prepared launch, which the vmapped call then finds)."""
    fn = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
    ref = torch.log_softmax if log else torch.softmax
    out_tol = TOL[torch.float32] * (20 if log else 1)
    x = random_input((3, 5, 40), torch.float32, DEVICE, seed=11)
    w = random_input((5, 40), torch.float32, DEVICE, seed=12)
    fn(x[0], scale=0.5)
    v = torch.func.vmap(lambda t: fn(t, scale=0.5))(x)
    assert (v.double() - ref(x.double() * 0.5, -1)).abs().max().item() <= out_tol
    g = torch.func.grad(lambda t: (fn(t, scale=0.5) * w).sum())(x[0])
    xr = x[0].double().requires_grad_()
    (ref(xr * 0.5, -1) * w.double()).sum().backward()
    assert (g.double() - xr.grad).abs().max().item() <= GRAD_TOL[torch.float32] * max(1.0, xr.grad.abs().max().item())
    jac = torch.func.jacrev(lambda t: fn(t, scale=0.5))(x[0, 0])
    want = torch.func.jacrev(lambda t: ref(t * 0.5, -1))(x[0, 0].double())
    assert (jac.double() - want).abs().max().item() <= GRAD_TOL[torch.float32]


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        p = tritonsoftmax.softmax(self.proj(x), -1, scale=0.5)
        return tritonsoftmax.log_softmax(p @ self.proj.weight, -1).sum()


def test_torch_compile_fullgraph_has_no_graph_break():
    model = _Block().to(DEVICE)
    x = random_input((8, 64), torch.float32, DEVICE)
    expected = model(x)
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if HAS_GPU else "aot_eager")
    got = compiled(x)
    got.backward()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for p, g in zip(model.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g, atol=1e-4, rtol=1e-4)


def test_modules_match_the_functions():
    x = random_input((4, 33), torch.float32, DEVICE)
    torch.testing.assert_close(tritonsoftmax.Softmax(dim=0)(x), torch.softmax(x, 0), atol=2e-6, rtol=0)
    torch.testing.assert_close(tritonsoftmax.LogSoftmax(-1, scale=2.0)(x), torch.log_softmax(2 * x, -1),
                               atol=1e-5, rtol=0)
    assert "dim=0" in repr(tritonsoftmax.Softmax(dim=0))


def _spy(monkeypatch):
    """Record each forward (its log flag) and backward that reaches tritonsoftmax's execute module."""
    from tritonsoftmax import execute

    calls = []
    forward, backward = execute.forward, execute.backward
    monkeypatch.setattr(execute, "forward", lambda *a: calls.append(("fwd", a[-2])) or forward(*a))
    monkeypatch.setattr(execute, "backward", lambda *a: calls.append(("bwd", a[-2])) or backward(*a))
    return calls


def test_patch_torch_routes_every_softmax_through_the_operator_registry(monkeypatch):
    """Inside the block torch.softmax, Tensor.softmax, nn.Softmax, nn.LogSoftmax, F.softmin and F.cross_entropy (its
    log_softmax is inside ATen) run ours forward, and torch's autograd formulas call our backward; every result and
    gradient matches float64. (CPU tensors under the Triton interpreter here; GPU tensors always.)"""
    calls = _spy(monkeypatch)
    x = random_input((6, 300), torch.float32, DEVICE, seed=1).requires_grad_()
    target = torch.randint(0, 300, (6,), device=DEVICE)
    xd = x.detach().double().requires_grad_()
    with tritonsoftmax.patch_torch():
        outs = [torch.softmax(x, -1), x.softmax(0), torch.nn.Softmax(dim=1)(x), torch.nn.LogSoftmax(dim=1)(x),
                F.softmin(x, 1)]
        loss = F.cross_entropy(x, target)
        (loss + sum(o.sum() * 0.5 for o in outs)).backward()
    assert [c for c in calls if c[0] == "fwd"] == [("fwd", False)] * 3 + [("fwd", True), ("fwd", False),
                                                                         ("fwd", True)]
    assert ("bwd", True) in calls and ("bwd", False) in calls
    want = [torch.softmax(xd, -1), xd.softmax(0), torch.softmax(xd, 1), torch.log_softmax(xd, 1),
            torch.softmax(-xd, 1)]
    for got, ref in zip(outs, want, strict=True):  # fp32 against float64, every element
        torch.testing.assert_close(got.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    ref_loss = F.cross_entropy(xd, target)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * max(1.0, abs(ref_loss.item()))
    (ref_loss + sum(o.sum() * 0.5 for o in want)).backward()
    torch.testing.assert_close(x.grad.double(), xd.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_patch_torch_keeps_half_to_float_and_leaves_float64_to_torch(monkeypatch, dtype):
    """aten::_softmax's half_to_float gives a float32 output of a 16-bit input (what softmax(x, dtype=float32) asks of
    a GPU kernel); float64, 0-dim and empty tensors are computed from other torch operators, exactly, without
    calling back into the overridden ones."""
    calls = _spy(monkeypatch)
    x = random_input((5, 70), dtype, DEVICE, seed=2)
    with tritonsoftmax.patch_torch():
        y = torch._softmax(x, -1, True)
        lg = torch._log_softmax(x, 1, True)
        d = torch.randn(5, 70, dtype=torch.float64, device=DEVICE)
        yd, ld = torch.softmax(d, -1), torch.log_softmax(d, 0)
        scalar, empty = torch.softmax(torch.tensor(3.0, device=DEVICE), 0), torch.softmax(x[:0], -1)
    assert y.dtype == lg.dtype == torch.float32 and calls == [("fwd", False), ("fwd", True)]
    assert (y.double() - torch.softmax(x.double(), -1)).abs().max().item() <= 1e-6
    assert (lg.double() - torch.log_softmax(x.double(), 1)).abs().max().item() <= 1e-5
    assert torch.allclose(yd, torch.softmax(d, -1), atol=1e-15) and torch.allclose(ld, torch.log_softmax(d, 0))
    assert scalar.item() == 1.0 and empty.shape == (0, 70)


def test_patch_torch_restores_torchs_kernels_even_on_error(monkeypatch):
    """After the block, also one left by an exception, softmax runs torch's kernel again (nothing reaches ours)."""
    calls = _spy(monkeypatch)
    x = random_input((3, 50), torch.float32, DEVICE, seed=3)
    with pytest.raises(RuntimeError, match="boom"):
        with tritonsoftmax.patch_torch():
            torch.softmax(x, 1)
            raise RuntimeError("boom")
    assert calls == [("fwd", False)]
    y = torch.softmax(x, 1)
    assert calls == [("fwd", False)]
    torch.testing.assert_close(y, torch.exp(x - torch.logsumexp(x, 1, keepdim=True)))


@pytest.mark.gpu
def test_patch_torch_routes_gpu_tensors_to_tritonsoftmax(monkeypatch):
    from tritonsoftmax import execute

    calls = []
    real = execute.forward
    monkeypatch.setattr(execute, "forward", lambda *a: calls.append(a[-2]) or real(*a))
    x = random_input((4, 1000), torch.float16, DEVICE)
    with tritonsoftmax.patch_torch():
        y1, y2, y3 = torch.softmax(x, -1), F.log_softmax(x, dim=1), x.softmax(-1, dtype=torch.float32)
    assert calls == [False, True, False]
    assert y3.dtype == torch.float32
    torch.testing.assert_close(y1, torch.softmax(x, -1), atol=2e-3, rtol=0)
    torch.testing.assert_close(y2.float(), torch.log_softmax(x.float(), -1), atol=2e-2, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", [(64, 1000), (4096, 4096), (8, 262144), (1, 2000000), (300, 70000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("log", [False, True])
def test_gpu_gradients_long_and_few_rows(M, N, dtype, log):
    _check_grads(random_input((M, N), dtype, DEVICE, seed=N), log=log)


def test_backward_takes_the_dense_config_only_for_contiguous_rows(monkeypatch):
    """Through the API, with a synthetic H200 and a reload table whose 64-element block is DENSE past 256 elements:
    the backward of contiguous rows plans DENSE; a softmax over dim 0 (column stride 8) does not, nor the forward of
    padded rows (whose output, and so the backward's tensors, empty_like makes contiguous); every gradient matches
    float64."""
    from synthetic_devices import SM90

    from tritonsoftmax import api, execute

    monkeypatch.setattr(dispatch, "device_info", lambda device: SM90)
    reload = {**SM90_RELOAD, "rows": {**SM90_RELOAD["rows"], 2: {64: (1, 2, 0, 256)}}, "dense_rows": {2: {64: (1, 2)}}}
    patched = dataclasses.replace(policy_for(SM90), reload=reload)
    monkeypatch.setattr(dispatch, "policy_for", lambda device: patched)
    seen = []
    prepare = execute.prepare_launch
    monkeypatch.setattr(execute, "prepare_launch", lambda problem, x, y, impl, flags, backward: seen.append(
        (backward, problem.rows_dense())) or prepare(problem, x, y, impl, flags, backward))
    try:
        x = random_input((8, 64), torch.bfloat16, DEVICE, seed=3)
        padded = random_input((8, 72), torch.bfloat16, DEVICE, seed=4)[:, :64]
        for case, dim, dense_fwd, dense_bwd in ((x, -1, True, True), (x.t().contiguous(), 0, False, False),
                                                (padded, -1, False, True)):
            seen.clear()
            api.clear_caches()  # a warm call would skip prepare_launch
            _check_grads(case, dim)
            assert seen == [(False, dense_fwd), (True, dense_bwd)], seen
            (backward,) = [p for k, p in dispatch._plans.items() if k[6]]
            assert dict(getattr(backward.config, "meta", ())).get("DENSE", 0) == int(dense_bwd), backward
    finally:
        api.clear_caches()


SM90_RELOAD = policy_for(SM90).reload  # the reload configs the H200's policy holds (tune_cache/cuda/sm_90.yaml)
RELOAD_SHAPES = [(dt, block) for dt in (torch.float32, torch.bfloat16, torch.float16)
                 for block in SM90_RELOAD["rows"][dt.itemsize]]


@pytest.mark.needs("sm90_table")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,block", RELOAD_SHAPES, ids=str)
@pytest.mark.parametrize("log", [False, True])
def test_gpu_backward_of_rows_that_fill_their_block_with_the_reload_config(dtype, block, log):
    """The fewest rows of the shortest length that reload_row_config takes, per block of the policy's reload rows:
    auto's plan (fused's, for the 16-bit 32K block that auto gives smem-bwd where it copies the rows) is fused-bwd with
    RELOAD and 32 registers a thread, and its dx (into a poisoned buffer, scale -0.5) matches float64 in every
    element."""
    N = dispatch.reload_shortest(SM90_RELOAD, dtype.itemsize, block)
    M = -(-SM90_RELOAD["rows"][dtype.itemsize][block][2] // N)
    impl = "auto" if block <= policy_for(SM90).smem_one_chunk["reload_over_smem_max_n"] else "fused"
    p = dispatch.plan(impl, M, N, dtype, dtype, torch.device(DEVICE), backward=True)
    assert p.impl == "fused" and p.config["RELOAD"] == 1 and dict(p.config.options)["maxnreg"] == 32, p
    x = random_input((M, N), dtype, DEVICE, seed=block)
    y = (torch.log_softmax if log else torch.softmax)(x.float(), -1).to(dtype)
    dy = random_input((M, N), dtype, DEVICE, scale=1.0, seed=block + 1)
    dx = poisoned_like(dy)
    fused.launch_backward(dy, y, dx, p.config, scale=-0.5, log=log)
    assert not dx.isnan().any()
    assert_grad_close(dx, dy, y, scale=-0.5, log=log)


DENSE_SHAPES = [(dt, block, rows) for dt in (torch.bfloat16, torch.float16)
                for block, (rows, _) in SM90_RELOAD["dense_rows"][dt.itemsize].items()]


@pytest.mark.needs("sm90_table")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,block,rows", DENSE_SHAPES, ids=str)
@pytest.mark.parametrize("log", [False, True])
def test_gpu_backward_of_dense_rows_with_the_dense_config(dtype, block, rows, log):
    """One program's rows past the reload entry's most elements, contiguous rows of exactly the block: the backward
    through the API (impl="fused": auto gives these rows smem-bwd where it copies them) plans fused-bwd with DENSE,
    and dx (scale -0.5) matches float64 in every element, for an input with contiguous rows and for one with padded
    rows (its output, and so the backward, is contiguous); the plan for rows that are not dense has no DENSE
    config."""
    from tritonsoftmax import api

    M = SM90_RELOAD["rows"][dtype.itemsize][block][3] // block + rows
    fn = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
    api.clear_caches()
    for padded in (False, True):
        base = random_input((M, block + (64 if padded else 0)), dtype, DEVICE, seed=block)
        x = base[:, :block].detach().requires_grad_()
        y = fn(x, -1, scale=-0.5, impl="fused")
        dy = random_input((M, block), dtype, DEVICE, scale=1.0, seed=block + 1)
        y.backward(dy)
        keys = [k for k in dispatch._plans if k[6] and k[1:3] == (M, block) and k[3] == dtype]
        assert len(keys) == 1 and keys[0][8] is True, keys  # the backward's y (empty_like) is contiguous either way
        assert dispatch._plans[keys[0]].config["DENSE"] == 1
        assert not x.grad.isnan().any()
        assert_grad_close(x.grad, dy, y.detach(), scale=-0.5, log=log)
        api.clear_caches()
    strided = dispatch.plan("fused", M, block, dtype, dtype, torch.device(DEVICE), backward=True)
    assert strided.config is None or "DENSE" not in dict(strided.config.meta)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["auto", "coop", "split", pytest.param("smem", marks=pytest.mark.needs("smem"))])
@pytest.mark.parametrize("M,N", [(64, 1000), (4, 1048576)])
def test_cuda_graph_capture_and_replay_forward_and_backward(M, N, impl):
    x = random_input((M, N), torch.float32, DEVICE).requires_grad_()
    dy = random_input((M, N), torch.float32, DEVICE, seed=9)
    for _ in range(2):  # warm up: compile, prepare
        tritonsoftmax.softmax(x, scale=0.5, impl=impl).backward(dy)
    x.grad = None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        y = tritonsoftmax.softmax(x, scale=0.5, impl=impl)
        y.backward(dy)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.no_grad():
        x.copy_(random_input((M, N), torch.float32, DEVICE, seed=11))
    x.grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    xr, yr = _reference(x, -1, scale=0.5)
    yr.backward(dy.double())
    assert (y.double() - yr).abs().max().item() <= 2e-6
    assert (x.grad.double() - xr.grad).abs().max().item() <= 1e-5


@pytest.mark.parametrize("log", [False, True])
def test_patch_torch_takes_a_second_derivative(log):
    """Inside the block torch's own autograd formulas run (ours are the kernels beneath them), so a Hessian-vector
    product through softmax or log_softmax works and matches float64."""
    fn = torch.log_softmax if log else torch.softmax
    x = random_input((3, 40), torch.float32, DEVICE, seed=5).requires_grad_()
    w = random_input((3, 40), torch.float32, DEVICE, scale=1.0, seed=6)

    def hvp(inp, weights):
        (g,) = torch.autograd.grad((fn(inp, -1) * weights).sum(), inp, create_graph=True)
        return torch.autograd.grad((g * weights).sum(), inp)[0]

    with tritonsoftmax.patch_torch():
        got = hvp(x, w)
    want = hvp(x.detach().double().requires_grad_(), w.double())
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_patch_torch_blocks_nest(monkeypatch):
    """An inner block's exit leaves the outer block's kernels: a softmax between the two exits is still ours, one
    after the outer exit is torch's."""
    calls = _spy(monkeypatch)
    x = random_input((3, 50), torch.float32, DEVICE, seed=4)
    with tritonsoftmax.patch_torch():
        with tritonsoftmax.patch_torch():
            torch.softmax(x, 1)
        torch.softmax(x, 1)
    torch.softmax(x, 1)
    assert calls == [("fwd", False)] * 2
