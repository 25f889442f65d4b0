"""Softmax, log_softmax and cross-entropy over a dimension split across the ranks of a process group
(vocabulary-parallel logits): each rank holds a slice of every row; the result is this rank's slice.

    import tritonsoftmax.distributed as tsd
    y = tsd.softmax(local_logits, dim=-1, group=tp_group)
    loss = tsd.cross_entropy(local_logits, target, group=tp_group)   # target: indices into the whole vocabulary

One pass over the slice for the per-row (max, sum-of-exp) pair, **one** collective (an all-gather of the pairs,
combined on every rank: the same combine the split family does between its chunks), one pass to write. The
backward needs one all-reduce of a per-row sum. Slices may differ in width (a slice of width 0 is fine).

softmax and log_softmax run the split family's two kernels where our kernels take the slice (fp32/fp16/bf16 on a
GPU, or on the CPU under the Triton interpreter): its first pass writes each chunk's (max, sum) partial, those are
combined per row here and across ranks by the collective, and its second pass writes the slice from the whole
row's pair (given as the row's first partial, the others empty); the backward likewise with its partial sums.
cross_entropy runs the same first pass for its log-sum-exp, and its gradient g * (softmax - smoothing / V - (1 -
smoothing) * onehot) as the second pass writing g * softmax (the row's pair given as (lse, 1 / g)) in fp32, then the
smoothing and the target's column in place. Elsewhere (float64, CPU tensors without the interpreter, inside
``torch.compile``) the passes are torch operators, fp32 math. The collectives are ``torch.distributed``'s, on whatever
backend the group runs (NCCL, RCCL, gloo). Under ``torch.compile`` each function is one graph, collectives
included (tested with aot_eager and inductor over gloo); CUDA graphs are not checked yet.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import execute, layout
from .device import interpreter_active
from .layout import ALIGN_BYTES

__all__ = ["softmax", "log_softmax", "cross_entropy"]


def _stats(z: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This slice's per-row max and sum of exp(z - max) (keepdim): (-inf, 0) for a row that is all -inf here."""
    if z.shape[dim] == 0:
        shape = list(z.shape)
        shape[dim] = 1
        return z.new_full(shape, float("-inf")), z.new_zeros(shape)
    m = z.amax(dim, keepdim=True)
    return m, torch.exp(z - _shift(m)).sum(dim, keepdim=True)


def _combine(m: torch.Tensor, s: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole row's (max, sum of exp(z - max)) from every rank's pair: one all-gather, combined locally."""
    gathered = _all_gather(torch.stack([m, s]).contiguous(), group)
    ms, ss = gathered[:, 0], gathered[:, 1]
    top = ms.amax(0)
    return top, (ss * torch.exp(ms - _shift(top))).sum(0)


def _all_gather(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``t`` (one shape on all ranks), stacked in rank order."""
    world = dist.get_world_size(group)
    if world == 1:  # a group of one has nothing to exchange
        return t.unsqueeze(0)
    out = t.new_empty((world * t.shape[0], *t.shape[1:]))  # the ranks' tensors back to back along dim 0
    dist.all_gather_into_tensor(out, t, group=group)
    return out.view(world, *t.shape)


def _all_reduce(t: torch.Tensor, group) -> None:
    """Sum ``t`` over the group's ranks, in place (nothing to do in a group of one)."""
    if dist.get_world_size(group) > 1:
        dist.all_reduce(t, group=group)


def _shift(top: torch.Tensor) -> torch.Tensor:
    """A row maximum to subtract: 0 where the row (or slice) is all -inf, so that exp gives 0, not NaN."""
    return torch.where(torch.isneginf(top), torch.zeros_like(top), top)


def _scaled(x: torch.Tensor, scale: float | None) -> torch.Tensor:
    z = x.float()
    return z if scale is None or scale == 1.0 else z * float(scale)


def _split_launch(a: torch.Tensor, out: torch.Tensor, dim: int, flags: dict, backward: bool):
    """The split family's launch over ``a``'s rows along ``dim`` into ``out``, or None where torch operators
    compute the passes (what our kernels do not take, a layout whose rows do not collapse, torch.compile). ``flags``
    take PDL 0: the second pass follows the combine and the collective, not the first pass, so it gains nothing
    from starting early."""
    if not _kernels_take(a, out.dtype):
        return None
    # kept for later calls of the same signature (a launch takes its tensors at each call): preparing one costs
    # more host time than a small slice's kernels take
    key = (a.shape, a.stride(), out.stride(), a.dtype, out.dtype, a.device, dim, tuple(flags.items()), backward,
           a.data_ptr() % ALIGN_BYTES == 0, out.data_ptr() % ALIGN_BYTES == 0)
    if key in _launches:
        return _launches[key]
    problem = layout.row_problem(a, out, dim)
    launch = None if problem is None else execute.prepare_launch(problem, a, out, "split", flags, backward)
    if len(_launches) >= _LAUNCHES_MAX:
        _launches.clear()
    _launches[key] = launch
    return launch


_LAUNCHES_MAX = 256
_launches: dict[tuple, object] = {}


def forget_launches() -> None:
    """Forget the kept launches (``tritonsoftmax.clear_caches`` calls this once the module is loaded)."""
    _launches.clear()


def _kernels_take(a: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether our kernels run a pass over ``a`` writing ``out_dtype`` (else torch operators do)."""
    return not (torch.compiler.is_compiling() or a.dtype not in execute.KERNEL_DTYPES
                or out_dtype not in execute.KERNEL_DTYPES or a.numel() == 0
                or (a.device.type == "cpu" and not interpreter_active()))


def _row_pair(launch, a: torch.Tensor, out: torch.Tensor, extra: tuple, group) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole row's (max, sum of exp(z - max)), shape (rows, 1), from ``launch``'s first pass over this rank's
    slice: the slice's chunks combined here, the ranks' pairs by the one all-gather."""
    pairs = launch.partials(a, out, *extra).view(-1, launch.chunks_per_row, 2)
    m, part = pairs[..., 0], pairs[..., 1]
    local = m.amax(1, keepdim=True)
    return _combine(local, (part * torch.exp(m - _shift(local))).sum(1, keepdim=True), group)


def _write_from_pair(launch, a: torch.Tensor, out: torch.Tensor, top: torch.Tensor, total: torch.Tensor,
                     extra: tuple) -> None:
    """``launch``'s second pass over the slice given the whole row's pair (top, total), shape (rows, 1): the pair is
    each row's first partial, the others empty (max -inf, sum 0), so the kernel's combine returns it as it is."""
    whole = torch.zeros(top.shape[0], launch.chunks_per_row, 2, device=top.device, dtype=torch.float32)
    whole[..., 0] = float("-inf")
    whole[:, :1, 0], whole[:, :1, 1] = top, total
    launch.write(a, out, whole.view(-1), *extra)


def _kernel_forward(x, dim, group, out_dtype, scale, log):
    """The forward on the split family's kernels, or None where they do not run (see _split_launch)."""
    if not _kernels_take(x, out_dtype):  # before allocating an output the torch path would not use
        return None
    y = torch.empty_like(x, dtype=out_dtype)
    launch = _split_launch(x, y, dim, {"LOG": int(log), "ZERO_MASKED": 0, "PDL": 0}, False)
    if launch is None:
        return None
    extra = (1.0 if scale is None else float(scale),)
    _write_from_pair(launch, x, y, *_row_pair(launch, x, y, extra, group), extra)
    return y


def _kernel_backward(dy, y, dim, group, scale, log):
    """The backward on the split family's kernels (dx in y's dtype), or None where they do not run."""
    if not _kernels_take(y, y.dtype):
        return None
    dy = execute.dy_in_layout(dy, y)
    if dy.stride() != y.stride():  # y is not dense: torch operators
        return None
    dx = torch.empty_like(y)
    launch = _split_launch(dy, dx, dim, {"LOG": int(log), "PDL": 0}, True)
    if launch is None:
        return None
    s = 1.0 if scale is None else float(scale)
    parts = launch.partials(dy, dx, y, s).view(-1, launch.chunks_per_row)
    total = parts.sum(1)
    _all_reduce(total, group)  # the one collective of the backward: a per-row sum over the whole row
    whole = torch.zeros_like(parts)
    whole[:, 0] = total
    launch.write(dy, dx, whole.view(-1), y, s)
    return dx


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, out_dtype, scale, log):
        ctx.dim, ctx.group, ctx.scale, ctx.log, ctx.in_dtype = dim, group, scale, log, x.dtype
        y = _kernel_forward(x, dim, group, out_dtype, scale, log)
        if y is not None:
            ctx.save_for_backward(y)
            return y
        z = _scaled(x, scale)
        top, total = _combine(*_stats(z, dim), group)
        if log:
            y = z - _shift(top) - torch.log(total)
        else:
            y = torch.exp(z - _shift(top)) / total
        ctx.save_for_backward(y)
        return y if y.dtype == out_dtype else y.to(out_dtype)  # see _CrossEntropy.forward's return

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = _kernel_backward(dy, y, ctx.dim, ctx.group, ctx.scale, ctx.log)
        if dx is not None:
            return dx.to(ctx.in_dtype), None, None, None, None, None
        g = dy.float()
        yf = y.float()
        # the one collective of the backward: a per-row sum over the whole row
        part = g.sum(ctx.dim, keepdim=True) if ctx.log else (g * yf).sum(ctx.dim, keepdim=True)
        _all_reduce(part, ctx.group)
        dz = g - torch.exp(yf) * part if ctx.log else yf * (g - part)
        if ctx.scale is not None and ctx.scale != 1.0:
            dz = dz * float(ctx.scale)
        return dz.to(ctx.in_dtype), None, None, None, None, None


def _check(x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"expected a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0:
        raise ValueError("a 0-dim tensor has no dimension to split across ranks")
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"dim {dim} out of range for a {x.dim()}-dim tensor")
    return dim % x.dim()


def softmax(x: torch.Tensor, dim: int = -1, *, group=None, dtype: torch.dtype | None = None,
            scale: float | None = None) -> torch.Tensor:
    """This rank's slice of softmax(x_whole * scale) along ``dim``, where ``x`` is this rank's slice of x_whole
    (the ranks' slices, in rank order, make the whole dimension). ``dtype``: the output's (default x's)."""
    dim = _check(x, dim)
    return _Softmax.apply(x, dim, group, dtype or x.dtype, scale, False)


def log_softmax(x: torch.Tensor, dim: int = -1, *, group=None, dtype: torch.dtype | None = None,
                scale: float | None = None) -> torch.Tensor:
    """This rank's slice of log_softmax(x_whole * scale) along ``dim`` (see :func:`softmax`)."""
    dim = _check(x, dim)
    return _Softmax.apply(x, dim, group, dtype or x.dtype, scale, True)


class _CrossEntropy(torch.autograd.Function):
    """Where this rank's slice starts and the vocabulary's size stay tensors, and the target's column is picked with
    a gather and corrected with a scatter under a mask (no data-dependent shapes): torch.compile captures it whole."""

    @staticmethod
    def forward(ctx, logits, target, group, ignore_index, reduction, smoothing):
        width = logits.shape[1]
        # the width as a fill on the device (no copy from host memory)
        widths = _all_gather(torch.full((1,), width, device=logits.device, dtype=torch.int64), group).flatten()
        start, vocab = widths[:dist.get_rank(group)].sum(), widths.sum().float()
        # the statistics pass: the split family's first pass over the logits (it writes no output: the logits stand
        # in for it), else torch operators in fp32
        launch = _split_launch(logits, logits, 1, {"LOG": 0, "ZERO_MASKED": 0, "PDL": 0}, False)
        if launch is not None:
            top, total = _row_pair(launch, logits, logits, (1.0,), group)
        else:
            top, total = _combine(*_stats(logits.float(), 1), group)
        lse = (_shift(top) + torch.log(total)).squeeze(1)
        valid = target != ignore_index
        # a target outside the vocabulary would pick no logit on any rank: an error, as in F.cross_entropy (checked
        # on the device, without a host synchronisation)
        torch._assert_async((~valid | ((target >= 0) & (target < widths.sum()))).all(),
                            "cross_entropy: a target is outside the vocabulary (and is not ignore_index)")
        local = valid & (target >= start) & (target < start + width)  # the target's column is on this rank
        column = (target - start).clamp(0, max(width - 1, 0))
        picked = torch.zeros_like(lse)
        if width:
            picked = torch.where(local, logits.gather(1, column[:, None]).squeeze(1).float(), picked)
        row_sum = logits.sum(1, dtype=torch.float32) if smoothing else torch.zeros_like(lse)
        sums = torch.stack([picked, row_sum])  # the target's logit (on its rank) and the row's sum, over the row
        _all_reduce(sums, group)
        loss = (1.0 - smoothing) * (lse - sums[0]) + smoothing * (lse - sums[1] / vocab)
        loss = torch.where(valid, loss, torch.zeros_like(loss))
        count = valid.sum()
        ctx.save_for_backward(logits, lse, valid, count, local, column, vocab)
        ctx.smoothing, ctx.reduction = smoothing, reduction
        if reduction != "none":
            loss = loss.sum() / count if reduction == "mean" else loss.sum()
        # converted only where the dtype differs: under torch.compile (torch 2.11) a Function whose output is the
        # no-op .to of an intermediate gets a backward traced with a zero gradient
        return loss if loss.dtype == logits.dtype else loss.to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        logits, lse, valid, count, local, column, vocab = ctx.saved_tensors
        smoothing = ctx.smoothing
        g = grad.float()
        if ctx.reduction == "mean":
            g = (g / count).expand(lse.shape)
        elif ctx.reduction == "sum":
            g = g.expand(lse.shape)
        g = torch.where(valid, g, torch.zeros_like(g))
        dz = torch.empty_like(logits, dtype=torch.float32)
        launch = _split_launch(logits, dz, 1, {"LOG": 0, "ZERO_MASKED": 0, "PDL": 0}, False)
        if launch is not None:
            # g * softmax in the split family's write pass: the row's pair given as (lse, 1 / g), so that
            # exp(z - lse) / (1 / g) = g * p (a row of g = 0 gets 1 / 0 = inf, and 0)
            _write_from_pair(launch, logits, dz, lse[:, None], (1.0 / g)[:, None], (1.0,))
            if smoothing:
                dz -= (g * smoothing / vocab)[:, None]
        else:  # the softmax in torch operators, in the one fp32 copy of the logits that becomes the gradient
            dz.copy_(logits).sub_(lse[:, None]).exp_()
            dz -= smoothing / vocab
            dz *= g[:, None]
        if logits.shape[1]:  # - (1 - smoothing) * g at the target's column, where it is on this rank
            onehot = torch.where(local, g * -(1.0 - smoothing), torch.zeros_like(g))
            dz.scatter_add_(1, column[:, None], onehot[:, None])
        return dz.to(logits.dtype), None, None, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, group=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy`` of the whole logits, from this rank's vocabulary slice: ``logits`` (rows, this rank's
    columns), ``target`` (rows,) indices into the whole vocabulary (ranks' slices in rank order). The logits are
    never gathered; the gradient is this rank's slice."""
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"expected logits (rows, columns) and target (rows,), got {tuple(logits.shape)} and "
                         f"{tuple(target.shape)}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    return _CrossEntropy.apply(logits, target, group, ignore_index, reduction, float(label_smoothing))
