"""Vocabulary-parallel softmax and cross-entropy across the ranks of a process group, ours against the same
algorithm in torch operators (Megatron's way: a max all-reduce, a sum all-reduce, full passes between) and
against one slice's local softmax and the collective alone.

    torchrun --nproc-per-node 2 -m bench.distributed [--rows 1 512 4096 16384] [--vocab 32000 151936 256000]
        [--dtype float32 bfloat16] [--iters 20] [--out DIR]

Every rank holds an even slice of each row (the last takes the remainder). Before timing, each provider's output
and gradient on this rank's slice are checked against torch on the whole (gathered) tensor in float64. Timing: a
fixed number of calls on every rank (a collective needs every rank), CUDA events around them (a wall clock on the
CPU), the slowest rank's time. Lines (each forward, then forward + backward):

- ``ours``: ``tritonsoftmax.distributed`` (softmax; cross_entropy with mean reduction);
- ``torch ops``: the torch-operator version with two all-reduces (max, then the rescaled sum) for softmax and
  three for cross_entropy (max, sum, the target's logit), as Megatron writes it;
- ``local``: our softmax of this rank's slice alone (no collective), and ``collective``: the all-gather of two
  floats a row alone: the issue's bound is ours <= 1.2 x (local + collective).

Writes summary.md (the command first) and distributed.csv to DIR (default
bench/results/<gpu>/distributed-<ranks>/), on rank 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _slice(V: int, rank: int, world: int) -> slice:
    width = V // world
    start = rank * width
    return slice(start, V if rank == world - 1 else start + width)


def megatron_softmax(x: torch.Tensor, group=None) -> torch.Tensor:
    """Softmax over the whole row from this rank's slice in torch operators: the row max all-reduced, exp, the sum
    all-reduced, divide (fp32 math)."""
    z = x.float()
    m = z.amax(-1, keepdim=True)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    e = torch.exp(z - m)
    s = e.sum(-1, keepdim=True)
    dist.all_reduce(s, group=group)
    return (e / s).to(x.dtype)


class _MegatronSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        y = megatron_softmax(x, group)
        ctx.save_for_backward(y)
        ctx.group = group
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        yf, g = y.float(), dy.float()
        part = (g * yf).sum(-1, keepdim=True)
        dist.all_reduce(part, group=ctx.group)
        return (yf * (g - part)).to(y.dtype), None


class _MegatronCrossEntropy(torch.autograd.Function):
    """Megatron's vocab-parallel cross-entropy (mean over the rows), in torch operators."""

    @staticmethod
    def forward(ctx, logits, target, start, group):
        z = logits.float()
        m = z.amax(-1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = z - m[:, None]
        local = (target >= start) & (target < start + z.shape[1])
        idx = (target - start).clamp(0, z.shape[1] - 1)
        picked = torch.where(local, z.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(m))
        dist.all_reduce(picked, group=group)
        e = torch.exp(z)
        s = e.sum(-1)
        dist.all_reduce(s, group=group)
        loss = torch.log(s) - picked
        e /= s[:, None]
        ctx.save_for_backward(e, local, idx)
        ctx.dtype = logits.dtype
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        p, local, idx = ctx.saved_tensors
        dz = p.clone()
        rows = local.nonzero().squeeze(1)
        dz[rows, idx[rows]] -= 1.0
        dz *= grad / p.shape[0]
        return dz.to(ctx.dtype), None, None, None


def _timed(fn, iters: int, device: torch.device, group=None) -> float:
    """Milliseconds a call, the slowest rank's: ``iters`` calls after 3 untimed ones, on every rank."""
    for _ in range(3):
        fn()
    dist.barrier(group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        ms = start.elapsed_time(end) / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        ms = (time.perf_counter() - t0) * 1e3 / iters
    worst = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst.item())


def _check(got: torch.Tensor, want: torch.Tensor, what: str, tol: float) -> None:
    err = (got.double() - want).abs().max().item() / max(1.0, want.abs().max().item())
    if not err <= tol:
        raise AssertionError(f"{what}: max error {err:.3g} over {tol}")


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


def measure(M: int, V: int, dtype: torch.dtype, iters: int, device: torch.device, group=None) -> dict:
    """One point: every provider checked against torch on the whole row, then timed (ms, slowest rank)."""
    import tritonsoftmax
    import tritonsoftmax.distributed as tsd

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = _slice(V, rank, world)
    gen = torch.Generator().manual_seed(11)
    whole = torch.randn(M, V, generator=gen) * 3
    target = torch.randint(0, V, (M,), generator=gen)
    dy_whole = torch.randn(M, V, generator=gen)
    x = whole[:, mine].to(device, dtype).contiguous()
    dy = dy_whole[:, mine].to(device, dtype).contiguous()
    target = target.to(device)
    ref = torch.softmax(whole.to(dtype).double(), -1)
    ref_grad = ref * (dy_whole.to(dtype).double() - (dy_whole.to(dtype).double() * ref).sum(-1, keepdim=True))
    xd = whole.to(dtype).double().requires_grad_()
    F.cross_entropy(xd, target.cpu()).backward()
    tol = TOL[dtype]

    softmaxes = {"ours": lambda t: tsd.softmax(t, -1, group=group),
                 "torch ops": lambda t: _MegatronSoftmax.apply(t, group)}
    losses = {"ours": lambda t: tsd.cross_entropy(t, target, group=group),
              "torch ops": lambda t: _MegatronCrossEntropy.apply(t, target, mine.start, group)}
    for name, fn in softmaxes.items():
        xg = x.clone().requires_grad_()
        y = fn(xg)
        y.backward(dy)
        _check(y, ref[:, mine].to(device), f"{name} softmax", tol)
        _check(xg.grad, ref_grad[:, mine].to(device), f"{name} softmax gradient", tol)
    for name, fn in losses.items():
        xg = x.clone().requires_grad_()
        fn(xg).backward()
        _check(xg.grad, xd.grad[:, mine].to(device), f"{name} cross_entropy gradient", tol)

    def step(fn, grad=None):
        xg = x.detach().requires_grad_()
        return lambda: torch.autograd.grad(fn(xg), xg, grad)

    pairs = torch.zeros(2, M, device=device)
    gathered = [torch.empty_like(pairs) for _ in range(world)]
    row = {"M": M, "V": V, "dtype": str(dtype).removeprefix("torch."), "ranks": world}
    for name, fn in softmaxes.items():
        row[f"softmax {name} fwd"] = _timed(lambda fn=fn: fn(x), iters, device, group)
        row[f"softmax {name} fwd+bwd"] = _timed(step(fn, dy), iters, device, group)
    for name, fn in losses.items():
        row[f"cross_entropy {name} fwd"] = _timed(lambda fn=fn: fn(x), iters, device, group)
        row[f"cross_entropy {name} fwd+bwd"] = _timed(step(fn), iters, device, group)
    row["softmax local fwd"] = _timed(lambda: tritonsoftmax.softmax(x, -1), iters, device, group)
    row["collective"] = _timed(lambda: dist.all_gather(gathered, pairs, group=group), iters, device, group)
    row["slice bytes"] = 2 * x.numel() * x.element_size()
    return row


COLUMNS = ["softmax ours fwd", "softmax torch ops fwd", "softmax local fwd", "collective", "softmax ours fwd+bwd",
           "softmax torch ops fwd+bwd", "cross_entropy ours fwd", "cross_entropy torch ops fwd",
           "cross_entropy ours fwd+bwd", "cross_entropy torch ops fwd+bwd"]


def summary(rows: list[dict], command: str, device_name: str) -> str:
    """summary.md: the command, then a table of ms a call (slowest rank) and the two ratios the issue targets."""
    import triton

    lines = [f"Command: `{command}`", "",
             f"{device_name} x {rows[0]['ranks'] if rows else '?'} ranks; torch {torch.__version__}, triton "
             f"{triton.__version__}. ms a call, the slowest rank's, CUDA events around a fixed number of calls on "
             "every rank. `ours / bound` = ours forward / (local softmax of the slice + the all-gather of two floats "
             "a row): the target is 1.2 or less. `CE speed-up` = torch ops / ours, cross_entropy forward + backward: "
             "the target is 2 or more.", "",
             "| M×V | dtype | " + " | ".join(COLUMNS) + " | ours / bound | CE speed-up |",
             "| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " | --- | --- |"]
    for r in rows:
        bound = r["softmax ours fwd"] / (r["softmax local fwd"] + r["collective"])
        speedup = r["cross_entropy torch ops fwd+bwd"] / r["cross_entropy ours fwd+bwd"]
        cells = " | ".join(f"{r[c]:.4g}" for c in COLUMNS)
        lines.append(f"| {r['M']}×{r['V']} | {r['dtype']} | {cells} | {bound:.2f} | {speedup:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 512, 4096, 16384])
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936, 256000])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--max-elements", type=int, default=2**31 // 4,
                    help="skip points whose whole M x V exceeds this (the float64 reference is built on every rank)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        print("run it under torchrun: torchrun --nproc-per-node N -m bench.distributed ...", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        rows = []
        for dname in args.dtype:
            for V in args.vocab:
                for M in args.rows:
                    if M * V > args.max_elements:
                        continue
                    rows.append(measure(M, V, getattr(torch, dname), args.iters, device))
                    if dist.get_rank() == 0:
                        r = rows[-1]
                        print(f"{M}x{V} {dname}: softmax ours {r['softmax ours fwd']:.4g} ms, torch ops "
                              f"{r['softmax torch ops fwd']:.4g}; cross_entropy fwd+bwd ours "
                              f"{r['cross_entropy ours fwd+bwd']:.4g}, torch ops "
                              f"{r['cross_entropy torch ops fwd+bwd']:.4g}", flush=True)
        if dist.get_rank() == 0:
            from bench.common import results_dir
            from tritonsoftmax.device import device_info

            name = device_info(device).name if cuda else "CPU (gloo; the kernels under the Triton interpreter)"
            slug = device_info(device).slug if cuda else "cpu-interpreter"
            out = results_dir(slug, f"distributed-{dist.get_world_size()}", args.out)
            command = " ".join(["torchrun --nproc-per-node", str(dist.get_world_size()), "-m bench.distributed",
                                *(argv if argv is not None else sys.argv[1:])])
            (out / "summary.md").write_text(summary(rows, command, name))
            keys = list(rows[0]) if rows else []
            (out / "distributed.csv").write_text("\n".join([",".join(keys)] + [
                ",".join(str(r[k]) for k in keys) for r in rows]) + "\n")
            print(f"wrote {out}/summary.md")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
