"""The C++ launch path of an eager step (NVIDIA): opt in with ``tritonsoftmax.native.enable()`` or
``TRITONSOFTMAX_NATIVE=1``.

A recorded eager softmax through Python costs more host time than torch's: ``torch.autograd.Function``'s Python on
the way in, and the backward's Python on autograd's device thread, where it runs slower than on the main thread
(docs/performance.md). ``csrc/native_step.cpp`` starts the same compiled Triton kernels from C++: a C++
autograd Function whose forward and backward look up a plan (the compiled function, its grid and its parameters)
and call ``cuLaunchKernel``. It chooses nothing: the first call of a signature runs the Python path (the dispatcher,
Triton's compile) and this module hands the launch it kept to C++ as a plan; later calls of that signature start
it from C++. Launch forms it cannot take (several kernels, clusters, AMD) stay on the Python path, and so do calls
made while a profiler's Triton launch hook is installed (Triton's launcher calls it; C++ would not). Inside
``patch_torch()`` the same plans serve torch's own operators: the extension registers C++ kernels for aten's softmax
operators (patch.py), so that torch's autograd node reaches a C++ launch with no Python between.

The extension is compiled once per torch, Python and source version with the host's C++ compiler (``CXX`` or
``c++``) into ``$TRITONSOFTMAX_NATIVE_DIR`` (default ``~/.cache/tritonsoftmax/native``), about 20 s; a build
that fails warns and leaves the Python path on.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

import torch

from . import dispatch, execute

SOURCE = Path(__file__).with_name("csrc") / "native_step.cpp"
NAME = "_tritonsoftmax_native"

# Parameter kinds (csrc/native_step.cpp's Kind).
FIXED_INT, FIXED_F32, PTR_IN, PTR_OUT, PTR_SAVED, SCALE = range(6)

# The loaded extension while enabled (api reads it on every call), else None.
module: ModuleType | None = None

# A forward's mode (impl, log, zero_masked) as one number, the C++ plans' key.
MODE_OF_IMPL = {impl: 4 * i for i, impl in enumerate(dispatch.IMPLS)}
_IMPL_OF_MODE = {v: k for k, v in MODE_OF_IMPL.items()}

_refused: set[tuple] = set()  # signatures whose launch C++ cannot start (the Python path runs them)


def _flags() -> list[str]:
    """The compile flags torch's own extensions get (its ABI, its pybind11's build identity)."""
    flags = ["-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={NAME}",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    for part in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(torch._C, f"_PYBIND11_{part}", None)
        if value is not None:
            flags.append(f'-DPYBIND11_{part}="{value}"')
    return flags


def build_command(output: Path) -> list[str]:
    """The compiler command that builds the extension into ``output``."""
    from torch.utils.cpp_extension import include_paths, library_paths

    lib = library_paths()[0]
    cxx = os.environ.get("CXX") or shutil.which("c++") or "g++"
    return [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", str(SOURCE), "-o", str(output), *_flags(),
            *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}", f"-L{lib}",
            f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl"]


def library_path() -> Path:
    """Where the extension built for this source, torch and Python lives."""
    tag = hashlib.sha256(SOURCE.read_bytes() + " ".join([torch.__version__, sys.version, *_flags()]).encode())
    root = Path(os.environ.get("TRITONSOFTMAX_NATIVE_DIR") or Path.home() / ".cache" / "tritonsoftmax" / "native")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return root / tag.hexdigest()[:16] / f"{NAME}{suffix}"


def build(verbose: bool = False) -> Path:
    """Compile the extension unless this version is already built; its path. RuntimeError with the compiler's
    output on failure."""
    out = library_path()
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # several processes may build at once: rename last
        part = Path(tmp) / out.name
        cmd = build_command(part)
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed ({cmd[0]}, exit {done.returncode}):\n"
                               f"{done.stderr[-4000:]}")
        os.replace(part, out)
    return out


def load() -> ModuleType:
    """The extension, built if needed (build's errors)."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    path = build()
    spec = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[NAME] = mod
    mod.set_backward(backward_miss, _backward_recorded)
    return mod


def enable() -> bool:
    """Turn the C++ launch path on (building it if needed); whether it is on. It stays off, with a warning, on
    AMD's torch, without a CUDA driver that has every entry point it uses, or where the build fails."""
    global module
    if module is not None:
        return True
    if torch.version.hip is not None:
        warnings.warn("tritonsoftmax native: NVIDIA only; the Python path stays on", RuntimeWarning, stacklevel=2)
        return False
    try:
        mod = load()
    except (RuntimeError, OSError, ImportError) as e:
        warnings.warn(f"tritonsoftmax native: {e}; the Python path stays on", RuntimeWarning, stacklevel=2)
        return False
    if torch.cuda.is_available():
        torch.cuda.init()  # libcuda loaded, so the extension finds its entry points
    if not mod.driver_ok():
        warnings.warn("tritonsoftmax native: no CUDA driver with cuLaunchKernel and cuFuncGetParamInfo (CUDA 12.4+) "
                      "in this process; the Python path stays on", RuntimeWarning, stacklevel=2)
        return False
    module = mod
    return True


def disable(forget_plans: bool = True) -> None:
    """Back to the Python path (the extension stays loaded; its plans forgotten unless ``forget_plans`` is false,
    for an enable() that follows)."""
    global module
    if forget_plans:
        forget()
    module = None


def forget() -> None:
    """Forget every plan (clear_caches)."""
    if module is not None:
        module.clear()
    _refused.clear()


def parameter_plan(signature: list, leading: int, fixed: tuple) -> tuple[list[int], list[int]] | None:
    """What each parameter of a compiled kernel holds, as C++ takes it: (kinds, values), one each for every
    non-constexpr entry of ``signature`` (Triton's types in parameter order: "*fp32", "i32", "fp32",
    "constexpr"). The first ``leading`` parameters are the call's: the input, the output, the saved output where
    leading is 4, then the float scale; ``fixed`` holds the values of the rest. None for a parameter C++ does not
    know how to pass."""
    if len(signature) != leading + len(fixed) or leading not in (3, 4):
        return None
    pointers = (PTR_IN, PTR_OUT, PTR_SAVED)[:leading - 1]
    kinds: list[int] = []
    values: list[int] = []
    for i, ty in enumerate(signature):
        if not isinstance(ty, str):
            return None
        if ty == "constexpr":
            continue
        if i < leading - 1:
            if not ty.startswith("*"):
                return None
            kinds.append(pointers[i])
            values.append(0)
        elif i == leading - 1:
            if ty != "fp32":
                return None
            kinds.append(SCALE)
            values.append(0)
        else:
            value = fixed[i - leading]
            if ty == "fp32" and isinstance(value, float):
                kinds.append(FIXED_F32)
                values.append(struct.unpack("<I", struct.pack("<f", value))[0])
            elif ty[:1] in ("i", "u") and ty[1:].isdigit() and isinstance(value, int):
                kinds.append(FIXED_INT)
                values.append(int(value))
            else:
                return None
    return kinds, values


def _offer(t: torch.Tensor, backward: bool, dim: int, mode: int, prepared, signature_key: tuple) -> None:
    """Give C++ the plan of ``prepared`` (what execute kept for this signature) or remember that it has none. A
    launch whose first call autotuned keeps its kernel from its second call on: it is asked again next time."""
    warm_kernel = getattr(prepared, "warm_kernel", None)
    warm = None if warm_kernel is None else warm_kernel()
    if warm is None and getattr(prepared, "kept", True) is False:
        return
    plan = None if warm is None else parameter_plan(warm.signature, warm.leading, warm.fixed_args)
    if plan is None or not module.add_plan(t, backward, dim, mode, warm.function, list(warm.grid), 32 * warm.num_warps,
                                           warm.shared, warm.aligned, *plan):
        if len(_refused) >= execute.PREPARED_MAX:
            _refused.clear()
        _refused.add(signature_key)


def learn_forward(x: torch.Tensor, dim: int, impl: str, log: bool, zero_masked: bool, mode: int) -> None:
    """After the Python path ran a forward that C++ had no plan for: hand over the launch it kept, if any."""
    if module is None or type(dim) is not int or not x.is_cuda or x.dim() == 0:
        return
    key = ("fwd", x.shape, x.stride(), x.dtype, x.get_device(), dim, mode)
    if key in _refused:
        return
    entry = execute.prepared_entry(x, dim, None, impl, log, zero_masked)
    if entry is not None:
        _offer(x, False, dim % x.dim(), mode, entry, key)


def backward_miss(dy: torch.Tensor, y: torch.Tensor, dim: int, scale: float, mode: int) -> torch.Tensor:
    """C++'s backward of a signature it has no plan for: the Python path, then its launch handed over."""
    impl, log = _IMPL_OF_MODE[mode & ~3], bool(mode & 2)
    dx = execute.backward(dy, y, dim, impl, scale, log, y.dtype)
    key = ("bwd", y.shape, y.stride(), y.dtype, y.get_device(), dim, mode)
    if module is not None and key not in _refused:
        entry = execute.prepared_backward_entry(y, dim, impl, log)
        if entry is not None:
            _offer(y, True, dim, mode, entry, key)
    return dx


def _backward_recorded(dy: torch.Tensor, y: torch.Tensor, dim: int, scale: float, mode: int) -> torch.Tensor:
    """C++'s backward where autograd records it (create_graph=True): the operator, whose formula differentiates."""
    from . import ops

    return ops.softmax_backward_op(dy, y, dim, _IMPL_OF_MODE[mode & ~3], scale, bool(mode & 2), y.dtype)


def counts() -> dict[str, int]:
    """Launches C++ started and signatures it had no plan for, since the extension loaded."""
    mod = module or sys.modules.get(NAME)
    names = ("forward", "backward", "forward_misses", "backward_misses")
    return dict(zip(names, mod.counts() if mod is not None else (0, 0, 0, 0), strict=True))


if os.environ.get("TRITONSOFTMAX_NATIVE", "0") not in ("", "0"):
    enable()
