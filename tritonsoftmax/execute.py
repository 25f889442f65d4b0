"""Softmax and its backward on tensors, without autograd: validate, view as rows, plan, launch.

The eager path and the bodies of the autograd operators (``ops.py``) both run here. The first call of a
signature validates its arguments, views the tensor as rows (``layout``), asks ``dispatch`` for the
family and config and prepares the family's launch; it is kept, so a warm call with the same
signature costs one dict lookup and a launch. Tensors our kernels do not take (float64, CPU tensors
without the Triton interpreter, ``torch.func`` wrappers) are computed by torch.
"""

from __future__ import annotations

import torch

from . import dispatch, layout
from .device import interpreter_active

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_impl(impl: str) -> None:
    """A ValueError naming the choices for an ``impl`` that is not "auto" or a family."""
    if impl not in dispatch.IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(map(repr, dispatch.IMPLS))}")


def normalize_dim(dim: int, ndim: int) -> int:
    """``dim`` as a non-negative index, with torch's errors: TypeError for a non-int, IndexError out of range."""
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not lo <= dim <= hi:
        raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {dim})")
    return dim % max(ndim, 1)


def check_scale(scale) -> float | torch.Tensor:
    """``scale`` as a float (None: 1.0), or a floating-point tensor of scales as it is (scale_view checks its
    shape against the input); a TypeError for anything else."""
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        if not scale.is_floating_point():
            raise TypeError(f"a tensor scale must be floating point, got {scale.dtype}")
        return scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python number or a tensor of one scale a row, got {type(scale).__name__}")
    return float(scale)


def scale_view(scale: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """A tensor of scales (one a row: a per-row temperature) as a view that broadcasts against ``x``: its shape,
    padded with leading 1s, must have size 1 along ``dim`` and broadcast to ``x`` elsewhere. No gradient flows
    into it (ValueError if it requires one while grad mode is on)."""
    if scale.device != x.device:
        raise ValueError(f"scale is on {scale.device}, the input on {x.device}")
    if scale.requires_grad and torch.is_grad_enabled():
        raise ValueError("tritonsoftmax computes no gradient for a tensor scale; pass scale.detach()")
    if scale.dim() > x.dim():
        raise ValueError(f"a scale of shape {tuple(scale.shape)} has more dims than the input {tuple(x.shape)}")
    shape = (1,) * (x.dim() - scale.dim()) + tuple(scale.shape)
    if shape[dim] != 1 or any(s not in (1, n) for s, n in zip(shape, x.shape, strict=True)):
        raise ValueError(f"a scale of shape {tuple(scale.shape)} must broadcast to the input {tuple(x.shape)} with "
                         f"size 1 along dim {dim} (one scale a row)")
    return scale.reshape(shape)


def row_scales(view: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The kernels' form of scale_view's ``view``: float32, contiguous, one a row in row order (the input's other
    dims in C order, as layout.row_problem numbers rows)."""
    rows = list(x.shape)
    rows[dim] = 1
    return view.expand(rows).reshape(-1).to(torch.float32).contiguous()


def kernel_scales(scale: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """A tensor of scales checked against ``x`` (scale_view) and in the kernels' form (row_scales)."""
    dim %= x.dim()
    return row_scales(scale_view(scale, x, dim), x, dim)


def dy_in_layout(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``dy`` with ``y``'s dtype and strides (a copy where it differs): the backward kernels read dy and y with
    one set of strides. A non-dense ``y`` may still give other strides; callers check."""
    if dy.dtype != y.dtype or dy.stride() != y.stride():
        return torch.empty_like(y).copy_(dy)
    return dy


def _cast_input(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Apply torch's dtype rules: complex never; integer/bool only with a floating ``dtype``."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
    if x.is_complex():
        raise TypeError(f"softmax is not defined for complex input (got {x.dtype})")
    if not x.is_floating_point():
        if dtype is None:
            raise TypeError(f"softmax needs a floating-point input, got {x.dtype}; pass dtype= to cast it first")
        return x.to(dtype)
    return x


# call signature -> (what starts it warm: the launch's ``direct`` where it has one, output dtype or None: x's,
# the prepared launch)
_prepared: dict[tuple, tuple] = {}
PREPARED_MAX = 4096  # forget everything past this many signatures (dynamic shapes)


def _signature(x: torch.Tensor, dim, dtype, impl, log, zero_masked) -> tuple:
    """What a warm call must match to reuse a prepared launch (device as an index: cheaper than x.device)."""
    return (x.shape, x.stride(), x.dtype, x.get_device(), dim, dtype, impl, log, zero_masked)


def _backward_signature(y: torch.Tensor, dim, impl, log) -> tuple:
    """What a warm backward must match (besides dy laid out as y, and its scales' signature for a tensor scale)."""
    return ("bwd", y.shape, y.stride(), y.dtype, y.get_device(), dim, impl, log)


def _scale_signature(scale: torch.Tensor) -> tuple:
    """What a warm call with a tensor of scales must also match: the scales' shape, strides, dtype and device."""
    return ("row_scale", scale.shape, scale.stride(), scale.dtype, scale.get_device())


def forward(x: torch.Tensor, dim: int, dtype: torch.dtype | None, impl: str, scale: float | torch.Tensor | None,
            log: bool, zero_masked: bool) -> torch.Tensor:
    """Softmax/log-softmax without autograd: the eager path (and the custom operator's body)."""
    per_row = type(scale) is torch.Tensor
    try:
        key = _signature(x, dim, dtype, impl, log, zero_masked)
        hit = _prepared.get(key + _scale_signature(scale) if per_row else key)
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: validate below
        hit = None
    if hit is not None:  # a warm call: same signature as an earlier one that ran our kernels in place
        start, out_dtype, prepared = hit
        y = torch.empty_like(x) if out_dtype is None else torch.empty_like(x, dtype=out_dtype)  # no dtype: cheaper
        try:
            if per_row:  # the scales checked again (their values may now ask for a gradient) and laid out one a row
                prepared(x, y, kernel_scales(scale, x, dim))
            else:
                start(x, y, 1.0 if scale is None else check_scale(scale))
        except RuntimeError:  # a torch.func wrapper (vmap) has no storage: its data_ptr raises before any launch
            if not functorch_active():
                raise
            return forward_cold(x, dim, dtype, impl, scale, log, zero_masked)
        return y
    return forward_cold(x, dim, dtype, impl, scale, log, zero_masked)


def functorch_active() -> bool:
    """A torch.func transform (vmap, grad, jacrev, ...) is running: its tensors are wrappers without storage, which
    our kernels cannot read and whose autograd they would not record."""
    return torch._C._are_functorch_transforms_active()


def _torch_forward(x, dim, out_dtype, scale, log, zero_masked) -> torch.Tensor:
    """The reference computation for what our kernels do not take (float64, CPU tensors, torch.func transforms);
    ``scale``: a float, or scale_view's tensor."""
    z = x * scale if isinstance(scale, torch.Tensor) or scale != 1.0 else x
    y = torch.log_softmax(z, dim, dtype=out_dtype) if log else torch.softmax(z, dim, dtype=out_dtype)
    if zero_masked:
        y = y.masked_fill((z == float("-inf")).all(dim, keepdim=True), 0.0)
    return _like_input(y, x, out_dtype)


def _like_input(r: torch.Tensor, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``r`` in the layout of ``torch.empty_like(x)`` (what every path of ours returns)."""
    out = torch.empty_like(x, dtype=out_dtype)
    if out.stride() == r.stride():
        return r
    return out.copy_(r)


def forward_cold(x, dim, dtype, impl, scale, log, zero_masked) -> torch.Tensor:
    """The first call of a signature: validate, choose, prepare (and remember) the launch."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax expects a torch.Tensor, got {type(x).__name__}")
    check_impl(impl)
    key = _signature(x, dim, dtype, impl, log, zero_masked)
    x, dim, s = _checked(x, dim, dtype, scale)
    out_dtype = dtype or x.dtype
    per_row = isinstance(s, torch.Tensor)
    if (x.dtype not in KERNEL_DTYPES or out_dtype not in KERNEL_DTYPES or x.dim() == 0 or x.numel() == 0
            or (x.device.type == "cpu" and not interpreter_active()) or functorch_active()):
        return _torch_forward(x, dim, out_dtype, s, log, zero_masked)
    flags = {"LOG": int(log), "ZERO_MASKED": int(zero_masked)}
    if per_row:  # one scale a row: the kernels' ROW_SCALE form
        flags["ROW_SCALE"] = 1
        key += _scale_signature(scale)
        s = row_scales(s, x, dim)
    y = torch.empty_like(x, dtype=out_dtype)
    # Remember the launch unless a cast happened (the key is the uncast input's) or the interpreter runs it (it
    # reads the environment on every call).
    remember = key if key[2] == x.dtype and x.device.type != "cpu" else None
    return _launch_rows(x, y, (), dim, impl, flags, False, s, remember, out_dtype)


def _checked(x: torch.Tensor, dim: int, dtype: torch.dtype | None, scale) -> tuple:
    """A forward's arguments checked: (x cast by torch's dtype rules, dim as a non-negative index, the scale as a
    float or scale_view's tensor)."""
    s = check_scale(scale)
    x = _cast_input(x, dtype)
    dim = normalize_dim(dim, x.dim())
    return x, dim, scale_view(s, x, dim) if isinstance(s, torch.Tensor) else s


def forward_torch(x, dim, dtype, scale, log, zero_masked) -> torch.Tensor:
    """forward_cold's checks, then torch operators whatever the device (a tensor scale under torch.compile)."""
    x, dim, s = _checked(x, dim, dtype, scale)
    return _torch_forward(x, dim, dtype or x.dtype, s, log, zero_masked)


def _launch_rows(a: torch.Tensor, out: torch.Tensor, rest: tuple, dim: int, impl: str, flags: dict, backward: bool,
                 scale: float | torch.Tensor, remember: tuple | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Run the chosen kernel over the rows along ``dim``: ``a`` (x, or the backward's dy) and ``rest``
    (the saved output) into ``out``; prepared launches of in-place layouts are kept under ``remember``.
    Layouts whose other dims do not collapse into two stride groups (or whose column stride passes
    32 bits) run on contiguous copies with ``dim`` last, written back into ``out``'s layout."""
    problem = layout.row_problem(a, out, dim)
    if problem is not None:
        prepared = prepare_launch(problem, a, out, impl, flags, backward)
        prepared(a, out, *rest, scale)
        _record_autotuned(prepared)
        if remember is not None:  # after the first launch, which gives a PreparedLaunch its direct start
            if len(_prepared) >= PREPARED_MAX:
                _prepared.clear()
            _prepared[remember] = (getattr(prepared, "direct", prepared), None if out_dtype == a.dtype else out_dtype,
                                   prepared)
        return out
    at, *rt = (t.movedim(dim, -1).contiguous() for t in (a, *rest))
    ot = torch.empty_like(at, dtype=out.dtype)
    prepared = prepare_launch(layout.row_problem(at, ot, at.dim() - 1), at, ot, impl, flags, backward)
    prepared(at, ot, *rt, scale)
    _record_autotuned(prepared)
    return out.copy_(ot.movedim(-1, dim))


def _record_autotuned(prepared) -> None:
    """The tuner's record of a launch that autotuned on its first call (tune.record_autotuned), imported only then:
    the package does not import the tuner, so ``python -m tritonsoftmax.tune`` runs a module not yet imported."""
    if getattr(prepared, "autotuned", False):
        from . import tune

        tune.record_autotuned(prepared)


def prepare_launch(problem: layout.RowProblem, x: torch.Tensor, y: torch.Tensor, impl: str, flags: dict,
             backward: bool):
    """The launch the dispatcher plans for ``problem`` (``x`` into ``y``) with ``impl`` and the kernels' ``flags``."""
    aligned = problem.rows_aligned(x.element_size(), y.element_size())
    dense = problem.rows_dense() and x.element_size() == y.element_size()
    p = dispatch.plan(impl, problem.M, problem.N, x.dtype, y.dtype, x.device, backward, aligned, dense,
                      bool(flags.get("ROW_SCALE")))
    return p.family.prepare(problem, p.config, p.device, p.from_store, flags, modes=p.modes)


def backward(dy: torch.Tensor, y: torch.Tensor, dim: int, impl: str, scale: float | torch.Tensor, log: bool,
             input_dtype: torch.dtype) -> torch.Tensor:
    """The input gradient of softmax/log_softmax from the incoming gradient and the saved output:
    scale * y * (dy - sum(dy * y)), or scale * (dy - exp(y) * sum(dy)) for log_softmax (``scale``: a float, or
    a tensor of one scale a row, as the forward took it)."""
    per_row = type(scale) is torch.Tensor
    if per_row or type(scale) is float:
        try:
            key = _backward_signature(y, dim, impl, log)
            stride = key[2]
            hit = _prepared.get(key + _scale_signature(scale) if per_row else key)
        except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: validate below
            hit = None
        if hit is not None:
            dy = dy_in_layout(dy, y)
        if hit is not None and dy.stride() == stride:
            # a warm call: the signature of an earlier one that ran our kernels on these strides
            dx = torch.empty_like(y)
            try:
                if per_row:  # the scales laid out one a row (checked again: their values may now want a gradient)
                    hit[2](dy, dx, y, kernel_scales(scale, y, dim))
                else:
                    hit[0](dy, dx, y, scale)
            except RuntimeError:  # a torch.func wrapper has no storage: its data_ptr raises before any launch
                if not functorch_active():
                    raise
                return _backward_cold(dy, y, dim, impl, scale, log, input_dtype)
            return dx if input_dtype == dx.dtype else dx.to(input_dtype)
    return _backward_cold(dy, y, dim, impl, scale, log, input_dtype)


def _backward_cold(dy, y, dim, impl, scale, log, input_dtype) -> torch.Tensor:
    """backward's first call of a signature (or one a warm launch cannot take): choose, prepare, remember."""
    key = _backward_signature(y, dim, impl, log)  # dim as the caller gave it
    dim = normalize_dim(dim, y.dim())
    per_row = isinstance(scale, torch.Tensor)
    if (y.dtype not in KERNEL_DTYPES or y.dim() == 0 or y.numel() == 0
            or (y.device.type == "cpu" and not interpreter_active()) or functorch_active()):
        return backward_torch(dy, y, dim, scale_view(scale, y, dim) if per_row else scale, log, input_dtype)
    dy = dy_in_layout(dy, y)
    dx = torch.empty_like(y)
    remember = key if y.device.type != "cpu" else None  # the interpreter reads the environment on every call
    if per_row:  # the kernels' ROW_SCALE form
        _launch_rows(dy, dx, (y,), dim, impl, {"LOG": int(log), "ROW_SCALE": 1}, True,
                     kernel_scales(scale, y, dim), remember + _scale_signature(scale)
                     if remember else None, y.dtype)
    else:
        _launch_rows(dy, dx, (y,), dim, impl, {"LOG": int(log)}, True, float(scale), remember, y.dtype)
    return dx if input_dtype == dx.dtype else dx.to(input_dtype)


def backward_torch(dy: torch.Tensor, y: torch.Tensor, dim: int, scale: float | torch.Tensor, log: bool,
                   input_dtype: torch.dtype) -> torch.Tensor:
    """backward's formula in torch operators (``scale``: a float or scale_view's tensor): what our kernels do not
    take, and a recorded backward with a tensor scale (autograd differentiates it again)."""
    dyf, yf = dy.to(y.dtype), y
    if log:
        dx = scale * (dyf - torch.exp(yf) * dyf.sum(dim, keepdim=True))
    else:
        dx = scale * yf * (dyf - (dyf * yf).sum(dim, keepdim=True))
    return _like_input(dx.to(input_dtype), y, input_dtype)


def prepared_entry(x: torch.Tensor, dim: int, dtype: torch.dtype | None, impl: str, log: bool,
                   zero_masked: bool):
    """The launch a warm forward of this signature starts (with no tensor of scales), None where none is kept."""
    return _kept_launch(_signature(x, dim, dtype, impl, log, zero_masked))


def prepared_backward_entry(y: torch.Tensor, dim: int, impl: str, log: bool):
    """The launch a warm backward of this signature starts (a float scale), None where none is kept."""
    return _kept_launch(_backward_signature(y, dim, impl, log))


def _kept_launch(key: tuple):
    """The prepared launch remembered under ``key`` (the last of its _prepared entry), or None."""
    hit = _prepared.get(key)
    return None if hit is None else hit[2]


def forget_prepared() -> None:
    """Forget every prepared launch (``tritonsoftmax.clear_caches`` also forgets decisions)."""
    _prepared.clear()
