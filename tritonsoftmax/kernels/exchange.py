"""How the programs of a row exchange their partials (the coop and smem families): through a workspace
in global memory, or through a CTA cluster's shared memory.

**Workspace.** Each program publishes its partial, a (max, sum) pair or a sum, as one 64-bit word
(publish_word), waits until its row's G words are there (row_words: no barrier counter, no fence) and
combines them. Forward progress: each program takes a ticket from an atomic counter when it starts and
works on chunk ticket % G of row ticket // G. Tickets go out in start order, so a waiting program only
waits for partners that already run or that can start: when a row still has chunks without a program, no
later row has one, so every resident program belongs to that row; with G at most the SM count
(max_chunks) there is a free slot for the next one. The ticket counter resets itself (its last holder sets
it to 0), and a row's last program to leave zeroes the row's words and departure counter (with depart's
PER_WORD, each word's last reader zeroes that word and its counter), so one zeroed buffer per (device,
stream) (scratch) serves every launch on that stream and no program waits for anything on its way out. A
cooperative launch (every program resident at once) uses program ids instead of tickets (RESIDENT).
Programs that wait for each other deadlock under the Triton interpreter, which runs programs one after
another: there the exchange runs as two launches (PHASE 1 publishes, PHASE 2 combines and writes).

**Cluster** (NVIDIA sm_90+, inline PTX; cluster_mode says when).

When a row's G chunks are the G programs (CTAs) of one cluster, launched together by the hardware,
each program sends its partial pair into slot ``rank`` of every program's shared memory with
``st.async``, which counts the bytes on the receiving program's mbarrier, and waits on its own
mbarrier until its G pairs have landed; then it reads them from its own shared memory: no workspace
in global memory, no polling of it, no tickets, and no barrier round trip after the stores. This is
QuACK's exchange; Triton 3.6 has no words for it, so it is written as PTX. One-way stores counted on
an mbarrier spare the release/acquire cluster barrier that plain ``st.shared::cluster`` stores would
need, a round trip on every exchange.

The slots and the mbarrier are the last ``cluster_smem_bytes(BLOCK_G)`` bytes of the program's dynamic
shared memory, past what the compiled kernel uses: the launch asks for that much more
(``launches.PreparedLaunch``'s cluster mode), and the PTX finds them from ``%dynamic_smem_size``, so no
offset is compiled in.

The programs of a cluster must all have started, and initialised their mbarriers, before one writes
into another's shared memory (CUDA's rule for distributed shared memory): ``cluster_arrive`` (after
the mbarrier's init and its fence; relaxed) at the kernel's start, and the matching wait right before
the remote stores. A program goes on once all G pairs have reached it, so none leaves while another
may still write into it, and none writes into one that has left.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from ..config import LaunchConfig
from ..device import DeviceInfo
from .launch_modes import PerWord
from .row_ops import combine_max_sum

NEG_INF = tl.constexpr(float("-inf"))

try:  # the backend a kernel is compiled for, asked at compile time (poll_words)
    from triton.language.target_info import is_hip
except ImportError as e:  # triton before 3.4
    raise ImportError(f"the coop family needs triton >= 3.6 ({e})") from e

WORD_FLOATS = 2  # workspace floats a program: one int64 word (publish_word)

CLUSTER_SIZES = range(2, 17)  # chunks a row in cluster mode: 8 is CUDA's portable most, 16 the H100/H200's

CLUSTER_MIN_SM = 90  # distributed shared memory and barrier.cluster: sm_90+

CLUSTER_MIN_WARPS = 2  # a one-warp program's reductions need no shared memory, and then Triton declares none



@triton.jit
def take_ticket(sync_ptr, total, PHASE: tl.constexpr, RESIDENT: tl.constexpr):
    """This program's ticket: start order in the cooperative launch (PHASE 0), else its program id
    (also in PHASE 0 with RESIDENT, a launch whose programs CUDA runs all at once, so that start
    order cannot matter and the ticket's atomic round trip before the first load is saved).

    sync_ptr[0] counts tickets; the holder of the last one (total - 1) sets it back to 0."""
    if PHASE == 0 and not RESIDENT:
        ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
        tl.store(sync_ptr, 0, mask=ticket == total - 1)
    else:
        ticket = tl.program_id(0)
    return ticket


@triton.jit
def low_bits(x):
    """A float32's bits as the low half of an int64 (high half 0)."""
    return x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF


@triton.jit
def pack_pair(lo, hi):
    """One 64-bit word holding two float32 values' bits: ``lo`` in the low half, ``hi`` in the high
    half (little-endian, so the word reads back as the floats pair[0] = lo, pair[1] = hi)."""
    return (low_bits(hi) << 32) | low_bits(lo)


@triton.jit
def unpack_pair(v):
    """The two float32 values of pack_pair's words ``v``: (low half, high half)."""
    lo = (v & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    hi = (v >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def publish_word(ws_ptr, ticket, word, PHASE: tl.constexpr):
    """Write this program's ``word`` (never 0) to its slot: ws_ptr, the float32 workspace read as
    int64, one word a program, all 0 when a launch starts (PHASE 0: a relaxed exchange, so that
    the word is written whole for the polls of row_words; else a store)."""
    words = ws_ptr.to(tl.pointer_type(tl.int64))
    if PHASE == 0:
        tl.atomic_xchg(words + ticket, word, sem="relaxed")
    else:
        tl.store(words + ticket, word)


@triton.jit
def row_words(ws_ptr, row, G, gs, WAIT: tl.constexpr):
    """The G words of a row over the chunk indices ``gs`` (0 .. BLOCK_G - 1, in the layout the caller
    wants; lanes at or past G read as 1). WAIT (the single launch): polled until none is 0.

    That is the whole exchange: no barrier counter, no fence. A word carries its partial itself, so
    it is read whole (a relaxed 64-bit exchange against volatile 64-bit loads) and is valid once
    non-zero, where a counter barrier with release/acquire atomics would add its own round trips after
    the row's last arrival. The words go back to 0 through depart."""
    words = ws_ptr.to(tl.pointer_type(tl.int64)) + row * G + gs
    if WAIT:
        v = poll_words(words, gs < G)
        missing = tl.sum((v == 0).to(tl.int32), axis=0)
        while missing > 0:
            v = poll_words(words, gs < G)
            missing = tl.sum((v == 0).to(tl.int32), axis=0)
        # Where the layout holds a lane in several threads (BLOCK_G under the program's threads), each copy polls
        # on its own and the reduction may take its count from one copy only (triton 3.9 does: two warps' counts
        # share one shared-memory slot), so the loop can end while another copy still holds a 0. A lane still at 0
        # looks once more: its word is non-zero by now (a copy saw it so; words leave 0 once a launch).
        v = tl.where(v == 0, poll_words(words, (gs < G) & (v == 0)), v)
    else:
        v = tl.load(words, mask=gs < G, other=1)
    return v


@triton.jit
def poll_words(words, mask):
    """One look at the words (masked lanes 1) that sees other programs' latest writes: a volatile
    load on NVIDIA (ld.volatile, served by L2); on AMD a relaxed atomic add of 0, since Triton
    gives a volatile load there no cache-coherence bits (compiled for gfx90a/gfx942: a plain
    buffer_load, which a CU's L1 may answer with a stale line forever). LLVM may lower the add of 0
    to a device-scope atomic load, which has the bits (triton 3.6 on gfx90a and gfx1100: glc)."""
    if is_hip():
        v = tl.where(mask, tl.atomic_add(words, 0, mask=mask, sem="relaxed"), 1)
    else:
        v = tl.load(words, mask=mask, other=1, volatile=True)
    return v


@triton.jit
def zero_word(sync_ptr):
    """sync_ptr[1], an int32 that is always 0 (nothing writes it), for depart's operand; loaded
    before the word is published, so that it has arrived by the time depart needs it."""
    return tl.load(sync_ptr + 1)


@triton.jit
def depart(ws_ptr, sync_ptr, row, G, gs, after, zero, PER_WORD: tl.constexpr):
    """The single launch's way out of the exchange, called right after the combine.

    The count must not leave before this program's loads of the words (row_words) have returned,
    or the last departer could zero a word that someone still polls. Its operand, 1 + (the bits of
    ``after`` & ``zero``), depends on every word read (``after``: a float32 the caller combined from
    them) and on ``zero`` (zero_word), whose value no compiler knows, so the dependence cannot be
    folded away: no fence is needed for it.

    PER_WORD 0: one count a program on the row's counter (sync_ptr[2 + row]); the row's last
    departer zeroes the row's words and the counter for the next launch, which the kernel boundary
    orders before it. Triton hands a scalar atomic's result to every thread through shared memory
    behind a barrier, so the program waits one L2 round trip here, before its output stores.
    PER_WORD 1: lane g counts this program out of word g (its reader counter sync_ptr[2 + row * G
    + g]), one tensor atomic a lane; with BLOCK_G >= the program's threads (CoopLaunch) no lane is
    replicated, so each thread keeps its own results and nothing waits for them until
    finish_departure, after the stores. G atomics a program instead of 1: worth it for rows of a few chunks
    (per_word_departure), not where G is in the hundreds. Returns what finish_departure takes (the counts
    seen)."""
    one = 1 + (after.to(tl.int32, bitcast=True) & zero)
    if PER_WORD:
        seen = tl.atomic_add(sync_ptr + 2 + row * G + gs, gs * 0 + one, mask=gs < G, sem="relaxed")
    else:
        count_ptr = sync_ptr + 2 + row
        if tl.atomic_add(count_ptr, one, sem="relaxed") == G - 1:
            words = ws_ptr.to(tl.pointer_type(tl.int64))
            tl.store(words + row * G + gs, (gs * 0).to(tl.int64), mask=gs < G)
            tl.store(count_ptr, 0)
        seen = gs * 0
    return seen


@triton.jit
def finish_departure(ws_ptr, sync_ptr, row, G, gs, seen, PHASE: tl.constexpr, PER_WORD: tl.constexpr):
    """The end of a PER_WORD departure, at the end of the kernel: the last reader of word g (``seen``
    == G - 1 in lane g) zeroes the word and its counter. Nothing to do otherwise."""
    if PHASE == 0 and PER_WORD:
        if G > 1:
            last = (gs < G) & (seen == G - 1)
            words = ws_ptr.to(tl.pointer_type(tl.int64))
            tl.store(words + row * G + gs, (gs * 0).to(tl.int64), mask=last)
            tl.store(sync_ptr + 2 + row * G + gs, gs * 0, mask=last)


@triton.jit
def _max_sum_of(v, gs, G):
    m_g, s_g = unpack_pair(v)
    return combine_max_sum(tl.where(gs < G, m_g, NEG_INF), tl.where(gs < G, s_g, 0.0))


@triton.jit
def _sum_of(v, gs, G):
    part_g, _ = unpack_pair(v)
    return tl.sum(tl.where(gs < G, part_g, 0.0), axis=0)


@triton.jit
def exchange_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, PHASE: tl.constexpr, PER_WORD: tl.constexpr):
    """The row's (max, sum) from this program's chunk partial (m, s). The word exchanged is
    pack_pair(m, s), never 0 (s >= 1 when m is finite, as the chunk's max adds exp(0); m = -inf,
    +inf or NaN has non-zero bits): publish_word, row_words, depart. PHASE 1 only publishes and
    returns (m, s); PHASE 2 only combines (m and s are not read; CoopLaunch zeroes the words after
    it). A one-chunk row (G == 1) in the single launch returns (m, s) as they are: no workspace, no
    exchange (smem's one-chunk rows). Also returns the counts depart saw, for
    finish_departure (PER_WORD: see depart)."""
    seen = gs * 0
    if PHASE == 0:
        if G > 1:
            zero = zero_word(sync_ptr)
            publish_word(ws_ptr, ticket, pack_pair(m, s), PHASE)
            m, s = _max_sum_of(row_words(ws_ptr, row, G, gs, True), gs, G)
            seen = depart(ws_ptr, sync_ptr, row, G, gs, s, zero, PER_WORD)
    elif PHASE == 1:
        publish_word(ws_ptr, ticket, pack_pair(m, s), PHASE)
    else:
        m, s = _max_sum_of(row_words(ws_ptr, row, G, gs, False), gs, G)
    return m, s, seen


@triton.jit
def exchange_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, PHASE: tl.constexpr, PER_WORD: tl.constexpr):
    """The backward's row sum from this program's partial sum, as exchange_max_sum; the word holds
    the sum's bits in its low half and 1 in its high half, which keeps it non-zero whatever the sum."""
    seen = gs * 0
    if PHASE == 0:
        if G > 1:
            zero = zero_word(sync_ptr)
            publish_word(ws_ptr, ticket, low_bits(part) | (1 << 32), PHASE)
            part = _sum_of(row_words(ws_ptr, row, G, gs, True), gs, G)
            seen = depart(ws_ptr, sync_ptr, row, G, gs, part, zero, PER_WORD)
    elif PHASE == 1:
        publish_word(ws_ptr, ticket, low_bits(part) | (1 << 32), PHASE)
    else:
        part = _sum_of(row_words(ws_ptr, row, G, gs, False), gs, G)
    return part, seen


@triton.jit
def row_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, started, PHASE: tl.constexpr, PER_WORD: tl.constexpr,
                CLUSTER: tl.constexpr, BLOCK_G: tl.constexpr):
    """The row's (max, sum) and the counts for finish_departure, from this program's chunk partial (m, s):
    with CLUSTER through the cluster's shared memory (cluster_max_sum; no departure), else through the
    workspace (exchange_max_sum). ``started``: cluster_arrive's result (0 without CLUSTER)."""
    if CLUSTER:
        m_r, s_r = cluster_max_sum(m, s, G, gs, started, BLOCK_G)
        seen = gs * 0
    else:
        m_r, s_r, seen = exchange_max_sum(ws_ptr, sync_ptr, ticket, row, G, m, s, gs, PHASE, PER_WORD)
    return m_r, s_r, seen


@triton.jit
def row_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, started, PHASE: tl.constexpr, PER_WORD: tl.constexpr,
            CLUSTER: tl.constexpr, BLOCK_G: tl.constexpr):
    """The backward's row sum and departure counts, as row_max_sum (cluster_sum or exchange_sum)."""
    if CLUSTER:
        red = cluster_sum(part, G, gs, started, BLOCK_G)
        seen = gs * 0
    else:
        red, seen = exchange_sum(ws_ptr, sync_ptr, ticket, row, G, part, gs, PHASE, PER_WORD)
    return red, seen


def max_chunks(device: DeviceInfo) -> int:
    """The most programs a row may have: the forward-progress argument needs G <= SM count."""
    return max(1, device.sm_count)


def has_clusters(device: DeviceInfo) -> bool:
    """The device runs CTA clusters that exchange through distributed shared memory: NVIDIA sm_90+."""
    return device.backend == "cuda" and device.sm_version >= CLUSTER_MIN_SM


def cluster_mode(config: LaunchConfig, G: int, device: DeviceInfo, two_phase: bool) -> bool:
    """Whether a single launch runs each row's G programs as one CTA cluster that exchanges through
    shared memory (exchange.py): asked for by the config (CLUSTER 1), on NVIDIA sm_90+, with G one of
    CLUSTER_SIZES and at least CLUSTER_MIN_WARPS warps (exchange.py finds its slots from Triton's
    shared memory symbol, which a kernel that uses no shared memory lacks)."""
    return (bool(dict(config.meta).get("CLUSTER")) and not two_phase and has_clusters(device) and G in CLUSTER_SIZES
            and config.num_warps >= CLUSTER_MIN_WARPS)


def per_word_departure(G: int, M: int, device: DeviceInfo, bounds: PerWord | None) -> bool:
    """Whether a single launch of a family that departs_per_word (smem) has its programs leave the
    exchange word by word (depart's PER_WORD), within the arch's measured ``bounds`` (launch_modes.PerWord;
    None: never): rows of min_chunks to max_chunks chunks, at least rows_per_sm rows an SM. Many rows of a few
    chunks gain from not waiting on one counter before their stores; with G in the tens or hundreds every program
    would add to G counters."""
    return (bounds is not None and bounds.min_chunks <= G <= bounds.max_chunks
            and M >= bounds.rows_per_sm * device.sm_count)


_scratch: dict = {}  # (device index, stream) -> (ws float32 view, sync int32 view, ws words, sync words)


def scratch(device: torch.device, ws_words: int, sync_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The workspace and the counters for a launch on ``device``'s current stream.

    One buffer per (device, stream), zeroed when made and grown when a launch needs more; every
    launch leaves it zeroed again (depart; CoopLaunch after two phases). Launches on one
    stream run one after another, so they can share it. During CUDA-graph capture a fresh buffer
    is made (its zero fill is captured too) and not kept."""
    if device.type == "cuda":  # a tensor's device: its index is always set
        key = (device.index, driver.active.get_current_stream(device.index))
    else:
        key = (device.type, 0)
    found = _scratch.get(key)
    if found is not None and found[2] >= ws_words and found[3] >= sync_words:
        return found[0], found[1]
    ws_cap = max(ws_words, 2 * (found[2] if found else 0), 4096)
    ws_cap = -(-ws_cap // 4) * 4  # the counters start 16-byte aligned
    sync_cap = max(sync_words, 2 * (found[3] if found else 0), 1024)
    buf = torch.zeros(ws_cap + sync_cap, device=device, dtype=torch.float32)
    views = (buf[:ws_cap], buf[ws_cap:].view(torch.int32), ws_cap, sync_cap)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _scratch[key] = views
    return views[0], views[1]


def release_scratch() -> None:
    """Drop every kept buffer (the next launch on a stream makes a new zeroed one)."""
    _scratch.clear()


SLOT_BYTES = tl.constexpr(8)  # one (float32, float32) pair a program (the PTX below says 8 too)
MBAR_BYTES = 8  # the program's mbarrier, past its slots


def cluster_smem_bytes(block_g: int) -> int:
    """The dynamic shared memory a cluster launch adds past the compiled kernel's: BLOCK_G slots and the
    mbarrier that counts the bytes arriving in them."""
    return SLOT_BYTES.value * block_g + MBAR_BYTES


# The address of this program's mbarrier (the last MBAR_BYTES of its dynamic shared memory).
_MBAR = f"""
    mov.u32 %tsm_dyn, %dynamic_smem_size;
    mov.b32 %tsm_mbar, global_smem;
    add.u32 %tsm_mbar, %tsm_mbar, %tsm_dyn;
    sub.u32 %tsm_mbar, %tsm_mbar, {MBAR_BYTES};
"""

# Thread 0 initialises the mbarrier (one arrival expected: its own, with the bytes to come); the fence makes
# that visible to the cluster before the relaxed arrive that tells the others this program has started.
_ARRIVE = tl.constexpr("""
    {
    .reg .pred %tsm_p;
    .reg .b32 %tsm_dyn, %tsm_mbar, %tsm_t;
""" + _MBAR + """
    mov.u32 %tsm_t, %tid.x;
    setp.eq.u32 %tsm_p, %tsm_t, 0;
    @%tsm_p mbarrier.init.shared::cta.b64 [%tsm_mbar], 1;
    fence.mbarrier_init.release.cluster;
    barrier.cluster.arrive.relaxed.aligned;
    mov.u32 $0, 0;
    }
""")

# $0: out (0, for ordering), $1/$2: the pair, $3: the cluster size G, $4: the slots' bytes. After the
# cluster wait (every program has started, its mbarrier initialised), thread 0 arms this program's
# mbarrier for G pairs' bytes, thread t < G sends the pair into slot %cluster_ctarank of program t with
# st.async, which counts its bytes on program t's mbarrier, and every thread waits until this program's
# mbarrier has seen its G pairs (acquire, cluster scope): one-way stores, no barrier round trip.
_PUBLISH = tl.constexpr("""
    {
    .reg .pred %tsm_p, %tsm_q;
    .reg .b32 %tsm_dyn, %tsm_mbar, %tsm_base, %tsm_t, %tsm_k, %tsm_a, %tsm_m, %tsm_x;
""" + _MBAR + """
    sub.u32 %tsm_base, %tsm_mbar, $4;
    mov.u32 %tsm_t, %tid.x;
    setp.lt.u32 %tsm_p, %tsm_t, $3;
    setp.eq.u32 %tsm_q, %tsm_t, 0;
    shl.b32 %tsm_x, $3, 3;
    mov.u32 %tsm_k, %cluster_ctarank;
    mad.lo.u32 %tsm_a, %tsm_k, 8, %tsm_base;
    barrier.cluster.wait.aligned;
    @%tsm_q mbarrier.arrive.expect_tx.shared::cta.b64 _, [%tsm_mbar], %tsm_x;
    @%tsm_p mapa.shared::cluster.u32 %tsm_a, %tsm_a, %tsm_t;
    @%tsm_p mapa.shared::cluster.u32 %tsm_m, %tsm_mbar, %tsm_t;
    @%tsm_p st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%tsm_a], {$1, $2}, [%tsm_m];
    TSM_WAIT_${:uid}:
    mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 %tsm_p, [%tsm_mbar], 0;
    @!%tsm_p bra TSM_WAIT_${:uid};
    mov.u32 $0, 0;
    }
""")

# $0/$1: slot i's pair, $2: i, $3: the slots' bytes.
_READ = tl.constexpr("""
    {
    .reg .b32 %tsm_dyn, %tsm_mbar, %tsm_base;
""" + _MBAR + """
    sub.u32 %tsm_base, %tsm_mbar, $3;
    mad.lo.u32 %tsm_base, $2, 8, %tsm_base;
    ld.shared.v2.f32 {$0, $1}, [%tsm_base];
    }
""")


@triton.jit
def cluster_arrive():
    """The kernel's first step in cluster mode: thread 0 initialises this program's mbarrier, then the
    program says it has started (a relaxed cluster arrive; cluster_exchange waits on it before its
    remote stores). Returns 0, for ordering."""
    return tl.inline_asm_elementwise(_ARRIVE, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_exchange(a, b, G, gs, started, BLOCK_G: tl.constexpr):
    """Every program's pair of the cluster, over the lanes ``gs`` (0 .. BLOCK_G - 1): this program's
    float32 pair (a, b) goes into slot ``%cluster_ctarank`` of each of the G programs' shared memory
    (thread t < G sends program t's, counted on program t's mbarrier), this program waits until its own
    mbarrier has counted G pairs, then lane i reads slot i here.
    Lanes at or past G read slots nobody wrote: the caller masks them. ``started``: cluster_arrive's
    result (ties the order). Once a launch: the wait is for the mbarrier's first phase (parity 0).
    Returns (a_i, b_i) as BLOCK_G-lane float32 tensors."""
    slots = BLOCK_G * SLOT_BYTES
    done = tl.inline_asm_elementwise(_PUBLISH, "=r,f,f,r,r", [a, b, G + started, slots], dtype=tl.int32,
                                     is_pure=False, pack=1)
    return tl.inline_asm_elementwise(_READ, "=f,=f,r,r", [gs + done, slots], dtype=(tl.float32, tl.float32),
                                     is_pure=False, pack=1)


@triton.jit
def cluster_max_sum(m, s, G, gs, started, BLOCK_G: tl.constexpr):
    """The row's (max, sum) from this program's chunk partial (m, s): cluster_exchange, then the G pairs
    combined (lanes at or past G masked)."""
    m_g, s_g = cluster_exchange(m, s, G, gs, started, BLOCK_G)
    return combine_max_sum(tl.where(gs < G, m_g, float("-inf")), tl.where(gs < G, s_g, 0.0))


@triton.jit
def cluster_sum(part, G, gs, started, BLOCK_G: tl.constexpr):
    """The backward's row sum from this program's partial sum: cluster_exchange, then the G sums added."""
    part_g, _ = cluster_exchange(part, 0.0, G, gs, started, BLOCK_G)
    return tl.sum(tl.where(gs < G, part_g, 0.0), axis=0)
