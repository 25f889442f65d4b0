"""``python -m bench.sweep``: GB/s of tritonsoftmax against every peer, as perf_report plots and CSVs.

    python -m bench.sweep                                   # default grid, all dtypes (GPU)
    python -m bench.sweep --preset design --dtype float32   # exactly the design notes' table of shapes
    python -m bench.sweep --plots m4096 --dtype bfloat16    # one part of the grid
    python -m bench.sweep --preset every-n --plots every-n-m4096 --sample 10 --mode bwd   # a slice of every-n
    python -m bench.sweep --quick                           # a small grid (the default without a GPU)
    python -m bench.sweep --merge run1/every-n run2/every-n --out bench/results/h200/every-n  # add parts run elsewhere

Plots: ``m4096`` (M = 4096, N = 256 .. 262144), ``few-131072`` and ``few-1m`` (few long rows:
GB/s against M for N = 131072 and 1048576), ``attention`` (65536x2048, 16384x8192), ``odd``
(M = 4096, odd N from 1023 to 100003: rows off a 16-byte boundary), ``even`` (even N that are not
multiples of 16, 100 to 50264: rows on 4-, 8- or 16-byte boundaries that Triton cannot see), ``vocab``
(M = 4096, language models' vocabulary sizes, 32000 to 256000), ``router`` (16384 tokens over a
mixture-of-experts router's 8 to 256 experts), ``sampling`` (1 to 256 rows of 128K-256K logits, one
temperature a row: softmax(x / t), forward only; the peers without a per-row temperature sit it out),
``dispatch`` (one shape for each family the
dispatcher picks: with every family as a line, what auto's choice wins there). Lines:
tritonsoftmax (auto and each family), a copy of the same bytes, torch.softmax, torch.compile,
the Triton tutorial kernel, the naive five-op torch version, and Liger-Kernel, FlagGems and
QuACK when importable (``pip install liger-kernel flag-gems quack-kernels``, or a folder of them
named by ``--peers-site`` / TRITONSOFTMAX_PEERS_SITE). A provider that is missing or fails on a
point is skipped there; the reasons are listed once at the end and in the summary.

Each point is the median of ``--repeats`` interleaved rounds (every provider once per round),
each round a ``do_bench`` median, or with ``--timer kernel`` the GPU time of the kernels a call
launched as CUPTI records it (``tritonsoftmax.kernel_timer``: the time the device was busy with
them, overlapping kernels counted once; no launch gap, no event time; what ranks microsecond
shapes fairly; each point's JSON then lists the kernels every call launched). GB/s = (bytes read +
bytes written) / time. Every run writes a ``points-<part>.json`` into the output folder (default
bench/results/<gpu>/<suite>/: ``sweep-fwd``, ``sweep-bwd``, ``design-fwd``, ``design-bwd``) and
rebuilds ``summary.md``, the CSVs, the PNGs and ``results.html`` from all parts there
(``bench.report``), so a big grid can be run in pieces. Without a GPU the kernels run under the
Triton interpreter and are timed with a wall clock: those numbers measure the interpreter, not a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported (the next line imports the package)

from tritonsoftmax.tune_dispatch import fine_lengths  # noqa: E402

PLOTS = {
    "m4096": {"x": "N", "shapes": [(4096, 2**k) for k in range(8, 19)]},
    "few-131072": {"x": "M", "shapes": [(m, 131072) for m in (1, 2, 4, 8, 16, 32, 64, 128)]},
    "few-1m": {"x": "M", "shapes": [(m, 1048576) for m in (1, 2, 4, 8, 16, 32)]},
    "attention": {"x": "M", "shapes": [(16384, 8192), (65536, 2048)]},
    # From a few hundred rows of 32K to many: where the 16-bit backward changes kernel (dispatch.reload_row_config).
    "rows-32k": {"x": "M", "shapes": [(m, 32768) for m in (256, 512, 1024, 2048, 4096, 8192)]},
    # Row lengths that are not a multiple of 16 bytes (vocabulary sizes among them): rows start off
    # a 16-byte boundary, where a kernel that does not realign them loses its wide loads.
    "odd": {"x": "N", "shapes": [(4096, n) for n in (1023, 4097, 12345, 16383, 32767, 50257, 100003)]},
    # Even row lengths that are not a multiple of 16 elements: rows on 4-, 8- or 16-byte boundaries, which
    # Triton's specialisation (divisibility by 16) cannot see, so kernels without VEC load element by element.
    "even": {"x": "N", "shapes": [(16384, n) for n in (100, 200, 300, 1000, 1002, 4100)]
             + [(4096, n) for n in (16392, 50264)]},
    # Language models' vocabularies (Llama 2, Phi-3, GPT-2, GPT-2 padded to 64, cl100k padded, Llama 3, Qwen2, Gemma):
    # the logits a training step's softmax reads, 4096 rows (tokens) at a time.
    "vocab": {"x": "N", "shapes": [(4096, n) for n in (32000, 32064, 50257, 50304, 100352, 128256, 151936, 256000)]},
    # Mixture-of-experts routers: 16384 tokens' logits over the experts (Mixtral 8, DBRX 16, Qwen1.5-MoE 60, OLMoE 64,
    # Qwen3-MoE 128, DeepSeek-V2 160, DeepSeek-V3 256); short rows, several a program; 16-bit 60 sits off 16 bytes.
    "router": {"x": "N", "shapes": [(16384, n) for n in (8, 16, 60, 64, 128, 160, 256)]},
    # One shape for each family the dispatcher picks (docs/dispatch.md): run with every family as a line, it shows
    # what auto's choice wins over the others there.
    # Sampling: each decoding step's logits over a language model's vocabulary, 1-256 requests, each with its own
    # temperature: softmax(x / t) with t one value a row (forward only).
    "sampling": {"x": "point", "temperature": True,
                 "shapes": [(m, n) for n in (131072, 151936, 262144) for m in (1, 8, 64, 256)]},
    "dispatch": {"x": "point", "shapes": [(4096, 4096), (4096, 16384), (4096, 16392), (4096, 32768), (4096, 65536),
                                          (4096, 262144), (8, 131072), (64, 152064), (32, 262144), (32, 524288),
                                          (4, 1048576), (1, 8388608)]},
}
# The every-n preset: the family tuner's fine grid of row lengths (tune_dispatch.fine_lengths: every multiple of 64
# up to 16K, eight an octave to 8M, odd ones), at each row count of EVERY_N_ROWS where M x N fits
# EVERY_N_MAX_ELEMENTS.
EVERY_N_ROWS = (1, 32, 512, 4096, 16384)
EVERY_N_MAX_ELEMENTS = 2**28
EVERY_N_LENGTHS = fine_lengths()
EVERY_N_PLOTS = {f"every-n-m{m}": {"x": "N", "shapes": [(m, n) for n in EVERY_N_LENGTHS
                                                         if m * n <= EVERY_N_MAX_ELEMENTS and n <= 2**23]}
                 for m in EVERY_N_ROWS}
QUICK_PLOTS = {
    "m64": {"x": "N", "shapes": [(64, 256), (64, 1024), (64, 4096)]},
    "few-16384": {"x": "M", "shapes": [(1, 16384), (4, 16384)]},
}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


def _design_plots(dtypes: list[str], mode: str) -> dict:
    from bench.common import DESIGN_BWD_SHAPES, DESIGN_FWD_SHAPES

    table = DESIGN_FWD_SHAPES if mode == "fwd" else DESIGN_BWD_SHAPES
    shapes = sorted({s for d in dtypes for s in table.get(getattr(torch, d), [])},
                    key=lambda s: (s[1], s[0]))
    return {"design": {"x": "point", "shapes": shapes}}


def _parse(argv):
    from bench.peers import ALL, BASELINE
    from tritonsoftmax.kernel_timer import TIMERS

    ap = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["grid", "design", "every-n"], default="grid",
                    help="grid: the plots below (default); design: the design table's shapes, one plot (GPU only); "
                         f"every-n: row lengths on a fine grid ({len(EVERY_N_LENGTHS)} lengths: every multiple of 64 "
                         "to 16K, eight an octave to 8M, odd ones) at each row count of "
                         f"{', '.join(map(str, EVERY_N_ROWS))} where M x N <= 2^28, one plot a row count "
                         "(every-n-m<M>); forward and backward share its folder (GPU only)")
    ap.add_argument("--plots", nargs="+", metavar="PLOT",
                    help=f"some of the preset's plots: {', '.join(PLOTS)}; every-n: {', '.join(EVERY_N_PLOTS)}")
    ap.add_argument("--sample", default=None, metavar="K[/J]",
                    help="keep every K-th point of each chosen plot, starting at the J-th (default 0): a fine grid "
                         "measured in slices, one call each")
    ap.add_argument("--dtype", nargs="+", default=None, choices=["float32", "float16", "bfloat16"],
                    help="dtypes to measure (default: all three on a GPU, float32 without one)")
    ap.add_argument("--shapes", nargs="+", metavar="MxN", help="keep only these points of the chosen plots "
                    "(e.g. 4x1048576)")
    ap.add_argument("--mode", choices=["fwd", "bwd"], default="fwd", help="forward (default) or backward")
    ap.add_argument("--providers", nargs="+", default=[p for p in ALL if p not in BASELINE], choices=list(ALL),
                    metavar="NAME", help=f"lines to measure (default: all but previous): {', '.join(ALL)}")
    ap.add_argument("--quick", action="store_true", help="a small grid (always on without a GPU)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds per point (GPU default 3)")
    ap.add_argument("--rep-ms", type=float, default=30.0, help="do_bench budget per measurement, ms (default 30)")
    ap.add_argument("--timer", choices=TIMERS, default="events",
                    help="events: do_bench's CUDA events around each call (default); kernel: the GPU time of "
                         "the kernels each call launched, from CUPTI (GPU only)")
    ap.add_argument("--peers-site", default=None, metavar="DIR",
                    help="a folder holding the peer libraries (Liger-Kernel, FlagGems, QuACK) to import them from")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="a folder holding an earlier version of this package (python -m bench.baseline COMMIT DIR): "
                         "the 'previous' line, and a `vs previous` column")
    ap.add_argument("--no-table", action="store_true",
                    help="run tritonsoftmax without any tuning table (no shipped one, an empty user one): what a "
                         "GPU nobody tuned gets, the default dispatch policy and the families' heuristics")
    ap.add_argument("--merge-only", action="store_true",
                    help="measure nothing: rebuild summary.md, PNGs, CSVs and results.html from the parts in --out")
    ap.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                    help="measure nothing: copy the parts of these folders (runs made elsewhere) into --out after "
                         "its own, in the order given (the last measurement of a point shows), and rebuild it")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="output folder (default bench/results/<gpu>/<suite>/, the suite sweep-fwd, sweep-bwd, "
                         "design-fwd or design-bwd; cpu-interpreter/ in place of <gpu> without a GPU); parts "
                         "already there are kept and merged")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    on_gpu = torch.cuda.is_available()
    args = _parse(argv)
    if args.merge_only or args.merge:
        if not args.out:
            print("error: --merge-only and --merge need --out", file=sys.stderr)
            return 2
        if args.merge:
            from bench.report import adopt_parts

            missing = [d for d in args.merge if not list(Path(d).glob("points-*.json"))]
            if missing:
                print(f"error: no points-*.json in {', '.join(missing)}", file=sys.stderr)
                return 2
            adopt_parts(Path(args.out), [Path(d) for d in args.merge])
        return _finish(Path(args.out))
    if args.peers_site:
        os.environ["TRITONSOFTMAX_PEERS_SITE"] = args.peers_site
    if args.baseline:
        os.environ["TRITONSOFTMAX_BASELINE"] = args.baseline
    if args.no_table:
        import tempfile

        os.environ["TRITONSOFTMAX_TUNE_CACHE_SHIPPED"] = "0"
        os.environ["TRITONSOFTMAX_TUNE_CACHE"] = tempfile.mkdtemp(prefix="tritonsoftmax-no-table-")
    import triton

    from bench import peers
    from bench.common import bwd_bytes, fwd_bytes, gbps, results_dir
    from bench.report import best_peer, fmt_gbps, next_seq, ratio, skipped_lines
    from tritonsoftmax.device import device_info
    from tritonsoftmax.kernel_timer import NEEDS_GPU

    if args.timer == "kernel" and not on_gpu:
        print(f"error: {NEEDS_GPU}", file=sys.stderr)
        return 2
    info = device_info(torch.device("cuda" if on_gpu else "cpu"))
    quick = args.quick or not on_gpu
    dtypes = args.dtype or (["float32", "float16", "bfloat16"] if on_gpu else ["float32"])
    if args.preset == "design":
        if not on_gpu:
            print("error: the design preset's shapes (up to 4 GiB) need a GPU; without one use --quick",
                  file=sys.stderr)
            return 2
        plots = _design_plots(dtypes, args.mode)
        suite = f"design-{args.mode}"
    elif args.preset == "every-n":
        if not on_gpu:
            print("error: the every-n preset's grid (up to 2^28 elements a point) needs a GPU; without one use "
                  "--quick", file=sys.stderr)
            return 2
        unknown = set(args.plots or []) - set(EVERY_N_PLOTS)
        if unknown:
            print(f"error: unknown plots {sorted(unknown)}; choose from {', '.join(EVERY_N_PLOTS)}", file=sys.stderr)
            return 2
        plots = {k: v for k, v in EVERY_N_PLOTS.items() if not args.plots or k in args.plots}
        suite = "every-n"
    else:
        grid = QUICK_PLOTS if quick else PLOTS
        unknown = set(args.plots or []) - set(grid)
        if unknown:
            print(f"error: unknown plots {sorted(unknown)}; choose from {', '.join(grid)}", file=sys.stderr)
            return 2
        plots = {k: v for k, v in grid.items() if (not args.plots or k in args.plots)
                 and not (args.mode == "bwd" and v.get("temperature"))}  # sampling: forward only
        suite = f"sweep-{args.mode}"
    if args.shapes:
        keep = {tuple(map(int, s.lower().split("x"))) for s in args.shapes}
        plots = {k: {**v, "shapes": [sh for sh in v["shapes"] if sh in keep]} for k, v in plots.items()}
        plots = {k: v for k, v in plots.items() if v["shapes"]}
        if not plots:
            print("error: --shapes matches no point of the chosen plots", file=sys.stderr)
            return 2
    if args.sample:
        try:
            every, first = (int(v) for v in (args.sample.split("/") + ["0"])[:2])
            if every < 1 or not 0 <= first < every:
                raise ValueError
        except ValueError:
            print(f"error: --sample takes K or K/J with 0 <= J < K, got {args.sample!r}", file=sys.stderr)
            return 2
        plots = {k: {**v, "shapes": v["shapes"][first::every]} for k, v in plots.items()}
        plots = {k: v for k, v in plots.items() if v["shapes"]}
    slug = info.slug if on_gpu else "cpu-interpreter"
    out = results_dir(slug, suite, args.out)
    repeats = args.repeats or (3 if on_gpu else 1)
    if not on_gpu:
        print("no GPU: the kernels run under the Triton interpreter and are timed with a wall clock; "
              "these numbers measure the interpreter, not a GPU.")

    points = []
    skipped: dict[str, str] = {}
    part = "-".join([args.preset, *plots, *dtypes]) + ("-quick" if quick and args.preset == "grid" else "")
    if args.shapes:
        part += "-" + "-".join(sorted(args.shapes))
    if args.sample:
        part += "-sample" + args.sample.replace("/", "of")
    if suite == "every-n":
        part += f"-{args.mode}"
    if args.timer == "kernel":
        part += "-kernel"
    command = " ".join(["python -m bench.sweep", *(argv if argv is not None else sys.argv[1:])])
    meta = {"command": command, "device": info.name, "torch": torch.__version__, "triton": triton.__version__,
            "mode": args.mode, "repeats": repeats, "rep_ms": args.rep_ms, "timer": args.timer,
            "interpreter": not on_gpu, "autotune": os.environ.get("TRITONSOFTMAX_AUTOTUNE", "1"), "skipped": skipped}
    if "previous" in args.providers:
        marker = Path(os.environ.get("TRITONSOFTMAX_BASELINE", ".")) / "tritonsoftmax_base" / "BASELINE"
        meta["previous"] = marker.read_text().strip() if marker.is_file() else "unknown"
    part_file = out / f"points-{part}.json"
    meta["seq"] = next_seq(out, part_file)

    def save() -> None:
        part_file.write_text(json.dumps({"meta": meta, "points": points}, indent=1))

    total = sum(len(p["shapes"]) for p in plots.values()) * len(dtypes)
    done, start = 0, time.time()
    print(f"{total} points x {len(args.providers)} providers, {repeats} round{'s' * (repeats > 1)} each -> {out}",
          flush=True)
    for dname in dtypes:
        dtype = getattr(torch, dname)
        for plot, spec in plots.items():
            for M, N in spec["shapes"]:
                done += 1
                x = torch.randn(M, N, device="cuda" if on_gpu else "cpu", dtype=dtype)
                temperature = None
                if spec.get("temperature"):  # one temperature a row, 0.5 .. 1.5
                    temperature = (torch.rand(M, 1, device=x.device) + 0.5).to(dtype)
                    ref = torch.softmax(x.double() / temperature.double(), -1)
                elif args.mode == "fwd":
                    ref = torch.softmax(x.double(), -1)
                else:
                    y = torch.softmax(x.float(), -1).to(dtype)
                    dy = torch.randn_like(x)
                    ref = y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True))
                fns = {}
                for name in args.providers:
                    try:
                        if temperature is not None:
                            fn = peers.prepare_sampling(name, x, temperature)
                        elif args.mode == "fwd":
                            fn = peers.prepare(name, x)
                        else:
                            fn = peers.prepare_backward(name, x, y, dy)
                        out_ = fn()
                        if name != "copy":
                            err = (out_.double() - ref).abs().max().item()
                            if not err <= TOL[dtype]:
                                raise peers.Unavailable(f"wrong result (max abs error {err:.2e})")
                        fns[name] = fn
                    except Exception as e:  # a missing or failing provider skips this point, listed at the end
                        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                        if not isinstance(e, peers.Unavailable):
                            reason = f"{type(e).__name__}: {reason}"
                        skipped[f"{name} {dname} {M}x{N}"] = reason
                    if on_gpu:
                        torch.cuda.synchronize()
                times, launched = measure(fns, repeats, args.timer, args.rep_ms)
                nbytes = fwd_bytes(M, N, dtype) if args.mode == "fwd" else bwd_bytes(M, N, dtype)
                rec = {"plot": plot, "dtype": dname, "M": M, "N": N,
                       "gbps": {n: float(f"{gbps(nbytes, statistics.median(t)):.4g}") for n, t in times.items()}}
                if launched:
                    rec["kernels"] = launched
                points.append(rec)
                best = best_peer(rec["gbps"])
                ours = rec["gbps"].get("auto")
                line = f"[{done}/{total}] {plot} {dname} {M}x{N}:"
                if ours:
                    line += f" tritonsoftmax {fmt_gbps(ours)} GB/s"
                if ours and best:
                    line += f", {ratio(ours / best[1])}x the best peer ({peers.LABELS[best[0]]} {fmt_gbps(best[1])})"
                print(f"{line} ({time.time() - start:.0f} s)", flush=True)
                del x, ref, fns
                if args.mode == "bwd":
                    del y, dy
                if on_gpu:
                    torch.cuda.empty_cache()
                save()  # after every point: a run cut short keeps what it measured

    if skipped:
        print(f"skipped {len(skipped)} provider-points:")
        for line in skipped_lines(skipped):
            print(f"  {line}")
    return _finish(out)


def _finish(out: Path) -> int:
    """Rebuild the folder's summary, plots and page from all its parts; say where they are."""
    from bench.report import plot_all, write_summary

    if not list(out.glob("points-*.json")):
        print(f"error: no points-*.json in {out}", file=sys.stderr)
        return 2
    write_summary(out)
    pngs = plot_all(out, {**PLOTS, **QUICK_PLOTS, **EVERY_N_PLOTS})
    print(f"wrote {out}/: summary.md, results.html, {len(pngs)} plot{'s' * (len(pngs) != 1)} with their CSVs")
    return 0


def measure(fns: dict, repeats: int, timer: str, rep_ms: float) -> tuple[dict[str, list[float]], dict[str, list]]:
    """Milliseconds per call of each provider in ``fns``, ``repeats`` interleaved rounds; with the
    kernel timer also what each call put on the device (the last round's [name, launches, us])."""
    from bench.common import time_ms
    from tritonsoftmax.kernel_timer import kernel_profile, total_ms

    times: dict[str, list[float]] = {n: [] for n in fns}
    launched: dict[str, list] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            if timer == "kernel":
                profile = kernel_profile(fn)
                launched[name] = [[k[:80], round(n, 2), round(us, 3)] for k, n, us in profile.rows]
                times[name].append(total_ms(profile))
            else:
                times[name].append(time_ms(fn, warmup_ms=5, rep_ms=rep_ms))
    return times, launched


if __name__ == "__main__":
    sys.exit(main())
