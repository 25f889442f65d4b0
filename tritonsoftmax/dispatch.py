"""Which kernel family runs a softmax of M rows of N elements, and with which config.

The decision reads top to bottom; the first rule whose condition holds wins. Thresholds are
named constants here and nowhere else. A decision is made once per (impl, M, N, dtypes,
device) and cached, so a warm call costs one dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from . import tuning
from .config import LaunchConfig, n_bucket, next_power_of_2, save_tuning_enabled
from .device import DeviceInfo, device_info
from .kernels import (
    ALL_FAMILY_NAMES,
    SMEM_MIN_SM,
    backward_family,
    coop,
    exchange,
    family,
    gluon_available,
    smem_launch,
)
from .kernels.constexprs import row_tail
from .kernels.coop import COOP_CHUNK
from .kernels.sizing import chunks, heuristic_warps
from .layout import ALIGN_BYTES, whole_vectors

IMPLS = ("auto",) + ALL_FAMILY_NAMES

# A fused row lives in registers (fp32, whatever the input dtype). Leaving room for this many
# programs per SM keeps enough loads in flight; with 64K registers per SM it allows rows up to
# 16384 elements.
FUSED_PROGRAMS_PER_SM = 4
# A forward over many rows still gains from one program per row at half that (one 16-warp program an SM
# holding 32K fp32 values): the row is read once, with no exchange. The backward holds two rows: two 16-bit
# rows are one fp32 row's bytes; two fp32 rows are too many, and coop reads those once instead.
FUSED_MANY_ROWS_PROGRAMS_PER_SM = 2
# Fewer rows than this many per SM leave most of the GPU idle with one program per row: spread
# each row over many programs instead.
FEW_ROWS_PER_SM = 2
# The coop family keeps a row's chunks in registers while the row's programs wait for each other.
# Few rows go to it when all their programs fit on the GPU at once (COOP_RESIDENT_PER_SM programs
# of up to COOP_CHUNK elements per SM), and in fp32 or the backward whenever a row is read once: one
# launch and one read beat split's two launches and second read. A 16-bit forward chunk holds half the
# bytes for the same wait, and split's two launches win there. Many long rows go to coop in every dtype,
# forward and backward, except 16-bit forward rows of up to 64K (ONLINE_16BIT_MAX_N). CUDA only: the
# cooperative kernel has never run on AMD. COOP_CHUNK is coop's widest chunk (kernels/coop.py).
# "All on chip at once" counts what is really resident: the coop forward program (4 warps, one
# COOP_CHUNK chunk) compiles to 89-96 registers a thread on sm_90, so 5 fit an SM.
COOP_RESIDENT_PER_SM = 5
# Many 16-bit rows of up to 64K elements (forward) run faster through online than through coop:
# online's second read, marked evict_last by its first, mostly comes from L2, and coop's 16-bit
# chunks keep too few bytes in flight while they wait.
ONLINE_16BIT_MAX_N = 65536
# Rows that start off a 16-byte boundary run each family's realigned path (kernels/row_ops.row_window).
# The realigned fused kernel keeps its aligned speed up to 16K, but in the 32K bucket 16-bit rows run
# faster through realigned online (fp32 stays fused). Rows just past 16K that fused holds as half a block
# plus a tail (fused_held) stay fused, and dense rows (input and output contiguous, one element size) go
# to smem's odd-row form (smem_one_chunk_rows), its chunks cut so that the row's lead adds none.
OFF_ALIGN_ONLINE_BUCKET = 32768
# Many rows longer than this go to the smem family (coop's launch, each chunk held in shared memory
# in the input dtype) when their layout lets it copy 16-byte vectors (smem_takes): each element is
# read once, and 16-bit data stays 16-bit on chip, so a chunk takes half coop's on-chip bytes.
SMEM_MIN_N = 32768
# Few 16-bit rows (forward) go to smem too once there are more elements than coop holds at once
# (coop_holds_all): there split reads each element twice, and smem reads it once. Under that size coop's
# register chunks stay ahead. The 16-bit backward of rows longer than SMEM_MIN_N goes to smem too, few
# rows or many (dy and y chunks held in shared memory in their dtype, against coop's fp32 registers).
# Rows in the SMEM_FP32_MIN_N bucket or longer: the fp32 backward goes to smem, few rows or many, unless
# coop holds every program at once and reads each element once (coop_holds_all and not coop_rereads):
# coop's resident launch waits for no tickets, and for shorter rows its register chunks are level with
# smem's. Few fp32 rows of this bucket up to SMEM_FP32_FEW_ROWS_MAX_N go to smem in the forward too once
# they hold more than SMEM_FP32_FEW_ROWS_BEYOND times what coop holds at once: coop then runs ticketed in
# waves and split reads twice. Rows of the 4M bucket (one 128 KB chunk an SM) stay with split.
SMEM_FP32_MIN_N = 524288
SMEM_FP32_FEW_ROWS_BEYOND = 2
SMEM_FP32_FEW_ROWS_MAX_N = 2097152
# Few fp32 rows of the SMEM_FP32_CLUSTER_MIN_N to MAX_N buckets that hold more than coop does at once
# (coop then runs ticketed, in waves) go to smem in the forward, each row SMEM_FP32_CLUSTER_CHUNKS chunks
# (fewer where 1024-element copy groups cover it in fewer) in one CTA cluster of 4-warp programs
# (smem_fp32_cluster_config): the row's exchange stays in the cluster's shared memory and no program waits
# for a ticket. Where coop holds the rows at once it stays. The backward takes the same chunks for dy and y
# where they come to at most SMEM_FP32_CLUSTER_BWD_MAX_CHUNK elements (two 40 KB chunks a program; larger
# ones leave one program an SM). The backward of many such rows goes to smem-bwd in cluster mode too
# (coop-bwd would run them ticketed), in chunks of SMEM_FP32_MANY_ROWS_BWD_CHUNK elements, or in
# SMEM_FP32_CLUSTER_CHUNKS where that takes more.
SMEM_FP32_MANY_ROWS_BWD_CHUNK = 8192
SMEM_FP32_CLUSTER_MIN_N = 65536
SMEM_FP32_CLUSTER_MAX_N = 262144
SMEM_FP32_CLUSTER_CHUNKS = 16
SMEM_FP32_CLUSTER_BLOCK = 1024
SMEM_FP32_CLUSTER_WARPS = 4
SMEM_FP32_CLUSTER_BWD_MAX_CHUNK = 10240
# Few fp32 rows past the 131072 bucket that coop holds at once, but in more of its COOP_CHUNK chunks than
# a cluster takes (G > 16: coop exchanges through the workspace), go to the same clusters from
# SMEM_FP32_CLUSTER_HELD_SHARE (forward; backward SMEM_FP32_CLUSTER_HELD_SHARE_BWD) of what coop holds at
# once, in chunks of at most SMEM_FP32_CLUSTER_HELD_SHARE_MAX_CHUNK elements. Below that share coop's
# resident launch leads; its backward's programs stay resident up to a larger share, hence the higher one.
SMEM_FP32_CLUSTER_HELD_SHARE = 0.5
SMEM_FP32_CLUSTER_HELD_SHARE_BWD = 0.58
SMEM_FP32_CLUSTER_HELD_SHARE_MAX_CHUNK = 10240
# Many 16-bit rows longer than SMEM_ONE_CHUNK_MIN_N, up to the FWD/BWD maxima, go to smem with the whole
# row one chunk (kernels/smem_launch.heuristic): one program a row holds it in shared memory in its dtype (twice
# the elements fused holds in fp32 registers) and, with nothing to exchange, skips the workspace and the
# exchange. Fused stays ahead at 8K and in fp32. The forward of the 16K bucket wants
# SMEM_ONE_CHUNK_16K_ROWS_PER_SM rows an SM: with fewer, fused's programs hide latency better.
SMEM_ONE_CHUNK_MIN_N = 8192
SMEM_ONE_CHUNK_16K_ROWS_PER_SM = 7
SMEM_ONE_CHUNK_FWD_MAX_N = 32768
# The 16-bit backward of the 32K bucket takes two 16K chunks of dy and y in a cluster (smem-bwd's
# heuristic), ahead of fused-bwd's plain, RELOAD and DENSE configs; RELOAD keeps the 16K block
# (RELOAD_OVER_SMEM_MAX_N). On GPUs without clusters (exchange.has_clusters) the two chunks would exchange
# through the workspace and trail fused: there the backward stops at SMEM_ONE_CHUNK_BWD_MAX_N_TICKETED.
SMEM_ONE_CHUNK_BWD_MAX_N = 32768
SMEM_ONE_CHUNK_BWD_MAX_N_TICKETED = 16384
RELOAD_OVER_SMEM_MAX_N = 16384

# Many rows that the fused kernel holds as half a block plus a small tail (fused_held) run a one-row
# plain fused config with warps for HELD_VALUES_PER_THREAD values a thread of the held half, whatever
# the tuning table holds for the bucket: its entries were tuned on rows that fill the block, with warps
# for the whole block. 16-bit rows so held leave smem's one-chunk rule: smem sizes its chunk on the N
# bucket (32K for 16392). Blocks of HELD_MIN_BLOCK and up; smaller blocks keep their several-row configs.
HELD_VALUES_PER_THREAD = 32
HELD_MIN_BLOCK = 4096
# Many rows that fill their block (backward, CUDA, rows on 16-byte boundaries) run fused-bwd with RELOAD
# (the tile loaded evict_last for the sum and again evict_first for the write, as inductor's two-loop
# backward does) with the rows and warps RELOAD_ROW_CONFIGS gives for the block, held to
# RELOAD_MAX_REGISTERS registers a thread so that more programs fit an SM (reload_row_config), whatever
# the tuning table holds for the bucket. "Fill": at least (RELOAD_FILL_PARTS - 1) / RELOAD_FILL_PARTS of
# the block (31/32 for the 16-bit 32K block, where shorter rows lose more to the re-read than the extra
# programs win); "many": the entry's element count or more in all, and for the 16-bit 32K block at most
# its most (512 to 1536 rows of 32768). Past that, contiguous rows of exactly 32768 run the DENSE form
# (no mask, the row stride a constant; one 1024-thread program an SM, uncapped). What the configs buy is
# programs an SM (two of 32 warps, four of 16), so the rule also asks for RELOAD_MIN_THREADS_PER_SM
# threads an SM (H100/H200 and A100 have them; GPUs with 1536 do not).
RELOAD_FILL_PARTS = 16
RELOAD_FILL_PARTS_OF = {(2, 32768): 32}  # (element bytes, block) -> its own RELOAD_FILL_PARTS
RELOAD_MAX_REGISTERS = 32
RELOAD_MIN_THREADS_PER_SM = 2048
RELOAD_ROW_CONFIGS = {  # element bytes -> {block: (rows a program, warps, fewest elements in all, most or None)}
    2: {1024: (2, 8, 3 * 2**22, None), 2048: (1, 8, 2**24, None), 4096: (1, 16, 2**24, None),
        8192: (1, 16, 2**25, None), 16384: (1, 32, 5 * 2**21, None), 32768: (1, 32, 2**24, 3 * 2**24)},
    4: {2048: (2, 16, 2**24, None), 4096: (1, 16, 2**24, None)},
}
RELOAD_DENSE_ROW_CONFIGS = {2: {32768: (1, 32)}}  # element bytes -> {block: (rows a program, warps)}

# 16-bit rows of this bucket that fused would hold with a tail run smem instead (smem_held_32k_rows):
# smem cuts its chunks to the row and starts them on 128-byte lines (kernels/smem_launch.balanced_config),
# where fused's held half still takes 16K elements of registers. In the 16K bucket fused stays ahead.
SMEM_HELD_BUCKET = 32768

# Few 16-bit rows of at most COOP_BWD_16BIT_CHUNKS_PER_SM x COOP_CHUNK elements an SM (backward) run
# coop's backward rather than smem's when coop-bwd has a tuned config for the shape: its tuned configs
# (one wide program an SM or fewer, 32-64 values a thread) exchange with fewer programs than smem-bwd.
# Its heuristic config (4 warps of 8-16 values a thread, four programs an SM) does not, so without a
# tuned entry the rows stay with smem.
COOP_BWD_16BIT_CHUNKS_PER_SM = 1


def fused_capacity(device: DeviceInfo, programs_per_sm: int = FUSED_PROGRAMS_PER_SM) -> int:
    """Longest row (power of two, elements) that the fused family keeps on chip on ``device`` with
    ``programs_per_sm`` programs resident on each SM."""
    cap = max(1, device.regs_per_sm // programs_per_sm)
    return 1 << (cap.bit_length() - 1)


@dataclass(frozen=True)
class Shape:
    """What the rules look at: row count, row length, input dtype and the device."""

    M: int
    N: int
    dtype: torch.dtype
    device: DeviceInfo
    backward: bool = False
    aligned: bool = True  # every row starts on a 16-byte boundary (RowProblem.rows_aligned)
    dense: bool = False  # input and output are contiguous rows, back to back, of one element size (rows_dense)


def few_rows(s: Shape) -> bool:
    """Fewer rows than FEW_ROWS_PER_SM per SM: one program a row would leave most SMs idle."""
    return s.M < FEW_ROWS_PER_SM * s.device.sm_count


def fused_held(s: Shape) -> int:
    """The elements a one-row fused tile holds for these rows (less its small tail): half the block when
    the kernel holds the row as half a block plus a tail (kernels/constexprs.row_tail; rows off 16-byte
    boundaries count their whole 16-byte groups, as the realigned path holds them), else the whole block."""
    block = next_power_of_2(s.N)
    align = 1 if s.aligned else ALIGN_BYTES // s.dtype.itemsize
    return block // 2 if row_tail(s.N, block, align) else block


def held_row_config(s: Shape) -> LaunchConfig | None:
    """For many rows (CUDA) that the fused kernel holds as half a block (of HELD_MIN_BLOCK or more) plus a
    small tail (fused_held below the block, within fused_capacity): a one-row plain fused config with
    warps for HELD_VALUES_PER_THREAD values a thread of the held half. Else None."""
    block = next_power_of_2(s.N)
    held = fused_held(s)
    if (s.device.backend != "cuda" or few_rows(s) or block < HELD_MIN_BLOCK or held == block
            or held > fused_capacity(s.device)):
        return None
    nw = heuristic_warps(s.device, held, per_thread=HELD_VALUES_PER_THREAD, max_warps=32)
    return LaunchConfig.make(nw, BLOCK_N=block, ROWS=1)


def reload_shortest(itemsize: int, block: int) -> int:
    """The shortest row reload_row_config takes in a block: (parts - 1) / parts of it, parts RELOAD_FILL_PARTS
    or the entry's own (RELOAD_FILL_PARTS_OF)."""
    parts = RELOAD_FILL_PARTS_OF.get((itemsize, block), RELOAD_FILL_PARTS)
    return -(-block * (parts - 1) // parts)


def reload_row_config(s: Shape) -> LaunchConfig | None:
    """For the backward of many rows (CUDA, RELOAD_MIN_THREADS_PER_SM threads an SM, rows on 16-byte boundaries) that
    fill their block, in the dtypes and blocks of RELOAD_ROW_CONFIGS and their element counts: fused-bwd's RELOAD config
    for the block, held to RELOAD_MAX_REGISTERS registers a thread; past an entry's most elements, for dense rows of
    exactly the block in RELOAD_DENSE_ROW_CONFIGS, its DENSE config (uncapped). Else None."""
    block = next_power_of_2(s.N)
    entry = RELOAD_ROW_CONFIGS.get(s.dtype.itemsize, {}).get(block)
    if (entry is None or not s.backward or not s.aligned or s.device.backend != "cuda"
            or s.device.max_threads_per_sm < RELOAD_MIN_THREADS_PER_SM
            or s.N < reload_shortest(s.dtype.itemsize, block) or s.M * s.N < entry[2]):
        return None
    if entry[3] is not None and s.M * s.N > entry[3]:
        dense = RELOAD_DENSE_ROW_CONFIGS.get(s.dtype.itemsize, {}).get(block)
        if dense is None or not s.dense or s.N != block or s.M % dense[0]:
            return None
        return LaunchConfig.make(dense[1], BLOCK_N=block, ROWS=dense[0], RELOAD=1, DENSE=1)
    rows, warps = entry[:2]
    return LaunchConfig.make(warps, BLOCK_N=block, ROWS=rows, RELOAD=1).with_options(maxnreg=RELOAD_MAX_REGISTERS)


def coop_single_read(s: Shape) -> bool:
    """The coop family can hold a row on chip: at most one chunk of COOP_CHUNK per SM (counted on
    the N bucket, which its configs are sized on)."""
    return s.device.backend == "cuda" and n_bucket(s.N) <= s.device.sm_count * COOP_CHUNK


def coop_holds_all(s: Shape, times: int = 1) -> bool:
    """No more elements than ``times`` x COOP_RESIDENT_PER_SM chunks of COOP_CHUNK on every SM."""
    return s.M * s.N <= times * s.device.sm_count * COOP_RESIDENT_PER_SM * COOP_CHUNK


def coop_fits_at_once(s: Shape) -> bool:
    """Every program of every row can be resident at the same time (one wave, single read)."""
    return coop_single_read(s) and coop_holds_all(s)


def coop_rereads(s: Shape) -> bool:
    """Coop's heuristic config for the shape reads its chunks twice (TILES > 1: the row needs more
    chunks than max_chunks allows even at the widest chunk coop._chunk holds, COOP_CHUNK / held tensors)."""
    fam = coop.BWD_FAMILY if s.backward else coop.FAMILY
    return fam.heuristic(s.device, s.M, s.N)["TILES"] > 1


def smem_copies(s: Shape) -> bool:
    """The smem kernels can copy these rows: NVIDIA sm_80+, a triton with Gluon, and rows on 16-byte
    boundaries along unit-stride columns (``aligned``) with N a whole number of 16-byte vectors, or
    (the kernels' odd-row form, kernels/smem_launch.odd_rows_fit) ``dense`` rows of any length."""
    return (s.device.sm_version >= SMEM_MIN_SM and ((s.aligned and whole_vectors(s.N, s.dtype.itemsize)) or s.dense)
            and gluon_available())


def smem_takes(s: Shape) -> bool:
    """The smem family takes these long rows: longer than SMEM_MIN_N, ones it can copy (smem_copies),
    and short enough for one chunk per SM (kernels/smem_launch.max_row; the backward holds two tensors' chunks)."""
    if not (s.N > SMEM_MIN_N and smem_copies(s)):
        return False

    return n_bucket(s.N) <= smem_launch.max_row(s.device, held=2 if s.backward else 1)


def smem_one_chunk_rows(s: Shape) -> bool:
    """Many 16-bit rows of the 16K bucket (backward, and forward from SMEM_ONE_CHUNK_16K_ROWS_PER_SM rows
    an SM) or the 32K bucket that smem can copy: one chunk a row, no exchange (SMEM_ONE_CHUNK_MIN_N), or two in a
    cluster (the 32K backward, SMEM_ONE_CHUNK_BWD_MAX_N; rows the odd-row lead pushes past a chunk)."""

    clusters = exchange.has_clusters(s.device)
    top = SMEM_ONE_CHUNK_FWD_MAX_N
    if s.backward:
        top = SMEM_ONE_CHUNK_BWD_MAX_N if clusters else SMEM_ONE_CHUNK_BWD_MAX_N_TICKETED
    if not s.backward and n_bucket(s.N) <= 16384 and s.M < SMEM_ONE_CHUNK_16K_ROWS_PER_SM * s.device.sm_count:
        return False  # forward 16K-bucket rows, too few of them: fused
    if held_row_config(s) is not None:
        return False  # rows fused holds as half a block plus a small tail: fused, or smem_held_32k_rows
    if reload_row_config(s) is not None and n_bucket(s.N) <= RELOAD_OVER_SMEM_MAX_N:
        return False  # the backward of many rows that fill the 16K block: fused-bwd with RELOAD
    if not (s.dtype.itemsize <= 2 and not few_rows(s) and SMEM_ONE_CHUNK_MIN_N < s.N <= top and smem_copies(s)):
        return False
    # A forward odd row whose window (smem_launch.odd_lead elements more) runs past the bucket takes a chunk more than
    # the bucket's config: cheap when its chunks exchange in a cluster, slower than fused when they exchange ticketed.
    return s.aligned or s.backward or clusters or s.N + smem_launch.odd_lead(s.dtype.itemsize) <= n_bucket(s.N)


def smem_held_32k_rows(s: Shape) -> bool:
    """Many 16-bit rows of the 32K bucket that fused would hold as half a block plus a small tail
    (held_row_config) and smem can copy, forward and backward: smem cuts its chunks to the row
    (SMEM_HELD_BUCKET)."""
    return (s.dtype.itemsize <= 2 and n_bucket(s.N) == SMEM_HELD_BUCKET and held_row_config(s) is not None
            and smem_copies(s))


def smem_few_fp32_rows(s: Shape) -> bool:
    """Few fp32 rows (forward) in the buckets SMEM_FP32_MIN_N to SMEM_FP32_FEW_ROWS_MAX_N that smem
    takes, holding more than SMEM_FP32_FEW_ROWS_BEYOND times what coop holds at once."""
    return (not s.backward and s.dtype.itemsize >= 4 and few_rows(s)
            and SMEM_FP32_MIN_N <= n_bucket(s.N) <= SMEM_FP32_FEW_ROWS_MAX_N
            and not coop_holds_all(s, SMEM_FP32_FEW_ROWS_BEYOND) and smem_takes(s))


def smem_fp32_cluster_config(s: Shape) -> LaunchConfig | None:
    """For fp32 rows of the SMEM_FP32_CLUSTER_MIN_N to MAX_N buckets that smem takes and coop would run ticketed: few
    rows holding more than coop does at once, SMEM_FP32_CLUSTER_CHUNKS chunks a row (rows past the 131072 bucket:
    from SMEM_FP32_CLUSTER_HELD_SHARE of it, backward SMEM_FP32_CLUSTER_HELD_SHARE_BWD, in chunks of at most
    SMEM_FP32_CLUSTER_HELD_SHARE_MAX_CHUNK: coop runs those in more chunks than a cluster takes); many rows
    (backward only), chunks of SMEM_FP32_MANY_ROWS_BWD_CHUNK elements, or SMEM_FP32_CLUSTER_CHUNKS where that takes
    more. Chunks in whole SMEM_FP32_CLUSTER_BLOCK copy groups (fewer where those cover the row in fewer), in cluster
    mode, for this N, where exchange.cluster_mode allows it on the device (NVIDIA sm_90+); the backward only with chunks
    of at most SMEM_FP32_CLUSTER_BWD_MAX_CHUNK elements, and of few rows only rows on 16-byte boundaries (odd rows in
    smem's odd-row form trail coop-bwd there). Else None."""
    few = few_rows(s)
    if not (s.dtype.itemsize >= 4 and SMEM_FP32_CLUSTER_MIN_N <= n_bucket(s.N) <= SMEM_FP32_CLUSTER_MAX_N
            and (few or s.backward) and smem_takes(s)):
        return None
    g = SMEM_FP32_CLUSTER_CHUNKS
    if not few:
        g = min(g, triton.cdiv(s.N, SMEM_FP32_MANY_ROWS_BWD_CHUNK))
    tiles = triton.cdiv(triton.cdiv(s.N, g), SMEM_FP32_CLUSTER_BLOCK)
    if few and coop_holds_all(s):  # only rows whose coop chunks are more than a cluster takes, from a share of it
        share = SMEM_FP32_CLUSTER_HELD_SHARE_BWD if s.backward else SMEM_FP32_CLUSTER_HELD_SHARE
        if not (n_bucket(s.N) > COOP_CHUNK * max(exchange.CLUSTER_SIZES) and not coop_holds_all(s, share)
                and tiles * SMEM_FP32_CLUSTER_BLOCK <= SMEM_FP32_CLUSTER_HELD_SHARE_MAX_CHUNK):
            return None
    if s.backward and (tiles * SMEM_FP32_CLUSTER_BLOCK > SMEM_FP32_CLUSTER_BWD_MAX_CHUNK or (few and not s.aligned)):
        return None
    config = LaunchConfig.make(SMEM_FP32_CLUSTER_WARPS, BLOCK=SMEM_FP32_CLUSTER_BLOCK, TILES=tiles,
                               BLOCK_G=next_power_of_2(g), CLUSTER=1)
    return config if exchange.cluster_mode(config, chunks(s.N, dict(config.meta)), s.device, False) else None


def ruled_config(name: str, s: Shape) -> LaunchConfig | None:
    """The config a rule fixes for family ``name`` at this shape, over the tuning table's entry: fused's rows held
    with a tail (held_row_config) and its backward's RELOAD rows (reload_row_config), smem's few fp32 rows and the
    backward of many fp32 rows in CTA clusters (smem_fp32_cluster_config). None where the table or the heuristic
    decides."""
    if name == "fused":
        return held_row_config(s) or reload_row_config(s)
    if name == "smem":
        return smem_fp32_cluster_config(s)
    return None


def coop_tuned_16bit_backward(s: Shape) -> bool:
    """Few 16-bit rows (backward) that smem takes, of at most COOP_BWD_16BIT_CHUNKS_PER_SM chunks of
    COOP_CHUNK an SM, read once, for which the tuning table holds a coop-bwd config."""
    if not (s.backward and s.dtype.itemsize <= 2 and few_rows(s) and coop_single_read(s) and smem_takes(s)
            and s.M * s.N <= COOP_BWD_16BIT_CHUNKS_PER_SM * s.device.sm_count * COOP_CHUNK):
        return False
    return stored(s.device, coop.BWD_FAMILY, s.dtype, s.N, s.M) is not None


def smem_backward(s: Shape) -> bool:
    """The backward runs smem's kernel: 16-bit rows it takes, and fp32 rows of SMEM_FP32_MIN_N
    or longer unless coop holds every program at once and reads each element once."""
    if not (s.backward and smem_takes(s)):
        return False
    if s.dtype.itemsize <= 2:
        return True
    return n_bucket(s.N) >= SMEM_FP32_MIN_N and (not coop_holds_all(s) or coop_rereads(s))


@dataclass(frozen=True)
class Rule:
    impl: str
    why: str
    holds: Callable[[Shape], bool]


def realigned_16bit_32k_rows(s: Shape) -> bool:
    """Many 16-bit rows (forward, CUDA) that start off 16 bytes, in the OFF_ALIGN_ONLINE_BUCKET bucket, save
    those fused holds as half a block plus a tail (held_row_config) and, on GPUs with CTA clusters, those smem can
    copy (smem_copies: dense rows, in its odd-row form, whose extra chunk exchanges in the cluster; ticketed, it
    would trail online)."""
    return (not s.aligned and not s.backward and s.device.backend == "cuda" and s.dtype.itemsize == 2
            and not few_rows(s) and n_bucket(s.N) == OFF_ALIGN_ONLINE_BUCKET and held_row_config(s) is None
            and not (smem_copies(s) and exchange.has_clusters(s.device)))


RULES: tuple[Rule, ...] = (
    Rule("online", "many 16-bit rows of 16K-32K that start off 16 bytes (forward; not those fused holds with a "
         "small tail, nor dense rows, which smem copies): realigned online beats fused",
         realigned_16bit_32k_rows),
    Rule("smem", "many 16-bit rows of 8K-32K (backward save 2^24+ elements of rows that fill the 16K block; "
         "forward 8K-16K from 7 rows an SM) on 16-byte boundaries or dense: one program a row holds it in shared "
         "memory in its dtype (the 32K backward and rows the odd-row lead pushes past a chunk: two or three in a "
         "cluster), with little to exchange",
         smem_one_chunk_rows),
    Rule("smem", "many 16-bit rows just past 16K on 16-byte boundaries that fused would hold as half a block plus a "
         "small tail: smem's chunks cut to the row", smem_held_32k_rows),
    Rule("fused", "the whole row fits in registers",
         lambda s: next_power_of_2(s.N) <= fused_capacity(s.device)),
    Rule("fused", "many rows, each fits in registers with one program an SM (forward, 16-bit backward)",
         lambda s: (not s.backward or s.dtype.itemsize <= 2) and not few_rows(s)
         and next_power_of_2(s.N) <= fused_capacity(s.device, FUSED_MANY_ROWS_PROGRAMS_PER_SM)),
    Rule("fused", "many rows just past a power of two that fits in registers, held as half the block plus a "
         "small tail (TAIL; it adds the fp32 backward of 16K-16.5K rows)",
         lambda s: s.device.backend == "cuda" and not few_rows(s) and fused_held(s) <= fused_capacity(s.device)),
    Rule("coop", "few 16-bit rows of at most one chunk an SM (backward) with a tuned coop-bwd config: its wide "
         "programs exchange with fewer programs than smem-bwd", coop_tuned_16bit_backward),
    Rule("smem", "long rows (backward; fp32 from 512K, unless coop holds all and reads once): dy and y "
         "chunks held in shared memory in their dtype, each element read once", smem_backward),
    Rule("smem", "few fp32 rows from 512K, more than twice what coop holds at once (forward): smem's fp32 chunks "
         "run ahead of coop's and split's", smem_few_fp32_rows),
    Rule("smem", "few fp32 rows of 32K-256K, more than coop holds at once (CTA clusters; backward up to 160K; "
         "rows of 128K-160K from a half, backward 0.58, of it): 16 chunks a row in shared memory, one cluster a "
         "row; the backward of many such rows up to 160K, in chunks of 8K-10K",
         lambda s: smem_fp32_cluster_config(s) is not None),
    Rule("coop", "few long rows, all on chip at once (or read once, fp32 or backward): one cooperative launch",
         lambda s: few_rows(s) and (coop_fits_at_once(s)
                                    or (coop_single_read(s) and (s.dtype.itemsize >= 4 or s.backward)))),
    Rule("smem", "few 16-bit long rows, more than coop holds at once (forward): smem's 16-bit chunks read each "
         "element once, split reads it twice",
         lambda s: few_rows(s) and s.dtype.itemsize <= 2 and not coop_holds_all(s) and smem_takes(s)),
    Rule("split", "few long rows: M rows cannot fill the GPU, so each row is spread over many programs",
         few_rows),
    Rule("smem", "many long rows on 16-byte boundaries (forward): one cooperative launch, each chunk held in "
         "shared memory in the input dtype", lambda s: not s.backward and smem_takes(s)),
    Rule("online", "many 16-bit rows of up to 64K (forward): the second read mostly hits L2, ahead of coop",
         lambda s: s.dtype.itemsize <= 2 and not s.backward and not few_rows(s)
         and n_bucket(s.N) <= ONLINE_16BIT_MAX_N),
    Rule("coop", "many long rows: one cooperative launch, each element read once",
         coop_single_read),
    Rule("online", "many long rows: one (max, sum) pass and one write pass, two reads per element",
         lambda s: True),
)


def choose(M: int, N: int, dtype: torch.dtype, device: DeviceInfo, backward: bool = False,
           aligned: bool = True, dense: bool = False) -> Rule:
    """The first rule of :data:`RULES` that holds for this shape (of the forward, or the backward;
    ``aligned``: every row starts on a 16-byte boundary; ``dense``: as in Shape)."""
    shape = Shape(M, N, dtype, device, backward, aligned, dense)
    for rule in RULES:
        if rule.holds(shape):
            return rule
    raise AssertionError("the last rule always holds")


@dataclass(frozen=True)
class Plan:
    """A decided launch: the family and either the dispatcher's config (``from_store``: the tuning
    store's, held_row_config's for fused rows held with a tail or reload_row_config's for the fused backward
    of many rows that fill their block; a launch that fails with it
    autotunes instead) or None (autotune)."""

    impl: str
    family: object
    config: LaunchConfig | None
    device: DeviceInfo
    from_store: bool = False


_plans: dict[tuple, Plan] = {}


def stored(device: DeviceInfo, fam, dtype: torch.dtype, N: int, M: int, within=None) -> tuning.Entry | None:
    """The tuning table's entry for family ``fam`` at this shape (``within``: from that root's table only);
    families whose grid grows with M take entries from fewer rows only (tuning.NEAREST_M_FEWER_ROWS_GRID_FROM_M)."""
    fewer = tuning.NEAREST_M_FEWER_ROWS_GRID_FROM_M if fam.grid_from_m else tuning.NEAREST_M
    return tuning.lookup(device, fam.name, dtype, N, M, fewer, within)


def resolve(impl: str, M: int, N: int, dtype: torch.dtype, info: DeviceInfo, backward: bool = False,
            aligned: bool = True, dense: bool = False) -> Plan:
    """The one decision from a shape to a launch: the family (``impl``, or for ``auto`` the first rule that holds)
    and its config: a rule's (ruled_config), else the tuning table's entry, else None (the family's heuristic or
    autotuner decides when it launches). ``aligned``: every row starts on a 16-byte boundary; ``dense``: input and
    output are contiguous rows, back to back, of one element size. The backward runs the backward kernel of the
    family the rules pick for it."""
    name = choose(M, N, dtype, info, backward, aligned, dense).impl if impl == "auto" else impl
    if name == "fused":
        from .kernels.fused import check_row_length

        check_row_length(N)
    fam = backward_family(name) if backward else family(name)
    ruled = ruled_config(name, Shape(M, N, dtype, info, backward, aligned, dense))
    entry = None if ruled else stored(info, fam, dtype, N, M)
    config = ruled or (entry.config if entry else None)
    return Plan(name, fam, config, info, config is not None)


def plan(impl: str, M: int, N: int, dtype: torch.dtype, out_dtype: torch.dtype,
         device: torch.device, backward: bool = False, aligned: bool = True, dense: bool = False) -> Plan:
    """:func:`resolve` for one call shape on ``device``, cached (``impl`` already validated)."""
    key = (impl, M, N, dtype, out_dtype, device, backward, aligned, dense)
    p = _plans.get(key)
    if p is None:
        p = _plans[key] = resolve(impl, M, N, dtype, device_info(device), backward, aligned, dense)
    return p


def record_autotuned(launch) -> None:
    """With TRITONSOFTMAX_TUNE_SAVE=1, write what a launch's first call autotuned (its config and time) to the
    user's tuning table, so later processes launch it without tuning."""
    if not getattr(launch, "autotuned", False) or not save_tuning_enabled():
        return
    p = launch.problem
    tuning.record(tuning.user_dir(), launch.device, [(launch.family.name, p.dtype, p.N, p.M, launch.config,
                                                      launch.autotuned_ms)], covers="autotuned on first use")


def clear_cache() -> None:
    """Forget every cached decision and re-read the tuning tables on the next decision."""
    _plans.clear()
    tuning.forget()
