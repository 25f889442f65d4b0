"""The HIP chapter's tables, filled: v0-v3 beside the Triton kernels and torch.softmax.

    python -m bench.hip_compare [--shapes 8x2048 ...] [--iters 50] [--out DIR]
    python -m bench.hip_compare --cpu-only      # no GPU: the CPU reference's error table

Tables, as the chapter lays them out: per shape the min and median time and GB/s of v0-v3 (the
binary: events around each launch), the v2/v1 and v3/v2 speed-ups, and the Triton kernels and
torch.softmax beside them (``triton.testing.do_bench`` median); the error table (max_diff,
mean_diff, rel_err, row-sum deviation, status) of every version at B=8, S=2048 with inputs
uniform in [-2, 2], against torch.softmax of the float64 input; and inputs above 88, where v0's
exp overflows. GB/s counts one read and one write of the tensor for every provider (each of v0-v3
issues 3 reads and 2 writes; see hip_reference/softmax.hip). Writes ``summary.md`` and
``hip_compare.csv`` to DIR (default bench/results/<gpu>/hip-compare/). ``--cpu-only`` needs a
compiler (hipcc or nvcc) but no GPU: it runs the binary's CPU reference and prints its error row.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import torch

CHAPTER_SHAPES = ["8x2048", "8x4096", "32x4096", "32x8192"]
LARGER_SHAPES = ["1024x4096", "4096x4096", "4096x16384", "65536x2048"]
HIP = ("v0", "v1", "v2", "v3")
TRITON = ("fused", "tile", "online", "auto")
ERROR_SHAPE = (8, 2048)  # the chapter's verification: B=8, S=2048, inputs uniform in [-2, 2]
STATUS_TOL = 1e-5  # max_diff within this and every output finite: "ok"
ERROR_HEAD = ["| provider | max_diff | mean_diff | rel_err | row-sum deviation | status |",
              "| --- | --- | --- | --- | --- | --- |"]


def error_input() -> torch.Tensor:
    """The error table's input: ERROR_SHAPE, uniform in [-2, 2], seeded."""
    return torch.rand(*ERROR_SHAPE, generator=torch.Generator().manual_seed(0)) * 4 - 2


def error_row(name: str, check) -> str:
    """One row of the error table from a hip_reference.driver.Check."""
    ok = check.nonfinite == 0 and check.max_diff <= STATUS_TOL
    status = "ok" if ok else (f"{check.nonfinite} non-finite" if check.nonfinite else "over tolerance")
    return (f"| {name} | {check.max_diff:.2e} | {check.mean_diff:.2e} | {check.rel_err:.2e} | "
            f"{check.row_sum_dev:.2e} | {status} |")


def cpu_only() -> int:
    """The error table's CPU rows: the binary's CPU reference and torch.softmax in float32, against float64."""
    import hip_reference
    from hip_reference.driver import Check

    x = error_input()
    result = hip_reference.run(x, cpu_only=True)
    lines = [f"CPU only ({result.compiler} build; no GPU versions run). B={ERROR_SHAPE[0]}, S={ERROR_SHAPE[1]}, "
             f"inputs uniform in [-2, 2], against torch.softmax of the float64 input; status: every output finite "
             f"and max_diff <= {STATUS_TOL:g}.", ""] + ERROR_HEAD
    lines.append(error_row("CPU reference (hip_reference)", result.cpu))
    lines.append(error_row("torch.softmax float32 (CPU)", Check.of(torch.softmax(x, -1), x)))
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=CHAPTER_SHAPES + LARGER_SHAPES)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu-only", action="store_true", help="no GPU: the CPU reference's error table only")
    args = ap.parse_args(argv)
    if args.cpu_only:
        return cpu_only()
    if not torch.cuda.is_available():
        print("hip_compare needs a GPU for v0-v3 and the Triton kernels; without one: --cpu-only", file=sys.stderr)
        return 2
    import triton

    import hip_reference
    import tritonsoftmax
    from bench.common import fwd_bytes, gbps, results_dir, time_ms
    from hip_reference.driver import Check
    from tritonsoftmax.device import device_info

    info = device_info(torch.device("cuda"))
    out = results_dir(info.slug, "hip-compare", args.out)
    binary = hip_reference.build()
    others = TRITON + ("torch",)

    def ours(name: str, x: torch.Tensor):
        return (lambda: torch.softmax(x, -1)) if name == "torch" else (lambda: tritonsoftmax.softmax(x, impl=name))

    rows = []
    for shape in args.shapes:
        M, N = map(int, shape.split("x"))
        x = (torch.randn(M, N, generator=torch.Generator().manual_seed(M * N)) * 3).cuda()
        hip = hip_reference.run(x, iters=args.iters, binary=binary)
        rec = {"M": M, "N": N}
        for v in HIP:
            r = hip.versions[v]
            rec[f"{v}_min_ms"], rec[f"{v}_ms"] = r.min_ms, r.median_ms
        for name in others:
            rec[f"{name}_ms"] = time_ms(ours(name, x), warmup_ms=10, rep_ms=50)
        rows.append(rec)
        print(f"{M}x{N}: " + " ".join(f"{p}={rec[p + '_ms'] * 1e3:.1f}us" for p in HIP + others), flush=True)

    x = error_input().cuda()
    err_hip = hip_reference.run(x, iters=3, binary=binary)
    errors = {"CPU reference": err_hip.cpu, **{v: err_hip.versions[v].check for v in HIP}}
    errors.update({name: Check.of(ours(name, x)().cpu(), x.cpu()) for name in others})

    over = (torch.randn(8, 4096, generator=torch.Generator().manual_seed(1)) * 2 + 100).cuda()
    over_hip = hip_reference.run(over, iters=3, binary=binary)
    over_checks = {v: over_hip.versions[v].check for v in HIP}
    over_checks.update({name: Check.of(ours(name, over)().cpu(), over.cpu()) for name in others})

    with open(out / "hip_compare.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    def bw(r: dict, key: str) -> str:
        return f"{gbps(fwd_bytes(r['M'], r['N'], torch.float32), r[key]):.0f}"

    command = " ".join(["python -m bench.hip_compare", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"Command: `{command}` (TRITONSOFTMAX_AUTOTUNE={os.environ.get('TRITONSOFTMAX_AUTOTUNE', '1')})", "",
             f"{info.name}; compiler {hip.compiler}; torch {torch.__version__}, triton {triton.__version__}. "
             "float32 input, normal with std 3. v0–v3: one block of 256 threads per row, GPU times of "
             f"{args.iters} launches (events); Triton kernels and torch.softmax: `do_bench` median. "
             "GB/s counts one read and one write of the tensor for every provider (v0–v3 each issue 3 reads and "
             "2 writes of it; v0 and v1 through a third buffer, exp_out).", "",
             "## v0–v3: time and bandwidth", "",
             "| M×N | " + " | ".join(f"{v} min µs | {v} median µs | {v} GB/s" for v in HIP)
             + " | v2/v1 | v3/v2 |", "| --- |" + " --- |" * (3 * len(HIP) + 2)]
    for r in rows:
        cells = [f"{r[v + '_min_ms'] * 1e3:.1f} | {r[v + '_ms'] * 1e3:.1f} | {bw(r, v + '_ms')}" for v in HIP]
        lines.append(f"| {r['M']}×{r['N']} | " + " | ".join(cells)
                     + f" | {r['v1_ms'] / r['v2_ms']:.2f}× | {r['v2_ms'] / r['v3_ms']:.2f}× |")
    lines += ["", "## Beside the Triton kernels and torch.softmax: median µs (GB/s)", "",
              "| M×N | v3 | " + " | ".join(others) + " |", "| --- |" + " --- |" * (len(others) + 1)]
    lines += [f"| {r['M']}×{r['N']} | " + " | ".join(f"{r[p + '_ms'] * 1e3:.1f} ({bw(r, p + '_ms')})"
                                                   for p in ("v3",) + others) + " |" for r in rows]
    lines += ["", f"## Errors at B={ERROR_SHAPE[0]}, S={ERROR_SHAPE[1]}, inputs uniform in [-2, 2]", "",
              f"Against torch.softmax of the float64 input; status: every output finite and max_diff <= "
              f"{STATUS_TOL:g}.", ""] + ERROR_HEAD
    lines += [error_row(name, check) for name, check in errors.items()]
    lines += ["", "## Inputs above 88 (8×4096, normal std 2 + 100): v0 overflows", "",
              "| provider | non-finite outputs | max abs error |", "| --- | --- | --- |"]
    lines += [f"| {p} | {c.nonfinite} | {c.max_diff:.1e} |" for p, c in over_checks.items()]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
