"""The coop exchange through a CTA cluster's shared memory (NVIDIA sm_90+, inline PTX).

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

import triton
import triton.language as tl

from .row_ops import combine_max_sum

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
