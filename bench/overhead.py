"""Host overhead per eager call and GPU time per kernel, tritonsoftmax against torch.softmax.

    python -m bench.overhead [--shapes 8x2048 32x8192 ...] [--dtype float32 bfloat16] [--rounds 9] [--out DIR]

Host time: wall clock over many back-to-back calls with no synchronisation inside the loop
(for tiny inputs this is the CPU cost of one call, the GPU being faster), for torch.softmax,
our plain eager call and the same computation through the ``tritonsoftmax::softmax`` operator
(the path torch.compile takes), then a forward and backward with a gradient to record (torch's,
ours through eager autograd, ours through the operators, an autograd.Function that launches nothing: the
floor of a Python autograd step, and torch.softmax's inside ``patch_torch()``); where the C++ launch path builds,
our eager calls and the patched step again with it on. Each column's path (C++ on or off, inside the block or not)
is entered before and left after its timed run. The median of ``--rounds`` rounds, each timing every
function once, in an order reversed every other round (a process's host speed drifts by a few
microseconds; interleaving puts the drift on every function alike). Before the first shape's timed rounds, untimed
rounds run for ``--settle`` seconds: a process started while the host is still busy (say, straight after a parallel
pytest) times every function slower for a while. Several ``--dtype`` values are timed in the same rounds, so that
they share the process (host speed differs more between processes than between dtypes). GPU time: the same calls
captured in a CUDA graph and replayed, per call — no host work at all. Writes ``summary.md`` (the command first) to
DIR (default bench/results/<gpu>/overhead/).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch


def host_us(fn, calls: int = 2000) -> float:
    """Wall-clock microseconds per call over ``calls`` back-to-back calls."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


@contextlib.contextmanager
def launch_path(native_on: bool, patched: bool):
    """The path a column times: the C++ launch path on (its plans kept across switches) or off, inside
    patch_torch() or not; both are entered before and left after each timed run."""
    from tritonsoftmax import native, patch_torch

    if native_on:
        native.enable()
    try:
        with patch_torch() if patched else contextlib.nullcontext():
            yield
    finally:
        if native_on:
            native.disable(forget_plans=False)


def native_available() -> bool:
    """Whether the C++ launch path turns on here (built if needed); left off. Without it its columns are left out."""
    from tritonsoftmax import native

    on = native.enable()
    native.disable(forget_plans=False)
    return on


def native_fallbacks(step, steps: int = 20, patched: bool = False) -> str:
    """How many of ``steps`` calls of ``step`` (a training step) with the C++ launch path on (inside patch_torch()
    where ``patched``) ran their forward and their backward through Python instead, as "forward/backward": a
    signature C++ holds no plan for falls back to the Python path and pays its host time, which the C++ columns
    then include."""
    from tritonsoftmax import native

    with launch_path(True, patched):
        before = native.counts()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        after = native.counts()
    return "/".join(str(after[k] - before[k]) for k in ("forward_misses", "backward_misses"))


FALLBACK_STEPS = 20  # the steps native_fallbacks counts, after each shape's timed rounds


def interleaved_host_us(fns: list, rounds: int, settle_s: float = 0.0,
                        paths: list[tuple[bool, bool]] | None = None) -> list[float]:
    """The median host time of each of ``fns`` over ``rounds`` rounds, order reversed every other round, after
    untimed rounds for ``settle_s`` seconds; ``paths[i]``: fns[i] runs on launch_path(*paths[i])."""
    paths = paths or [(False, False)] * len(fns)

    def timed(i, calls):
        with launch_path(*paths[i]):
            if calls:
                for _ in range(calls):
                    fns[i]()
                return 0.0
            return host_us(fns[i])

    for i in range(len(fns)):
        timed(i, 200)
    end = time.perf_counter() + settle_s
    while time.perf_counter() < end:
        for i in range(len(fns)):
            timed(i, 0)
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            times[i].append(timed(i, 0))
    return [statistics.median(t) for t in times]


def graph_us(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def busy_host() -> str:
    """The host's 1-minute load average over its CPU cores (``?`` where the OS does not say)."""
    try:
        return f"{os.getloadavg()[0]:.2f} / {os.cpu_count()}"
    except (AttributeError, OSError):
        return "?"


def grad_step(fn, x: torch.Tensor, dy: torch.Tensor):
    """A training step's softmax: ``fn`` of a leaf copy of ``x`` and its input gradient for ``dy``
    (``torch.autograd.grad``: no accumulation into ``.grad``)."""
    xg = x.detach().requires_grad_()
    return lambda: torch.autograd.grad(fn(xg), xg, dy)


class EmptyFunction(torch.autograd.Function):
    """A ``torch.autograd.Function`` with the shape of ours (the input, six arguments, the output saved) whose
    forward and backward only allocate their result: the host time of the autograd machinery alone, the floor of
    any drop-in whose forward and backward are Python."""

    @staticmethod
    def forward(ctx, x, dim, dtype, impl, scale, log, zero_masked):
        y = torch.empty_like(x)
        ctx.save_for_backward(y)
        ctx.args = (dim, impl, scale, log, x.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return (torch.empty_like(y),) + (None,) * 6


def host_functions(x: torch.Tensor, dy: torch.Tensor) -> dict:
    """What the host columns time, by column: forward calls without a gradient to record, then forward and
    backward with one (grad_step)."""
    import tritonsoftmax

    op = torch.ops.tritonsoftmax.softmax.default

    def step(fn):
        return grad_step(fn, x, dy)

    return {
        "torch": lambda: torch.softmax(x, -1),
        "ours": lambda: tritonsoftmax.softmax(x),
        "ours through the operator": lambda: op(x, -1, None, "auto", 1.0, False, False),  # what compile calls
        "torch fwd+bwd": step(lambda t: torch.softmax(t, -1)),
        "ours fwd+bwd": step(tritonsoftmax.softmax),  # eager autograd: ops.SoftmaxFunction
        "ours fwd+bwd through the operator": step(lambda t: op(t, -1, None, "auto", 1.0, False, False)),
        "empty autograd.Function fwd+bwd": step(lambda t: EmptyFunction.apply(t, -1, None, "auto", 1.0, False,
                                                                              False)),
        "ours fwd+bwd" + PATCHED: step(lambda t: torch.softmax(t, -1)),  # torch's autograd node, our kernels
        NATIVE + "ours": lambda: tritonsoftmax.softmax(x),
        NATIVE + "ours fwd+bwd": step(tritonsoftmax.softmax),  # the C++ autograd Function
        NATIVE + "ours fwd+bwd" + PATCHED: step(lambda t: torch.softmax(t, -1)),  # torch's node, C++ kernels
    }


NATIVE = "C++ launch path: "  # host_functions' columns timed with tritonsoftmax.native on
PATCHED = " inside patch_torch()"  # ... and those timed inside the block


def column_path(name: str) -> tuple[bool, bool]:
    """launch_path's arguments for a host_functions column: (C++ launch path on, inside patch_torch())."""
    return name.startswith(NATIVE), name.endswith(PATCHED)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8x2048", "8x4096", "32x4096", "32x8192"])
    ap.add_argument("--dtype", nargs="+", default=["float32"], help="dtypes timed in the same rounds")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of host timing (median reported)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of untimed rounds before the first shape's timed ones")
    ap.add_argument("--out", default=None, help="output folder (default bench/results/<gpu>/overhead/)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.overhead times CUDA launches and needs a GPU", file=sys.stderr)
        return 2
    import triton

    from bench.common import results_dir
    from tritonsoftmax import ops  # noqa: F401  (registers torch.ops.tritonsoftmax)
    from tritonsoftmax.device import device_info

    load_start = busy_host()

    with_native = native_available()

    def timed_functions(x, dy) -> dict:
        return {k: f for k, f in host_functions(x, dy).items() if with_native or not k.startswith(NATIVE)}

    names = list(timed_functions(torch.empty(0), torch.empty(0)))
    fallbacks = [f"{NATIVE}steps of {FALLBACK_STEPS} through Python (fwd/bwd)",
                 f"{NATIVE}steps of {FALLBACK_STEPS}{PATCHED} through Python (fwd/bwd)"] if with_native else []
    table = ["| shape | dtype | " + " | ".join(f"{n} host µs" for n in names) + " | torch GPU µs | ours GPU µs | "
             + "".join(f"{f} |" for f in fallbacks),
             "| " + " | ".join(["---"] * (len(names) + 4 + len(fallbacks))) + " |"]
    print("\n".join(table))
    for index, s in enumerate(args.shapes):
        M, N = map(int, s.split("x"))
        settle = args.settle if index == 0 else 0.0
        fns, paths = [], []
        for dname in args.dtype:
            dtype = getattr(torch, dname)
            x, dy = torch.randn(M, N, device="cuda", dtype=dtype), torch.randn(M, N, device="cuda", dtype=dtype)
            fns += timed_functions(x, dy).values()
            paths += [column_path(n) for n in names]
        if settle:
            print(f"(untimed rounds for {settle:g} s first)", file=sys.stderr, flush=True)
        host = interleaved_host_us(fns, args.rounds, settle, paths)
        k = len(names)
        for i, dname in enumerate(args.dtype):
            theirs, ours = fns[k * i:k * i + 2]
            row = [f"{v:.1f}" for v in (*host[k * i:k * i + k], graph_us(theirs), graph_us(ours))]
            if with_native:
                for column in ("ours fwd+bwd", "ours fwd+bwd" + PATCHED):
                    row.append(native_fallbacks(fns[k * i + names.index(NATIVE + column)], FALLBACK_STEPS,
                                                patched=column.endswith(PATCHED)))
            table.append(f"| {M}×{N} | {dname} | " + " | ".join(row) + " |")
            print(table[-1], flush=True)
    info = device_info(torch.device("cuda"))
    out = results_dir(info.slug, "overhead", args.out)
    command = " ".join(["python -m bench.overhead", *(argv if argv is not None else sys.argv[1:])])
    autotune = os.environ.get("TRITONSOFTMAX_AUTOTUNE", "1")
    lines = [f"Command: `{command}` (TRITONSOFTMAX_AUTOTUNE={autotune})", "",
             f"{info.name}; torch {torch.__version__}, triton {triton.__version__}. Host µs: wall clock per call over "
             f"2000 back-to-back calls, median of {args.rounds} interleaved rounds (one process). GPU µs: the same "
             "call captured in a CUDA graph and replayed (no host work). `fwd+bwd`: `torch.autograd.grad` of the "
             "forward with a gradient to record; `through the operator`: the `tritonsoftmax::softmax` operator that "
             "`torch.compile` calls; `ours`: the plain eager call; `empty autograd.Function`: a Function "
             "shaped like ours that only allocates (no kernel), the autograd machinery's own host time; "
             "`inside patch_torch()`: torch.softmax's forward "
             "and backward with our kernels as aten's (torch's own C++ autograd node). `C++ launch path`: the same "
             "calls with `tritonsoftmax.native` on (its C++ autograd Function, and inside patch_torch() its C++ aten "
             "kernels, start the kernels the Python path compiled). The C++ path and the block are entered before "
             "and left after each timed run, so every column shares every round. The last columns count, over "
             f"{FALLBACK_STEPS} steps after the timed rounds, the forwards and backwards that found no C++ plan and "
             "ran through Python.",
             "",
             f"Host load (1-minute load average / CPU cores) at the start {load_start} and at the end {busy_host()}: "
             "other work on the host slows every column alike, torch's too.", "", *table]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
