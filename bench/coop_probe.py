"""``python -m bench.coop_probe MODE DTYPE full|heuristic MxN ...``: the coop family's configs beside
online, split and torch at chosen shapes (GPU only), the exploration behind the coop heuristics
and the dispatcher's coop rules (bench/NOTES.md, session 2; logs in bench/results/h200/coop-probe/).

    python -m bench.coop_probe fwd float32 full 4096x65536 1x131072
    BLOCKS="((8192, (4, 8)), (16384, (16,)))" python -m bench.coop_probe bwd bfloat16 full 4096x65536

Each line: GB/s (bytes read + written / do_bench median, 30 ms) of every candidate, prepared once
and then called (no per-call preparation), with the time in µs for calls under 50 µs; ``ERR`` marks
a result off the float64 reference by more than 1e-2 (checked when M*N <= 2^28), and the heuristic
config of coop is printed last. Candidates: torch, online and split (heuristic configs), coop-h
(coop's heuristic) and, with ``full``, coop at each (BLOCK, num_warps) of ``BLOCKS``.
"""

from __future__ import annotations

import ast
import os
import sys

import torch

DEFAULT_BLOCKS = "((1024, (4,)), (2048, (4,)), (4096, (4, 8)), (8192, (8, 16)), (16384, (16,)))"


def _coop_configs(info, N: int, full: bool) -> list:
    from tritonsoftmax.kernels import coop

    out = [("coop-h", None)]
    if full:
        for block, warps in ast.literal_eval(os.environ.get("BLOCKS", DEFAULT_BLOCKS)):
            if block * 2 <= N:
                out += [(f"coop-{block}-w{nw}", coop._shape_config(info, N, block, nw)) for nw in warps]
    return out


def probe(mode: str, dname: str, M: int, N: int, full: bool) -> str:
    from bench.common import bwd_bytes, fwd_bytes, gbps, time_ms
    from tritonsoftmax.device import device_info
    from tritonsoftmax.kernels import coop, online, split
    from tritonsoftmax.layout import matrix_problem

    info = device_info(torch.device("cuda"))
    dtype = getattr(torch, dname)
    x = (torch.randn(M, N, device="cuda") * 3).to(dtype)
    out = torch.empty_like(x)
    check = M * N <= 2**28
    if mode == "fwd":
        ref = torch.softmax(x.double(), -1) if check else None
        nbytes, flags, args = fwd_bytes(M, N, dtype), {"LOG": 0, "ZERO_MASKED": 0}, (x, out, 1.0)
        families = [online.FAMILY, split.FAMILY, coop.FAMILY]
        cands = [("torch", lambda: torch.softmax(x, -1))]
    else:
        y = torch.softmax(x.float(), -1).to(dtype)
        dy = torch.randn_like(x)
        ref = y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True)) if check else None
        nbytes, flags, args = bwd_bytes(M, N, dtype), {"LOG": 0}, (dy, out, y, 1.0)
        families = [online.BWD_FAMILY, split.BWD_FAMILY, coop.BWD_FAMILY]
        cands = [("torch", lambda: torch._softmax_backward_data(dy, y, -1, dtype))]
    named = [("online", families[0], None), ("split", families[1], None)]
    named += [(name, families[2], c) for name, c in _coop_configs(info, N, full)]
    for name, fam, config in named:
        launch = fam.prepare(matrix_problem(x, out), config or fam.heuristic(info, M, N), info, flags=flags)
        cands.append((name, lambda launch=launch: launch(*args)))
    cells = []
    for name, fn in cands:
        try:
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = (out.double() - ref).abs().max().item() if ref is not None and name != "torch" else 0.0
            ms = time_ms(fn, warmup_ms=5, rep_ms=30)
            cells.append(f"{name}={gbps(nbytes, ms):.0f}" + ("" if err < 1e-2 else f"(ERR {err:.2g})")
                         + (f"/{ms * 1e3:.1f}us" if ms < 0.05 else ""))
        except Exception as e:  # a config the compiler rejects is reported on its line
            cells.append(f"{name}=FAIL({type(e).__name__}: {str(e)[:200]})")
    heuristic = (coop.FAMILY if mode == "fwd" else coop.BWD_FAMILY).heuristic(info, M, N)
    return f"{mode} {dname} {M}x{N}: " + " ".join(cells) + f"   [coop-h {heuristic}]"


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("fwd", "bwd") or argv[2] not in ("full", "heuristic"):
        print(__doc__, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: the probe times GPU kernels; no GPU here", file=sys.stderr)
        return 2
    for shape in argv[3:]:
        M, N = map(int, shape.lower().split("x"))
        print(probe(argv[0], argv[1], M, N, argv[2] == "full"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
