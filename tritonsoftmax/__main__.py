"""Self-check: ``python -m tritonsoftmax``.

Prints the backend, arch, versions and the dispatch decision for a few shapes, then runs every
kernel family against a float64 reference (and, on a GPU, times it). On a machine without a GPU
it runs itself again with the Triton interpreter on (``TRITON_INTERPRET=1`` must be set before the
package defines its kernels, and ``python -m`` imports the package first), so it checks our kernels,
not torch against torch. Launches use each family's heuristic config unless ``--autotune`` is given.
Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

from tritonsoftmax.device import interpreter_active

SHAPES = [(1, 1), (7, 17), (64, 1000), (3, 4097), (2, 20000)]
GPU_SHAPES = [(4096, 1024), (4096, 16384), (256, 131072)]
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 8e-3}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tritonsoftmax", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--autotune", action="store_true",
                    help="autotune shapes the tuning table lacks (default: each family's heuristic config)")
    ap.add_argument("--native", action="store_true",
                    help="build and turn on the C++ launch path first (NVIDIA; tritonsoftmax.native), and check it")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not interpreter_active():
        # The kernels were defined when `python -m` imported the package, before this could turn the
        # interpreter on: run again in a process that has it from the start.
        cmd = [sys.executable, "-m", "tritonsoftmax", *(sys.argv[1:] if argv is None else argv)]
        return subprocess.call(cmd, env={**os.environ, "TRITON_INTERPRET": "1"})
    start = time.time()
    if not args.autotune:
        os.environ.setdefault("TRITONSOFTMAX_AUTOTUNE", "0")  # heuristic configs: no minutes of tuning
    import triton

    import tritonsoftmax
    from tritonsoftmax import dispatch, native
    from tritonsoftmax.device import device_info
    from tritonsoftmax.kernels import FAMILY_NAMES, GLUON_FAMILY_NAMES, gluon_available

    dev = torch.device("cuda" if on_gpu else "cpu")
    info = device_info(dev)
    print(f"tritonsoftmax {tritonsoftmax.__version__}: torch {torch.__version__}, triton {triton.__version__}")
    print(f"device: {info.name} backend={info.backend} arch={info.arch} warp={info.warp_size} "
          f"SMs={info.sm_count} regs/SM={info.regs_per_sm}")
    if not on_gpu:
        import numpy

        from tritonsoftmax.device import interpreter_numpy_conflict

        why = interpreter_numpy_conflict(triton.__version__, numpy.__version__)
        if why:
            print(f"cannot run the kernels under the Triton interpreter: {why}")
            return 1
        print("no GPU: running the kernels under the Triton interpreter (correctness only, no speed)")
    failures = 0
    if args.native and not native.enable():
        failures += on_gpu  # asked for on a GPU and not there; without one it cannot run
    print("C++ launch path:", "on (gradient checks run three times: the later ones through C++)" if native.module
          else "off (TRITONSOFTMAX_NATIVE=1 turns it on)")
    print("dispatch:")
    for M, N in [(8, 2048), (4096, 1024), (4096, 16384), (4096, 65536), (1, 8388608)]:
        rule = dispatch.choose(M, N, torch.float32, info)
        print(f"  {M:>5} x {N:<8} -> {rule.impl:7} ({rule.why})")

    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if on_gpu else [])
    shapes = SHAPES + (GPU_SHAPES if on_gpu else [])
    gen = torch.Generator().manual_seed(0)
    gluon = GLUON_FAMILY_NAMES if on_gpu and info.sm_version >= 80 and gluon_available() else ()
    for impl in ("auto",) + FAMILY_NAMES + gluon:
        for dtype in dtypes:
            for M, N in shapes:
                if impl == "fused" and N > 65536:
                    continue
                x = (torch.randn(M, N, generator=gen) * 4).to(dev, dtype)
                try:
                    y = tritonsoftmax.softmax(x, impl=impl)
                    err = (y.double() - torch.softmax(x.double(), -1)).abs().max().item()
                    ok = err <= TOL[dtype]
                except Exception as e:  # report and go on: the self-check lists every failure
                    err, ok = float("nan"), False
                    print(f"  ERROR {impl} {dtype} {M}x{N}: {type(e).__name__}: {e}")
                speed = ""
                if ok and on_gpu:
                    run = lambda x=x, impl=impl: tritonsoftmax.softmax(x, impl=impl)
                    ms = triton.testing.do_bench(run, warmup=10, rep=40, return_mode="median")
                    speed = f"{2 * x.numel() * x.element_size() / ms / 1e6:8.0f} GB/s"
                failures += not ok
                print(f"  {'ok  ' if ok else 'FAIL'} {impl:7} {str(dtype)[6:]:8} {M:>5} x {N:<6} "
                      f"max err {err:.1e} {speed}")
    rounds = 3 if native.module else 1  # the C++ launch path starts a signature's kernels from its second call
    for log in [False, True] * rounds:  # gradients through eager autograd (ops.SoftmaxFunction), auto dispatch
        for M, N in [(7, 17), (3, 4097)] + ([(4, 1048576)] if on_gpu else []):
            x = (torch.randn(M, N, generator=gen) * 4).to(dev).requires_grad_()
            dy = torch.randn(M, N, generator=gen).to(dev)
            fn = tritonsoftmax.log_softmax if log else tritonsoftmax.softmax
            try:
                fn(x, scale=0.5).backward(dy)
                xr = x.detach().double().requires_grad_()
                (torch.log_softmax if log else torch.softmax)(xr * 0.5, -1).backward(dy.double())
                err = (x.grad.double() - xr.grad).abs().max().item()
                ok = err <= 1e-5
            except Exception as e:  # report and go on
                err, ok = float("nan"), False
                print(f"  ERROR backward {M}x{N}: {type(e).__name__}: {e}")
            failures += not ok
            print(f"  {'ok  ' if ok else 'FAIL'} {'log_softmax' if log else 'softmax':11} backward float32 "
                  f"{M:>5} x {N:<7} max err {err:.1e}")
    print("self-check", "passed" if failures == 0 else f"FAILED ({failures} checks)", f"({time.time() - start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
