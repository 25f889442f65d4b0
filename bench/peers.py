"""Every softmax the sweep compares, behind one signature.

``prepare(name, x)`` returns a zero-argument callable computing the softmax of ``x`` over its last
dim, or raises :class:`Unavailable` with a one-line reason (library missing, GPU only, shape not
supported). Peer libraries are imported lazily: installed ones (``pip install liger-kernel flag-gems
quack-kernels``), or those in a folder named by ``TRITONSOFTMAX_PEERS_SITE`` (or ``--peers-site``).
"""

from __future__ import annotations

import importlib
import itertools
import os
import sys
import types
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from tritonsoftmax.kernels.triton_launcher import COMPILE_OPTIONS

OURS = ("auto", "fused", "tile", "online", "split", "coop", "smem")
REFERENCE = ("copy",)  # the same bytes moved by a copy: the bandwidth ceiling, not a peer
BASELINE = ("previous",)  # auto of an earlier version of this package (bench.baseline): asked for by name only
PEERS = ("torch", "compile", "tutorial", "naive", "liger", "flaggems", "quack")
# the textbook Triton kernels (bench/textbook.py): lines beside ours, not peers (no `vs best` counts them)
TEXTBOOK = ("textbook-fused", "textbook-tile", "textbook-online")
ALL = OURS + REFERENCE + BASELINE + PEERS + TEXTBOOK
LABELS = {"auto": "tritonsoftmax", "fused": "ts-fused", "tile": "ts-tile", "online": "ts-online", "split": "ts-split",
          "coop": "ts-coop", "smem": "ts-smem",
          "copy": "copy", "previous": "previous",
          "torch": "torch.softmax", "compile": "torch.compile", "tutorial": "Triton tutorial", "naive": "naive torch",
          "liger": "Liger-Kernel", "flaggems": "FlagGems", "quack": "QuACK",
          "textbook-fused": "textbook fused", "textbook-tile": "textbook tile", "textbook-online": "textbook online"}


class Unavailable(Exception):
    """This provider cannot run this input; the message says why in one line."""


def previous_package():
    """The earlier version of tritonsoftmax that bench.baseline copied as ``tritonsoftmax_base`` into the folder
    named by TRITONSOFTMAX_BASELINE (``--baseline``); raises Unavailable without one."""
    path = os.environ.get("TRITONSOFTMAX_BASELINE")
    if not path or not os.path.isdir(os.path.join(path, "tritonsoftmax_base")):
        raise Unavailable("no previous package (python -m bench.baseline COMMIT DIR, then --baseline DIR)")
    if path not in sys.path:
        sys.path.insert(0, path)
    import tritonsoftmax_base

    return tritonsoftmax_base


def _previous_backward(base):
    """The earlier package's backward without autograd, ``backward(dy, y, dim, impl, scale, log, input_dtype)``:
    in its ``execute`` module, or in ``api`` where it predates that module."""
    try:
        return importlib.import_module(f"{base.__name__}.execute").backward
    except ModuleNotFoundError:
        return importlib.import_module(f"{base.__name__}.api").backward


def add_peers_site(path: str | None = None) -> None:
    """Make the peer libraries in folder ``path`` (or TRITONSOFTMAX_PEERS_SITE) importable; a ``peers_site`` module
    there, if any, finishes the set-up (no-op without a path)."""
    path = path or os.environ.get("TRITONSOFTMAX_PEERS_SITE")
    if not path or not os.path.isdir(path):
        return
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        import peers_site

        peers_site.add(path)
    except ImportError:
        pass


@triton.jit
def _tutorial_softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_rows, n_cols, BLOCK: tl.constexpr,
                             STAGES: tl.constexpr):
    """The Triton tutorial's fused softmax: a persistent loop over rows (software-pipelined over STAGES), one
    whole row in registers.

    x_ptr, y_ptr: input/output; *_row_stride: element stride between rows; BLOCK >= n_cols.
    """
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        z = x - tl.max(x, axis=0)
        num = tl.exp(z)
        y = num / tl.sum(num, axis=0)
        tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


TUTORIAL_WARPS = 8  # the tutorial's launch: 8 warps; 4 pipeline stages where an SM has over 200 KB of shared memory
TUTORIAL_STAGES_SMEM = 200000


def tutorial_programs(n_rows: int, n_regs: int, shared: int, props: dict) -> int:
    """The tutorial's grid: programs an SM from the compiled kernel's registers (and its shared memory), times
    the SMs, at most one a row. ``props``: the driver's device properties (max_num_regs, warpSize,
    max_shared_mem, multiprocessor_count)."""
    per_sm = props["max_num_regs"] // (n_regs * props["warpSize"] * TUTORIAL_WARPS)
    if shared:
        per_sm = min(per_sm, props["max_shared_mem"] // shared)
    return max(1, min(n_rows, props["multiprocessor_count"] * per_sm))


def _tutorial(x: torch.Tensor) -> Callable[[], torch.Tensor]:
    M, N = x.shape
    if N > 65536:
        raise Unavailable("the tutorial kernel holds the whole row in registers (N > 65536)")
    block = triton.next_power_of_2(N)
    y = torch.empty_like(x)
    programs = M
    stages = 2
    if x.is_cuda:
        from triton.runtime import driver

        props = driver.active.utils.get_device_properties(x.device.index or 0)
        stages = 4 if props["max_shared_mem"] > TUTORIAL_STAGES_SMEM else 2
        compiled = _tutorial_softmax_kernel.warmup(x, y, x.stride(0), y.stride(0), M, N, BLOCK=block, STAGES=stages,
                                                   num_warps=TUTORIAL_WARPS, grid=(1,), **COMPILE_OPTIONS)
        compiled._init_handles()
        programs = tutorial_programs(M, compiled.n_regs, compiled.metadata.shared, props)

    def run():
        out = torch.empty_like(x)
        _tutorial_softmax_kernel[(programs,)](x, out, x.stride(0), out.stride(0), M, N, BLOCK=block, STAGES=stages,
                                              num_warps=TUTORIAL_WARPS, **COMPILE_OPTIONS)
        return out

    return run


def _naive(x: torch.Tensor) -> Callable[[], torch.Tensor]:
    def run():
        x_max = x.max(dim=1)[0]
        z = x - x_max[:, None]
        num = torch.exp(z)
        den = num.sum(dim=1)
        return num / den[:, None]

    return run


_compiled_points = itertools.count()


def compiled_per_point(fn: Callable) -> Callable:
    """``torch.compile(fn, dynamic=False)`` on a copy of ``fn`` with its own code object.

    Dynamo keeps its compiled graphs on the code object: one lambda compiled for every point of
    a sweep piles up one graph per shape on one code object, and past the recompile limit (8 by
    default) Dynamo silently runs eager code for every later point. A fresh code object per point
    gives each point its own single graph: what a user calling with one static shape gets."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_point{next(_compiled_points)}")
    fresh = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(fresh, dynamic=False)


def _softmax_last(t: torch.Tensor) -> torch.Tensor:
    return torch.softmax(t, -1)


def _softmax_grad_last(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y * (dy - (dy * y).sum(-1, keepdim=True))


def _compile(x: torch.Tensor) -> Callable[[], torch.Tensor]:
    if not x.is_cuda:
        raise Unavailable("torch.compile is compared on the GPU only")
    fn = compiled_per_point(_softmax_last)
    return lambda: fn(x)


def _peer(module: str, x: torch.Tensor):
    if not x.is_cuda:
        raise Unavailable(f"{module} runs on the GPU only")
    add_peers_site()
    try:
        return __import__(module, fromlist=["_"])
    except Exception as e:  # ImportError, or a library that fails while importing
        raise Unavailable(f"{module} not importable ({type(e).__name__}: {str(e).splitlines()[0][:80]})") from None


def _softmax_over_temperature(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x / t, -1)


def prepare_sampling(name: str, x: torch.Tensor, t: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A callable computing softmax(x / t, -1), ``t`` one temperature a row (shape (M, 1)): what a sampler runs on
    each step's logits. Ours takes the reciprocals as its per-row scale (computed once, as a sampler keeps them
    per request); the peers without a per-row temperature raise Unavailable."""
    if name in OURS:
        import tritonsoftmax

        if name == "smem":
            raise Unavailable("smem takes one scale for all rows")
        inv = (1.0 / t).float()
        return lambda: tritonsoftmax.softmax(x, impl=name, scale=inv)
    if name == "copy":
        y = torch.empty_like(x)
        return lambda: y.copy_(x)
    if name == "torch":
        return lambda: _softmax_over_temperature(x, t)
    if name == "naive":
        return lambda: _naive(x / t)()
    if name == "compile":
        if not x.is_cuda:
            raise Unavailable("torch.compile is compared on the GPU only")
        fn = compiled_per_point(_softmax_over_temperature)
        return lambda: fn(x, t)
    if name in ALL:
        raise Unavailable(f"{LABELS[name]} has no per-row temperature")
    raise ValueError(f"unknown provider {name!r}; choose from {', '.join(ALL)}")


def prepare_backward(name: str, x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A callable computing softmax's input gradient from the saved output ``y`` = softmax(x, -1)
    and the incoming gradient ``dy`` (all 2-D, contiguous); raises Unavailable like ``prepare``."""
    if name in OURS:
        from tritonsoftmax import execute

        if name == "fused" and x.shape[1] > 65536:
            raise Unavailable("fused holds the whole row on chip (N > 65536)")
        return lambda: execute.backward(dy, y, -1, name, 1.0, False, x.dtype)
    if name == "previous":
        backward = _previous_backward(previous_package())
        return lambda: backward(dy, y, -1, "auto", 1.0, False, x.dtype)
    if name == "copy":  # the same bytes: read two tensors, write one
        out = torch.empty_like(x)
        return lambda: torch.add(dy, y, out=out)
    if name == "torch":
        return lambda: torch._softmax_backward_data(dy, y, -1, x.dtype)
    if name == "naive":
        return lambda: y * (dy - (dy * y).sum(-1, keepdim=True))
    if name == "compile":
        if not x.is_cuda:
            raise Unavailable("torch.compile is compared on the GPU only")
        fn = compiled_per_point(_softmax_grad_last)
        return lambda: fn(dy, y)
    if name == "tutorial":
        raise Unavailable("the tutorial kernel has no backward")
    if name in TEXTBOOK:
        raise Unavailable("the textbook kernels are forward only")
    if name == "liger":  # no public backward entry: its autograd Function, on its own forward output
        fn = _peer("liger_kernel.ops.softmax", x).LigerSoftmaxFunction
        xg = x.detach().requires_grad_()
        out = fn.apply(xg)
        return lambda: torch.autograd.grad(out, xg, dy, retain_graph=True)[0]
    if name == "flaggems":
        fn = _peer("flag_gems.ops.softmax", x).softmax_backward
        return lambda: fn(dy, y, -1, x.dtype)
    if name == "quack":
        fn = _peer("quack.softmax", x).softmax_bwd
        return lambda: fn(dy, y)
    raise ValueError(f"unknown provider {name!r}; choose from {', '.join(ALL)}")


def prepare(name: str, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A callable computing softmax(x, -1) with provider ``name`` (x: 2-D, contiguous)."""
    if name in OURS:
        import tritonsoftmax

        if name == "fused" and x.shape[1] > 65536:
            raise Unavailable("fused holds the whole row on chip (N > 65536)")
        if name == "smem" and not x.is_cuda:
            raise Unavailable("smem is a Gluon kernel: NVIDIA GPUs only, no interpreter")
        return lambda: tritonsoftmax.softmax(x, impl=name)
    if name == "previous":
        base = previous_package()
        return lambda: base.softmax(x)
    if name == "copy":
        y = torch.empty_like(x)
        return lambda: y.copy_(x)
    if name == "torch":
        return lambda: torch.softmax(x, -1)
    if name == "naive":
        return _naive(x)
    if name == "tutorial":
        return _tutorial(x)
    if name in TEXTBOOK:
        from bench.textbook import textbook

        try:
            return textbook(name.removeprefix("textbook-"), x)
        except ValueError as e:
            raise Unavailable(str(e)) from None
    if name == "compile":
        return _compile(x)
    if name == "liger":
        fn = _peer("liger_kernel.ops.softmax", x).LigerSoftmaxFunction
        return lambda: fn.apply(x)
    if name == "flaggems":
        fn = _peer("flag_gems.ops.softmax", x).softmax
        return lambda: fn(x, -1)
    if name == "quack":
        fn = _peer("quack.softmax", x).softmax_fwd
        return lambda: fn(x)
    raise ValueError(f"unknown provider {name!r}; choose from {', '.join(ALL)}")
