"""``python -m bench.sweep``: GB/s of tritonsoftmax against every peer, as perf_report plots and CSVs.

    python -m bench.sweep                                   # default grid, all dtypes (GPU)
    python -m bench.sweep --preset design --dtype float32   # exactly the design notes' table of shapes
    python -m bench.sweep --plots m4096 --dtype bfloat16    # one part of the grid
    python -m bench.sweep --quick                           # a small grid (the default without a GPU)

Plots: ``m4096`` (M = 4096, N = 256 .. 262144), ``few-131072`` and ``few-1m`` (few long rows:
GB/s against M for N = 131072 and 1048576), ``attention`` (65536x2048, 16384x8192), ``odd``
(M = 4096, odd N from 1023 to 100003: rows off a 16-byte boundary), ``even`` (even N that are not
multiples of 16, 100 to 50264: rows on 4-, 8- or 16-byte boundaries that Triton cannot see), ``vocab``
(M = 4096, language models' vocabulary sizes, 32000 to 256000), ``router`` (16384 tokens over a
mixture-of-experts router's 8 to 256 experts). Lines:
tritonsoftmax (auto and each family), a copy of the same bytes, torch.softmax, torch.compile,
the Triton tutorial kernel, the naive five-op torch version, and Liger-Kernel, FlagGems and
QuACK when importable (``--peers-site`` or TRITONSOFTMAX_PEERS_SITE). A provider that is missing
or fails on a point is skipped there with a one-line reason.

Each point is the median of ``--repeats`` interleaved rounds (every provider once per round),
each round a ``do_bench`` median, or with ``--timer kernel`` the GPU time of the kernels a call
launched as CUPTI records it (``tritonsoftmax.kernel_timer``: the time the device was busy with
them, overlapping kernels counted once; no launch gap, no event time; what
ranks microsecond shapes fairly; written to a ``-kernel`` suite folder, each point's JSON listing
the kernels every call launched, with launches and microseconds per call). GB/s = (bytes read +
bytes written) / time. Every run writes a ``points-<part>.json`` into the output folder and
rebuilds ``summary.md`` from all parts there, so a big grid can be run in pieces. Without a GPU the
kernels run under the Triton interpreter and are timed with a wall clock: those numbers measure the
interpreter, not a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

PLOTS = {
    "m4096": {"x": "N", "shapes": [(4096, 2**k) for k in range(8, 19)], "log": True},
    "few-131072": {"x": "M", "shapes": [(m, 131072) for m in (1, 2, 4, 8, 16, 32, 64, 128)], "log": True},
    "few-1m": {"x": "M", "shapes": [(m, 1048576) for m in (1, 2, 4, 8, 16, 32)], "log": True},
    "attention": {"x": "M", "shapes": [(16384, 8192), (65536, 2048)], "log": True},
    # From a few hundred rows of 32K to many: where the 16-bit backward changes kernel (dispatch.reload_row_config).
    "rows-32k": {"x": "M", "shapes": [(m, 32768) for m in (256, 512, 1024, 2048, 4096, 8192)], "log": True},
    # Row lengths that are not a multiple of 16 bytes (vocabulary sizes among them): rows start off
    # a 16-byte boundary, where a kernel that does not realign them loses its wide loads.
    "odd": {"x": "N", "shapes": [(4096, n) for n in (1023, 4097, 12345, 16383, 32767, 50257, 100003)], "log": True},
    # Even row lengths that are not a multiple of 16 elements: rows on 4-, 8- or 16-byte boundaries, which
    # Triton's specialisation (divisibility by 16) cannot see, so kernels without VEC load element by element.
    "even": {"x": "N", "shapes": [(16384, n) for n in (100, 200, 300, 1000, 1002, 4100)]
             + [(4096, n) for n in (16392, 50264)], "log": True},
    # Language models' vocabularies (Llama 2, Phi-3, GPT-2, GPT-2 padded to 64, cl100k padded, Llama 3, Qwen2, Gemma):
    # the logits a training step's softmax reads, 4096 rows (tokens) at a time.
    "vocab": {"x": "N", "shapes": [(4096, n) for n in (32000, 32064, 50257, 50304, 100352, 128256, 151936, 256000)],
              "log": True},
    # Mixture-of-experts routers: 16384 tokens' logits over the experts (Mixtral 8, DBRX 16, Qwen1.5-MoE 60, OLMoE 64,
    # Qwen3-MoE 128, DeepSeek-V2 160, DeepSeek-V3 256); short rows, several a program; 16-bit 60 sits off 16 bytes.
    "router": {"x": "N", "shapes": [(16384, n) for n in (8, 16, 60, 64, 128, 160, 256)], "log": True},
}
QUICK_PLOTS = {
    "m64": {"x": "N", "shapes": [(64, 256), (64, 1024), (64, 4096)], "log": True},
    "few-16384": {"x": "M", "shapes": [(1, 16384), (4, 16384)], "log": True},
}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


def _design_plots(dtypes: list[str], mode: str) -> dict:
    from bench.common import DESIGN_BWD_SHAPES, DESIGN_FWD_SHAPES

    table = DESIGN_FWD_SHAPES if mode == "fwd" else DESIGN_BWD_SHAPES
    shapes = sorted({s for d in dtypes for s in table.get(getattr(torch, d), [])},
                    key=lambda s: (s[1], s[0]))
    return {"design": {"x": "point", "shapes": shapes, "log": False}}


def _parse(argv):
    from bench.peers import ALL
    from tritonsoftmax.kernel_timer import TIMERS

    ap = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["grid", "design"], default="grid")
    ap.add_argument("--plots", nargs="+", help=f"subset of the grid's plots: {', '.join(PLOTS)}")
    ap.add_argument("--dtype", nargs="+", default=None, choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--shapes", nargs="+", help="keep only these MxN points of the chosen plots (e.g. 4x1048576)")
    ap.add_argument("--mode", choices=["fwd", "bwd"], default="fwd")
    ap.add_argument("--providers", nargs="+", default=list(ALL), choices=list(ALL))
    ap.add_argument("--quick", action="store_true", help="a small grid (always on without a GPU)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds per point (GPU default 3)")
    ap.add_argument("--rep-ms", type=float, default=30.0, help="do_bench budget per measurement")
    ap.add_argument("--timer", choices=TIMERS, default="events",
                    help="events: do_bench's CUDA events around each call (default); kernel: the GPU time of "
                         "the kernels each call launched, from CUPTI (GPU only)")
    ap.add_argument("--peers-site", default=None, help="folder made by install-peers.sh")
    ap.add_argument("--merge-only", action="store_true",
                    help="measure nothing: rebuild summary.md, PNGs and CSVs from the parts already in --out")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    args = _parse(argv)
    if args.merge_only:
        if not args.out:
            print("error: --merge-only needs --out", file=sys.stderr)
            return 2
        print(merge(Path(args.out)))
        return 0
    if args.peers_site:
        os.environ["TRITONSOFTMAX_PEERS_SITE"] = args.peers_site
    import triton

    from bench import peers
    from bench.common import bwd_bytes, fwd_bytes, gbps, results_dir
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
        suite = "peers" if args.mode == "fwd" else "peers-bwd"
    else:
        grid = QUICK_PLOTS if quick else PLOTS
        unknown = set(args.plots or []) - set(grid)
        if unknown:
            print(f"error: unknown plots {sorted(unknown)}; choose from {', '.join(grid)}", file=sys.stderr)
            return 2
        plots = {k: v for k, v in grid.items() if not args.plots or k in args.plots}
        suite = f"sweep-{args.mode}"
    if args.shapes:
        keep = {tuple(map(int, s.lower().split("x"))) for s in args.shapes}
        plots = {k: {**v, "shapes": [sh for sh in v["shapes"] if sh in keep]} for k, v in plots.items()}
        plots = {k: v for k, v in plots.items() if v["shapes"]}
        if not plots:
            print("error: --shapes matches no point of the chosen plots", file=sys.stderr)
            return 2
    if args.timer == "kernel":
        suite += "-kernel"
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
    if args.timer == "kernel":
        part += "-kernel"
    command = " ".join(["python -m bench.sweep", *(argv if argv is not None else sys.argv[1:])])
    meta = {"command": command, "device": info.name, "torch": torch.__version__, "triton": triton.__version__,
            "repeats": repeats, "rep_ms": args.rep_ms, "timer": args.timer,
            **({"kernel_time": "busy"} if args.timer == "kernel" else {}), "interpreter": not on_gpu,
            "autotune": os.environ.get("TRITONSOFTMAX_AUTOTUNE", "1"), "skipped": skipped,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def save() -> None:
        (out / f"points-{part}.json").write_text(json.dumps({"meta": meta, "points": points}, indent=1))

    total = sum(len(p["shapes"]) for p in plots.values()) * len(dtypes)
    done, start = 0, time.time()
    for dname in dtypes:
        dtype = getattr(torch, dname)
        for plot, spec in plots.items():
            for M, N in spec["shapes"]:
                done += 1
                x = torch.randn(M, N, device="cuda" if on_gpu else "cpu", dtype=dtype)
                if args.mode == "fwd":
                    ref = torch.softmax(x.double(), -1)
                else:
                    y = torch.softmax(x.float(), -1).to(dtype)
                    dy = torch.randn_like(x)
                    ref = y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True))
                fns = {}
                for name in args.providers:
                    try:
                        fn = peers.prepare(name, x) if args.mode == "fwd" else peers.prepare_backward(name, x, y, dy)
                        out_ = fn()
                        if name != "copy":
                            err = (out_.double() - ref).abs().max().item()
                            if not err <= TOL[dtype]:
                                raise peers.Unavailable(f"wrong result (max abs error {err:.2e})")
                        fns[name] = fn
                    except Exception as e:  # a missing or failing provider skips this point, said once
                        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                        if not isinstance(e, peers.Unavailable):
                            reason = f"{type(e).__name__}: {reason}"
                        key = f"{name} {dname} {M}x{N}"
                        skipped[key] = reason
                        print(f"    skip {key}: {reason}", flush=True)
                    if on_gpu:
                        torch.cuda.synchronize()
                times, launched = measure(fns, repeats, args.timer, args.rep_ms)
                nbytes = fwd_bytes(M, N, dtype) if args.mode == "fwd" else bwd_bytes(M, N, dtype)
                rec = {"plot": plot, "dtype": dname, "M": M, "N": N,
                       "gbps": {n: float(f"{gbps(nbytes, statistics.median(t)):.4g}") for n, t in times.items()}}
                if launched:
                    rec["kernels"] = launched
                points.append(rec)
                best = _best_peer(rec["gbps"])
                ours = rec["gbps"].get("auto")
                ratio = f"{ours / best[1]:.2f}x best peer ({best[0]})" if ours and best else ""
                elapsed = time.time() - start
                print(f"[{done}/{total}] {plot} {dname} {M}x{N}: auto {ours} GB/s {ratio} ({elapsed:.0f} s)",
                      flush=True)
                del x, ref, fns
                if args.mode == "bwd":
                    del y, dy
                if on_gpu:
                    torch.cuda.empty_cache()
                save()  # after every point: a run cut short keeps what it measured

    _plot(points, plots, out)
    summary = write_summary(out)
    print(summary)
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


def _best_peer(gbps_by_provider: dict) -> tuple[str, float] | None:
    from bench.peers import PEERS

    peers_here = {k: v for k, v in gbps_by_provider.items() if k in PEERS and v and not math.isnan(v)}
    return max(peers_here.items(), key=lambda kv: kv[1]) if peers_here else None


def _plot(points: list[dict], plots: dict, out: Path) -> None:
    """One PNG and one CSV per (plot, dtype) through triton.testing.perf_report."""
    import matplotlib
    import triton

    from bench.peers import ALL, LABELS

    styles = ["-", "--", ":", "-."]
    for plot, spec in plots.items():
        for dname in sorted({p["dtype"] for p in points if p["plot"] == plot}):
            pts = [p for p in points if p["plot"] == plot and p["dtype"] == dname]
            names = [n for n in ALL if any(n in p["gbps"] for p in pts)]
            if not pts or not names:
                continue
            x_name = spec["x"]
            x_vals = list(range(len(pts))) if x_name == "point" else [p[x_name] for p in pts]
            lookup = {x: p for x, p in zip(x_vals, pts, strict=True)}
            bench = triton.testing.Benchmark(
                x_names=[x_name], x_vals=x_vals, line_arg="provider", line_vals=names,
                line_names=[LABELS[n] for n in names],
                styles=[(f"C{i % 10}", styles[i // 10 % 4]) for i in range(len(names))],
                ylabel="GB/s", plot_name=f"{plot}-{dname}", x_log=spec["log"], args={})

            @triton.testing.perf_report(bench)
            def report(provider, lookup=lookup, x_name=x_name, **kw):
                value = lookup[kw[x_name]]["gbps"].get(provider)
                return float("nan") if value is None else value

            # A small, see-through legend: a default one hides the long-row end of the lines.
            with matplotlib.rc_context({"legend.fontsize": "x-small", "legend.framealpha": 0.35}):
                report.run(save_path=str(out), print_data=False, show_plots=False)


def merge(out: Path) -> str:
    """Rebuild the plots (latest point per shape across parts) and summary.md of ``out``."""
    points = _latest_points(out)
    specs = {**PLOTS, **QUICK_PLOTS, "design": {"x": "point", "log": False}}
    plots = {}
    for plot in dict.fromkeys(pt["plot"] for pt in points):
        shapes = sorted({(pt["M"], pt["N"]) for pt in points if pt["plot"] == plot}, key=lambda s: (s[1], s[0]))
        plots[plot] = {**specs[plot], "shapes": shapes}
    order = {plot: {sh: i for i, sh in enumerate(spec["shapes"])} for plot, spec in plots.items()}
    points.sort(key=lambda pt: order[pt["plot"]][(pt["M"], pt["N"])])
    _plot(points, plots, out)
    return write_summary(out)


def _parts(out: Path) -> list[dict]:
    """The parts in ``out``, oldest first (by the time each run started)."""
    parts = [json.loads(p.read_text()) for p in sorted(out.glob("points-*.json"))]
    return sorted(parts, key=lambda p: p["meta"].get("started", ""))


def _latest_points(out: Path) -> list[dict]:
    """The latest measurement of each (plot, dtype, shape) across the parts, in plot order and then
    by N and M (a point re-measured by a later part keeps its place)."""
    latest: dict[tuple, dict] = {}
    for i, part in enumerate(_parts(out), 1):
        for pt in part["points"]:
            latest[(pt["plot"], pt["dtype"], pt["M"], pt["N"])] = {**pt, "run": i}
    return sorted(latest.values(), key=lambda pt: (pt["N"], pt["M"]))


def _fmt(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def _timer_words(meta: dict) -> str:
    if meta.get("timer", "events") == "kernel":
        if meta.get("kernel_time") == "busy":
            return ("the time the device was busy with the kernels each call launched (CUPTI, overlapping "
                    "kernels counted once, L2 emptied before each call)")
        return ("the GPU time of the kernels each call launched (CUPTI, the sum of their durations, "
                "L2 emptied before each call)")
    return f"do_bench {meta['rep_ms']} ms"


def write_summary(out: Path) -> str:
    """Rebuild ``summary.md`` from every points-*.json in ``out`` (parts of one grid merge here)."""
    from bench.peers import ALL, LABELS

    parts = _parts(out)
    lines = ["Commands (each a part of this suite; a point measured by several parts shows the latest, "
             "and the `run` column names the command):", ""]
    lines += [f"{i}. `{p['meta']['command']}` (TRITONSOFTMAX_AUTOTUNE={p['meta']['autotune']}) on "
              f"{p['meta']['device']}, torch {p['meta']['torch']}, triton {p['meta']['triton']}, "
              f"{p['meta']['repeats']} interleaved rounds x {_timer_words(p['meta'])}"
              for i, p in enumerate(parts, 1)]
    if len({p["meta"].get("timer", "events") for p in parts}) > 1:
        lines += ["", "**These parts were timed differently (do_bench events and CUPTI kernel time): "
                      "compare points of one timer only.**"]
    if any(p["meta"]["interpreter"] for p in parts):
        lines += ["", "**No GPU: these numbers time the Triton interpreter with a wall clock, not a GPU.**"]
    lines += ["", "GB/s = (bytes read + bytes written) / median time (forward: x read, y written; backward: dy "
              "and y read, dx written). `vs best` = tritonsoftmax (auto) / the best peer (every line but ours and "
              "copy; in the backward, copy is a two-input add)."]
    points = _latest_points(out)
    for plot in dict.fromkeys(pt["plot"] for pt in points):
        for dname in dict.fromkeys(pt["dtype"] for pt in points if pt["plot"] == plot):
            pts = [pt for pt in points if pt["plot"] == plot and pt["dtype"] == dname]
            names = [n for n in ALL if any(n in pt["gbps"] for pt in pts)]
            lines += ["", f"## {plot}, {dname}", "",
                      "| M×N | " + " | ".join(LABELS[n] for n in names) + " | best peer | vs best | run |",
                      "| --- |" + " --- |" * (len(names) + 3)]
            for pt in pts:
                cells = [_fmt(pt["gbps"][n]) if n in pt["gbps"] else "–" for n in names]
                best = _best_peer(pt["gbps"])
                ours = pt["gbps"].get("auto")
                vs = f"{ours / best[1]:.2f}" if ours and best else "–"
                lines.append(f"| {pt['M']}×{pt['N']} | " + " | ".join(cells) +
                             f" | {LABELS[best[0]] + ' ' + _fmt(best[1]) if best else '–'} | {vs} | {pt['run']} |")
    skipped = {k: v for p in parts for k, v in p["meta"]["skipped"].items()}
    if skipped:
        reasons: dict[str, list[str]] = {}
        for key, why in skipped.items():
            reasons.setdefault(f"{key.split()[0]}: {why}", []).append(" ".join(key.split()[1:]))
        lines += ["", "## Skipped points", ""]
        lines += [f"- {r} ({len(at)} point{'s' * (len(at) > 1)}: {', '.join(at[:6])}{' …' * (len(at) > 6)})"
                  for r, at in reasons.items()]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
