"""Compile the smem forward kernel for sm_90 without a GPU and print what the compiler made of it, as
JSON (test_smem.py runs this in a process of its own: under TRITON_INTERPRET the @triton.jit helpers the
Gluon kernel calls are interpreter objects that Gluon cannot compile).

    python tests/smem_compile.py '[["bf16", "bf16", {"BLOCK": 4096, ...}, 4, {"LOG": 1}], ...]'

Each case: input dtype, output dtype, constexprs of a config, num_warps, flags. Prints a list of
{"ptx": ..., "shared": ...}; N and the strides carry no divisibility hint (the kernel must know its
vectors without one); pointers are 16-byte aligned, as a launch on aligned rows gets them."""

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from tritonsoftmax.kernels import smem  # noqa: E402


def compile_case(dtype: str, out_dtype: str, meta: dict, num_warps: int, flags: dict) -> dict:
    kernel = smem._softmax_smem_fwd_kernel
    sig, const, attrs = {}, {}, {}
    pointers = {"x_ptr": "*" + dtype, "y_ptr": "*" + out_dtype, "ws_ptr": "*fp32", "sync_ptr": "*i32"}
    for i, name in enumerate(kernel.arg_names):
        if name in pointers:
            sig[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "scale":
            sig[name] = "fp32"
        elif name in ("INNER", "stride_x_col", "stride_y_col"):
            sig[name], const[name] = "constexpr", 1
        elif name in ("M", "N", "N_BUCKET", "M_BUCKET") or name.startswith("stride"):
            sig[name] = "i32"
        else:
            sig[name] = "constexpr"
    const.update({"LOG": 0, "ZERO_MASKED": 0, "PHASE": 0, "HINTS": 1, "RESIDENT": 0, **meta, **flags})
    compiled = triton.compile(GluonASTSource(kernel, sig, const, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": True})
    return {"ptx": compiled.asm["ptx"], "shared": compiled.metadata.shared}


if __name__ == "__main__":
    print(json.dumps([compile_case(*case) for case in json.loads(sys.argv[1])]))
