"""Viewing a tensor as rows for a softmax over one dimension, without copying.

The kernels address row ``r`` (0 <= r < M) of length N as::

    base(r) = (r // inner) * stride_outer + (r % inner) * stride_inner      (64-bit)
    element j at base(r) + j * stride_col

With ``inner == 1`` that is a plain (M, N) matrix with a row stride (``inner`` equal to 1 is
specialised by Triton, so the division disappears). With ``inner > 1`` it covers a softmax over
a middle or leading dimension of a contiguous tensor — shape (outer, N, inner) — with no
transpose copy. Only layouts whose other dimensions do not collapse into two groups (rare
permutations) are copied to a contiguous tensor first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT32_MAX = 2**31 - 1


ALIGN_BYTES = 16  # the widest load/store a thread issues (ld.global.v4)


def whole_vectors(n: int, element_size: int) -> bool:
    """Whether ``n`` elements of ``element_size`` bytes fill whole ALIGN_BYTES vectors."""
    return (n * element_size) % ALIGN_BYTES == 0


@dataclass(frozen=True)
class RowStrides:
    """Element strides of one tensor seen as rows: outer-row, inner-row and column strides."""

    outer: int
    inner: int
    col: int


def offsets_fit_int32(M: int, inner: int, strides: RowStrides, rows: int, block_n: int) -> bool:
    """Whether the largest element offset that tiles of ``rows`` rows by ``block_n`` columns compute over M rows
    of one layout (the last tile's padded rows and the columns past N included: masked, but computed) fits in a
    signed 32-bit integer."""
    last = -(-M // rows) * rows - 1
    biggest = ((last // inner) * abs(strides.outer) + min(last, inner - 1) * abs(strides.inner)
               + (block_n - 1) * abs(strides.col))
    return biggest < 2**31


@dataclass(frozen=True)
class RowProblem:
    """M rows of N elements, ``inner`` rows per outer index, the strides of input and output, and the
    input's dtype (x's, or the backward's dy's)."""

    M: int
    N: int
    inner: int
    x: RowStrides
    y: RowStrides
    dtype: torch.dtype = torch.float32

    def rows_aligned(self, *element_sizes: int) -> bool:
        """Whether every row of input and output starts on a 16-byte boundary (given aligned base
        pointers) and runs along unit-stride columns: the layout in which loads are 16 bytes wide."""
        return all(t.col == 1 and (t.outer * size) % ALIGN_BYTES == 0 and (t.inner * size) % ALIGN_BYTES == 0
                   for t in (self.x, self.y) for size in element_sizes)

    def rows_dense(self) -> bool:
        """Whether input and output are both M contiguous rows of N, back to back (row r at r * N)."""
        return self.inner == 1 and all(t.col == 1 and t.outer == self.N for t in (self.x, self.y))

    def offsets_fit_int32(self, rows: int, block_n: int) -> bool:
        """Whether every element offset a tile of ``rows`` rows by ``block_n`` columns computes (padded rows
        past M and columns past N included) fits in a signed 32-bit integer, in input and output."""
        return all(offsets_fit_int32(self.M, self.inner, t, rows, block_n) for t in (self.x, self.y))

    def kernel_args(self) -> tuple[int, ...]:
        """The shape/stride arguments every kernel takes after its two pointers."""
        return (self.M, self.N, self.inner, self.x.outer, self.x.inner, self.x.col,
                self.y.outer, self.y.inner, self.y.col)


def _row_strides(t: torch.Tensor, dim: int, inner: int) -> RowStrides | None:
    """Strides of ``t`` as (outer, inner) rows x columns along ``dim``, if its layout allows."""
    sizes = [s for i, s in enumerate(t.shape) if i != dim]
    strides = [st for i, st in enumerate(t.stride()) if i != dim]
    # Collapse the non-softmax dims into groups of equal-stride runs (innermost first).
    groups: list[tuple[int, int]] = []  # (size, stride)
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if groups and groups[-1][1] * groups[-1][0] == stride:
            groups[-1] = (groups[-1][0] * size, groups[-1][1])
        else:
            groups.append((size, stride))
    col = t.stride(dim) if t.shape[dim] > 1 else 1
    if not groups:
        return RowStrides(0, 0, col)
    if len(groups) == 1:
        size, stride = groups[0]
        # One group: inner-row index runs over it, or (inner == 1) the outer index does.
        return RowStrides(stride, 0, col) if inner == 1 else (
            RowStrides(0, stride, col) if size == inner else None)
    if len(groups) == 2 and groups[0][0] == inner:
        return RowStrides(groups[1][1], groups[0][1], col)
    return None


def inner_rows(t: torch.Tensor, dim: int) -> int:
    """Product of the sizes after ``dim`` when those dims sit inside the softmax dim in memory."""
    inner = 1
    for i in range(dim + 1, t.dim()):
        inner *= t.shape[i]
    return inner


def row_problem(x: torch.Tensor, y: torch.Tensor, dim: int) -> RowProblem | None:
    """Describe softmax of ``x`` along ``dim`` into ``y`` as rows, or None if a copy is needed.

    ``x`` and ``y`` have the same shape. Tries inner == 1 (the other dims collapse to one row
    stride, e.g. the last dim or a sliced matrix) first, then the (outer, N, inner) split.
    """
    N = x.shape[dim]
    M = x.numel() // N
    for inner in (1, inner_rows(x, dim)):
        sx, sy = _row_strides(x, dim, inner), _row_strides(y, dim, inner)
        if sx is not None and sy is not None:
            # Column offsets are 32-bit in the kernels.
            if (N - 1) * max(sx.col, sy.col) > _INT32_MAX:
                return None
            return RowProblem(M, N, inner, sx, sy, x.dtype)
    return None


def matrix_problem(x2d: torch.Tensor, y2d: torch.Tensor) -> RowProblem:
    """The RowProblem of a 2-D input and output (softmax over dim 1), as the launchers take them."""
    if x2d.dim() != 2 or y2d.shape != x2d.shape:
        raise ValueError(f"launchers take a 2-D input and an output of the same shape, got "
                         f"{tuple(x2d.shape)} and {tuple(y2d.shape)}")
    problem = row_problem(x2d, y2d, 1)
    if problem is None:
        raise ValueError("column stride too large for 32-bit column offsets; pass a contiguous tensor")
    return problem
