"""Which kernel family runs a softmax of M rows of N elements, and with which config.

The decision reads top to bottom; the first rule whose condition holds wins. The numbers the rules
compare against are the device's policy (tritonsoftmax.policy: measured per arch in the tuning
table's ``policy:``, else a default from the device's quantities); what each family can run is the
family's. A decision is made once per (impl, M, N, dtypes, device) and cached, so a warm call costs
one dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from . import policy, tuning
from .config import LaunchConfig, n_bucket, next_power_of_2
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
from .kernels.constexprs import held_length, row_pieces, row_tail
from .kernels.coop import COOP_CHUNK
from .kernels.launch_modes import NO_MODES, LaunchModes
from .kernels.sizing import chunks, heuristic_warps
from .layout import ALIGN_BYTES, whole_vectors
from .policy import Policy, policy_for

IMPLS = ("auto",) + ALL_FAMILY_NAMES


def fused_capacity(device: DeviceInfo, programs_per_sm: int | None = None) -> int:
    """Longest row (power of two, elements) that the fused family keeps on chip on ``device`` with
    ``programs_per_sm`` programs resident on each SM (the policy's fused_programs_per_sm by default)."""
    return policy.fused_capacity(device, programs_per_sm or policy_for(device).fused_programs_per_sm)


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

    @property
    def policy(self) -> Policy:
        return policy_for(self.device)


def few_rows(s: Shape) -> bool:
    """Fewer rows than few_rows_per_sm per SM: one program a row would leave most SMs idle."""
    return s.M < s.policy.few_rows_per_sm * s.device.sm_count


def _for_shape(table: dict | None, s: Shape):
    """A policy table's value for these rows' direction and element size ({"fwd" | "bwd": {element bytes: value}}),
    None where it has none."""
    return (table or {}).get("bwd" if s.backward else "fwd", {}).get(s.dtype.itemsize)


def _blocks_in(table: dict | None, s: Shape) -> bool:
    """A policy table {"fwd" | "bwd": {element bytes: (least block, most block)}} holds these rows' block."""
    blocks = _for_shape(table, s)
    return blocks is not None and blocks[0] <= next_power_of_2(s.N) <= blocks[1]


def held_tails(s: Shape) -> bool:
    """The policy's held_tails holds these rows with any tail shorter than half the block (HELD): their block
    lies in its [least, most] for the direction and element size."""
    return _blocks_in(s.policy.held_tails, s)


def held_pieces(s: Shape) -> bool:
    """The policy's held_pieces holds these rows, on 16-byte boundaries, as half the block, a power of two and a
    shorter tail (HELD 2, kernels/constexprs.row_pieces) where those three pieces save positions over two: their
    block lies in its [least, most]."""
    block = next_power_of_2(s.N)
    return s.aligned and _blocks_in(s.policy.held_pieces, s) and row_pieces(s.N, block)[0] > 0


def held_rows_warps(s: Shape) -> int:
    """The warps the policy's held_rows gives these rows (on 16-byte boundaries, in a block it names, between that
    block's shortest and longest row), else 0."""
    entry = (_for_shape(s.policy.held_rows, s) or {}).get(next_power_of_2(s.N))
    return entry[2] if entry is not None and s.aligned and entry[0] <= s.N <= entry[1] else 0


def fused_held(s: Shape) -> int:
    """The elements a one-row fused tile holds for these rows, less a small tail: half the block when the kernel
    holds the row as half a block plus a small tail (kernels/constexprs.row_tail), the three pieces where the
    policy holds them (held_pieces), half plus the tail where it holds any tail (held_tails), else the
    whole block. Rows off 16-byte boundaries count their whole 16-byte groups, as the realigned path holds them."""
    block = next_power_of_2(s.N)
    align = 1 if s.aligned else ALIGN_BYTES // s.dtype.itemsize
    if row_tail(s.N, block, align):
        return block // 2
    if held_rows_warps(s):
        return held_length(s.N, block, align, any_tail=True)
    if held_pieces(s):
        return held_length(s.N, block, align, pieces=True)
    return held_length(s.N, block, align, any_tail=held_tails(s))


def held_row_config(s: Shape) -> LaunchConfig | None:
    """For many rows (CUDA) that the fused kernel holds as half a block plus a tail (fused_held below the block,
    within fused_capacity): a one-row plain fused config with warps for held_values_per_thread values a thread of
    what it holds (the tuning table's entries were tuned on rows that fill the block, with warps for the whole
    block) — with HELD 2 (half, a power of two, a tail) where the policy's held_pieces says so, HELD (any tail) where
    its held_tails does; else for small tails on blocks of held_min_block and up. Where the policy's held_rows names
    the rows (measured on that GPU, so on any backend): HELD on its warps, also for rows whose tail is the half (held
    as the whole block). Else None."""
    block = next_power_of_2(s.N)
    held = fused_held(s)
    if few_rows(s) or held > fused_capacity(s.device):
        return None
    warps = held_rows_warps(s)
    if warps:
        return LaunchConfig.make(warps, BLOCK_N=block, ROWS=1, HELD=1)
    if s.device.backend != "cuda" or held == block:
        return None
    nw = heuristic_warps(s.device, held, per_thread=s.policy.held_values_per_thread, max_warps=32)
    if held_pieces(s):
        return LaunchConfig.make(nw, BLOCK_N=block, ROWS=1, HELD=2)
    if held_tails(s):
        return LaunchConfig.make(nw, BLOCK_N=block, ROWS=1, HELD=1)
    if block < s.policy.held_min_block:
        return None
    return LaunchConfig.make(nw, BLOCK_N=block, ROWS=1)


def reload_shortest(reload: dict, itemsize: int, block: int) -> int:
    """The shortest row reload_row_config takes in a block: (parts - 1) / parts of it, parts the policy's
    fill_parts or the block's own (fill_parts_of)."""
    parts = reload.get("fill_parts_of", {}).get(itemsize, {}).get(block, reload["fill_parts"])
    return -(-block * (parts - 1) // parts)


def reload_row_config(s: Shape) -> LaunchConfig | None:
    """For the backward of many rows (CUDA, the policy's min_threads_per_sm, rows on 16-byte boundaries) that fill
    their block, in the element sizes and blocks of the policy's reload rows and their element counts: fused-bwd's
    RELOAD config for the block (the tile loaded evict_last for the sum and again evict_first for the write), held to
    max_registers a thread so that more programs fit an SM; past an entry's most elements, for dense rows of exactly
    the block in dense_rows, its DENSE config (uncapped). Else None."""
    reload = s.policy.reload
    if not reload:
        return None
    block = next_power_of_2(s.N)
    entry = reload["rows"].get(s.dtype.itemsize, {}).get(block)
    if (entry is None or not s.backward or not s.aligned or s.device.backend != "cuda"
            or s.device.max_threads_per_sm < reload["min_threads_per_sm"]
            or s.N < reload_shortest(reload, s.dtype.itemsize, block) or s.M * s.N < entry[2]):
        return None
    if entry[3] is not None and s.M * s.N > entry[3]:
        dense = reload.get("dense_rows", {}).get(s.dtype.itemsize, {}).get(block)
        if dense is None or not s.dense or s.N != block or s.M % dense[0]:
            return None
        return LaunchConfig.make(dense[1], BLOCK_N=block, ROWS=dense[0], RELOAD=1, DENSE=1)
    rows, warps = entry[:2]
    return LaunchConfig.make(warps, BLOCK_N=block, ROWS=rows, RELOAD=1).with_options(maxnreg=reload["max_registers"])


def coop_single_read(s: Shape) -> bool:
    """The coop family can hold a row on chip: at most one chunk of COOP_CHUNK per SM (counted on
    the N bucket, which its configs are sized on)."""
    return s.device.backend == "cuda" and n_bucket(s.N) <= s.device.sm_count * COOP_CHUNK


def coop_holds_all(s: Shape, times: float = 1) -> bool:
    """No more elements than ``times`` x coop_resident_per_sm chunks of COOP_CHUNK on every SM."""
    return s.M * s.N <= times * s.device.sm_count * s.policy.coop_resident_per_sm * COOP_CHUNK


def coop_fits_at_once(s: Shape) -> bool:
    """Every program of every row can be resident at the same time (one wave, single read)."""
    return coop_single_read(s) and coop_holds_all(s)


def coop_rereads(s: Shape) -> bool:
    """Coop's heuristic config for the shape reads its chunks twice (TILES > 1: the row needs more
    chunks than max_chunks allows even at the widest chunk coop holds, COOP_CHUNK / held tensors)."""
    fam = coop.BWD_FAMILY if s.backward else coop.FAMILY
    return fam.heuristic(s.device, s.M, s.N)["TILES"] > 1


def smem_copies(s: Shape) -> bool:
    """The smem kernels can copy these rows: NVIDIA sm_80+, a triton with Gluon, and rows on 16-byte
    boundaries along unit-stride columns (``aligned``) with N a whole number of 16-byte vectors, or
    (the kernels' odd-row form, kernels/smem_launch.odd_rows_fit) ``dense`` rows of any length."""
    return (s.device.sm_version >= SMEM_MIN_SM and ((s.aligned and whole_vectors(s.N, s.dtype.itemsize)) or s.dense)
            and gluon_available())


def smem_takes(s: Shape) -> bool:
    """The smem family takes these long rows: longer than smem_min_n, ones it can copy (smem_copies),
    and short enough for one chunk per SM (kernels/smem_launch.max_row; the backward holds two tensors' chunks)."""
    if not (s.N > s.policy.smem_min_n and smem_copies(s)):
        return False
    return n_bucket(s.N) <= smem_launch.max_row(s.device, held=2 if s.backward else 1)


def smem_one_chunk_rows(s: Shape) -> bool:
    """Many 16-bit rows of the 16K bucket (backward, and forward from rows_per_sm_16k rows an SM) or the 32K
    bucket that smem can copy: one chunk a row, no exchange (from min_n), or two in a cluster (the 32K backward,
    up to bwd_max_n; rows the odd-row lead pushes past a chunk). One program a row holds it in shared memory in
    its dtype, twice the elements fused holds in fp32 registers. Policy: smem_one_chunk (None: rule off)."""
    one = s.policy.smem_one_chunk
    if not one:
        return False
    clusters = exchange.has_clusters(s.device)
    top = one["fwd_max_n"]
    if s.backward:  # without clusters the backward's two chunks would exchange through the workspace
        top = one["bwd_max_n"] if clusters else one["bwd_max_n_ticketed"]
    if not s.backward and n_bucket(s.N) <= 16384 and s.M < one["rows_per_sm_16k"] * s.device.sm_count:
        return False  # forward 16K-bucket rows, too few of them: fused
    if held_row_config(s) is not None:
        return False  # rows fused holds as half a block plus a small tail: fused, or smem_held_rows
    if reload_row_config(s) is not None and n_bucket(s.N) <= one["reload_over_smem_max_n"]:
        return False  # the backward of many rows that fill the 16K block: fused-bwd with RELOAD
    if not (s.dtype.itemsize <= 2 and not few_rows(s) and one["min_n"] < s.N <= top and smem_copies(s)):
        return False
    # A forward odd row whose window (smem_launch.odd_lead elements more) runs past the bucket takes a chunk more than
    # the bucket's config: cheap when its chunks exchange in a cluster, slower than fused when they exchange ticketed.
    return s.aligned or s.backward or clusters or s.N + smem_launch.odd_lead(s.dtype.itemsize) <= n_bucket(s.N)


def smem_held_rows(s: Shape) -> bool:
    """Many 16-bit rows of the policy's smem_held_bucket that fused would hold as half a block plus a small tail
    (held_row_config) and smem can copy, forward and backward: smem cuts its chunks to the row and starts them on
    128-byte lines, where fused's held half still takes half the block of registers."""
    bucket = s.policy.smem_held_bucket
    return (bucket is not None and s.dtype.itemsize <= 2 and n_bucket(s.N) == bucket
            and held_row_config(s) is not None and smem_copies(s))


def smem_few_fp32_rows(s: Shape) -> bool:
    """Few fp32 rows (forward) in the buckets smem_fp32_min_n to the policy's smem_fp32_few_rows max_n that smem
    takes, holding more than its ``beyond`` times what coop holds at once (coop then runs ticketed in waves and
    split reads twice)."""
    few = s.policy.smem_fp32_few_rows
    return (bool(few) and not s.backward and s.dtype.itemsize >= 4 and few_rows(s)
            and s.policy.smem_fp32_min_n <= n_bucket(s.N) <= few["max_n"]
            and not coop_holds_all(s, few["beyond"]) and smem_takes(s))


def smem_fp32_cluster_config(s: Shape) -> LaunchConfig | None:
    """For fp32 rows of the policy's smem_fp32_cluster min_n to max_n buckets that smem takes and coop would run
    ticketed: few rows holding more than coop does at once, ``chunks`` chunks a row (rows coop splits into more
    chunks than a cluster takes: from ``held_share`` of what coop holds at once, backward ``held_share_bwd``, in
    chunks of at most ``held_share_max_chunk``); many rows (backward only), chunks of ``many_rows_bwd_chunk``
    elements, or ``chunks`` where that takes more. Chunks in whole ``block`` copy groups, in cluster mode, for this
    N, where exchange.cluster_mode allows it on the device (NVIDIA sm_90+): the row's exchange stays in the
    cluster's shared memory and no program waits for a ticket. The backward only with chunks of at most
    ``bwd_max_chunk`` elements, and of few rows only rows on 16-byte boundaries. Else None."""
    c = s.policy.smem_fp32_cluster
    few = few_rows(s)
    if not (c and s.dtype.itemsize >= 4 and c["min_n"] <= n_bucket(s.N) <= c["max_n"]
            and (few or s.backward) and smem_takes(s)):
        return None
    g = c["chunks"]
    if not few:
        g = min(g, triton.cdiv(s.N, c["many_rows_bwd_chunk"]))
    tiles = triton.cdiv(triton.cdiv(s.N, g), c["block"])
    if few and coop_holds_all(s):  # only rows whose coop chunks are more than a cluster takes, from a share of it
        share = c["held_share_bwd"] if s.backward else c["held_share"]
        if not (n_bucket(s.N) > COOP_CHUNK * max(exchange.CLUSTER_SIZES) and not coop_holds_all(s, share)
                and tiles * c["block"] <= c["held_share_max_chunk"]):
            return None
    if s.backward and (tiles * c["block"] > c["bwd_max_chunk"] or (few and not s.aligned)):
        return None
    config = LaunchConfig.make(c["warps"], BLOCK=c["block"], TILES=tiles, BLOCK_G=next_power_of_2(g), CLUSTER=1)
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
    """Few 16-bit rows (backward) that smem takes, of at most the policy's coop_bwd_16bit_chunks_per_sm chunks of
    COOP_CHUNK an SM, read once, for which the tuning table holds a coop-bwd config: its tuned configs (one wide
    program an SM or fewer) exchange with fewer programs than smem-bwd; its heuristic's do not."""
    if not (s.backward and s.dtype.itemsize <= 2 and few_rows(s) and coop_single_read(s) and smem_takes(s)
            and s.M * s.N <= s.policy.coop_bwd_16bit_chunks_per_sm * s.device.sm_count * COOP_CHUNK):
        return False
    return stored(s.device, coop.BWD_FAMILY, s.dtype, s.N, s.M) is not None


def smem_backward(s: Shape) -> bool:
    """The backward runs smem's kernel: 16-bit rows it takes, and fp32 rows of smem_fp32_min_n
    or longer unless coop holds every program at once and reads each element once."""
    if not (s.backward and smem_takes(s)):
        return False
    if s.dtype.itemsize <= 2:
        return True
    return n_bucket(s.N) >= s.policy.smem_fp32_min_n and (not coop_holds_all(s) or coop_rereads(s))


@dataclass(frozen=True)
class Rule:
    impl: str
    why: str
    holds: Callable[[Shape], bool]


def realigned_16bit_rows(s: Shape) -> bool:
    """Many 16-bit rows (forward, CUDA) that start off 16 bytes, in the policy's off_align_online_bucket, save
    those fused holds as half a block plus a tail (held_row_config) and, on GPUs with CTA clusters, those smem can
    copy (smem_copies: dense rows, in its odd-row form, whose extra chunk exchanges in the cluster)."""
    bucket = s.policy.off_align_online_bucket
    return (bucket is not None and not s.aligned and not s.backward and s.device.backend == "cuda"
            and s.dtype.itemsize == 2 and not few_rows(s) and n_bucket(s.N) == bucket and held_row_config(s) is None
            and not (smem_copies(s) and exchange.has_clusters(s.device)))


RULES: tuple[Rule, ...] = (
    Rule("online", "many 16-bit rows of 16K-32K that start off 16 bytes (forward; not those fused holds with a "
         "small tail, nor dense rows, which smem copies): realigned online beats fused",
         realigned_16bit_rows),
    Rule("smem", "many 16-bit rows of 8K-32K (backward save 2^24+ elements of rows that fill the 16K block; "
         "forward 8K-16K from 7 rows an SM) on 16-byte boundaries or dense: one program a row holds it in shared "
         "memory in its dtype (the 32K backward and rows the odd-row lead pushes past a chunk: two or three in a "
         "cluster), with little to exchange",
         smem_one_chunk_rows),
    Rule("smem", "many 16-bit rows just past 16K on 16-byte boundaries that fused would hold as half a block plus a "
         "small tail: smem's chunks cut to the row", smem_held_rows),
    Rule("fused", "the whole row fits in registers",
         lambda s: next_power_of_2(s.N) <= fused_capacity(s.device)),
    Rule("fused", "many rows, each fits in registers with one program an SM (forward, 16-bit backward)",
         lambda s: (not s.backward or s.dtype.itemsize <= 2) and not few_rows(s)
         and next_power_of_2(s.N) <= fused_capacity(s.device, s.policy.fused_many_rows_programs_per_sm)),
    Rule("fused", "many rows just past a power of two that fits in registers, held as half the block plus a "
         "tail (TAIL, HELD; it adds the fp32 backward of 16K-16.5K rows)",
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
         and n_bucket(s.N) <= s.policy.online_16bit_max_n),
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
    autotunes instead) or None (autotune); ``modes``: the arch's bounds of the launch modes a launch picks for
    itself (the policy's launch_modes)."""

    impl: str
    family: object
    config: LaunchConfig | None
    device: DeviceInfo
    from_store: bool = False
    modes: LaunchModes = NO_MODES


_plans: dict[tuple, Plan] = {}


def stored(device: DeviceInfo, fam, dtype: torch.dtype, N: int, M: int, within=None) -> tuning.Entry | None:
    """The tuning table's entry for family ``fam`` at this shape (``within``: from that root's table only);
    families whose grid grows with M take entries from fewer rows only (tuning.NEAREST_M_FEWER_ROWS_GRID_FROM_M)."""
    fewer = tuning.NEAREST_M_FEWER_ROWS_GRID_FROM_M if fam.grid_from_m else tuning.NEAREST_M
    return tuning.lookup(device, fam.name, dtype, N, M, fewer, within)


def measured_winner(s: Shape) -> str | None:
    """The family the arch's family tuner (python -m tritonsoftmax.tune --dispatch) found fastest for this shape,
    where it measured rows of exactly this length in the layout it times (contiguous rows) and the family can run
    them; else None."""
    if not s.dense or s.aligned != whole_vectors(s.N, s.dtype.itemsize):
        return None
    name = tuning.dispatch_winner(s.device, s.backward, s.dtype, s.N, s.M)
    if name == "smem" and not smem_copies(s):
        return None
    if name == "fused":
        from .kernels.fused import MAX_N

        if s.N > MAX_N:
            return None
    return name if name in ALL_FAMILY_NAMES else None


def resolve(impl: str, M: int, N: int, dtype: torch.dtype, info: DeviceInfo, backward: bool = False,
            aligned: bool = True, dense: bool = False, row_scale: bool = False) -> Plan:
    """The one decision from a shape to a launch: the family (``impl``, or for ``auto`` the family tuner's measured
    winner at this shape (measured_winner), else the first rule that holds) and its config: a rule's
    (ruled_config), else the tuning table's entry, else None (the family's heuristic or autotuner decides when it
    launches). ``aligned``: every row starts on a 16-byte boundary; ``dense``: input and output are contiguous
    rows, back to back, of one element size. The backward runs the backward kernel of the family the rules pick
    for it. ``row_scale``: one scale a row (ROW_SCALE), which every family but smem takes: where smem would run,
    coop does (the family smem falls back to for what it cannot take)."""
    name = impl
    if impl == "auto":
        name = measured_winner(Shape(M, N, dtype, info, backward, aligned, dense)) or \
            choose(M, N, dtype, info, backward, aligned, dense).impl
    if row_scale and name == "smem":
        if impl == "smem":
            raise ValueError("impl='smem' takes one scale for all rows, not a tensor of scales; use impl='auto' "
                             "or 'coop'")
        name = "coop"
    if name == "fused":
        from .kernels.fused import check_row_length

        check_row_length(N)
    fam = backward_family(name) if backward else family(name)
    ruled = ruled_config(name, Shape(M, N, dtype, info, backward, aligned, dense))
    entry = None if ruled else stored(info, fam, dtype, N, M)
    config = ruled or (entry.config if entry else None)
    return Plan(name, fam, config, info, config is not None, policy.launch_modes(policy_for(info)))


def plan(impl: str, M: int, N: int, dtype: torch.dtype, out_dtype: torch.dtype,
         device: torch.device, backward: bool = False, aligned: bool = True, dense: bool = False,
         row_scale: bool = False) -> Plan:
    """:func:`resolve` for one call shape on ``device``, cached (``impl`` already validated)."""
    key = (impl, M, N, dtype, out_dtype, device, backward, aligned, dense, row_scale)
    p = _plans.get(key)
    if p is None:
        p = _plans[key] = resolve(impl, M, N, dtype, device_info(device), backward, aligned, dense, row_scale)
    return p


def clear_cache() -> None:
    """Forget every cached decision and re-read the tuning tables (entries and policies) on the next decision."""
    _plans.clear()
    tuning.forget()
    policy.forget()
