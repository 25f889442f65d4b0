"""Host overhead per eager call and GPU time per kernel, tritonsoftmax against torch.softmax.

    python -m bench.overhead [--shapes 8x2048 32x8192 ...] [--dtype float32]

Host time: wall clock over many back-to-back calls with no synchronisation inside the loop
(for tiny inputs this is the CPU cost of one call, the GPU being faster), for torch.softmax,
our plain eager call and the same computation through the ``tritonsoftmax::softmax`` operator
(the path autograd and torch.compile take). GPU time: the same
calls captured in a CUDA graph and replayed, per call — no host work at all.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def host_us(fn, calls: int = 3000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8x2048", "8x4096", "32x4096", "32x8192"])
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    import tritonsoftmax

    dtype = getattr(torch, args.dtype)
    from tritonsoftmax import ops  # noqa: F401  (registers torch.ops.tritonsoftmax)

    op = torch.ops.tritonsoftmax.softmax.default
    print("| shape | dtype | torch host µs | ours host µs | ours through the operator host µs | torch GPU µs "
          "| ours GPU µs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in args.shapes:
        M, N = map(int, s.split("x"))
        x = torch.randn(M, N, device="cuda", dtype=dtype)
        ours = lambda x=x: tritonsoftmax.softmax(x)  # noqa: E731
        theirs = lambda x=x: torch.softmax(x, -1)  # noqa: E731
        via_op = lambda x=x: op(x, -1, None, "auto", 1.0, False, False)  # noqa: E731  (what autograd/compile call)
        row = [host_us(theirs), host_us(ours), host_us(via_op), graph_us(theirs), graph_us(ours)]
        print(f"| {M}×{N} | {args.dtype} | " + " | ".join(f"{v:.1f}" for v in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
