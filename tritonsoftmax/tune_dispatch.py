"""The family tuner: ``python -m tritonsoftmax.tune --dispatch``.

Measures the families against each other on a grid of (direction, dtype, row length, row count) on the
current GPU and writes, for each point, the family that ran fastest into the arch's table (its
``dispatch:`` mapping), with every family's time beside it. ``auto`` then runs that family at the shapes
the grid holds (dispatch.resolve asks tuning.dispatch_winner first); the rules and the policy decide
everywhere else. Each family runs as ``auto`` would launch it: with its ruled or stored config, else its
heuristic.

    python -m tritonsoftmax.tune --dispatch                          # the default grid, every dtype, both ways
    python -m tritonsoftmax.tune --dispatch --part 2/8               # the second of 8 pieces of it
    python -m tritonsoftmax.tune --dispatch --fine --part 1/40       # the every-n benchmark's lengths, in pieces
    python -m tritonsoftmax.tune --dispatch --dtypes bfloat16 --n 1152 4480 --m 4096 --directions fwd

Resumable: a point the table already holds is skipped (``--again`` measures it anew). A winner must beat
the rules' own choice by ``--margin`` (default 2 %) to replace it; within that the rules' choice is
recorded, so re-running on the same GPU does not flip decisions on noise.
"""

from __future__ import annotations

import sys

import torch

DIRECTIONS = ("fwd", "bwd")
DEFAULT_ROWS = (1, 8, 32, 512, 4096, 16384)


def default_lengths() -> list[int]:
    """Row lengths of the default grid: each power of two from 256 to 8M, one past it held as half a block plus a
    small tail (2**k + 2**k // 64), one short of it (odd: rows off 16 bytes) and halfway to the next."""
    out = set()
    for k in range(8, 24):
        p = 2**k
        out |= {p, p + p // 64, p - 1, 3 * p // 2}
    return sorted(n for n in out if n <= 2**23)


def fine_lengths() -> list[int]:
    """Row lengths on a fine grid (the ``--fine`` grid, and the every-n benchmark's lengths): every multiple of 64
    up to 16K; from 16K to 8M eight lengths an octave (multiples of 64); one short of and one past each power of
    two; a few odd ones (vocabulary sizes, primes). No length is then fast only because it is a tuned one."""
    out = set(range(64, 16385, 64))
    out |= {round(16384 * 2 ** (k / 8) / 64) * 64 for k in range(1, 73)}
    out |= {2**k + d for k in range(1, 24) for d in (-1, 1)}
    out |= {1, 3, 7, 100, 1000, 3000, 12345, 50257, 100003, 1000003}
    return sorted(out)


def grid(dtypes: list[str], directions: list[str], lengths: list[int], rows: list[int],
         max_elements: int) -> list[tuple[str, str, int, int]]:
    """Every (direction, dtype, N, M) point, M capped so that M * N <= max_elements (duplicates dropped)."""
    out = []
    for direction in directions:
        for dname in dtypes:
            for N in lengths:
                for m in rows:
                    point = (direction, dname, N, max(1, min(m, max_elements // N)))
                    if point not in out:
                        out.append(point)
    return out


def candidates(M: int, N: int, dtype: torch.dtype, info, backward: bool) -> list[str]:
    """The families that can run this shape on this device (the capabilities): tile never (the textbook
    baseline), fused only for rows it holds, coop and smem on CUDA only, smem only for rows it copies."""
    from . import dispatch
    from .kernels.fused import MAX_N
    from .layout import whole_vectors

    aligned = whole_vectors(N, dtype.itemsize)
    shape = dispatch.Shape(M, N, dtype, info, backward, aligned, True)
    out = ["fused"] if N <= MAX_N else []
    out += ["online", "split"]
    if info.backend == "cuda":
        out.append("coop")
        if dispatch.smem_copies(shape) and N > 1:
            out.append("smem")
    return out


def measure(point: tuple[str, str, int, int], info, dev: torch.device, timer) -> dict[str, float]:
    """ms of each candidate family at one point (a family that fails is left out, with a line on stderr)."""
    from . import execute

    direction, dname, N, M = point
    dtype = getattr(torch, dname)
    backward = direction == "bwd"
    x = torch.randn(M, N, device=dev, dtype=dtype)
    y = torch.softmax(x.float(), -1).to(dtype)
    dy = torch.randn_like(x)
    out = {}
    for name in candidates(M, N, dtype, info, backward):
        if backward:
            def call(name=name):
                return execute.backward(dy, y, -1, name, 1.0, False, dtype)
        else:
            def call(name=name):
                return execute.forward(x, -1, None, name, 1.0, False, False)
        try:
            call()
            out[name] = timer(call)
        except Exception as e:  # a family that cannot run the shape here: not a candidate after all
            print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", file=sys.stderr)
    return out


def pick(times: dict[str, float], ruled: str, margin: float) -> str:
    """The fastest family, unless the rules' choice is within ``margin`` of it."""
    best = min(times, key=times.get)
    if ruled in times and times[ruled] <= times[best] * (1 + margin):
        return ruled
    return best


def run(args, info, dev: torch.device, root, timer) -> int:
    """The --dispatch mode of python -m tritonsoftmax.tune (its parsed ``args``)."""
    from . import dispatch, tuning
    from .layout import whole_vectors

    lengths = sorted(set(args.n)) if args.n else fine_lengths() if args.fine else default_lengths()
    rows = args.m if args.m_given else list(DEFAULT_ROWS)
    points = grid(args.dtypes, args.directions, lengths, rows, args.max_elements)
    k, n = args.part
    points = points[k - 1::n]
    todo = [p for p in points if args.again or tuning.stored_winner(root, info, *p) is None]
    print(f"{len(points)} points in part {k}/{n}, {len(points) - len(todo)} already in {tuning.table_path(root, info)}")
    for i, point in enumerate(todo, 1):
        direction, dname, N, M = point
        dtype = getattr(torch, dname)
        ruled = dispatch.choose(M, N, dtype, info, direction == "bwd", whole_vectors(N, dtype.itemsize), True).impl
        times = measure(point, info, dev, timer)
        if not times:
            print(f"[{i}/{len(todo)}] {direction} {dname} {M}x{N}: no family ran", flush=True)
            continue
        winner = pick(times, ruled, args.margin)
        tuning.record_winner(root, info, point, winner, times)
        others = ", ".join(f"{f} {ms * 1e3:.1f}" for f, ms in sorted(times.items(), key=lambda kv: kv[1]))
        print(f"[{i}/{len(todo)}] {direction} {dname} {M}x{N}: {winner} (rules: {ruled}; us: {others})", flush=True)
    return 0
