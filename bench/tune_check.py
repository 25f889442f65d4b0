"""What the tuning table buys: first-call latency and steady-state speed, with and without it.

    python -m bench.tune_check [--out DIR]

First call: a fresh process with an empty Triton cache calls softmax once on a shape whose N
bucket it has not seen, (a) with the shipped table and (b) with TRITONSOFTMAX_TUNE_CACHE_SHIPPED=0
(autotuning). Steady state: in one process, each shape with the table's config against the
config the autotuner picks, both timed with do_bench.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch

FIRST_CALL = """
import time, torch, tritonsoftmax
x = torch.randn({M}, {N}, device="cuda", dtype=torch.{dtype})
torch.cuda.synchronize()
t = time.perf_counter(); tritonsoftmax.softmax(x); torch.cuda.synchronize()
print(time.perf_counter() - t)
"""
SHAPES = [(4096, 3000, "float32"), (4096, 700, "bfloat16"), (32, 100000, "float32"), (1000, 12000, "float16")]


def first_call_s(M: int, N: int, dtype: str, shipped: bool) -> float:
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(), "TRITONSOFTMAX_TUNE_CACHE": tempfile.mkdtemp(),
           "TRITONSOFTMAX_TUNE_CACHE_SHIPPED": "1" if shipped else "0", "TRITONSOFTMAX_AUTOTUNE": "1"}
    out = subprocess.run([sys.executable, "-c", FIRST_CALL.format(M=M, N=N, dtype=dtype)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ["TRITONSOFTMAX_AUTOTUNE"] = "1"
    import triton

    from bench.common import fwd_bytes, gbps, results_dir, time_ms
    from tritonsoftmax import dispatch, tuning
    from tritonsoftmax.device import device_info
    from tritonsoftmax.layout import matrix_problem

    info = device_info(torch.device("cuda"))
    out = results_dir(info.slug, "tune-check", args.out)
    lines = ["Command: `python -m bench.tune_check`", "",
             f"{info.name}, torch {torch.__version__}, triton {triton.__version__}.", "",
             "## First call for a new N bucket (fresh process, empty Triton cache)", "",
             "| shape | dtype | with table (s) | autotuning (s) |", "| --- | --- | --- | --- |"]
    for M, N, dtype in SHAPES:
        with_t, without_t = first_call_s(M, N, dtype, True), first_call_s(M, N, dtype, False)
        lines.append(f"| {M}×{N} | {dtype} | {with_t:.2f} | {without_t:.2f} |")
        print(lines[-1], flush=True)
    lines += ["", "## Steady state: the table's config against the autotuner's own choice (same run)", "",
              "| shape | dtype | family | table config | GB/s | autotuned config | GB/s |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for M, N, dname in SHAPES:
        dtype = getattr(torch, dname)
        x = torch.randn(M, N, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        name = dispatch.choose(M, N, dtype, info).impl
        fam = dispatch.family(name)
        entry = tuning.lookup(info, name, dtype, N, M)
        problem = matrix_problem(x, y)
        flags = {"LOG": 0, "ZERO_MASKED": 0}
        tuned = fam.prepare(problem, None, info, flags=flags)
        tuned(x, y, 1.0)
        cells = []
        for launch in (fam.prepare(problem, entry.config if entry else None, info, flags=flags), tuned):
            launch(x, y, 1.0)
            ms = time_ms(lambda p=launch, x=x, y=y: p(x, y, 1.0))
            cells += [str(launch.config), f"{gbps(fwd_bytes(M, N, dtype), ms):.0f}"]
        lines.append(f"| {M}×{N} | {dname} | {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
