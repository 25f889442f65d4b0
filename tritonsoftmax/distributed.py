"""Softmax, log_softmax and cross-entropy over a dimension split across the ranks of a process group
(vocabulary-parallel logits): each rank holds a slice of every row; the result is this rank's slice.

    import tritonsoftmax.distributed as tsd
    y = tsd.softmax(local_logits, dim=-1, group=tp_group)
    loss = tsd.cross_entropy(local_logits, target, group=tp_group)   # target: indices into the whole vocabulary

One pass over the slice for the per-row (max, sum-of-exp) pair, **one** collective (an all-gather of the pairs,
combined on every rank: the same combine the split family does between its chunks), one pass to write. The
backward needs one all-reduce of a per-row sum. Slices may differ in width (a slice of width 0 is fine).

softmax and log_softmax run the split family's two kernels where our kernels take the slice (fp32/fp16/bf16 on a
GPU, or on the CPU under the Triton interpreter): its first pass writes each chunk's (max, sum) partial, one small
kernel combines a row's chunks into this rank's table, the collective gathers the ranks' tables, another small
kernel combines them into the whole row's pair, and the second pass writes the slice from it (given as the row's
first partial, the others empty); the backward likewise with its partial sums. cross_entropy runs the same first
pass; its table also carries the target's logit (where the target is in this slice) and the row sum, so the one
all-gather brings everything the loss needs, and one kernel gives each row's log-sum-exp and loss. Its gradient g *
(softmax - smoothing / V - (1 - smoothing) * onehot) is the second pass writing g * softmax (the row's pair given as
(lse, 1 / g), from one small kernel) in fp32, then the smoothing and the target's column in place. The small
kernels (kernels/vocab_parallel.py) each stand for a dozen torch operators: at small slices the host's time per
operator, not the GPU, sets the pace. Elsewhere (float64, CPU tensors without the interpreter, inside
``torch.compile``) the passes are torch operators, fp32 math. The collectives are ``torch.distributed``'s, on whatever
backend the group runs (NCCL, RCCL, gloo). Under ``torch.compile`` each function is one graph, collectives
included (tested with aot_eager and inductor over gloo). Nothing waits on the host, so the functions capture in a
CUDA graph (tested over NCCL with one GPU, where a group of one has no collective to capture).
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


def _gathered_stats(launch, a: torch.Tensor, out: torch.Tensor, extra: tuple, group,
                    pick: tuple | None = None) -> torch.Tensor:
    """Every rank's per-row statistics table (world, K, M) (kernels/vocab_parallel.py: (max, sum), and with
    ``pick`` cross-entropy's target logit and row sum) from ``launch``'s first pass over this rank's slice: the
    slice's chunks combined by one small kernel, the ranks' tables by the one all-gather."""
    from .kernels import vocab_parallel

    M = launch.problem.M
    parts = launch.partials(a, out, *extra)
    table = torch.empty(2 if pick is None else 4, M, device=a.device, dtype=torch.float32)
    return _all_gather(vocab_parallel.local_stats(parts, M, launch.chunks_per_row, table, pick), group)


def _kernel_forward(x, dim, group, out_dtype, scale, log):
    """The forward on the split family's kernels, or None where they do not run (see _split_launch)."""
    if not _kernels_take(x, out_dtype):  # before allocating an output the torch path would not use
        return None
    y = torch.empty_like(x, dtype=out_dtype)
    launch = _split_launch(x, y, dim, {"LOG": int(log), "ZERO_MASKED": 0, "PDL": 0}, False)
    if launch is None:
        return None
    from .kernels import vocab_parallel

    extra = (1.0 if scale is None else float(scale),)
    gathered = _gathered_stats(launch, x, y, extra, group)
    launch.write(x, y, vocab_parallel.whole_pairs(gathered, launch.problem.M, launch.chunks_per_row), *extra)
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
    """Where this rank's slice starts and the vocabulary's size stay tensors (the ranks' widths, all-gathered), and
    the target's column is picked under a mask (no data-dependent shapes): torch.compile captures it whole."""

    @staticmethod
    def forward(ctx, logits, target, group, ignore_index, reduction, smoothing):
        # the width as a fill on the device (no copy from host memory)
        widths = _all_gather(torch.full((1,), logits.shape[1], device=logits.device, dtype=torch.int64),
                             group).flatten()
        rank = dist.get_rank(group)
        # the statistics pass: the split family's first pass over the logits (it writes no output: the logits stand
        # in for it), then small kernels around the one all-gather; else torch operators in fp32
        launch = _split_launch(logits, logits, 1, {"LOG": 0, "ZERO_MASKED": 0, "PDL": 0}, False)
        run = _ce_forward_torch if launch is None else _ce_forward_kernels
        lse, loss, count, outside = run(launch, logits, target, widths, rank, group, ignore_index, smoothing)
        # a target outside the vocabulary would pick no logit on any rank: an error, as in F.cross_entropy (checked
        # on the device, without a host synchronisation)
        torch._assert_async(outside == 0, "cross_entropy: a target is outside the vocabulary (and is not ignore_index)")
        ctx.save_for_backward(logits, target, lse, count, widths)
        ctx.rank, ctx.ignore_index, ctx.smoothing, ctx.reduction = rank, ignore_index, smoothing, reduction
        if reduction != "none":
            loss = loss.sum() / count if reduction == "mean" else loss.sum()
        # converted only where the dtype differs: under torch.compile (torch 2.11) a Function whose output is the
        # no-op .to of an intermediate gets a backward traced with a zero gradient
        return loss if loss.dtype == logits.dtype else loss.to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        logits, target, lse, count, widths = ctx.saved_tensors
        dz = torch.empty_like(logits, dtype=torch.float32)
        launch = _split_launch(logits, dz, 1, {"LOG": 0, "ZERO_MASKED": 0, "PDL": 0}, False)
        run = _ce_backward_torch if launch is None else _ce_backward_kernels
        run(launch, grad, dz, logits, target, lse, count if ctx.reduction == "mean" else None, widths, ctx.rank,
            ctx.ignore_index, ctx.smoothing)
        return dz.to(logits.dtype), None, None, None, None, None


def _ce_forward_kernels(launch, logits, target, widths, rank, group, ignore_index, smoothing) -> tuple:
    """(lse, loss a row, rows counted, targets outside the vocabulary) on our kernels: the split stats pass, one
    kernel for this slice's table (with the target's logit where it is here), the one all-gather, one kernel for
    the rows' lse and loss."""
    from .kernels import vocab_parallel

    row_sums = logits.sum(1, dtype=torch.float32) if smoothing else None
    gathered = _gathered_stats(launch, logits, logits, (1.0,), group,
                               (logits, target, widths, rank, ignore_index, row_sums))
    lse, loss, sums = vocab_parallel.ce_finish(gathered, target, widths, ignore_index, smoothing)
    return lse, loss, sums[1], sums[2]


def _ce_forward_torch(launch, logits, target, widths, rank, group, ignore_index, smoothing) -> tuple:
    """_ce_forward_kernels's results in torch operators, fp32, with the same one all-gather of the same (4, rows)
    table (a rank whose slice is empty runs here while the others run the kernels: the collectives must match)."""
    width = logits.shape[1]
    start, vocab = widths[:rank].sum(), widths.sum()
    m, s = _stats(logits.float(), 1)
    valid = target != ignore_index
    picked = torch.zeros_like(m.squeeze(1))
    if width:  # the target's logit, where its column is on this rank
        local = valid & (target >= start) & (target < start + width)
        column = (target - start).clamp(0, width - 1)
        picked = torch.where(local, logits.gather(1, column[:, None]).squeeze(1).float(), picked)
    row_sum = logits.sum(1, dtype=torch.float32) if smoothing else torch.zeros_like(picked)
    gathered = _all_gather(torch.stack([m.squeeze(1), s.squeeze(1), picked, row_sum]), group)
    ms, ss = gathered[:, 0], gathered[:, 1]
    top = ms.amax(0)
    lse = _shift(top) + torch.log((ss * torch.exp(ms - _shift(top))).sum(0))
    picked, row_sum = gathered[:, 2].sum(0), gathered[:, 3].sum(0)
    loss = (1.0 - smoothing) * (lse - picked) + smoothing * (lse - row_sum / vocab.float())
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    outside = (valid & ((target < 0) | (target >= vocab))).sum()
    return lse, loss, valid.sum().float(), outside


def _ce_backward_kernels(launch, grad, dz, logits, target, lse, count, widths, rank, ignore_index, smoothing) -> None:
    """g * (softmax - smoothing / V - (1 - smoothing) * onehot) into ``dz`` (float32) on our kernels: one kernel for
    the rows' weights g and the write pass's workspace, the split write pass giving g * softmax (the row's pair
    given as (lse, 1 / g)), then the target's column."""
    from .kernels import vocab_parallel

    ws, g = vocab_parallel.ce_grad_pairs(grad, count, lse, target, ignore_index, launch.chunks_per_row)
    launch.write(logits, dz, ws, 1.0)
    if smoothing:
        dz -= (g * smoothing / widths.sum())[:, None]
    vocab_parallel.ce_target(dz, g, target, widths, rank, ignore_index, -(1.0 - smoothing))


def _ce_backward_torch(launch, grad, dz, logits, target, lse, count, widths, rank, ignore_index, smoothing) -> None:
    """_ce_backward_kernels's gradient in torch operators: the softmax in the one fp32 copy of the logits."""
    width = logits.shape[1]
    start = widths[:rank].sum()
    valid = target != ignore_index
    g = grad.float()
    g = (g / count if count is not None else g).expand(lse.shape)
    g = torch.where(valid, g, torch.zeros_like(g))
    dz.copy_(logits).sub_(lse[:, None]).exp_()
    dz -= smoothing / widths.sum()
    dz *= g[:, None]
    if width:  # - (1 - smoothing) * g at the target's column, where it is on this rank
        local = valid & (target >= start) & (target < start + width)
        column = (target - start).clamp(0, width - 1)
        onehot = torch.where(local, g * -(1.0 - smoothing), torch.zeros_like(g))
        dz.scatter_add_(1, column[:, None], onehot[:, None])


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
