"""One rank of the distributed tests (test_distributed.py spawns it): every check against torch on the whole
tensor, which every rank builds from one seed and slices."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _slices(width: list[int]) -> list[slice]:
    out, start = [], 0
    for w in width:
        out.append(slice(start, start + w))
        start += w
    return out


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    tol = {torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
    got, want = got.double(), want.double()
    same_nan = torch.isnan(got) == torch.isnan(want)
    assert bool(same_nan.all()), f"{what}: NaN where torch has none (or the other way)"
    diff = torch.where(got == want, 0.0, (got - want).abs()).nan_to_num(0.0)  # equal infinities: no error
    worst = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.numel() else ()
    assert diff.numel() == 0 or diff.max().item() <= tol * max(1.0, want[~torch.isnan(want)].abs().max().item()), \
        f"{what}: max error {diff.max().item()} at {worst}"


def run(rank: int, world: int, init: str, widths: list[int], backend: str = "gloo",
        compilers: tuple[str, ...] = ("aot_eager",)) -> None:
    """One rank's checks over ``backend`` (gloo: CPU tensors; nccl: this rank's GPU); the compiled checks with each
    torch.compile backend of ``compilers``."""
    import tritonsoftmax.distributed as tsd

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    from tritonsoftmax.device import interpreter_active
    from tritonsoftmax.kernels import split

    # else torch operators run every pass (as they do for a slice of width 0, while the other ranks run the kernels)
    kernels = (device.type == "cuda" or interpreter_active()) and widths[rank] > 0
    passes = []  # the split family's passes the distributed functions ran (our kernels, not torch operators)
    chunks = []  # the chunks a row of this rank's slice was cut into by each stats pass
    partials, write = split.SplitLaunch.partials, split.SplitLaunch.write
    split.SplitLaunch.partials = lambda self, *a: chunks.append(self.chunks_per_row) or passes.append(
        ("stats", self.words)) or partials(self, *a)
    split.SplitLaunch.write = lambda self, *a: passes.append(("write", self.words)) or write(self, *a)
    try:
        mine = _slices(widths)[rank]
        V = sum(widths)
        for dtype in (torch.float32, torch.float16):
            gen = torch.Generator().manual_seed(7)
            x = (torch.randn(6, V, generator=gen) * 3).to(device, dtype)
            x[1, _slices(widths)[0]] = float("-inf")  # a row all -inf in rank 0's slice only
            x[2, :] = float("-inf")  # a row all -inf everywhere: NaN, as torch gives
            # a row with NaN and -inf only in rank 0's slice: that slice's max is -inf (a max passes NaN over), yet
            # the whole row is NaN, as torch gives
            x[5, _slices(widths)[0]] = float("-inf")
            x[5, _slices(widths)[0].start] = float("nan")
            dy = torch.randn(6, V, generator=gen).to(device, dtype)
            for log in (False, True):
                fn, ref = (tsd.log_softmax, torch.log_softmax) if log else (tsd.softmax, torch.softmax)
                xl = x[:, mine].clone().requires_grad_()
                passes.clear()
                y = fn(xl, -1, scale=0.5)
                y.backward(dy[:, mine])
                assert passes == ([("stats", 2), ("write", 2), ("stats", 1), ("write", 1)] if kernels else []), \
                    f"rank {rank}: the kernels' passes (forward, backward) ran as {passes}"
                xw = x.double().requires_grad_()
                yw = ref(xw * 0.5, -1)
                yw.backward(dy.double())
                _close(y, yw[:, mine], dtype, f"rank {rank} {dtype} log={log} forward")
                rows = [0, 1, 3, 4, 5]  # the all -inf row's gradient is NaN in torch too
                _close(xl.grad[rows], xw.grad[rows][:, mine], dtype, f"rank {rank} {dtype} log={log} backward")
            xt = x[:, mine].t().contiguous()  # the split dim first: rows are columns of the layout
            _close(tsd.softmax(xt, 0), torch.softmax(x.double(), -1)[:, mine].t(), dtype, f"rank {rank} {dtype} dim 0")
            target = torch.randint(0, V, (6,), generator=gen).to(device)
            target[3] = -100
            target[4] = V - 1  # on the last rank
            xs = x.clone()
            xs[2, :] = 0.0  # cross-entropy over finite logits
            # rank 0's slice of row 1 far below the rest (its exp underflows against the other ranks' maxima), yet
            # small enough that fp32 keeps the loss exact to ~1e-5 where it is the whole row (a world of one)
            xs[1, :] = xs[1, :].nan_to_num(neginf=-50.0)
            xs[5, :] = xs[5, :].nan_to_num(nan=0.0, neginf=-50.0)
            w = torch.randn(6, generator=gen).to(device)  # signed per-row weights of the loss, one of them 0
            w[5] = 0.0
            for reduction in ("mean", "sum", "none"):
                for smoothing in (0.0, 0.1):
                    xl = xs[:, mine].clone().requires_grad_()
                    passes.clear()
                    loss = tsd.cross_entropy(xl, target, reduction=reduction, label_smoothing=smoothing)
                    ((loss.float() * w).sum() if reduction == "none" else loss).backward()
                    assert passes == ([("stats", 2), ("write", 2)] if kernels else []), \
                        f"rank {rank}: cross_entropy's passes: {passes}"
                    xw = xs.double().requires_grad_()
                    lw = F.cross_entropy(xw, target, reduction=reduction, label_smoothing=smoothing)
                    ((lw * w.double()).sum() if reduction == "none" else lw).backward()
                    what = f"rank {rank} {dtype} cross_entropy {reduction} {smoothing}"
                    _close(loss, lw, dtype, what)
                    _close(xl.grad, xw.grad[:, mine], dtype, what + " gradient")
        if kernels and min(widths) >= 4000:  # slices this wide run in several chunks a row
            assert min(chunks) > 1, f"rank {rank}: chunks a row {sorted(set(chunks))}"
        if device.type == "cpu":  # on a GPU the check is a device-side assert, which ends the process (as torch's)
            bad = torch.full((6,), sum(widths), dtype=torch.int64)  # one past the vocabulary
            try:
                tsd.cross_entropy(x[:, mine].float(), bad)
                raise AssertionError(f"rank {rank}: a target outside the vocabulary was not refused")
            except RuntimeError as e:
                assert "outside the vocabulary" in str(e), str(e)
        for compiler in compilers:
            _compiled(rank, widths, device, compiler)
        if device.type == "cuda":
            _graphed(rank, widths, device)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _compiled(rank: int, widths: list[int], device: torch.device, compiler: str) -> None:
    """softmax and cross_entropy inside torch.compile with ``compiler`` (aot_eager: dynamo's capture and autograd's
    trace, no code generation; inductor: generated code), one graph each (fullgraph: the collectives are captured,
    not left to eager), forward and backward, against torch on the whole tensor."""
    import tritonsoftmax.distributed as tsd

    torch._dynamo.reset()
    mine, V = _slices(widths)[rank], sum(widths)
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(4, V, generator=gen) * 2).to(device)
    target = torch.randint(0, V, (4,), generator=gen).to(device)
    what = f"rank {rank} compiled ({compiler})"
    xl = x[:, mine].clone().requires_grad_()
    y = torch.compile(lambda t: tsd.softmax(t, -1) * 2.0, backend=compiler, fullgraph=True)(xl)
    y.sum().backward()
    xw = x.double().requires_grad_()
    (torch.softmax(xw, -1) * 2.0).sum().backward()
    _close(y, torch.softmax(x.double(), -1)[:, mine] * 2.0, torch.float32, f"{what} softmax")
    _close(xl.grad, xw.grad[:, mine], torch.float32, f"{what} softmax gradient")
    xl = x[:, mine].clone().requires_grad_()
    loss = torch.compile(lambda t, tg: tsd.cross_entropy(t, tg, label_smoothing=0.1), backend=compiler,
                         fullgraph=True)(xl, target)
    loss.backward()
    xw = x.double().requires_grad_()
    lw = F.cross_entropy(xw, target, label_smoothing=0.1)
    lw.backward()
    _close(loss, lw, torch.float32, f"{what} cross_entropy")
    _close(xl.grad, xw.grad[:, mine], torch.float32, f"{what} cross_entropy gradient")


def _graphed(rank: int, widths: list[int], device: torch.device) -> None:
    """softmax, log_softmax and cross_entropy, forward and backward, captured in one CUDA graph after a warm-up on a
    side stream (nothing on the path waits on the host; the NCCL collectives are in the graph where the world has
    two ranks or more, a world of one exchanges nothing), then replayed on new logits and targets copied into the
    captured inputs; every replay's outputs against torch on the whole tensor."""
    import tritonsoftmax.distributed as tsd

    mine, V = _slices(widths)[rank], sum(widths)
    gen = torch.Generator().manual_seed(11)
    xl = torch.zeros(5, widths[rank], device=device, requires_grad=True)
    target = torch.zeros(5, dtype=torch.int64, device=device)

    def step():
        y = tsd.softmax(xl, -1)
        z = tsd.log_softmax(xl, -1)
        loss = tsd.cross_entropy(xl, target, label_smoothing=0.1)
        grad, = torch.autograd.grad((y * 0.5).sum() + (z * 0.25).sum() + loss, xl)
        return y, z, loss, grad

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for trial in range(3):
        x = torch.randn(5, V, generator=gen) * (trial + 1)
        t = torch.randint(0, V, (5,), generator=gen)
        with torch.no_grad():
            xl.copy_(x[:, mine])
            target.copy_(t)
        graph.replay()
        torch.cuda.synchronize(device)
        xw = x.double().requires_grad_()
        yw, zw = torch.softmax(xw, -1), torch.log_softmax(xw, -1)
        lw = F.cross_entropy(xw, t, label_smoothing=0.1)
        gw, = torch.autograd.grad((yw * 0.5).sum() + (zw * 0.25).sum() + lw, xw)
        what = f"rank {rank} CUDA graph replay {trial}"
        for got, want, name in zip(captured, (yw[:, mine], zw[:, mine], lw, gw[:, mine]),
                                   ("softmax", "log_softmax", "cross_entropy", "gradient"), strict=True):
            _close(got, want.to(device), torch.float32, f"{what} {name}")
