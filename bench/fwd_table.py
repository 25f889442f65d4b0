"""Forward GB/s of tritonsoftmax (auto and each family) against torch.softmax, in one run.

    python -m bench.fwd_table [--dtype float32 bfloat16] [--out DIR]

Shapes are the design notes' forward table. Writes ``fwd_table.csv`` and ``summary.md`` to DIR
(default bench/results/<gpu>/fwd-table/).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import torch

from bench.common import DESIGN_FWD_SHAPES, fwd_bytes, gbps, results_dir, time_ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fwd_table needs a GPU", file=sys.stderr)
        return 2
    import triton

    import tritonsoftmax
    from tritonsoftmax.device import device_info

    info = device_info(torch.device("cuda"))
    out = results_dir(info.slug, "fwd-table", args.out)
    providers = {
        "torch": lambda x: torch.softmax(x, -1),
        "auto": lambda x: tritonsoftmax.softmax(x),
        "fused": lambda x: tritonsoftmax.softmax(x, impl="fused"),
        "online": lambda x: tritonsoftmax.softmax(x, impl="online"),
        "tile": lambda x: tritonsoftmax.softmax(x, impl="tile"),
    }
    rows = []
    for dname in args.dtype:
        dtype = getattr(torch, dname)
        for M, N in DESIGN_FWD_SHAPES[dtype]:
            x = torch.randn(M, N, device="cuda", dtype=dtype)
            ref = torch.softmax(x.double(), -1)
            rec = {"dtype": dname, "M": M, "N": N}
            for name, fn in providers.items():
                if name == "fused" and N > 65536:
                    rec[name] = ""
                    continue
                err = (fn(x).double() - ref).abs().max().item()
                assert err < 1e-2, f"{name} {dname} {M}x{N}: error {err}"
                rec[name] = round(gbps(fwd_bytes(M, N, dtype), time_ms(lambda fn=fn, x=x: fn(x))))
            rows.append(rec)
            print(" ".join(f"{k}={v}" for k, v in rec.items()), flush=True)
            del x, ref
    with open(out / "fwd_table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    autotune = os.environ.get("TRITONSOFTMAX_AUTOTUNE", "1")
    lines = [f"Command: `{' '.join(['python -m bench.fwd_table'] + (argv or sys.argv[1:]))}` "
             f"(TRITONSOFTMAX_AUTOTUNE={autotune})", "",
             f"{info.name}, torch {torch.__version__}, triton {triton.__version__}. GB/s = (read + write bytes) / "
             "median time (`triton.testing.do_bench`, warmup 10 ms, rep 40 ms), all providers in one run.", "",
             "| dtype | M×N | torch.softmax | auto | fused | online | tile | auto / torch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['M']}×{r['N']} | {r['torch']} | {r['auto']} | {r['fused']} | "
                     f"{r['online']} | {r['tile']} | {r['auto'] / r['torch']:.2f} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
