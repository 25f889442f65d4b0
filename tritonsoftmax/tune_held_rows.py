"""The held-rows tuner: ``python -m tritonsoftmax.tune --held-rows``.

The policy's ``held_rows`` names, by direction, element size and block, a span of row lengths that many rows run
fused, one row a program, held as half the block plus a tail (``HELD``), on a measured warp count
(dispatch.held_rows_warps): the warps a row with a tail wants are not the ones the rules or the tuning table give its
block. This tuner measures it on the current GPU. For each block of ``--blocks`` and each dtype, ``--steps`` row
lengths between half the block and the block (on 16-byte boundaries), at ``--m`` rows (the first value; default
4096), it times the fused kernel held on each warp count of ``--warps`` against auto as the rules decide without
``held_rows``. A length's winner is its fastest warp count where that beats auto by ``--margin``; dtypes of one
element size must agree. The entry of a block is the longest run of consecutive measured lengths with one winner,
[its first length, its last, the warps]; a block with no run loses its entry. Lengths between the measured ones
take the entry only inside a run. The result goes into the table's ``policy: held_rows`` (the table's other
blocks and directions kept); the dispatcher honours it on any backend, AMD included (warps there are the device's
waves: 64 lanes on CDNA, so fewer counts fit a block).

    python -m tritonsoftmax.tune --held-rows --dtypes bfloat16 float16 --blocks 8192 16384 --timer kernel --repo
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable

import torch

DEFAULT_BLOCKS = (1024, 2048, 4096, 8192, 16384)
DEFAULT_WARPS = (2, 4, 8, 16, 32)


def lengths(block: int, steps: int, itemsize: int) -> list[int]:
    """``steps`` - 1 row lengths evenly spaced between half ``block`` and ``block`` (both left out: a row of half the
    block has no tail, a full row no padding), each a whole number of 16-byte vectors; fewer where the block is
    too short for that many."""
    vector = 16 // itemsize
    step = max(vector, (block // 2) // steps // vector * vector)
    return [n for n in range(block // 2 + step, block, step)][:max(0, steps - 1)]


def warp_counts(block: int, warps: tuple[int, ...] | list[int], info) -> list[int]:
    """The warp counts worth timing for a block on this device (its warp size: 64 on CDNA): at least one element of
    the block's half a thread, no more threads than a program may have."""
    return [w for w in warps if w * info.warp_size <= min(block // 2, info.max_threads_per_program)]


def winner(times: dict, margin: float) -> int | None:
    """The fastest warp count in ``times`` ({"auto": ms, warps: ms, ...}) where it beats auto by ``margin``."""
    held = {w: t for w, t in times.items() if w != "auto"}
    if not held or "auto" not in times:
        return None
    best = min(held, key=held.get)
    return best if held[best] < times["auto"] * (1 - margin) else None


def longest_run(winners: dict[int, int | None]) -> list[int] | None:
    """[first length, last length, warps] of the longest run of consecutive lengths (in ``winners``' sorted order)
    with one winner; the earlier run where two are as long; None where no length has one."""
    best, run = None, None
    for n in sorted(winners):
        w = winners[n]
        if w is not None and run is not None and run[2] == w:
            run[1] = n
        else:
            run = [n, n, w] if w is not None else None
        if run is not None and (best is None or _span(run) > _span(best)):
            best = list(run)
    return best


def _span(run: list[int]) -> int:
    return run[1] - run[0]


def merged_entries(current: dict | None, measured: dict[tuple[str, int, int], list[int] | None]) -> dict:
    """``current`` held_rows ({"fwd" | "bwd": {bytes: {block: entry}}}) with the measured blocks' entries replaced
    (a None entry removes its block; emptied levels go too)."""
    out = {direction: {nbytes: {block: list(entry) for block, entry in blocks.items()}
                       for nbytes, blocks in sizes.items()} for direction, sizes in (current or {}).items()}
    for (direction, nbytes, block), entry in measured.items():
        blocks = out.setdefault(direction, {}).setdefault(nbytes, {})
        if entry is None:
            blocks.pop(block, None)
        else:
            blocks[block] = list(entry)
        if not blocks:
            del out[direction][nbytes]
        if not out[direction]:
            del out[direction]
    return out


@contextlib.contextmanager
def rules_without_held_rows(info):
    """auto as the rules decide with no held_rows (every cached decision and launch forgotten on the way in and out)."""
    from . import api, policy

    api.clear_caches()
    policy.pin(info, dataclasses.replace(policy.policy_for(info), held_rows=None))
    try:
        yield
    finally:
        api.clear_caches()


def measure(direction: str, dtype: torch.dtype, block: int, N: int, M: int, warps: list[int], info,
            dev: torch.device, timer: Callable) -> dict:
    """ms of auto (as the policy in force decides: run inside rules_without_held_rows) and of the held fused kernel on
    each warp count, {"auto": ms, warps: ms}; a config that fails to run, or whose result is off float64 by more than
    the dtype's tolerance, is left out (with a line on stderr)."""
    from . import execute
    from .config import LaunchConfig
    from .kernels import backward_family, family
    from .tune import Workload

    backward = direction == "bwd"
    work = Workload(torch.randn(M, N, device=dev, dtype=dtype), backward)
    if backward:
        def auto():
            return execute.backward(work.dy, work.y, -1, "auto", 1.0, False, dtype)
    else:
        def auto():
            return execute.forward(work.x, -1, None, "auto", 1.0, False, False)
    auto()
    out = {"auto": timer(auto)}
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    fused = (backward_family if backward else family)("fused")
    for w in warps:
        config = LaunchConfig.make(w, BLOCK_N=block, ROWS=1, HELD=1)
        try:
            launch = fused.prepare(work.problem, config, info, flags=work.flags)
            error = work.error(launch)
            if not error <= tolerance:
                print(f"  {w} warps: off float64 by {error:.3g}; left out", file=sys.stderr)
                continue
            out[w] = timer(lambda launch=launch: work.run(launch))
        except Exception as e:  # a config this GPU cannot run: not a candidate
            print(f"  {w} warps: {type(e).__name__}: {str(e).splitlines()[0][:100]}", file=sys.stderr)
    return out


def run(args, info, dev: torch.device, root, timer: Callable) -> int:
    """The --held-rows mode of python -m tritonsoftmax.tune (its parsed ``args``)."""
    from . import api, policy, tuning

    with rules_without_held_rows(info):  # auto's times: the rules without held_rows (tables read once)
        by_size = _measure_all(args, info, dev, timer)
    measured = {}
    for key, wins in by_size.items():
        agreed = {n: next(iter(ws)) if len(ws) == 1 else None for n, ws in wins.items()}
        measured[key] = longest_run(agreed)
    value = merged_entries(policy.policy_for(info).held_rows, measured)
    path = tuning.record_policy(root, info, "held_rows", value or None)
    api.clear_caches()  # the next decision in this process reads what was written
    for (direction, nbytes, block), entry in sorted(measured.items()):
        print(f"held_rows {direction} {nbytes}-byte {block}: {entry if entry else 'none (rules)'}")
    print(f"wrote held_rows to {path}")
    return 0


def _measure_all(args, info, dev: torch.device, timer: Callable) -> dict[tuple[str, int, int], dict[int, set]]:
    """Every (direction, dtype, block, length) of the run at ``--m``'s first row count, its times printed: {(direction,
    element bytes, block): {N: the set of the dtypes' winners}}."""
    from .tune import DTYPES

    M = args.m[0]
    by_size: dict[tuple[str, int, int], dict[int, set]] = {}
    for direction in args.directions:
        for dname in args.dtypes:
            dtype = DTYPES[dname]
            for block in args.blocks:
                warps = warp_counts(block, args.warps, info)
                for N in lengths(block, args.steps, dtype.itemsize):
                    times = measure(direction, dtype, block, N, M, warps, info, dev, timer)
                    w = winner(times, args.margin)
                    by_size.setdefault((direction, dtype.itemsize, block), {}).setdefault(N, set()).add(w)
                    shown = ", ".join(f"{k if k == 'auto' else f'{k} warps'} {ms * 1e3:.1f}"
                                      for k, ms in times.items())
                    print(f"{direction} {dname} {M}x{N} (block {block}): "
                          f"{'auto' if w is None else f'{w} warps'} (us: {shown})", flush=True)
    return by_size
