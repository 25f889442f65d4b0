"""Compile the smem kernels (forward, backward) for sm_90 without a GPU and print what the compiler made of it, as
JSON (test_smem.py runs this in a process of its own: under TRITON_INTERPRET the @triton.jit helpers the
Gluon kernel calls are interpreter objects that Gluon cannot compile).

    python tests/smem_compile.py '[["fwd", "bf16", "bf16", {"BLOCK": 4096, ...}, 4, {"LOG": 1}], ...]'

Each case: the kernel ("fwd", or "bwd": dy and y of the input dtype, dx of the output dtype), input
dtype, output dtype, constexprs of a config, num_warps, flags, and optionally launch options
(e.g. {"maxnreg": 64}); constexprs not given take the kernel's defaults (PHASE: 0). Prints a list of
{"ptx": ..., "shared": ...}; N and the strides carry no divisibility hint (the kernel must know its
vectors without one); pointers are 16-byte aligned, as a launch on aligned rows gets them."""

import inspect
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from tritonsoftmax.kernels import smem  # noqa: E402


def compile_case(which: str, dtype: str, out_dtype: str, meta: dict, num_warps: int, flags: dict,
                 options: dict | None = None) -> dict:
    if which == "fwd":
        kernel = smem._softmax_smem_fwd_kernel
        pointers = {"x_ptr": "*" + dtype, "y_ptr": "*" + out_dtype}
        defaults = {"LOG": 0, "ZERO_MASKED": 0}
    else:
        kernel = smem._softmax_smem_bwd_kernel
        pointers = {"dy_ptr": "*" + dtype, "y_ptr": "*" + dtype, "dx_ptr": "*" + out_dtype}
        defaults = {"LOG": 0}
    pointers.update({"ws_ptr": "*fp32", "sync_ptr": "*i32"})
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in pointers:
            sig[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "scale":
            sig[name] = "fp32"
        elif name == "INNER" or name.endswith("_col"):
            sig[name], const[name] = "constexpr", 1
        elif name in ("M", "N", "N_BUCKET", "M_BUCKET") or name.startswith("stride"):
            sig[name] = "i32"
        else:
            sig[name] = "constexpr"
    kernel_defaults = {p.name: p.default for p in kernel.params
                       if p.is_constexpr and p.default is not inspect.Parameter.empty}
    const.update({**kernel_defaults, **defaults, "PHASE": 0, **meta, **flags})
    options = {"num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": True, **(options or {})}
    compiled = triton.compile(GluonASTSource(kernel, sig, const, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                              options=options)
    return {"ptx": compiled.asm["ptx"], "shared": compiled.metadata.shared}


if __name__ == "__main__":
    print(json.dumps([compile_case(*case) for case in json.loads(sys.argv[1])]))
