"""Compile the coop kernels (forward, backward) without a GPU, for an NVIDIA or an AMD target, and print
the assembly as JSON (test_exchange.py runs this in a process of its own, away from TRITON_INTERPRET).

    python tests/coop_compile.py TARGET '[["fwd", {"PHASE": 0, "TILES": 1}], ...]'

TARGET: "cuda:90" or "hip:gfx942:64" (arch, wavefront size). Prints a list of the PTX (CUDA) or AMDGCN
(AMD) texts. Code that asks ``triton.language.target_info`` which backend it is compiled for asks the
active driver; without a GPU there is none, so for an AMD target the answer is set to that target before
the package is imported."""

import inspect
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
import triton.language.target_info as target_info  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

backend, arch, *rest = sys.argv[1].split(":")
TARGET = GPUTarget(backend, int(arch) if backend == "cuda" else arch, int(rest[0]) if rest else 32)


def _target():
    return TARGET


_target.__triton_builtin__ = True  # referenced from jitted code through target_info.is_hip
target_info.current_target = _target

from tritonsoftmax.kernels import coop  # noqa: E402


def compile_case(which: str, flags: dict) -> str:
    kernel = coop._softmax_coop_fwd_kernel if which == "fwd" else coop._softmax_coop_bwd_kernel
    sig = {}
    for name in kernel.arg_names:
        if name.endswith("_ptr"):
            sig[name] = {"ws_ptr": "*fp32", "sync_ptr": "*i32"}.get(name, "*bf16")
        elif name == "scale":
            sig[name] = "fp32"
        elif name in ("M", "N", "N_BUCKET", "M_BUCKET", "INNER") or name.startswith("stride"):
            sig[name] = "i32"
        else:
            sig[name] = "constexpr"
    # The kernel's own defaults first (as a launch has them): a constexpr left out would compile as None.
    const = {p.name: p.default for p in kernel.params if p.is_constexpr and p.default is not inspect.Parameter.empty}
    const.update({"LOG": 0, "ZERO_MASKED": 0} if which == "fwd" else {"LOG": 0})
    const.update({"BLOCK": 2048, "TILES": 1, "BLOCK_G": 64, "PHASE": 0, "HINTS": 1, "ALIGN": 1, "RESIDENT": 0, "VEC": 1,
                  **flags})
    compiled = triton.compile(ASTSource(kernel, sig, const), target=TARGET, options={"num_warps": 4})
    return compiled.asm["ptx" if backend == "cuda" else "amdgcn"]


if __name__ == "__main__":
    print(json.dumps([compile_case(*case) for case in json.loads(sys.argv[2])]))
