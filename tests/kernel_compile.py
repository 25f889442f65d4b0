"""Compile the fused kernels (forward, backward) for sm_90 without a GPU and print their PTX as JSON
(test_align.py runs this in a process of its own, away from TRITON_INTERPRET).

    python tests/fused_compile.py '[["fwd", "fp32", {"VEC": 4}], ["bwd", "bf16", {"VEC": 1}], ...]'

The pointers are declared 16-byte aligned and the column strides 1, as Triton specialises them for
contiguous tensors; N and the row strides are plain 32-bit integers (a row length that is not a
multiple of 16, such as 200). Each case: kernel, pointer dtype, constexprs over the defaults below."""

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tritonsoftmax.kernels import fused  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def compile_case(which: str, dtype: str, flags: dict) -> str:
    kernel = fused._softmax_fused_fwd_kernel if which == "fwd" else fused._softmax_fused_bwd_kernel
    const = {"LOG": 0, "BLOCK_N": 256, "ROWS": 8, "ALIGN": 1, "VEC": 1, "INNER": 1, **flags}
    const.update({name: 1 for name in kernel.arg_names if name.endswith("_col")})
    if which == "fwd":
        const.update({"ZERO_MASKED": 0, "STAGES": 1, "PER_SM": 0, **flags})
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + dtype
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name == "scale" else "i32"
    compiled = triton.compile(ASTSource(kernel, sig, const, attrs), target=TARGET, options={"num_warps": 2})
    return compiled.asm["ptx"]


if __name__ == "__main__":
    print(json.dumps([compile_case(*case) for case in json.loads(sys.argv[1])]))
