"""The three textbook Triton softmax kernels, as benchmark lines beside ours: fused, tile and online, each at one
fixed size, with none of the package's modes (no tuning, no realignment, no vector widths, no eviction hints, no
several rows a program).

- fused: one program a row, the whole row in registers (BLOCK = the row's next power of two).
- tile: one program a row in fixed tiles, three walks (max; sum of exp(x - max); write), each walk starting on the
  tiles the walk before read last (forward, reverse, forward), so the first tiles it reads are still in cache.
- online: one program a row; one walk keeps a running max and sum per lane (a lane's sum rescaled when its max
  grows), the lanes are combined at the end, then a write walk last tile first.

Fixed sizes: 4 warps (Triton's default) and tiles of TEXTBOOK_TILE elements. The blog these kernels come from was
not readable where this module was written: its kernels' own constants may differ; the algorithms are the ones the
texts describe. Forward only, math in fp32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from tritonsoftmax.kernels.triton_launcher import COMPILE_OPTIONS

TEXTBOOK_WARPS = 4
TEXTBOOK_TILE = 1024
FUSED_MAX_N = 65536  # past this the whole row no longer fits one program's registers


@triton.jit
def textbook_fused_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    """Softmax of one row per program, the whole row in registers.

    x_ptr, y_ptr: input and output (rows of n_cols contiguous elements); x_row_stride, y_row_stride: elements
    between rows; BLOCK: a power of two >= n_cols.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    num = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * y_row_stride + cols, (num / tl.sum(num, 0)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def textbook_tile_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, TILE: tl.constexpr):
    """Softmax of one row per program in tiles of TILE elements, three walks: the row's max (first tile first),
    the sum of exp(x - max) (last tile first), the write (first tile first).

    x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols: as in textbook_fused_kernel; TILE: tile width (a power of two).
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, TILE)
    n_tiles = tl.cdiv(n_cols, TILE)
    m = tl.full([TILE], -float("inf"), tl.float32)
    for t in range(0, n_tiles):
        offs = t * TILE + cols
        m = tl.maximum(m, tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32))
    row_max = tl.max(m, 0)
    s = tl.zeros([TILE], tl.float32)
    for t in range(0, n_tiles):
        offs = (n_tiles - 1 - t) * TILE + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        s += tl.exp(x - row_max)
    denom = tl.sum(s, 0)
    for t in range(0, n_tiles):
        offs = t * TILE + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        tl.store(y_row + offs, (tl.exp(x - row_max) / denom).to(y_ptr.dtype.element_ty), mask=offs < n_cols)


@triton.jit
def textbook_online_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, TILE: tl.constexpr):
    """Softmax of one row per program: one walk with a running max m and sum s per lane (s rescaled by
    exp(m_old - m_new) when a lane's max grows), the lanes combined (sum of s * exp(m - max)), then the write walk,
    last tile first. A lane that has seen only -inf (past the row's end) holds s = 0.

    x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, TILE: as in textbook_tile_kernel.
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, TILE)
    n_tiles = tl.cdiv(n_cols, TILE)
    m = tl.full([TILE], -float("inf"), tl.float32)
    s = tl.zeros([TILE], tl.float32)
    for t in range(0, n_tiles):
        offs = t * TILE + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        empty = m_new == -float("inf")
        s = tl.where(empty, 0.0, s * tl.exp(m - m_new) + tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, 0)
    denom = tl.sum(tl.where(m == -float("inf"), 0.0, s * tl.exp(m - row_max)), 0)
    for t in range(0, n_tiles):
        offs = (n_tiles - 1 - t) * TILE + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        tl.store(y_row + offs, (tl.exp(x - row_max) / denom).to(y_ptr.dtype.element_ty), mask=offs < n_cols)


KERNELS = {"fused": textbook_fused_kernel, "tile": textbook_tile_kernel, "online": textbook_online_kernel}


def textbook(kind: str, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A callable computing softmax(x, -1) with the textbook ``kind`` ("fused", "tile" or "online"); ``x``: 2-D
    with contiguous rows. A ValueError for what the kernel cannot take (fused past FUSED_MAX_N elements a row)."""
    if kind not in KERNELS:
        raise ValueError(f"unknown textbook kernel {kind!r}; choose from {', '.join(KERNELS)}")
    if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError("the textbook kernels take 2-D inputs with contiguous rows")
    M, N = x.shape
    if kind == "fused" and N > FUSED_MAX_N:
        raise ValueError(f"the textbook fused kernel holds the whole row in registers (N > {FUSED_MAX_N})")
    size = {"BLOCK": triton.next_power_of_2(N)} if kind == "fused" else {"TILE": TEXTBOOK_TILE}
    kernel = KERNELS[kind]

    def run() -> torch.Tensor:
        y = torch.empty_like(x)
        kernel[(M,)](x, y, x.stride(0), y.stride(0), N, num_warps=TEXTBOOK_WARPS, **size, **COMPILE_OPTIONS)
        return y

    return run
