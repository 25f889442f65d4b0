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

from ._common import exp

NEG_INF = tl.constexpr(float("-inf"))

SLOT_BYTES = 8  # one (float32, float32) pair a program

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
def cluster_publish(a, b, G, started, BLOCK_G: tl.constexpr):
    """This program's float32 pair (a, b) into slot ``%cluster_ctarank`` of each of the cluster's G
    programs' shared memory (thread t < G writes program t's), then one cluster barrier: after it
    every slot below G holds its program's pair. ``started``: cluster_arrive's result (ties the
    order). Returns 0, for cluster_slot's order."""
    return tl.inline_asm_elementwise(_PUBLISH, "=r,f,f,r,r", [a, b, G + started, BLOCK_G * 8], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def cluster_slot(i, done, BLOCK_G: tl.constexpr):
    """Slot i's pair, read from this program's shared memory (``done``: cluster_publish's result)."""
    return tl.inline_asm_elementwise(_READ, "=f,=f,r,r", [i + done, BLOCK_G * 8], dtype=(tl.float32, tl.float32),
                                     is_pure=False, pack=1)


@triton.jit
def cluster_max_sum(m, s, G, started, BLOCK_G: tl.constexpr):
    """The row's (max, sum) from the G programs' (chunk max, sum of exp(z - chunk max)) pairs. Each
    thread reads the slots and combines them itself (scalars, no reduction across threads)."""
    done = cluster_publish(m, s, G, started, BLOCK_G)
    m_r = NEG_INF
    for i in tl.static_range(BLOCK_G):
        m_i, _ = cluster_slot(i, done, BLOCK_G)
        m_r = tl.maximum(m_r, tl.where(i < G, m_i, NEG_INF))
    s_r = 0.0
    for i in tl.static_range(BLOCK_G):
        m_i, s_i = cluster_slot(i, done, BLOCK_G)
        s_r += tl.where((i < G) & (m_i != NEG_INF), s_i * exp(m_i - m_r), 0.0)
    return m_r, s_r


@triton.jit
def cluster_sum(part, G, started, BLOCK_G: tl.constexpr):
    """The row's sum of the G programs' partial sums (cluster_max_sum's exchange, one value a slot)."""
    done = cluster_publish(part, 0.0, G, started, BLOCK_G)
    red = 0.0
    for i in tl.static_range(BLOCK_G):
        p_i, _ = cluster_slot(i, done, BLOCK_G)
        red += tl.where(i < G, p_i, 0.0)
    return red
