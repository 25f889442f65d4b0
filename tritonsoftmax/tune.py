"""The tuner: ``python -m tritonsoftmax.tune``.

Times every config of a family's search space for each (dtype, N bucket, M) on the current GPU, each
in the form a launch from the table will run it (``Family.dispatched_form``: smem cuts a bucket's config
to the row's length), and writes the winners to a tuning table (``tune_cache/<backend>/<arch>.yaml``
layout).

    python -m tritonsoftmax.tune                                 # what `auto` uses, all dtypes, N = 1 .. 8M
                                                                  # (buckets of 8..512 also at top - 3: odd rows)
    python -m tritonsoftmax.tune --dtypes float32 --n-max 65536  # a part of it
    python -m tritonsoftmax.tune --families fused online tile    # every family, not only auto's
    python -m tritonsoftmax.tune --families coop --n 152064 --m 32  # one exact shape (stored under its bucket)
    python -m tritonsoftmax.tune --repo                          # write the checkout's tune_cache/ (to contribute)
    python -m tritonsoftmax.tune --n 131072 --m 1 8 --timer kernel  # few short launches: rank by kernel time
    python -m tritonsoftmax.tune --families fused --n 300 400 512 --m 16384  # one entry for bucket 512,
                                                                  # chosen across the three lengths
    python -m tritonsoftmax.tune --families coop --n 131072 --m 8 16  # one entry for M bucket 16, chosen
                                                                  # across 8 and 16 rows
    python -m tritonsoftmax.tune --families fused --n 4100 6144 --up-to  # an entry for rows of 4097..6144
                                                                  # (the 8192 bucket's entry keeps the rest)
    python -m tritonsoftmax.tune --dispatch --part 1/8            # which family wins where (tune_dispatch.py)
    python -m tritonsoftmax.tune --held-rows --dtypes bfloat16 float16 --blocks 8192 16384  # the policy's held_rows
                                                                  # (tune_held_rows.py)

By default the table goes to the user directory (``TRITONSOFTMAX_TUNE_CACHE``, default
``~/.cache/tritonsoftmax``). Under the Triton interpreter (no GPU) it runs only when
``TRITON_INTERPRET=1`` is set, and then it times the interpreter (useful for testing only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from .config import m_bucket, n_bucket
from .kernel_timer import NEEDS_GPU, TIMERS, kernel_ms

FORWARD_FLAGS = {"LOG": 0, "ZERO_MASKED": 0}  # tables are tuned on plain softmax (the same kernels' cost)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# A run without --n tunes each bucket top of 8..ODD_BESIDE_MAX with an odd length of its bucket beside it (top - 3).
# Odd rows start off 16 bytes, several short rows a program then load element by element, and that ranks configs
# differently (two configs level at 4096x16 can differ by a quarter at 4096x13). Longer buckets keep the top alone:
# their one-row configs realign odd rows (kernels/constexprs.row_align); give --n an odd length to tune one that way.
ODD_BESIDE_MAX = 512


def record_autotuned(launch) -> None:
    """With TRITONSOFTMAX_TUNE_SAVE=1, write what a launch's first call autotuned (its config and time) to the
    user's tuning table, so later processes launch it without tuning. (The tuner's modules are the only ones that
    write tables.)"""
    from . import tuning
    from .config import save_tuning_enabled

    if not getattr(launch, "autotuned", False) or not save_tuning_enabled():
        return
    p = launch.problem
    tuning.record(tuning.user_dir(), launch.device, [(launch.family.name, p.dtype, p.N, p.M, launch.config,
                                                      launch.autotuned_ms)])


def default_lengths(n_min: int, n_max: int, odd: bool = True) -> list[int]:
    """The row lengths a run without --n tunes: the bucket tops of n_min..n_max, and with ``odd`` beside each top
    of 8..ODD_BESIDE_MAX the odd length top - 3 (in the same bucket, so the two give one entry)."""
    tops = [b for b in (2**k for k in range(31)) if n_bucket(n_min) <= b <= n_max]
    return sorted(tops + [b - 3 for b in tops if odd and 8 <= b <= ODD_BESIDE_MAX])


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tritonsoftmax.tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=["auto"],
                    help="'auto' (the family the dispatcher picks for each N) or family names")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--n-min", type=int, default=1)
    ap.add_argument("--n-max", type=int, default=8 * 2**20)
    ap.add_argument("--n", type=int, nargs="+",
                    help="tune at these exact row lengths instead of the bucket tops of --n-min..--n-max; each "
                         "entry is stored under its N bucket (for shapes where a bucket's top does not stand for "
                         "it, e.g. coop with few rows: 32x152064 against 32x262144). Several lengths in one "
                         "bucket give one entry: the config whose worst time, as a share of the best config's "
                         "at each length, is least")
    ap.add_argument("--no-odd", action="store_true",
                    help=f"without --n: tune each bucket at its top alone, not also at an odd length beside the tops "
                         f"of 8..{ODD_BESIDE_MAX} (rows off 16 bytes, which rank short-row configs differently)")
    ap.add_argument("--up-to", action="store_true",
                    help="with --n: store each entry under the longest of its lengths instead of the bucket; it "
                         "then serves the bucket's rows up to that length, and a longer key of the bucket (the "
                         "bucket's own entry) the rest")
    ap.add_argument("--m", type=int, nargs="+", default=[4096],
                    help="row counts to tune at (each capped so that M*N <= --max-elements); counts in one M "
                         "bucket (1, 4, 16, ...: 8 and 16 share 16) give one entry, chosen across them as across "
                         "lengths")
    ap.add_argument("--max-elements", type=int, default=2**27)
    ap.add_argument("--rep-ms", type=float, default=25.0, help="do_bench repetition budget per config")
    ap.add_argument("--timer", choices=TIMERS, default="events",
                    help="events: do_bench (default); kernel: the GPU time of the launch's kernels from CUPTI "
                         "(tritonsoftmax.kernel_timer), for launches of a few microseconds, where do_bench's "
                         "event time is a large, noisy share (GPU only; entries record the timer)")
    ap.add_argument("--backward", action="store_true",
                    help="tune the families' backward kernels (stored as <family>-bwd) instead of the forward")
    ap.add_argument("--dispatch", action="store_true",
                    help="the family tuner (tritonsoftmax.tune_dispatch): time the families against each other on "
                         "a grid and record the fastest at each point in the table's dispatch: mapping")
    ap.add_argument("--fine", action="store_true",
                    help="with --dispatch and without --n: the fine grid of row lengths (every multiple of 64 to 16K, "
                         "eight an octave to 8M, odd ones; the every-n benchmark's) instead of powers of two and their "
                         "neighbours")
    ap.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"],
                    help="with --dispatch: the forward, the backward, or both (default)")
    ap.add_argument("--part", default="1/1", metavar="K/N",
                    help="with --dispatch: measure the K-th of N pieces of the grid (every N-th point)")
    ap.add_argument("--again", action="store_true", help="with --dispatch: measure points the table holds already")
    ap.add_argument("--margin", type=float, default=0.02,
                    help="with --dispatch: how much faster than the rules' choice a family must be to replace it; "
                         "with --held-rows: how much faster than auto a warp count must be")
    ap.add_argument("--held-rows", action="store_true",
                    help="the held-rows tuner (tritonsoftmax.tune_held_rows): time the fused kernel holding rows "
                         "between half a block and the block on each warp count against auto, and write the "
                         "policy's held_rows")
    ap.add_argument("--blocks", type=int, nargs="+", default=None,
                    help="with --held-rows: the blocks (powers of two) whose rows it measures (default 1024..16384)")
    ap.add_argument("--steps", type=int, default=16,
                    help="with --held-rows: lengths a block, evenly spaced between its half and itself (steps - 1)")
    ap.add_argument("--warps", type=int, nargs="+", default=None,
                    help="with --held-rows: the warp counts it times (default 2 4 8 16 32)")
    dest = ap.add_mutually_exclusive_group()
    dest.add_argument("--repo", action="store_true", help="write the repository's tune_cache/ (contributing)")
    dest.add_argument("--out", type=Path, help="write under this directory instead of the user directory")
    args = ap.parse_args(argv)
    args.m_given = argv is not None and "--m" in argv or argv is None and "--m" in sys.argv[1:]
    try:
        k, n = (int(v) for v in args.part.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        ap.error(f"--part takes K/N with 1 <= K <= N, got {args.part!r}")
    args.part = (k, n)
    from .tune_held_rows import DEFAULT_BLOCKS, DEFAULT_WARPS

    args.blocks = args.blocks or list(DEFAULT_BLOCKS)
    args.warps = args.warps or list(DEFAULT_WARPS)
    if any(b < 64 or b & (b - 1) for b in args.blocks) or args.steps < 2 or min(args.warps) < 1:
        ap.error("--blocks takes powers of two from 64, --steps 2 or more, --warps counts of 1 or more")
    return args


class Workload:
    """One tuning shape: the tensors, how to run a prepared launch on them and check its result.

    Forward: softmax of x into y (bytes: x read, y written). Backward: dx from dy and the saved
    output y = softmax(x) (bytes: dy and y read, dx written)."""

    def __init__(self, x: torch.Tensor, backward: bool):
        from .layout import matrix_problem

        self.backward = backward
        if backward:
            self.y = torch.softmax(x.float(), -1).to(x.dtype)
            self.dy = torch.randn_like(x)
            self.out = torch.empty_like(x)
            self.problem = matrix_problem(self.y, self.out)
            self.flags = {"LOG": 0}
            self.args = (self.dy, self.out, self.y, 1.0)
            self.nbytes = 3 * x.numel() * x.element_size()
        else:
            self.x, self.out = x, torch.empty_like(x)
            self.problem = matrix_problem(x, self.out)
            self.flags = FORWARD_FLAGS
            self.args = (x, self.out, 1.0)
            self.nbytes = 2 * x.numel() * x.element_size()

    def run(self, launch) -> None:
        launch(*self.args)

    def error(self, launch) -> float:
        """Max abs error of ``launch``'s result against float64."""
        self.run(launch)
        if self.backward:
            y, dy = self.y.double(), self.dy.double()
            ref = y * (dy - (dy * y).sum(-1, keepdim=True))
        else:
            ref = torch.softmax(self.x.double(), -1)
        return (self.out.double() - ref).abs().max().item()


def _timer(rep_ms: float, kind: str = "events"):
    from .device import interpreter_active
    from .kernels.kernel_family import interpreter_bench

    if kind == "kernel":
        return lambda fn: kernel_ms(fn, calls=20)
    if interpreter_active():
        return lambda fn: interpreter_bench(fn)
    import triton

    return lambda fn: triton.testing.do_bench(fn, warmup=5, rep=rep_ms, return_mode="median")


def choose_across_lengths(timings_by_n: dict) -> tuple:
    """The config for one entry from its timings at one or several lengths ({shape: {config: ms}}): the
    one whose worst time, as a share of the best config's at each length, is least (ties: the least
    summed share). Only configs that ran at every length count. Returns (config, that worst share),
    or (None, None) when no config ran at every length."""
    tables = list(timings_by_n.values())
    common = [c for c in tables[0] if all(c in t for t in tables[1:])]
    if not common:
        return None, None
    best = [min(t.values()) for t in tables]
    shares = {c: [t[c] / b for t, b in zip(tables, best, strict=True)] for c in common}
    chosen = min(common, key=lambda c: (max(shares[c]), sum(shares[c])))
    return chosen, max(shares[chosen])


def _workload_layout(N: int, dtype: torch.dtype) -> tuple[bool, bool]:
    """(aligned, dense) of the tuner's rows of N elements, as dispatch.choose and dispatch.Shape take them: contiguous
    rows of one dtype (dense), on 16-byte boundaries where N fills whole 16-byte vectors."""
    from .layout import whole_vectors

    return whole_vectors(N, dtype.itemsize), True


def _served_before(root, info, fam, dtype: torch.dtype, shape: tuple[int, int], up_to: bool) -> tuple[str, object]:
    """What served a group's largest shape in ``root``'s table before the run: (how it was found, its config), from
    the slot the entry will take (how: "") or the nearest entry the lookup gave; ("", None) when none did."""
    from . import dispatch, tuning

    N, M = shape
    exact = tuning.stored_config(root, info, fam.name, dtype, N, M, up_to)
    if exact is not None:
        return "", exact
    near = dispatch.stored(info, fam, dtype, N, M, within=root)
    return ("the nearest entry's config ", near.config) if near is not None else ("", None)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from . import dispatch, policy, tuning
    from .device import device_info, interpreter_active
    from .kernels import ALL_FAMILY_NAMES, backward_family, family

    if torch.cuda.is_available():
        dev = torch.device("cuda")
    elif interpreter_active():
        dev = torch.device("cpu")
        print("warning: no GPU; timing the Triton interpreter (for testing the tuner only)")
    else:
        print("error: the tuner needs a GPU (or TRITON_INTERPRET=1 to exercise it on the CPU)", file=sys.stderr)
        return 2
    if args.timer == "kernel" and dev.type != "cuda":
        print(f"error: {NEEDS_GPU}", file=sys.stderr)
        return 2
    info = device_info(dev)
    for name in args.families:
        if name != "auto" and name not in ALL_FAMILY_NAMES:
            print(f"error: unknown family {name!r}; choose auto or {', '.join(ALL_FAMILY_NAMES)}", file=sys.stderr)
            return 2
    root = tuning.repo_dir() if args.repo else (args.out or tuning.user_dir())
    if root is None:
        print("error: --repo needs a source checkout with a tune_cache/ folder", file=sys.stderr)
        return 2
    timer = _timer(args.rep_ms, args.timer)

    if args.n and min(args.n) < 1:
        print("error: --n takes row lengths >= 1", file=sys.stderr)
        return 2
    if args.dispatch:
        from . import tune_dispatch

        return tune_dispatch.run(args, info, dev, root, timer)
    if args.held_rows:
        from . import tune_held_rows

        return tune_held_rows.run(args, info, dev, root, timer)
    if args.up_to and not args.n:
        print("error: --up-to stores entries under the longest --n length; give --n", file=sys.stderr)
        return 2
    lengths = sorted(set(args.n)) if args.n else default_lengths(args.n_min, args.n_max, not args.no_odd)
    if not lengths:
        print(f"error: no bucket between --n-min {args.n_min} and --n-max {args.n_max}", file=sys.stderr)
        return 2
    tops = [n for n in lengths if n & (n - 1) == 0]
    groups: dict[tuple, list[tuple[int, int]]] = {}  # (family, dtype, N bucket, M bucket) -> [(N, M)]
    capped: dict[tuple[int, int], int] = {}  # (N, asked M) -> the M tuned, where --max-elements cut it
    for dname in args.dtypes:
        for N in lengths:
            for m in args.m:
                M = max(1, min(m, args.max_elements // N))
                if M < m:
                    capped[(N, m)] = M
                auto = dispatch.choose(M, N, DTYPES[dname], info, args.backward,
                                       *_workload_layout(N, DTYPES[dname])).impl
                names = [auto] if "auto" in args.families else []
                names += [f for f in args.families if f != "auto" and f not in names]
                for f in names:
                    if not (f == "fused" and N > 65536):
                        shapes = groups.setdefault((f, dname, n_bucket(N), m_bucket(M)), [])
                        if (N, M) not in shapes:
                            shapes.append((N, M))
    n_shapes = sum(map(len, groups.values()))
    covers = (f"{'+'.join(args.families)}{' backward' if args.backward else ''}; {'/'.join(args.dtypes)}; "
              f"N {'/'.join(map(str, lengths)) if args.n else f'{tops[0]}..{tops[-1]}'}"
              f"{'; odd lengths beside the tops' if not args.n and len(tops) < len(lengths) else ''}; "
              f"M {'/'.join(map(str, args.m))} (M*N <= {args.max_elements})"
              f"{'; entries up to the longest length' if args.up_to else ''}"
              f"{'; kernel time' if args.timer == 'kernel' else ''}")
    entries = f"{len(groups)} {'entry' if len(groups) == 1 else 'entries'}"
    if capped:
        print(f"note: --max-elements {args.max_elements} tunes fewer rows than asked at "
              + ", ".join(f"N={n} ({M} of {m})" for (n, m), M in sorted(capped.items()))
              + "; each entry is stored under the M bucket of the rows it ran", flush=True)
    print(f"tuning {n_shapes} shapes ({entries}) on {info.name} ({info.backend}/{info.arch}) -> "
          f"{tuning.table_path(root, info)}\n  {covers}", flush=True)

    family_of = backward_family if args.backward else family
    served = {g: _served_before(root, info, family_of(g[0]), DTYPES[g[1]], max(shapes), args.up_to)
              for g, shapes in groups.items()}
    start = time.time()
    recorded, done = 0, 0
    gen = torch.Generator().manual_seed(0)
    modes = policy.launch_modes(policy.policy_for(info))  # the launch modes auto's launches run with
    for group, shapes in groups.items():
        fname, dname = group[:2]
        dtype = DTYPES[dname]
        fam = family_of(fname)
        timings_by_n, works = {}, {}
        for N, M in shapes:
            done += 1
            work = Workload(torch.randn(M, N, generator=gen).to(dev, dtype), args.backward)
            timings = {}
            for config in fam.configs(info, M, N):
                try:
                    launch = fam.prepare(work.problem, fam.dispatched_form(work.problem, config, info, modes), info,
                                         flags=work.flags, modes=modes)
                    timings[config] = timer(lambda launch=launch, work=work: work.run(launch))
                except Exception as e:  # a config the compiler or the GPU rejects is skipped, and said so
                    print(f"    skip {config}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            if not timings:
                print(f"[{done}/{n_shapes}] {fam.name} {dname} N={N} M={M}: no config ran", flush=True)
                continue
            best = min(timings, key=timings.get)
            ms = timings[best]
            print(f"[{done}/{n_shapes}] {fam.name:10} {dname:8} N={N:<8} M={M:<5} {len(timings):2} configs  best "
                  f"{best}  {ms * 1e3:9.1f} us {work.nbytes / ms / 1e6:7.0f} GB/s  ({time.time() - start:.0f} s)",
                  flush=True)
            timings_by_n[(N, M)], works[(N, M)] = timings, work
        if not timings_by_n:
            continue
        chosen, worst = choose_across_lengths(timings_by_n)
        if chosen is None:
            print(f"    {fam.name} {dname}: no config ran at every length of {shapes}; not recorded", flush=True)
            continue
        if len(timings_by_n) > 1:
            key = f" (entry up to {max(timings_by_n)[0]})" if args.up_to else ""
            print(f"    bucket {n_bucket(shapes[0][0])}{key}: {chosen}, at worst {worst:.3f}x the best config's time "
                  f"over {'/'.join(f'{m}x{n}' for n, m in timings_by_n)}", flush=True)
        errors = {shape: w.error(fam.prepare(w.problem, fam.dispatched_form(w.problem, chosen, info, modes), info,
                                             flags=w.flags, modes=modes)) for shape, w in works.items()}
        if not all(e <= 1e-2 for e in errors.values()):
            print(f"    {fam.name} {dname}: {chosen} gave errors {errors}; not recorded", flush=True)
            continue
        ruled = [f"{m}x{n}" for n, m in works if dispatch.ruled_config(fname, dispatch.Shape(
            m, n, dtype, info, args.backward, *_workload_layout(n, dtype)))]
        if ruled:
            print(f"    note: a dispatch rule fixes {fname}'s config at {'/'.join(ruled)} (dispatch.ruled_config), so "
                  f"those shapes will not run this entry; it serves the bucket's other shapes", flush=True)
        N, M = max(timings_by_n)  # the entry's time: its largest shape's (the longest N, then the most rows)
        how, was = served[group]
        if was is None and hasattr(fam, "default_config"):  # coop, smem: with no entry they run the heuristic
            how, was = "the heuristic's config ", fam.default_config(info, works[(N, M)].problem)
        if was is not None:
            shares = [t[was] / t[chosen] for t in timings_by_n.values() if was in t]
            print(f"    replaces {how}{was}: " + (f"{max(shares):.3f}x the new entry's time at worst" if shares
                                                  else "not in this run's search space"), flush=True)
        # Written after every entry: a run cut short keeps all it measured. A write costs far less than an
        # entry's tuning.
        recorded += 1
        tuning.record(root, info, [(fam.name, dtype, N, M, chosen, timings_by_n[(N, M)][chosen])],
                      timer=args.timer, up_to_n=args.up_to)
    print(f"wrote {recorded} of {len(groups)} entries to {tuning.table_path(root, info)}" if recorded
          else "no entry written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
