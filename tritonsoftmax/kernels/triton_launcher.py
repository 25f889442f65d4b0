"""How a compiled Triton kernel is started without Triton's per-call Python: the launcher's C
function called directly (its argument layout recognised per triton release), cluster
launches, and the constexpr values the warm path passes itself."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from triton import knobs
from triton.runtime import driver

# How a warm call starts a compiled kernel (see c_launch_layout).
RUN_LAUNCHER = 0  # through Triton's CudaLauncher object (its Python __call__, then its C function)
C_LAUNCH_SPREAD = 1  # its C function, kernel arguments spread after 4 leading slots (triton 3.6)
C_LAUNCH_TUPLE = 2  # its C function, kernel arguments as one tuple after their annotations (triton 3.7-3.9)


def c_launch_layout(run) -> int:
    """How to call ``run`` (a CompiledKernel's ``run``) without its Python wrapper, which only
    allocates the scratch buffers a kernel may need (ours need none) and costs about 2 us of host
    time a call doing so.

    The layout is recognised from CudaLauncher.__call__'s parameters and attributes, which changed
    once between triton 3.6 and 3.7 (checked against each release's driver.py from 3.6 to 3.9);
    anything else (AMD's launcher, a kernel with scratch, a sanitizer, an unknown layout) keeps
    RUN_LAUNCHER."""
    if type(run).__name__ != "CudaLauncher" or not hasattr(run, "launch"):
        return RUN_LAUNCHER
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1) \
            or getattr(run, "gsan_enabled", False):
        return RUN_LAUNCHER
    try:
        params = tuple(inspect.signature(type(run).__call__).parameters)
    except (TypeError, ValueError):
        return RUN_LAUNCHER
    head = ("self", "gridX", "gridY", "gridZ", "stream", "function")
    if params == head + ("args",) and not hasattr(run, "arg_annotations"):
        return C_LAUNCH_SPREAD
    hooks = ("kernel_metadata", "launch_metadata", "launch_enter_hook", "launch_exit_hook", "args")
    if params == head + hooks and hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature"):
        return C_LAUNCH_TUPLE
    return RUN_LAUNCHER


def warm_launcher(run, grid3: tuple, function: int, packed_metadata, fixed_args: tuple,
                  current_stream: Callable[[int], int], device_index: int) -> Callable[..., None]:
    """A function of the leading kernel arguments (``x``, ``y`` and the extras as addresses and
    numbers, one parameter each) that starts the compiled kernel on the current stream, through
    ``run``'s C function where c_launch_layout allows; everything else a launch passes is fixed
    here, once. ``fixed_args``: the arguments after those (the problem's sizes and strides, the
    constexprs)."""
    g0, g1, g2 = grid3
    layout = c_launch_layout(run)
    if layout == C_LAUNCH_TUPLE:
        launch = run.launch
        head = (function, run.launch_cooperative_grid, run.launch_pdl, packed_metadata, None, None, None, None,
                None, run.arg_annotations, run.kernel_signature)

        def start(*args):
            launch(g0, g1, g2, current_stream(device_index), *head, (*args, *fixed_args))
    elif layout == C_LAUNCH_SPREAD:
        launch = run.launch
        head = (function, run.launch_cooperative_grid, run.launch_pdl, None, None, packed_metadata, None, None, None)

        def start(*args):
            launch(g0, g1, g2, current_stream(device_index), *head, *args, *fixed_args)
    else:
        head = (function, packed_metadata, None, None, None)

        def start(*args):
            run(g0, g1, g2, current_stream(device_index), *head, *args, *fixed_args)
    start.layout = layout
    return start


@dataclass(frozen=True)
class WarmKernel:
    """What a warm launch starts, for a launcher outside Python: the loaded CUfunction, its grid, num_warps and
    dynamic shared memory, Triton's type of every parameter in order (``signature``: "*fp32", "i32", "fp32",
    "constexpr"), how many lead the call's own (``leading``: the input, the output, the saved output where there
    is one, the float scale) and the values of the rest (``fixed_args``), and whether the pointers were 16-byte
    aligned when it was compiled (``aligned``)."""

    function: int
    grid: tuple
    num_warps: int
    shared: int
    signature: list
    leading: int
    fixed_args: tuple
    aligned: bool


def warm_kernel(compiled, grid3: tuple, packed_metadata, fixed_args: tuple, tensors: int, aligned: bool,
                layout: int) -> WarmKernel | None:
    """A warm launch as WarmKernel where it is one plain launch: a CUDA launcher called without its Python
    (``layout`` is not RUN_LAUNCHER: no scratch, no sanitizer), one CTA a cluster, neither cooperative nor
    programmatic-dependent, ``tensors`` (after x and y) 0 or 1; else None."""
    run = compiled.run
    if layout == RUN_LAUNCHER or tensors not in (0, 1) or getattr(run, "launch_cooperative_grid", True) \
            or getattr(run, "launch_pdl", True):
        return None
    if not (isinstance(packed_metadata, tuple) and len(packed_metadata) == 3 and packed_metadata[1] == 1):
        return None
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if not isinstance(signature, dict):
        return None
    num_warps, _, shared = packed_metadata
    return WarmKernel(int(compiled.function), tuple(grid3), int(num_warps), int(shared), list(signature.values()),
                      3 + tensors, tuple(fixed_args), bool(aligned))


def launch_hook_installed() -> bool:
    """Whether a Triton launch hook that wants calls (a profiler's) is installed: warm paths that skip Triton's
    launcher skip its hooks too, so such calls take Triton's runner."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and getattr(hook, "calls", True)


def direct_start(start: Callable[..., None], aligned: bool, fallback: Callable, tensors: int = 0) -> Callable:
    """A warm PreparedLaunch's call in one Python frame for its common case: ``(x, y, scale)`` with
    ``tensors`` = 0, ``(x, y, t, scale)`` with 1 (the backward's saved output, a workspace), every tensor on the
    16-byte alignment ``start`` (warm_launcher's) was compiled for (``aligned``), a float ``scale`` and no
    launch hook installed; any other call goes to ``fallback`` (the launch's own __call__, whose hook test this
    repeats). What it saves is the generic path's argument list and two Python frames, a fraction of a
    microsecond a warm call."""
    runtime = knobs.runtime
    if tensors not in (0, 1):
        return fallback

    def direct(x, y, *extra):
        xp, yp = x.data_ptr(), y.data_ptr()
        hook = runtime.launch_enter_hook
        whole = not (xp | yp) & 15
        if (whole is aligned and len(extra) == 1 and type(extra[0]) is float
                and (hook is None or not getattr(hook, "calls", True))):
            start(xp, yp, extra[0])
        else:
            fallback(x, y, *extra)

    def direct_with_tensor(x, y, *extra):
        hook = runtime.launch_enter_hook
        if (len(extra) == 2 and type(extra[1]) is float and type(extra[0]) is torch.Tensor
                and (hook is None or not getattr(hook, "calls", True))):
            xp, yp, tp = x.data_ptr(), y.data_ptr(), extra[0].data_ptr()
            if (not (xp | yp | tp) & 15) is aligned:
                start(xp, yp, tp, extra[1])
                return
        fallback(x, y, *extra)

    return direct_with_tensor if tensors else direct


PORTABLE_CLUSTER = 8  # the most CTAs a cluster may have without the function's non-portable attribute


def allow_cluster(function: int, shared_bytes: int, cluster: int) -> None:
    """Let ``function`` (a loaded CUfunction) start as clusters of ``cluster`` > 8 CTAs with
    ``shared_bytes`` of dynamic shared memory, or raise. Triton's launcher sets the non-portable
    attribute for clusters of exactly 16 only; its cuOccupancyMaxActiveClusters (triton 3.6-3.9)
    sets it, with the dynamic shared memory limit, on the function it is asked about, and answers how
    many such clusters fit at once (for 128-thread CTAs), which must be at least one."""
    ask = getattr(driver.active.utils, "cuOccupancyMaxActiveClusters", None)
    if ask is None:
        raise RuntimeError(f"this triton ({triton.__version__}) cannot start clusters of {cluster}")
    fits = ask(function, shared_bytes, cluster)
    if fits < 1:
        raise RuntimeError(f"no cluster of {cluster} CTAs fits on this GPU ({fits})")


def hooked_runner(compiled, grid3: tuple, packed_metadata, device_index: int) -> Callable:
    """What ``compiled[grid3]`` gives (a launch that calls the launch hooks a profiler installs),
    with the given packed metadata instead of the compiled kernel's (cluster mode)."""

    def runner(*args):
        stream = driver.active.get_current_stream(device_index)
        compiled.run(*grid3, stream, compiled.function, packed_metadata, compiled.launch_metadata(grid3, stream, *args),
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)

    return runner


def constexpr_values(kernel, meta: dict) -> tuple:
    """The values a compiled kernel's launcher takes after the runtime arguments: each of
    ``kernel``'s parameters named in ``meta``, or left to its default (e.g. fused's STAGES), in
    parameter order. (Triton's own launch path fills defaults in; the warm path must do it here.)"""
    params = inspect.signature(kernel.fn).parameters
    out = []
    for name in kernel.arg_names:
        if name in meta:
            out.append(meta[name])
        elif params[name].default is not inspect.Parameter.empty:
            out.append(params[name].default)
    return tuple(out)


def raw_args(x: torch.Tensor, y: torch.Tensor, extra: tuple) -> tuple[list, bool]:
    """The kernel arguments with each tensor as its address, and whether every address is 16-byte
    aligned. Triton's launcher takes an address as it is, where for a tensor it calls data_ptr()
    and asks the driver about the pointer (microseconds on the warm path). ``extra`` holds tensors
    and Python floats (the scale): told apart by ``type``, as ``isinstance(a, torch.Tensor)`` runs
    Python code of torch's metaclass (~0.1 us)."""
    xp, yp = x.data_ptr(), y.data_ptr()
    bits = xp | yp
    args = [xp, yp]
    for a in extra:
        if type(a) is not float:
            a = a.data_ptr()
            bits |= a
        args.append(a)
    return args, not bits & 15


# Compile options every launch passes. FP contraction (FMA) stays on, as it was the default on
# triton 3.6-3.9: saying so keeps our numerics when 3.10 turns the default off, and silences 3.9's
# warning about the coming change (which fires on any compile that leaves it unset).
COMPILE_OPTIONS = {"enable_fp_fusion": True}

