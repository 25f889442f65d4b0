"""The coop exchange through a CTA cluster's shared memory (NVIDIA sm_90+, inline PTX).

When a row's G chunks are the G programs (CTAs) of one cluster, launched together by the hardware,
each program writes its partial pair into slot ``rank`` of every program's shared memory
(``st.shared::cluster``), one cluster barrier (release/acquire) makes the G pairs visible, and each
program reads them from its own shared memory: no workspace in global memory, no polling, no
tickets. This is QuACK's exchange; Triton 3.6 has no words for it, so it is written as PTX.

The slots are the last ``SLOT_BYTES * BLOCK_G`` bytes of the program's dynamic shared memory, past
what the compiled kernel uses: the launch asks for that much more (``_common.PreparedLaunch``'s
cluster mode), and the PTX finds them from ``%dynamic_smem_size``, so no offset is compiled in.

The programs of a cluster must all have started before one writes into another's shared memory
(CUDA's rule for distributed shared memory): ``cluster_arrive`` (relaxed) at the kernel's start,
and the matching wait right before the remote stores. No program touches another's shared memory
after the exchange's barrier, so none has to wait for the others on its way out.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import combine_max_sum

SLOT_BYTES = tl.constexpr(8)  # one (float32, float32) pair a program (the PTX below says 8 too)

# The address of slot i of this program's own shared memory (the slots close the dynamic shared memory).
_SLOT_BASE = """
    mov.u32 %tsm_dyn, %dynamic_smem_size;
    mov.b32 %tsm_base, global_smem;
    add.u32 %tsm_base, %tsm_base, %tsm_dyn;
    sub.u32 %tsm_base, %tsm_base, {slots};
"""

_ARRIVE = tl.constexpr("""
    {
    barrier.cluster.arrive.relaxed.aligned;
    mov.u32 $0, 0;
    }
""")

# $0: out (0, for ordering), $1/$2: the pair, $3: the cluster size G, $4: the slots' bytes.
_PUBLISH = tl.constexpr("""
    {
    .reg .pred %tsm_p;
    .reg .b32 %tsm_dyn, %tsm_base, %tsm_t, %tsm_k, %tsm_a;
""" + _SLOT_BASE.format(slots="$4") + """
    mov.u32 %tsm_t, %tid.x;
    setp.lt.u32 %tsm_p, %tsm_t, $3;
    mov.u32 %tsm_k, %cluster_ctarank;
    mad.lo.u32 %tsm_a, %tsm_k, 8, %tsm_base;
    barrier.cluster.wait.aligned;
    @%tsm_p mapa.shared::cluster.u32 %tsm_a, %tsm_a, %tsm_t;
    @%tsm_p st.shared::cluster.v2.f32 [%tsm_a], {$1, $2};
    barrier.cluster.arrive.release.aligned;
    barrier.cluster.wait.acquire.aligned;
    mov.u32 $0, 0;
    }
""")

# $0/$1: slot i's pair, $2: i, $3: the slots' bytes.
_READ = tl.constexpr("""
    {
    .reg .b32 %tsm_dyn, %tsm_base;
""" + _SLOT_BASE.format(slots="$3") + """
    mad.lo.u32 %tsm_base, $2, 8, %tsm_base;
    ld.shared.v2.f32 {$0, $1}, [%tsm_base];
    }
""")


@triton.jit
def cluster_arrive():
    """The kernel's first step in cluster mode: this program has started (a relaxed cluster arrive;
    cluster_exchange waits on it before its remote stores). Returns 0, for ordering."""
    return tl.inline_asm_elementwise(_ARRIVE, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_exchange(a, b, G, gs, started, BLOCK_G: tl.constexpr):
    """Every program's pair of the cluster, over the lanes ``gs`` (0 .. BLOCK_G - 1): this program's
    float32 pair (a, b) goes into slot ``%cluster_ctarank`` of each of the G programs' shared memory
    (thread t < G writes program t's), then one cluster barrier, then lane i reads slot i here.
    Lanes at or past G read slots nobody wrote: the caller masks them. ``started``: cluster_arrive's
    result (ties the order). Returns (a_i, b_i) as BLOCK_G-lane float32 tensors."""
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
