"""The HIP chapter's tables, filled: v0-v3 beside the Triton kernels and torch.softmax.

    python -m bench.hip_compare [--shapes 8x2048 ...] [--iters 50] [--out DIR]

Every provider gets the same float32 input (normal, std 3); times are GPU medians (the binary:
events around each launch; Triton and torch: ``triton.testing.do_bench``); errors are against
torch.softmax of the float64 input. The last table feeds inputs above 88, where v0's exp
overflows. Writes ``summary.md`` and ``hip_compare.csv`` to DIR (default
bench/results/<gpu>/hip-compare/).
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch

CHAPTER_SHAPES = ["8x2048", "8x4096", "32x4096", "32x8192"]
LARGER_SHAPES = ["1024x4096", "4096x4096", "4096x16384", "65536x2048"]
HIP = ("v0", "v1", "v2", "v3")
TRITON = ("fused", "tile", "online", "auto")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=CHAPTER_SHAPES + LARGER_SHAPES)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("hip_compare needs a GPU (the binary's --cpu-only mode is tested in tests/)", file=sys.stderr)
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
    providers = HIP + TRITON + ("torch",)
    rows = []
    for shape in args.shapes:
        M, N = map(int, shape.split("x"))
        x = (torch.randn(M, N, generator=torch.Generator().manual_seed(M * N)) * 3).cuda()
        hip = hip_reference.run(x, iters=args.iters, binary=binary)
        rec = {"M": M, "N": N}
        for v in HIP:
            r = hip.versions[v]
            rec[f"{v}_ms"], rec[f"{v}_err"] = r.median_ms, r.check.max_diff
        for name in TRITON + ("torch",):
            fn = (lambda x=x: torch.softmax(x, -1)) if name == "torch" else \
                (lambda x=x, impl=name: tritonsoftmax.softmax(x, impl=impl))
            rec[f"{name}_ms"] = time_ms(fn, warmup_ms=10, rep_ms=50)
            rec[f"{name}_err"] = Check.of(fn().cpu(), x.cpu()).max_diff
        rows.append(rec)
        print(f"{M}x{N}: " + " ".join(f"{p}={rec[p + '_ms'] * 1e3:.1f}us" for p in providers), flush=True)

    over = (torch.randn(8, 4096, generator=torch.Generator().manual_seed(1)) * 2 + 100).cuda()
    over_hip = hip_reference.run(over, iters=3, binary=binary)
    over_checks = {v: over_hip.versions[v].check for v in HIP}
    for name in TRITON + ("torch",):
        y = torch.softmax(over, -1) if name == "torch" else tritonsoftmax.softmax(over, impl=name)
        over_checks[name] = Check.of(y.cpu(), over.cpu())

    with open(out / "hip_compare.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    head = "| M×N | " + " | ".join(providers) + " |"
    sep = "| --- |" + " --- |" * len(providers)
    command = " ".join(["python -m bench.hip_compare", *(argv if argv is not None else sys.argv[1:])])
    autotune = __import__("os").environ.get("TRITONSOFTMAX_AUTOTUNE", "1")
    lines = [f"Command: `{command}` (TRITONSOFTMAX_AUTOTUNE={autotune})", "",
             f"{info.name}; compiler {hip.compiler}; torch {torch.__version__}, triton {triton.__version__}. "
             "float32 input, normal with std 3. v0–v3: one block of 256 threads per row, GPU median of "
             f"{args.iters} launches (events); Triton kernels and torch.softmax: `do_bench` median. "
             "GB/s counts one read and one write of the tensor for every provider.", "",
             "## Median time (µs)", "", head, sep]
    lines += [f"| {r['M']}×{r['N']} | " + " | ".join(f"{r[p + '_ms'] * 1e3:.1f}" for p in providers) + " |"
              for r in rows]
    lines += ["", "## Bandwidth (GB/s)", "", head, sep]
    lines += [f"| {r['M']}×{r['N']} | " + " | ".join(
        f"{gbps(fwd_bytes(r['M'], r['N'], torch.float32), r[p + '_ms']):.0f}" for p in providers) + " |"
        for r in rows]
    lines += ["", "## Max abs error against float64 torch.softmax", "", head, sep]
    lines += [f"| {r['M']}×{r['N']} | " + " | ".join(f"{r[p + '_err']:.1e}" for p in providers) + " |"
              for r in rows]
    lines += ["", "## Inputs above 88 (8×4096, normal std 2 + 100): v0 overflows", "",
              "| provider | non-finite outputs | max abs error |", "| --- | --- | --- |"]
    lines += [f"| {p} | {c.nonfinite} | {c.max_diff:.1e} |" for p, c in over_checks.items()]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
