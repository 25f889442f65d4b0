"""What the reverse-order second pass buys: tile and online with CACHE_OPT on (last tile first) against off.

    python -m bench.cache_order [--shapes 4096x16384 ...] [--dtype float32] [--out DIR]

The textbook's tile kernel reads a row three times (max, sum, write) and online twice; when the
second walk starts at the tiles the previous one read last, they are the likeliest still in L1/L2.
The default shapes run rows from larger than an SM's L1 (256 KB: 64K fp32) to many rows whose
in-flight working set exceeds L2 (60 MiB on the H200). Kernel time (CUPTI, L2 emptied before each
call), three interleaved rounds, each config as the family's heuristic gives it. Writes summary.md
(command first) and cache_order.csv to DIR (default bench/results/<gpu>/cache-order/).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

import torch

SHAPES = ["4096x16384", "4096x65536", "1024x262144", "256x1048576", "64x4194304", "16x16777216"]
FAMILIES = ("tile", "online")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cache_order times kernels on a GPU (CUPTI); the orders' answers are tested in "
              "tests/test_cache_order.py", file=sys.stderr)
        return 2
    import triton

    from bench.common import fwd_bytes, gbps, results_dir
    from tritonsoftmax.device import device_info
    from tritonsoftmax.kernel_timer import kernel_ms
    from tritonsoftmax.kernels import family
    from tritonsoftmax.layout import matrix_problem

    info = device_info(torch.device("cuda"))
    out = results_dir(info.slug, "cache-order", args.out)
    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes:
        M, N = map(int, shape.split("x"))
        x = torch.randn(M, N, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        want = torch.softmax(x.float(), -1)
        runs = {}
        for name in FAMILIES:
            fam = family(name)
            base = fam.heuristic(info, M, N)
            for order in (1, 0):
                launch = fam.prepare(matrix_problem(x, y), base.with_meta(CACHE_OPT=order), info,
                                     flags={"LOG": 0, "ZERO_MASKED": 0})
                launch(x, y, 1.0)
                err = (y.float() - want).abs().max().item()
                if not err <= 1e-3:
                    raise RuntimeError(f"{name} CACHE_OPT={order} at {shape}: max abs error {err:.2e}")
                runs[(name, order)] = (launch, [])
        for _ in range(args.rounds):
            for launch, times in runs.values():
                times.append(kernel_ms(lambda launch=launch, x=x, y=y: launch(x, y, 1.0)))
        rec = {"M": M, "N": N, "row_bytes": N * x.element_size()}
        for (name, order), (launch, times) in runs.items():
            rec[f"{name}_{'reverse' if order else 'forward'}_gbps"] = round(
                gbps(fwd_bytes(M, N, dtype), statistics.median(times)), 1)
            rec[f"{name}_config"] = str(launch.config)
        rows.append(rec)
        print(f"{shape}: " + ", ".join(f"{n} reverse {rec[n + '_reverse_gbps']:.0f} / forward "
                                       f"{rec[n + '_forward_gbps']:.0f} GB/s" for n in FAMILIES), flush=True)
        del x, y, want
        torch.cuda.empty_cache()

    with open(out / "cache_order.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    command = " ".join(["python -m bench.cache_order", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"Command: `{command}`", "",
             f"{info.name}, torch {torch.__version__}, triton {triton.__version__}; {args.dtype}; kernel time "
             f"(CUPTI, L2 emptied before each call), median of {args.rounds} interleaved rounds; each family's "
             "heuristic config. GB/s = one read and one write of the tensor / time. reverse = CACHE_OPT 1 (the "
             "second walk over a row's tiles starts at the last), forward = CACHE_OPT 0.", "",
             "| M×N | row | " + " | ".join(f"{n} reverse | {n} forward | {n} reverse/forward" for n in FAMILIES)
             + " |", "| --- | --- |" + " --- |" * (3 * len(FAMILIES))]
    for r in rows:
        cells = [f"{r[n + '_reverse_gbps']:.0f} | {r[n + '_forward_gbps']:.0f} | "
                 f"{r[n + '_reverse_gbps'] / r[n + '_forward_gbps']:.3f}" for n in FAMILIES]
        lines.append(f"| {r['M']}×{r['N']} | {r['row_bytes'] / 2**20:g} MiB | " + " | ".join(cells) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
