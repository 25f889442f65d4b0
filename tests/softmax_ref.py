"""The one correctness helper: compare with torch.softmax of the float64 input."""

import torch

from tritonsoftmax.kernels import exchange

# Max abs error against the float64 reference, per output dtype (design notes).
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 8e-3, torch.float64: 1e-12}


def reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(x.double(), dim)


def assert_softmax_close(y: torch.Tensor, x: torch.Tensor, dim: int = -1, out_dtype=None) -> None:
    """Every element of ``y`` within the dtype's tolerance of the float64 softmax of ``x``; NaN where
    the reference is NaN and nowhere else; every non-NaN row sums to 1 within tolerance."""
    out_dtype = out_dtype or x.dtype
    assert y.dtype == out_dtype, f"output dtype {y.dtype}, expected {out_dtype}"
    assert y.shape == x.shape, f"output shape {tuple(y.shape)}, expected {tuple(x.shape)}"
    ref = reference(x, dim)
    got = y.double().cpu()
    ref = ref.cpu()
    tol = TOL[out_dtype]
    nan_ref, nan_got = ref.isnan(), got.isnan()
    assert torch.equal(nan_ref, nan_got), (
        f"NaN pattern differs: {int(nan_got.sum())} NaN in output, {int(nan_ref.sum())} in reference")
    ok = ~nan_ref
    if ok.any():
        err = (got[ok] - ref[ok]).abs().max().item()
        assert err <= tol, f"max abs error {err:.3g} > {tol:g} ({out_dtype})"
        sums = torch.where(ok, got, torch.zeros_like(got)).sum(dim)
        row_ok = ok.all(dim)
        if row_ok.any():
            n = x.shape[dim] if x.dim() else 1
            dev = (sums[row_ok] - 1).abs().max().item()
            assert dev <= tol * max(1.0, n ** 0.5) + 1e-6, f"row sum off by {dev:.3g}"


def assert_log_softmax_close(got: torch.Tensor, x: torch.Tensor) -> None:
    """Every element of ``got`` within the dtype's tolerance (at least 1e-5) of the float64 log_softmax of ``x``
    along the last dim, relative where the reference's magnitude passes 1."""
    want = torch.log_softmax(x.double(), -1)
    err = (got.double() - want).abs() / want.abs().clamp(min=1)
    assert err.max().item() <= max(TOL[x.dtype], 1e-5)


def grad_reference(dy: torch.Tensor, y: torch.Tensor, scale: float = 1.0, log: bool = False) -> torch.Tensor:
    """dx in float64 from the incoming gradient and the saved output along the last dim:
    scale * y * (dy - sum(dy * y)), or scale * (dy - exp(y) * sum(dy)) for log_softmax."""
    yd, dyd = y.double(), dy.double()
    if log:
        return scale * (dyd - yd.exp() * dyd.sum(-1, keepdim=True))
    return scale * yd * (dyd - (dyd * yd).sum(-1, keepdim=True))


BWD_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def assert_grad_close(dx: torch.Tensor, dy: torch.Tensor, y: torch.Tensor, scale: float = 1.0,
                      log: bool = False) -> None:
    """dx against float64 from the same dy and y, relative to dx's largest magnitude."""
    want = grad_reference(dy, y, scale, log)
    err = (dx.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= BWD_TOL[dy.dtype], f"relative dx error {err}"


def poisoned_like(x: torch.Tensor, dtype=None) -> torch.Tensor:
    """An output buffer filled with NaN, so an unwritten element cannot pass."""
    return torch.full_like(x, float("nan"), dtype=dtype or x.dtype)


def random_input(shape, dtype, device, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def coop_scratch_ready(device: torch.device, M: int) -> bool:
    """What the next cooperative launch on ``device``'s current stream expects: the whole scratch
    buffer zeroed (every exchange word, the ticket counter and the first M row counters)."""

    ws, sync = exchange.scratch(device, 0, M + 2)
    return ws.count_nonzero().item() == 0 and sync.count_nonzero().item() == 0
