"""Compile row kernels for sm_90 without a GPU and print their PTX as JSON (test_align.py runs this in
a process of its own, away from TRITON_INTERPRET).

    python tests/kernel_compile.py '[["fused", "_softmax_fused_fwd_kernel", "fp32", {"VEC": 4, ...}], ...]'

Each case: the module under tritonsoftmax.kernels, the kernel, the data pointers' dtype and every
constexpr the kernel has no default for (the others take their defaults). The pointers are declared
16-byte aligned and the column strides and INNER 1, as Triton specialises them for contiguous tensors;
N and the row strides are plain 32-bit integers (a row length that is not a multiple of 16, say 200)."""

import importlib
import inspect
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
WORKSPACE = {"ws_ptr": "*fp32", "sync_ptr": "*i32"}


def compile_case(module: str, name: str, dtype: str, const: dict) -> str:
    kernel = getattr(importlib.import_module(f"tritonsoftmax.kernels.{module}"), name)
    defaults = {p.name: p.default for p in kernel.params
                if p.is_constexpr and p.default is not inspect.Parameter.empty}
    const = {**defaults, **const, "INNER": 1, **{arg: 1 for arg in kernel.arg_names if arg.endswith("_col")}}
    sig, attrs = {}, {}
    for i, arg in enumerate(kernel.arg_names):
        if arg in const:
            sig[arg] = "constexpr"
        elif arg.endswith("_ptr"):
            sig[arg] = WORKSPACE.get(arg, "*" + dtype)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[arg] = "fp32" if arg == "scale" else "i32"
    compiled = triton.compile(ASTSource(kernel, sig, const, attrs), target=TARGET, options={"num_warps": 2})
    return compiled.asm["ptx"]


if __name__ == "__main__":
    print(json.dumps([compile_case(*case) for case in json.loads(sys.argv[1])]))
