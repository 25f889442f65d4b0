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
from .config import LaunchConfig, n_bucket, next_power_of_2
from .device import DeviceInfo, device_info
from .kernels import ALL_FAMILY_NAMES, backward_family, family, gluon_available
from .kernels._common import chunks, heuristic_warps, row_tail
from .layout import ALIGN_BYTES, whole_vectors

IMPLS = ("auto",) + ALL_FAMILY_NAMES

# A fused row lives in registers (fp32, whatever the input dtype). Leaving room for this many
# programs per SM keeps enough loads in flight; with 64K registers per SM it allows rows up to
# 16384 elements. Set from the first H200 run (bench/NOTES.md): fused beats online up to 16K.
FUSED_PROGRAMS_PER_SM = 4
# A forward over many rows still gains from one program per row at half that (one 16-warp program
# an SM holding 32K fp32 values): H200 4096x32768 fp32 fused 4053 GB/s against coop 3873 and
# online 2822, bf16 3060 / 3005 / 2830 (bench/NOTES.md, session 3). The backward holds two rows:
# two 16-bit rows are one fp32 row's bytes (bf16 4096x32768 backward fused 4045 against coop
# 3412), two fp32 rows are too many (fp32 fused 3303 against coop 4173).
FUSED_MANY_ROWS_PROGRAMS_PER_SM = 2
# Fewer rows than this many per SM leave most of the GPU idle with one program per row: spread
# each row over many programs instead. H200 design table: online (one program a row) reaches
# 0.03-0.31x the best peer at 1..32 rows of 131072..8M elements.
FEW_ROWS_PER_SM = 2
# The coop family keeps a row's chunks in registers while the row's programs wait for each other.
# Few rows go to it when all their programs fit on the GPU at once (COOP_RESIDENT_PER_SM programs
# of up to COOP_CHUNK elements per SM), and in fp32 whenever a row is read once (H200, session 3,
# bench/results/h200/sweep-fwd/: 8/16/32x1M coop 2168/2350/2474 GB/s against split's 1965/2132
# before; 64/128x131072 2250/2749 against 2017/2152; 32x152064 2017 against 1877). 16-bit forward
# chunks hold half the bytes for the same waiting, and split's two launches win there (bf16 16/32x1M
# split 1942/2072 against coop 1600/1848); the 16-bit backward holds two tensors and coop wins
# (session 4, sweep-bwd/: bf16 8/32x1M coop 2147/2736 against split 1892/2186, 128x131072 2586
# against 2055; fp16 alike). Many long rows go to it in every dtype, forward and
# backward, except 16-bit forward rows of up to 64K (ONLINE_16BIT_MAX_N); longer 16-bit rows tie
# with online (2816 against 2755 at 4096x262144 bf16, session 3). Used on CUDA only: the
# cooperative kernel has been measured on the H200 and never run on AMD.
COOP_PROGRAMS_PER_SM = 4
COOP_CHUNK = 8192
# "All on chip at once" counts what is really resident: the coop forward program (4 warps, one
# COOP_CHUNK chunk) compiles to 89-96 registers a thread on the H200, so 5 fit an SM. With 4, 16-bit
# 32x152064 went to split: 1302/1328 GB/s (bf16/fp16) against coop's 1473/1502 in the same run
# (bench/results/h200/peers/, session 5; probe8: 1330 against 1441).
COOP_RESIDENT_PER_SM = 5
# Many 16-bit rows of up to 64K elements (forward) run faster through online than through coop:
# online's second read, marked evict_last by its first, mostly comes from L2, and coop's 16-bit
# chunks stop near 3 TB/s whatever their size, warps or register cap (session 7, probe17/probe19:
# best 3006 GB/s at bf16 4096x65536). H200, session 6
# (bench/NOTES.md, coop-probe/probe12): bf16 512/1024/4096x65536 online 2507/2782/3107 GB/s
# against coop 2331/2615/2867, fp16 2473/2740/3086 against 2310/2572/2866; at 131072 coop is
# level or ahead (bf16 1024x131072 2726 against 2634, 4096x131072 2825 against 2886).
ONLINE_16BIT_MAX_N = 65536
# Rows that start off a 16-byte boundary (a row of N elements whose bytes are not a multiple of 16)
# run each family's realigned path (kernels/_common.row_window). The realigned fused kernel keeps
# its aligned speed up to 16K (H200, session 7, session7-probes/probe16.log, M = 4096: fp32
# 12345/16383 fused 3896/3926 GB/s against coop 3219/3522; bf16 fused 2877/3413 against online
# 2356/2980), but in the 32K bucket 16-bit rows run faster through online: bf16 20001/32767
# online 2686/3094 against fused 2116/2878, fp16 2829/3180 against 2248/3030 (fp32 stays fused:
# 32767 3996 against online 3240). Rows just past 16K that fused holds as half a block plus a tail
# (fused_held) stay fused: bf16 4096x16388 3651 against online's 2738, fp16 3594 / 2872
# (session22-probes/probe93.log). Dense rows (input and output contiguous, one element size) go to smem's odd-row
# form instead (smem_one_chunk_rows), its chunks cut so that the row's lead adds none (kernels/smem.balanced_config).
# H200, 4096 rows, kernel time, GB/s, smem against online (session34-probes/probe175-A.log): bf16 20001 3559 / 3085
# (one chunk of 10 x 2048), 32767 3771 / 3499 (two chunks of 9 x 2048 in a cluster); fp16 3742 / 3175, 3892 / 3580.
OFF_ALIGN_ONLINE_BUCKET = 32768
# Many rows longer than this go to the smem family (coop's launch, each chunk held in shared memory
# in the input dtype) when their layout lets it copy 16-byte vectors (smem_takes). H200, session 10
# (bench/results/h200/session10-probes/probe37.log, one process, GB/s, smem against the rule before it):
# bf16 4096x65536 3612 against online's 3170, 4096x262144 3620 against coop's 2889, 4096x50176 3079
# against online's 2965, 264x65536 2494 against online's 2220; fp32 4096x65536 3963 against coop's 3818,
# 264x65536 3114 against 2950 (fp32 4096x50176 a tie, 3732/3732). At 32768 rows stay fused (probe35:
# bf16 4096x32768 fused 3561, the shared-memory kernel 3529 before its arithmetic was cut).
SMEM_MIN_N = 32768
# Few 16-bit rows (forward) go to smem too once there are more elements than coop holds at once
# (coop_holds_all): there split read each element twice, and smem's 16-bit chunks read it once.
# H200, session 11 (bench/results/h200/session11-probes/probe39.log, probe40.log; one process, GB/s,
# smem against split): bf16 128x65536 2280 against 1824, 200x65536 2498 / 1966, 64x131072 2212 / 1820,
# 32x262144 2194 / 1816, 128x262144 2883 / 2196 (fp16 alike). Under that size coop stays ahead
# (probe38: bf16 8x131072 coop 542, smem 435; 4x1048576 1372 / 1355; 32x152064 1498 / 1415).
# The 16-bit backward of rows longer than SMEM_MIN_N goes to smem too, few rows or many (dy and y
# chunks held in shared memory in their dtype, against coop's fp32 registers). H200, session 12
# (bench/results/h200/session12-probes/probe47.log, one process, GB/s, smem against coop's backward):
# bf16 4096x65536 4080 against 3592, fp16 4108 / 3584, bf16 4096x262144 4147 / 3675, 512x131072
# 3656 / 3359, 32x152064 2037 / 1659, 8x131072 777 / 700.
# cp.async, which the smem kernels copy with, came with sm_80.
SMEM_MIN_SM = 80
# Rows in the SMEM_FP32_MIN_N bucket or longer: the fp32 backward goes to smem, few rows or many, unless coop
# holds every program at once and reads each element once (coop_holds_all and not coop_rereads).
# H200, session 13 (bench/results/h200/session13-probes/probe54.log, probe52.log; one process, GB/s,
# smem against the rule before it, coop or split): 2048x524288 4049 against 3574, 512x524288 3991 /
# 3565, 64x524288 3521 / 3294, 32x524288 3128 / 2930, 512x1048576 3670 / 3314, 32x1048576 3329 / 2873,
# 2x1048576 2166 / 1804, 1x1048576 1467 / 1119, 2x524288 1492 / 1375, 32x2097152 2711 / 2450,
# 1x2097152 2155 / 1866 (split 1900). Where coop holds everything and reads once it stays ahead or
# level (4x1048576 coop 2390, smem 2241; 8x524288 2401 / 2286; 4x524288 2103 / 2108), and so it does
# for shorter rows (4096 down to 1 rows of 65536-262144: smem within -4 % to +6 % of coop, e.g.
# 2048x262144 4181 / 4228, 8x131072 1448 / 1484). Since session 36 coop's heuristic holds one or two rows of the
# 512K bucket in 4096-element chunks where it re-read 1024-2048-element ones (coop._chunk), and its held backward
# leads smem's by 1-2 % there (session36-probes/probe190-G.log: fp32 1x524288 4.39 / 4.48 us, 2x524288 5.76 / 5.82).
# Few fp32 rows of this bucket or longer go to smem in the forward too, once they hold more than
# SMEM_FP32_FEW_ROWS_BEYOND times what coop holds at once (10.8M elements on the H200). H200, session 13
# (session13-probes/probe55.log, one process, GB/s, smem against the rule before it, coop or split):
# 32x524288 2800 / 2626, 128x524288 3602 / 3189, 16x1048576 2741 / 2583, 64x1048576 3483 / 2870,
# 8x2097152 2617 / 2443, 64x2097152 3468 / 2593, 200x2097152 3578 / 2564. At 8M elements coop or
# split stays ahead (16x524288 coop 2437 against smem's 2233, 8x1048576 2367 / 2169, 4x2097152 split
# 2257 / 2093), and below 512K smem gains at most 4 % (200x131072 3248 / 3116). Rows of the 4M bucket
# (one 128 KB chunk an SM) were not measured and stay split.
SMEM_FP32_MIN_N = 524288
SMEM_FP32_FEW_ROWS_BEYOND = 2
SMEM_FP32_FEW_ROWS_MAX_N = 2097152
# Few fp32 rows of the SMEM_FP32_CLUSTER_MIN_N to SMEM_FP32_CLUSTER_MAX_N buckets that hold more than coop does at once
# (coop then runs ticketed, in waves) go to smem in the forward, each row SMEM_FP32_CLUSTER_CHUNKS chunks (fewer where
# 1024-element copy groups cover it in fewer) in one CTA cluster, 4 warps (smem_fp32_cluster_config). H200, session 32
# (session32-probes/probe165.log, probe164.log; one process a shape, kernel time, GB/s, against auto before, coop):
# 40x152064 3159 / 2419, 64x152064 3609 / 2614, 128x152064 3880 / 2978, 256x152064 4035 / 3297, 100x65536 3461 /
# 2727, 256x65536 3892 / 3424, 64x262144 3315 / 3107, 200x262144 3838 / 3639, 160x100000 (14 chunks) 3844 / 3656,
# and level where coop already ran clusters (64x131072 3576 / 3455, 128x128256 3879 / 3818, 256x131072 4053 / 4032).
# Other G and 8 warps: within 3 % of it or behind, save the 262144 bucket's 8 warps (+1-4 %) and 256x65536's 8
# chunks of 8192 (+1.7 %). Where coop holds the rows at once it stays: 32x152064 smem 0.97-1.04 x coop (probe164),
# 16x152064 0.87-0.95.
# The backward takes the same chunks for dy and y where they come to at most SMEM_FP32_CLUSTER_BWD_MAX_CHUNK elements
# (two 40 KB chunks a program; session32-probes/probe169.log, against coop-bwd: 100x65536 3640 / 2925, 256x65536 4018
# / 3588, 64x131072 3656 / 3522, 40/64/128x152064 (10240) 1.02/1.06/1.05x; 64 and 200 rows of 262144 (16384, one
# program an SM) 0.93/0.95x).
# Many fp32 rows (backward) of those buckets, up to SMEM_FP32_CLUSTER_CHUNKS chunks of SMEM_FP32_CLUSTER_BWD_MAX_CHUNK,
# go to smem-bwd in cluster mode too (coop-bwd runs them ticketed), in chunks of SMEM_FP32_MANY_ROWS_BWD_CHUNK elements,
# or in SMEM_FP32_CLUSTER_CHUNKS where that takes more. H200, session 34, 4096 rows, kernel time, GB/s, against coop-bwd
# (session34-probes/probe177-F.log): 50257 (odd) 4383 / 3521, 50264 4379 / 4105, 65536 4381 / 4293, 100352 (13 chunks)
# 4405 / 4214, 151936 (15 of 10240) 4364 / 4175; chunks of 15-16K (two 60-64 KB chunks a program) lost: 151936 in
# 10 chunks 0.75 x, 262144 in 16 0.93 x.
SMEM_FP32_MANY_ROWS_BWD_CHUNK = 8192
SMEM_FP32_CLUSTER_MIN_N = 65536
SMEM_FP32_CLUSTER_MAX_N = 262144
SMEM_FP32_CLUSTER_CHUNKS = 16
SMEM_FP32_CLUSTER_BLOCK = 1024
SMEM_FP32_CLUSTER_WARPS = 4
SMEM_FP32_CLUSTER_BWD_MAX_CHUNK = 10240
# Few fp32 rows past the 131072 bucket that coop holds at once, but in more of its COOP_CHUNK chunks than a cluster
# takes (G > 16: coop runs them resident or ticketed, exchanging through the workspace), go to the same clusters from
# SMEM_FP32_CLUSTER_HELD_SHARE (forward; backward SMEM_FP32_CLUSTER_HELD_SHARE_BWD) of what coop holds at once, in
# chunks of at most SMEM_FP32_CLUSTER_HELD_SHARE_MAX_CHUNK elements. H200, session 35 (session35-probes/; one process
# a shape, kernel time, GB/s, through auto against coop as auto ran it before). Forward (probe180-D.log): 32x152064
# 2859 / 2726, 24x152064 2578 / 2531, 20x152064 2436 / 2338, 18x152064 2258 / 2222, 28x135000 2783 / 2503,
# 20x140004 2415 / 2238, 32x163840 2946 / 2936; not 16x152064 (coop's 16-row entry, one-warp programs: 0.973x in
# probe179-C.log), 24x200000 (chunks of 13 x 1024: 1.007x), 20x262144 (16 x 1024: 0.902x). Backward (probe182-F.log,
# against coop-bwd): where coop-bwd runs ticketed, 32x152064 2975 / 2708, 24x152064 2781 / 2440, 28x135000 3088 /
# 2425, 32x163840 3058 / 2774; where it still runs resident it leads: 20x152064 0.921x, 18x152064 0.908x
# (20x140004 1.018x), hence the higher share. Its 64-row entry (4096-element chunks, 2 warps) stops running resident
# past ~790 programs (probe183-G.log: 21x152064, 798 programs, ticketed, smem-bwd 1.144x; 22/23 rows 1.123/1.134x):
# 0.58 of coop's hold (3.14M elements) puts 21 rows of 152064 (3.19M) on smem-bwd and 20 (3.04M), or 22 of 140004
# (3.08M: 770 programs), on coop-bwd.
SMEM_FP32_CLUSTER_HELD_SHARE = 0.5
SMEM_FP32_CLUSTER_HELD_SHARE_BWD = 0.58
SMEM_FP32_CLUSTER_HELD_SHARE_MAX_CHUNK = 10240
# Many 16-bit rows longer than SMEM_ONE_CHUNK_MIN_N, up to the FWD/BWD maxima, go to smem with the
# whole row one chunk (kernels/smem._heuristic): one program a row holds it in shared memory and,
# with nothing to exchange, skips the workspace and the exchange (whose wait probe57/58 put at
# ~3.3 us of a ~13 us program with session 13's counter barrier). H200, session 13
# (session13-probes/probe59.log, one process, GB/s, M = 4096, smem against fused): forward bf16
# 16384 3707 / 3628, 32768 3856 / 3747; fp16 16384 3697 / 3579,
# 32768 3863 / 3652; backward bf16 16384 4020 / 3897, fp16 4038 / 3896. Fused stays ahead at 8192
# (forward bf16 3561 against 3418, backward 3811 / 3764), for the 16-bit backward of 32768 (a 32K
# chunk of dy and y does not fit: two 16K chunks 4012 against 4074, before session 34 below) and in fp32
# (16384 3996 / 3884).
# The forward of the 16K bucket wants SMEM_ONE_CHUNK_16K_ROWS_PER_SM rows an SM (probe60.log, through
# auto, GB/s): 300 rows lose to fused (bf16 300x12000 1197 / 1331, 300x16384 1571 / 1656; fp16 alike),
# 1024 are level or ahead (bf16 1024x12000 2213 / 2256, 1024x16384 2917 / 2853; fp16 2341 / 2182,
# 2824 / 2699), 4096 ahead (bf16 4096x12000 3270 / 3097). The 32K-bucket forward and the backward are
# ahead from 300 rows on (bf16 300x32768 2065 / 1796, backward 300x16384 2194 / 2039).
SMEM_ONE_CHUNK_MIN_N = 8192
SMEM_ONE_CHUNK_16K_ROWS_PER_SM = 7
SMEM_ONE_CHUNK_FWD_MAX_N = 32768
# The 16-bit backward of the 32K bucket joined it in session 34 (two 16K chunks of dy and y in a cluster: smem-bwd's
# heuristic), at every row count measured, against fused-bwd, its RELOAD rows and its DENSE rows (H200, kernel time,
# GB/s, smem-bwd against auto before, session34-probes/probe176-B.log): bf16 4096x20000 4237 / 3867, 4096x24576
# 4259 / 4074, 4096x32000 4286 / 4119, 4096x32767 4283 / 3956, 4096x32768 4296 / 4151 (DENSE), 8192x32768 4336 /
# 4269 (DENSE), 1024x32000 4048 / 3660 (RELOAD), 512x32768 3837 / 3321 (RELOAD), 300x32000 3382 / 2731; fp16
# 4096x32000 4274 / 4129, 4096x32768 4297 / 4231, 1024x32000 4039 / 3686. RELOAD keeps the 16K block
# (RELOAD_OVER_SMEM_MAX_N). On GPUs without clusters (coop.has_clusters) the two chunks would exchange through the
# workspace, which session 13 measured behind fused (above): there the backward stops at
# SMEM_ONE_CHUNK_BWD_MAX_N_TICKETED.
SMEM_ONE_CHUNK_BWD_MAX_N = 32768
SMEM_ONE_CHUNK_BWD_MAX_N_TICKETED = 16384
RELOAD_OVER_SMEM_MAX_N = 16384
# The 16-bit backward that smem-bwd runs on its heuristic config takes coop's cluster mode (the row's G programs
# one CTA cluster, their partial sums through the cluster's shared memory: kernels/cluster.py) when a row has at
# most SMEM_BWD_CLUSTER_MAX_G chunks, or when all rows make at most SMEM_BWD_CLUSTER_MAX_PROGRAMS programs (and
# G is a cluster size, 2-16). H200, kernel time, the plan's config with and without it, one process
# (bench/results/h200/session27-probes/probe139.log), bf16/fp16: G 4: 4096x65536 +2.8/+1.9 %, 1024x65536
# +5.4/+3.9 %, 512x65536 +7.7/+7.7 %, 264x65536 +12.8/+11.8 %; 4096x40960 (G 4) +1.4/+1.5 %, 4096x50176 (G 5)
# +1.3/+1.7 %, 2048x100000 (G 7) +5.0/+5.3 %; G 8: 1024x131072 +0.5/+0.8 %, 4096x131072 -0.8/-0.5 %;
# G 16: 64x131072 +12.7/+10.6 %, 4096x262144 -3.5/-3.4 %. The forward in cluster mode lost at many rows
# (probe136.log: bf16 4096x65536 3845 against 4041 GB/s with the same config) and is not ruled in.
SMEM_BWD_CLUSTER_MAX_G = 7
SMEM_BWD_CLUSTER_MAX_PROGRAMS = 8192

# Many rows that the fused kernel holds as half a block plus a small tail (fused_held) run a one-row
# plain fused config with warps for HELD_VALUES_PER_THREAD values a thread of the held half, whatever
# the tuning table holds for the bucket (its entries were tuned on rows that fill the block). 16-bit
# rows so held leave smem's one-chunk rule: smem sizes its chunk on the N bucket (32K for 16392).
# H200, kernel time, GB/s (session20-probes/probe84.log, one process): bf16 4096x16392 forward fused
# 16 warps 3681 against smem 2494 and the bucket's pipelined entry 2255 (fp16 3646 / 2288 / 2207);
# fp32 16384x8200 forward 8 warps 4089 against the entry's 32 warps 4004; fp16 16384x4104 4 warps
# 4042 against 4025; backward level (bf16 16384x4104 4220 / 4220, fp32 4096x16392 16 warps 4258
# against 4214). The one loss: fp32 4096x16392 forward 4026 against 4048 (-0.5 %). Against smem
# (probe85.log): bf16 4096x8200 forward 3824 against 2430, 16384x8200 4133 / 2624, backward 4021 / 3486
# and 4303 / 3814 (fp16 alike); 4096x16896 (tail 512) 3668 / 2609. 16904 (no tail) stays with smem:
# fused's whole 32K block ran 2021 against smem's 2565. Rows off 16 bytes are held the same way since
# session 22 (the realigned path takes TAIL; session22-probes/probe93.log, auto's config with the tail
# against without, then the held config): forward bf16 16384x4100 4057 against 2862, 16384x8196 4110 (held,
# 8 warps) against 2300 (32 warps, no tail), 4096x16388 3651 against online's 2738; backward bf16 16384x4100
# 4202 / 3743, 16384x8196 4230 / 2639; fp32 4096x16385 forward 4067 / 3092, backward 4259 against coop's
# 3958. fp32 16384x4097 is level (4108 against 4168 forward without the tail, 4290 / 4306 backward).
# Blocks of 4096 and up (held 2048 + tail, 2 warps) since session 22 (session22-probes/probe94.log, probe100.log,
# auto against one row of 2 warps, kernel time, GB/s): forward bf16 65536x2052 3074 / 4179, 65536x2100 3113 / 4164,
# 16384x2056 2971 / 3896 (the 4K bucket's bf16 entry is a two-row 8-warp config), fp16 16384x2100 3673 / 3873;
# backward fp16 16384x2100 3816 / 4031, 65536x2060 4180 / 4333; fp32 and the rest within 0.7 % (fp32 65536x2049
# forward 4179 / 4151). Smaller blocks were not measured with this config.
HELD_VALUES_PER_THREAD = 32
HELD_MIN_BLOCK = 4096
# Many rows that fill their block (backward, CUDA, rows on 16-byte boundaries) run fused-bwd with RELOAD (the tile
# loaded evict_last for the sum and again evict_first for the write, as inductor's two-loop backward does) with the
# rows and warps RELOAD_ROW_CONFIGS gives for the block, held to RELOAD_MAX_REGISTERS registers a thread so that more
# programs fit an SM (reload_row_config), whatever the tuning table holds for the bucket. "Fill": at least
# (RELOAD_FILL_PARTS - 1) / RELOAD_FILL_PARTS of the block; "many": the table's element count or more in all (2^24;
# 16-bit: 12M for the 1K block, 10M for the 16K block, 2^25 for the 8K block), and for the 16-bit 32K block at most
# 3 x 2^24 (512 to 1536 rows of 32768). What the configs buy is programs an SM
# (two of 32 warps, four of 16), so the rule also asks for RELOAD_MIN_THREADS_PER_SM threads an SM (H100/H200 and A100
# have them; GPUs with 1536 do not); it was measured on the H200 only.
# H200, session 24, kernel time, us, RELOAD against auto (session24-probes/probe116.log, probe117.log, probe118.log;
# one process each):
# bf16/fp16 4096x16384 93.8/93.5 against smem-bwd's 96.3/96.3 (torch.compile 93.5/93.4), 4096x16000 91.5/91.4 against
# 93.9/94.0, 1024x16384 26.4/26.2 against 26.9/27.3; 16384x8192 183.5/184.2 against fused's 186.8/185.3, 4096x8192
# 48.9/48.9 against 50.1/49.4 (16 warps uncapped compile to 34 registers: 53.4); 65536x4096 364.2/361.6 against
# 370.7/370.3, 4096x4096 25.6/24.9 against 26.1/26.1; 65536x2048 181.8/182.0 against 185.5/185.9 (compile 182.1/181.4),
# 16384x2048 47.4/47.6 against 48.5/48.7; 65536x1024 91.8/92.0 against 94.8/94.5; fp32 65536x2048 365.5 against 369.7,
# 16384x4096 183.6 against 186.6. Where it lost or did not gain it is left out: rows that do not fill the block
# (bf16/fp16 4096x12000 70.9/69.9 against 71.7/71.8 but 1024x12000 20.9/20.5 against 20.6/20.8; 4096x9000 61.3/58.8
# against 55.0/55.1; 65536x1800 164.9/163.1 against 164.2/164.3; 65536x1500 150.9/146.4 against 137.7/138.0; 16384x3600
# with 16 warps 86.9/85.5 against 83.9/83.3); fewer elements (bf16/fp16 1024x8192 15.1/15.0 against 14.3/13.9,
# 4096x2048 14.0/13.7 against 13.6/13.7, 4096x1024 7.6/7.4 against 7.4/7.5, 300x16384 9.6/9.3 against 8.9/9.1); fp32
# rows of 8K and 16K (4096x8192 100.9 against 95.3; 4096x16384 190.7 against 187.8). Through auto, the plan with it
# against without (probe119.log), rows that are not powers of two and odd row counts just over the element counts:
# bf16/fp16 16801x1000 +2.6/+4.1 %, 8401x2000 +0.3/+0.5 %, 65535x2040 +2.2/+2.2 %, 4201x4000 -0.1/+0.4 %, 1100x15504
# +4.8/+2.9 %, 4097x16376 +6.8/+7.3 %; fp32 8401x2000 +0.1 %, 4201x4000 +1.4 %, 65536x1920 +0.9 %; 2100x8104
# -4.6/-3.2 %, hence 2^25 elements for the 8K block (4096x8192 above is 2^25). Under 2^24 (probe121.log, the rule
# forced on against without it): 1K block bf16/fp16 16384x1000 +1.6/+2.4 %, 12288x1000 +0.3/+2.5 %, 8192x1000
# -0.6/-0.6 %, 8192x1024 -2.8/-2.2 %, hence 12M (3 x 2^22); 16K block 800x16384 +4.4/+4.8 %, 800x16000 +3.6/+5.8 %,
# 600x16384 -0.1/+4.1 % (300 rows lost 3-7 %, probe 116), hence 10M (5 x 2^21, 640 rows of 16384).
# The 16-bit 32K block (session 25, session25-probes/probe124.log, the rule forced on against without it; auto without
# it runs fused-bwd w16): bf16/fp16 512x32768 +3.4/+2.6 %, 768x32768 +6.9/+2.7 %, 1024x32768 +4.8/+2.4 %, 1024x32000
# +5.0/+1.6 %; not taken: 300x32768 -6.5/-4.7 %, 4096x32768 -0.6/-0.6 %, 8192x32768 -1.0/-1.0 %, 4096x32000
# -0.7/-1.0 %, 2048x31000 -5.6/-1.5 % (2048x32768 +1.6/+1.5 % in probe 123, which the bound leaves out with it).
# Past the bound, contiguous rows of exactly 32768 (RowProblem.rows_dense) run the DENSE form (no mask, the row stride
# a constant; 37-38 registers uncapped on triton 3.6, one 1024-thread program an SM), probe125.log, us, bf16/fp16 DENSE
# against auto before and torch.compile: 2048 rows 101.1/100.0 against 104.4/102.4 and 102.2/100.6; 3072 147.0/144.6
# against 151.1/149.5 and 148.9/146.7; 4096 193.0/190.4 against 197.4/196.4 and 191.6/192.3; 8192 377.0/371.3
# against 387.0/383.9 and 377.5/374.5; 16384 742.0/732.5 against 758.0/759.3 and 745.0/740.0. (Capped at 32, DENSE
# spills and ran like the capped RELOAD config; at 512-1024 rows uncapped DENSE ran 2-4 % behind the capped config.)
# Between (probe126.log, the capped config against DENSE, bf16/fp16): 1025 rows +3.2/+1.5 %, 1280 +3.5/+0.5 %, 1536
# +3.0/+0.2 %, 1792 +1.0/-1.2 % (2048: -0.3/-0.7 %, probe 125), hence the bound at 3 x 2^24 (1536 rows of 32768).
# Rows of the 32K bucket short of the block: 32000 gains, 31000 loses, at every row count measured (1024 rows
# +5.0/+1.6 % and 2048 rows -5.6/-1.5 %, session 25; session26-probes/probe132.log, 1025/1280/1536 rows: 32000
# +2.9/+2.4/+1.2 % bf16, +2.2/+1.1/+0.2 % fp16; 31000 -5.6/-5.8/-6.0 % bf16, -1.4/-1.4/-1.7 % fp16), so that entry
# takes rows of 31/32 of the block or more (31744+) where the others take 15/16.
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

# 16-bit rows of this bucket so held run smem instead (smem_held_32k_rows): since session 21-22 smem cuts its
# chunks to the row and starts them on 128-byte lines (kernels/smem.balanced_config), which the session-20
# comparison above predates. H200, kernel time, GB/s, auto (fused held) against smem's heuristic config as a
# launch cuts it (session22-probes/probe96.log): forward bf16 4096x16392 3705 / 3783 (one chunk of 9 x 2048),
# fp16 3657 / 3838, bf16 4096x16896 3680 / 3847; backward (two chunks of 9K) bf16 4096x16392 3792 / 3925, fp16
# 3825 / 3953, bf16 4096x16896 2850 / 3974. In the 16K bucket fused stays ahead (bf16 4096x8200 forward
# 3788 / 3604, fp16 16384x8200 4118 / 4063, backward 4004 / 3955 and 4281 / 4262).
SMEM_HELD_BUCKET = 32768

# Few 16-bit rows of at most COOP_BWD_16BIT_CHUNKS_PER_SM x COOP_CHUNK elements an SM (backward) run
# coop's backward rather than smem's when coop-bwd has a tuned config for the shape: its tuned configs
# (one wide program an SM or fewer, 32-64 values a thread) exchange with fewer programs than smem-bwd.
# H200, session 18 (bench/results/h200/session18-probes/probe74.log, one process, kernel time, us, coop's
# tuned config against smem-bwd): bf16 8x131072 4.91 / 5.08, 4x262144 5.10 / 5.40, 1x524288 3.72 / 3.94,
# 16x65536 4.96 / 5.12; fp16 8x131072 4.84 / 5.11, 2x524288 4.40 / 4.53, 1x1048576 4.50 / 4.63; at 1M
# elements or fewer coop leads by 0.7-6.3 % (bf16 1x1048576 level, 4.59 / 4.58). At 2M elements the two
# are level (0.98-1.02) and 2x1048576 loses 12 % (6.73 / 5.91). Coop's heuristic config (4 warps of 8-16
# values a thread, four programs an SM) ties or trails smem-bwd at every shape of 1M elements or fewer
# (bf16 8x131072 5.29 against 5.08, fp16 1x1048576 5.65 against 4.63), so without a tuned entry the
# rows stay with smem.
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
    the kernel holds the row as half a block plus a tail (kernels/_common.row_tail; rows off 16-byte
    boundaries count their whole 16-byte groups, as the realigned path holds them), else the whole block.
    H200, kernel time: fp32 4096x16392 backward, held as 16384 + 8, fused 4205 GB/s against coop's 4039
    (session19-probes/probe82.log), 4241 against 4041 in the 'even' sweep (sweep-even-bwd-kernel-s19b);
    rows off 16 bytes (session22-probes/probe93.log): fp32 4096x16385 backward 4259 against coop's 3958."""
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
    from .kernels import coop

    fam = coop.BWD_FAMILY if s.backward else coop.FAMILY
    return fam.heuristic(s.device, s.M, s.N)["TILES"] > 1


def smem_copies(s: Shape) -> bool:
    """The smem kernels can copy these rows: NVIDIA sm_80+, a triton with Gluon, and rows on 16-byte
    boundaries along unit-stride columns (``aligned``) with N a whole number of 16-byte vectors, or
    (the kernels' odd-row form, kernels/smem.odd_rows_fit) ``dense`` rows of any length."""
    return (s.device.sm_version >= SMEM_MIN_SM and ((s.aligned and whole_vectors(s.N, s.dtype.itemsize)) or s.dense)
            and gluon_available())


def smem_takes(s: Shape) -> bool:
    """The smem family takes these long rows: longer than SMEM_MIN_N, ones it can copy (smem_copies),
    and short enough for one chunk per SM (kernels/smem.max_row; the backward holds two tensors' chunks)."""
    if not (s.N > SMEM_MIN_N and smem_copies(s)):
        return False
    from .kernels import smem

    return n_bucket(s.N) <= smem.max_row(s.device, held=2 if s.backward else 1)


def smem_one_chunk_rows(s: Shape) -> bool:
    """Many 16-bit rows of the 16K bucket (backward, and forward from SMEM_ONE_CHUNK_16K_ROWS_PER_SM rows
    an SM) or the 32K bucket that smem can copy: one chunk a row, no exchange (SMEM_ONE_CHUNK_MIN_N), or two in a
    cluster (the 32K backward, SMEM_ONE_CHUNK_BWD_MAX_N; rows the odd-row lead pushes past a chunk)."""
    from .kernels import coop, smem

    clusters = coop.has_clusters(s.device)
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
    # A forward odd row whose window (smem.odd_lead elements more) runs past the bucket takes a chunk more than the
    # bucket's config unless its chunks exchange in a cluster (session33-probes/probe172-D.log: bf16 4096x16383 in 3
    # chunks 0.95 x fused; session34-probes/probe176-B.log: in 2 chunks of a cluster 1.08 x).
    return s.aligned or s.backward or clusters or s.N + smem.odd_lead(s.dtype.itemsize) <= n_bucket(s.N)


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
    mode, for this N, where coop.cluster_mode allows it on the device (NVIDIA sm_90+); the backward only with chunks
    of at most SMEM_FP32_CLUSTER_BWD_MAX_CHUNK elements, and of few rows only rows on 16-byte boundaries (odd rows in
    smem's odd-row form: 64x100003 0.935 x coop-bwd, session33-probes/probe172-D.log). Else None."""
    from .kernels import coop

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
        if not (n_bucket(s.N) > COOP_CHUNK * max(coop.CLUSTER_SIZES) and not coop_holds_all(s, share)
                and tiles * SMEM_FP32_CLUSTER_BLOCK <= SMEM_FP32_CLUSTER_HELD_SHARE_MAX_CHUNK):
            return None
    if s.backward and (tiles * SMEM_FP32_CLUSTER_BLOCK > SMEM_FP32_CLUSTER_BWD_MAX_CHUNK or (few and not s.aligned)):
        return None
    config = LaunchConfig.make(SMEM_FP32_CLUSTER_WARPS, BLOCK=SMEM_FP32_CLUSTER_BLOCK, TILES=tiles,
                               BLOCK_G=next_power_of_2(g), CLUSTER=1)
    return config if coop.cluster_mode(config, chunks(s.N, dict(config.meta)), s.device, False) else None


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
    from .kernels import coop

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
    copy (smem_copies: dense rows, in its odd-row form; measured on the H200 with the chunks a lead adds in a cluster,
    ticketed they ran 0.83 x online: session34-probes/probe175-A.log)."""
    from .kernels import coop

    return (not s.aligned and not s.backward and s.device.backend == "cuda" and s.dtype.itemsize == 2
            and not few_rows(s) and n_bucket(s.N) == OFF_ALIGN_ONLINE_BUCKET and held_row_config(s) is None
            and not (smem_copies(s) and coop.has_clusters(s.device)))


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


def plan(impl: str, M: int, N: int, dtype: torch.dtype, out_dtype: torch.dtype,
         device: torch.device, backward: bool = False, aligned: bool = True, dense: bool = False) -> Plan:
    """The cached launch plan for one call shape (``impl`` already validated; ``aligned``: every
    row starts on a 16-byte boundary; ``dense``: input and output are contiguous rows, back to back, of one
    element size).
    The backward runs the backward kernel of the family the rules pick for it."""
    key = (impl, M, N, dtype, out_dtype, device, backward, aligned, dense)
    p = _plans.get(key)
    if p is None:
        info = device_info(device)
        name = choose(M, N, dtype, info, backward, aligned, dense).impl if impl == "auto" else impl
        if name == "fused":
            from .kernels.fused import check_row_length

            check_row_length(N)
        fam = backward_family(name) if backward else family(name)
        shape = Shape(M, N, dtype, info, backward, aligned, dense)
        ruled = ruled_config(name, shape)
        entry = None if ruled else stored(info, fam, dtype, N, M)
        config = ruled or (entry.config if entry else None)
        p = Plan(name, fam, config, info, config is not None)
        _plans[key] = p
    return p


def clear_cache() -> None:
    """Forget every cached decision and re-read the tuning tables on the next decision."""
    _plans.clear()
    tuning.forget()
