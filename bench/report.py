"""What a benchmark suite leaves in its folder, rebuilt from the parts measured there.

Every run of ``bench.sweep`` writes one ``points-<part>.json``; from all of them this module writes
``summary.md`` (the commands first, then one table per plot and dtype with a ``vs best`` column), one
CSV and one PNG per (plot, dtype) through ``triton.testing.perf_report``, and ``results.html``
showing every plot. A point measured by several parts shows the latest measurement.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

SUMMARY = "summary.md"
HTML = "results.html"
MAX_TICKS = 24  # an axis with more x values labels the powers of two below them instead


def parts(out: Path) -> list[dict]:
    """The parts in ``out``, oldest first (each part's ``seq``: one more than the parts before it had)."""
    found = [json.loads(p.read_text()) for p in sorted(out.glob("points-*.json"))]
    return sorted(found, key=lambda p: p["meta"].get("seq", 0))


def next_seq(out: Path, part_file: Path) -> int:
    """The ``seq`` of a part about to be written as ``part_file``: after every other part in ``out`` (a part
    measured again replaces its file and moves to the end)."""
    seqs = [json.loads(p.read_text())["meta"].get("seq", 0) for p in out.glob("points-*.json") if p != part_file]
    return max(seqs, default=0) + 1


def adopt_parts(out: Path, sources: list[Path]) -> list[Path]:
    """Copy the parts of each folder in ``sources`` (runs made elsewhere, say on a lent GPU into a fresh folder) into
    ``out``, sequenced after the parts already there, in the order given and each folder's own order, so that the
    latest measurement of a point is the last adopted. A part of the same name in ``out`` is replaced. Returns the
    files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources:
        files = sorted(source.glob("points-*.json"), key=lambda f: json.loads(f.read_text())["meta"].get("seq", 0))
        for f in files:
            part = json.loads(f.read_text())
            dest = out / f.name
            part["meta"]["seq"] = next_seq(out, dest)
            dest.write_text(json.dumps(part, indent=1))
            written.append(dest)
    return written


def latest_points(out: Path) -> list[dict]:
    """The latest measurement of each (plot, dtype, shape) across the parts, by N and then M; each point
    names the part that measured it (``run``, counted from 1 in :func:`parts` order)."""
    latest: dict[tuple, dict] = {}
    for i, part in enumerate(parts(out), 1):
        for pt in part["points"]:
            mode = mode_of(part["meta"])
            latest[(mode, pt["plot"], pt["dtype"], pt["M"], pt["N"])] = {**pt, "run": i, "meta": part["meta"],
                                                                           "mode": mode}
    return sorted(latest.values(), key=lambda pt: (pt["N"], pt["M"]))


def groups(points: list[dict]) -> list[tuple[str, str, str, list[dict]]]:
    """(mode, plot, dtype, points) for each table and plot of a folder, in the order first measured; a folder
    holding both directions (the every-n suite) gives each its own."""
    keys = dict.fromkeys((pt["mode"], pt["plot"], pt["dtype"]) for pt in points)
    return [(m, p, d, [pt for pt in points if (pt["mode"], pt["plot"], pt["dtype"]) == (m, p, d)])
            for m, p, d in sorted(keys, key=lambda k: k[0] == "bwd")]


def _direction_words(points: list[dict], mode: str) -> tuple[str, str]:
    """A heading's and a file name's direction suffix where a folder holds both directions; else nothing."""
    if len({pt["mode"] for pt in points}) < 2:
        return "", ""
    return (", backward", "-bwd") if mode == "bwd" else (", forward", "-fwd")


def best_peer(gbps_by_provider: dict) -> tuple[str, float] | None:
    """(provider, GB/s) of the fastest peer at a point: every line but ours and the copy."""
    from bench.peers import PEERS

    here = {k: v for k, v in gbps_by_provider.items() if k in PEERS and v and not math.isnan(v)}
    return max(here.items(), key=lambda kv: kv[1]) if here else None


def ratio(value: float) -> str:
    """A ratio with three significant digits: 0.00298, 0.431, 1.02."""
    return f"{value:.3g}"


def fmt_gbps(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


def mode_of(meta: dict) -> str:
    """``fwd`` or ``bwd``: the part's recorded mode, else read from its command."""
    return meta.get("mode") or ("bwd" if "--mode bwd" in meta["command"] else "fwd")


def _timer_words(meta: dict) -> str:
    if meta.get("timer", "events") == "kernel":
        return ("the time the device was busy with the kernels each call launched (CUPTI, overlapping kernels "
                "counted once, L2 emptied before each call)")
    return f"do_bench {meta['rep_ms']} ms"


def write_summary(out: Path) -> str:
    """Rebuild ``summary.md`` from every part in ``out``; returns its text."""
    from bench.peers import ALL, LABELS

    found = parts(out)
    lines = ["Commands (each a part of this suite; a point measured by several parts shows the latest, "
             "and the `run` column names the command):", ""]
    lines += [f"{i}. `{p['meta']['command']}` (TRITONSOFTMAX_AUTOTUNE={p['meta']['autotune']}) on "
              f"{p['meta']['device']}, torch {p['meta']['torch']}, triton {p['meta']['triton']}, "
              f"{p['meta']['repeats']} interleaved rounds x {_timer_words(p['meta'])}"
              + (f"; previous = tritonsoftmax at {p['meta']['previous']}" if p["meta"].get("previous") else "")
              for i, p in enumerate(found, 1)]
    if len({p["meta"].get("timer", "events") for p in found}) > 1:
        lines += ["", "**These parts were timed differently (do_bench events and CUPTI kernel time): "
                      "compare points of one timer only.**"]
    if any(p["meta"]["interpreter"] for p in found):
        lines += ["", "**No GPU: these numbers time the Triton interpreter with a wall clock, not a GPU.**"]
    lines += ["", "GB/s = (bytes read + bytes written) / median time (forward: x read, y written; backward: dy "
              "and y read, dx written). `vs best` = tritonsoftmax (auto) / the best peer (every line but ours and "
              "copy; in the backward, copy is a two-input add); `vs previous` = tritonsoftmax (auto) / the previous "
              "version of the package (bench.baseline), where measured."]
    points = latest_points(out)
    for mode, plot, dname, pts in groups(points):
        names = [n for n in ALL if any(n in pt["gbps"] for pt in pts)]
        ran = any(auto_families(pt) for pt in pts)
        peers = any(best_peer(pt["gbps"]) for pt in pts)
        head = ["M×N"] + (["auto ran"] if ran else []) + [LABELS[n] for n in names]
        previous = "previous" in names
        head += (["best peer", "vs best"] if peers else []) + (["vs previous"] if previous else []) + ["run"]
        heading = f"## {plot}, {dname}{_direction_words(points, mode)[0]}"
        lines += ["", heading, ""] + _ratio_digest(pts)
        lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for pt in pts:
            cells = [f"{pt['M']}×{pt['N']}"] + ([auto_families(pt) or "–"] if ran else [])
            cells += [fmt_gbps(pt["gbps"][n]) if n in pt["gbps"] else "–" for n in names]
            if peers:
                best = best_peer(pt["gbps"])
                ours = pt["gbps"].get("auto")
                cells += [LABELS[best[0]] + " " + fmt_gbps(best[1]) if best else "–",
                          f"{ours / best[1]:.2f}" if ours and best else "–"]
            if previous:
                ours, before = pt["gbps"].get("auto"), pt["gbps"].get("previous")
                cells.append(f"{ours / before:.3f}" if ours and before else "–")
            lines.append("| " + " | ".join(cells + [str(pt["run"])]) + " |")
    skipped = skipped_lines({k: v for p in found for k, v in p["meta"]["skipped"].items()})
    if skipped:
        lines += ["", "## Skipped points", ""] + [f"- {line}" for line in skipped]
    text = "\n".join(lines) + "\n"
    (out / SUMMARY).write_text(text)
    return text


def vs_best(pt: dict) -> float | None:
    """tritonsoftmax (auto) / the best peer at a point, where both were measured."""
    best, ours = best_peer(pt["gbps"]), pt["gbps"].get("auto")
    return ours / best[1] if ours and best else None


# The share of the best peer's speed the package aims for at every point (the every-n target).
TARGET_VS_BEST = 0.97


def _ratio_digest(pts: list[dict]) -> list[str]:
    """One line over a table of ten points or more with peers: how many reach TARGET_VS_BEST of the best peer,
    the median and the worst; nothing otherwise."""
    ratios = sorted(r for r in map(vs_best, pts) if r is not None)
    if len(ratios) < 10:
        return []
    worst = min((pt for pt in pts if vs_best(pt) is not None), key=vs_best)
    reach = sum(r >= TARGET_VS_BEST for r in ratios)
    return [f"vs best: {reach} of {len(ratios)} points at {TARGET_VS_BEST} or more; median "
            f"{ratios[len(ratios) // 2]:.2f}, worst {ratios[0]:.2f} ({worst['M']}×{worst['N']}).", ""]


def auto_families(pt: dict) -> str:
    """The families whose kernels auto launched at a point, from the kernel timer's record
    (``_softmax_<family>_..._kernel``); empty where nothing was recorded."""
    names = [name for name, _, _ in pt.get("kernels", {}).get("auto", [])]
    fams = dict.fromkeys(m.group(1) for m in map(_KERNEL_FAMILY.match, names) if m)
    return "+".join(fams)


_KERNEL_FAMILY = re.compile(r"_softmax_([a-z]+)_")


def skipped_lines(skipped: dict[str, str]) -> list[str]:
    """One line per (provider, reason): ``skipped`` maps "provider dtype MxN" to why it was skipped there."""
    reasons: dict[str, list[str]] = {}
    for key, why in skipped.items():
        reasons.setdefault(f"{key.split()[0]}: {why}", []).append(" ".join(key.split()[1:]))
    return [f"{r} ({len(at)} point{'s' * (len(at) > 1)}: {', '.join(at[:6])}{' …' * (len(at) > 6)})"
            for r, at in reasons.items()]


def _size(n: int) -> str:
    """256, 1K, 64K, 1M, 8M; other lengths as they are."""
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def plot_all(out: Path, specs: dict) -> list[Path]:
    """One CSV and one PNG per (plot, dtype) of the latest points in ``out`` (``specs``: plot name -> its
    ``x`` axis, "N", "M" or "point"), then ``results.html``; returns the PNGs."""
    points = latest_points(out)
    pngs = []
    for mode, plot, dname, pts in groups(points):
        x_name = specs.get(plot, {}).get("x", "point")
        if x_name != "point":  # one point per x value, in order
            pts = sorted({pt[x_name]: pt for pt in pts}.values(), key=lambda pt: pt[x_name])
        pngs.append(_plot_one(out, plot, dname, x_name, pts, _direction_words(points, mode)[1]))
    write_html(out, pngs)
    return pngs


def _plot_one(out: Path, plot: str, dname: str, x_name: str, pts: list[dict], suffix: str = "") -> Path:
    """``<plot>-<dtype><suffix>.csv`` through perf_report, and its ``.png``: GB/s on a log axis against N, M or
    the point, ours in bold, the copy (the bandwidth ceiling) dashed black, titled with GPU, dtype and direction;
    below it, where peers ran, ours / the best peer with the TARGET_VS_BEST line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import triton
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from bench.peers import ALL, LABELS, OURS

    names = [n for n in ALL if any(n in pt["gbps"] for pt in pts)]
    x_vals = list(range(len(pts))) if x_name == "point" else [pt[x_name] for pt in pts]
    lookup = dict(zip(x_vals, pts, strict=True))
    bench = triton.testing.Benchmark(x_names=[x_name], x_vals=x_vals, line_arg="provider", line_vals=names,
                                     line_names=[LABELS[n] for n in names], plot_name="", ylabel="GB/s", args={})

    @triton.testing.perf_report(bench)
    def report(provider, **kw):
        value = lookup[kw[x_name]]["gbps"].get(provider)
        return float("nan") if value is None else value

    df = report.run(return_df=True)
    stem = f"{plot}-{dname}{suffix}"
    df.to_csv(out / f"{stem}.csv", float_format="%.6f", index=False)

    ratios = [vs_best(pt) for pt in pts]
    xs = range(len(x_vals)) if x_name == "point" else x_vals
    if any(r is not None for r in ratios):
        fig, (ax, ax_r) = plt.subplots(2, 1, figsize=(10, 7.0), sharex=True, height_ratios=(3, 1.2))
        ax_r.plot(xs, [float("nan") if r is None else r for r in ratios], color="C0", lw=1.6, marker="o", ms=3)
        ax_r.axhline(1.0, color="black", lw=0.8)
        ax_r.axhline(TARGET_VS_BEST, color="C3", lw=1.0, ls="--", label=f"{TARGET_VS_BEST}")
        ax_r.set_ylabel("ours / best peer")
        ax_r.grid(True, alpha=0.3)
        ax_r.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
        ax_x = ax_r
    else:
        fig, ax = plt.subplots(figsize=(10, 5.2))
        ax_x = ax
    for i, name in enumerate(names):
        ys = df[f"{LABELS[name]} (GB/s)"].astype(float)
        if name == "auto":
            style = {"color": "C0", "lw": 2.8, "marker": "o", "ms": 4, "zorder": 5}
        elif name == "copy":
            style = {"color": "black", "lw": 1.6, "ls": "--"}
        elif name in OURS:
            style = {"color": f"C{i % 10}", "lw": 1.0, "ls": ":"}
        else:
            style = {"color": f"C{i % 10}", "lw": 1.4, "marker": ".", "ms": 4}
        label = "copy (bandwidth ceiling)" if name == "copy" else LABELS[name]
        ax.plot(xs, ys, label=label, **style)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel("GB/s (bytes read + written / time)")
    if x_name == "point":
        ax_x.set_xticks(range(len(pts)), [f"{pt['M']}×{pt['N']}" for pt in pts], rotation=40, ha="right",
                        fontsize=8)
        ax_x.set_xlabel("M × N")
    else:
        ax_x.set_xscale("log", base=2)
        ticks = x_vals if len(x_vals) <= MAX_TICKS else sorted({1 << (v.bit_length() - 1) for v in x_vals})
        ax_x.set_xticks(ticks, [_size(v) for v in ticks], fontsize=8)
        ax_x.minorticks_off()
        fixed = {pt["M" if x_name == "N" else "N"] for pt in pts}
        other = "M" if x_name == "N" else "N"
        ax_x.set_xlabel(f"{x_name} (row {'length' if x_name == 'N' else 'count'})"
                        + (f", {other} = {_size(fixed.pop())}" if len(fixed) == 1 else ""))
    ax.grid(True, which="major", alpha=0.3)
    meta = pts[-1]["meta"]
    direction = "backward" if mode_of(meta) == "bwd" else "forward"
    where = "Triton interpreter on a CPU (wall clock, not GPU speed)" if meta["interpreter"] else meta["device"]
    ax.set_title(f"softmax {direction}, {dname}, {plot}: {where}", fontsize=11)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    fig.tight_layout()
    png = out / f"{stem}.png"
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return png


def write_html(out: Path, pngs: list[Path]) -> Path:
    """``results.html``: the summary's link and every plot of the folder, one under another."""
    body = [f'<p><a href="{SUMMARY}">{SUMMARY}</a></p>']
    body += [f'<h3>{p.stem}</h3>\n<img src="{p.name}" alt="{p.stem}"/>' for p in pngs]
    html = out / HTML
    html.write_text("<html><body>\n" + "\n".join(body) + "\n</body></html>\n")
    return html
