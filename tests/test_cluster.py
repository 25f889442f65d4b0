"""The cluster mode of coop and smem (kernels/exchange.py): a row's G programs as one CTA cluster exchanging
their partials through each other's shared memory. The CPU checks the choice, the set-up and the PTX; the
GPU checks the results (a cluster launch cannot run under the interpreter)."""

import json

import pytest
import torch
from compile_scripts import run_compile_script
from conftest import DEVICE
from shipped_tables import sm90_launch_modes
from softmax_ref import assert_grad_close, assert_softmax_close, poisoned_like, random_input
from synthetic_devices import GFX942, SM75, SM89, SM90

from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import coop, exchange, gluon_available, launches, sizing, smem_launch
from tritonsoftmax.kernels.exchange import MBAR_BYTES, SLOT_BYTES
from tritonsoftmax.layout import matrix_problem, whole_vectors
from tritonsoftmax.policy import launch_modes, policy_for

needs_gluon = pytest.mark.skipif(not gluon_available(), reason="this triton has no Gluon with the NVIDIA backend")

FWD_FLAGS = {"LOG": 0, "ZERO_MASKED": 0}
LOG_REL = {torch.float32: 2e-6, torch.float16: 2**-10, torch.bfloat16: 2**-7}  # log_softmax: twice the rounding


def clustered(config: LaunchConfig) -> bool:
    return bool(dict(config.meta).get("CLUSTER"))


def cluster_config(N: int, block: int, warps: int = 8, device=SM90) -> LaunchConfig:
    return coop.shape_config(device, N, block, warps).with_meta(CLUSTER=1)


def smem():
    from tritonsoftmax.kernels import smem as module

    return module


def smem_cluster_config(N: int, chunk: int, block: int = 2048, warps: int = 4, device=SM90) -> LaunchConfig:
    """A smem config of ``chunk``-element chunks in ``block`` copy groups, in cluster mode, as a stored entry
    runs it for 16-bit rows (register_capped)."""
    config = coop.shape_config(device, N, block, warps, chunk // block).with_meta(CLUSTER=1)
    return smem_launch.register_capped(config, 2, 1, device)


# ---------------------------------------------------------------- the choice (CPU)

@pytest.mark.parametrize("G,device,two_phase,want", [
    (16, SM90, False, True), (8, SM90, False, True), (5, SM90, False, True), (2, SM90, False, True),
    (12, SM90, False, True), (9, SM90, False, True),  # non-portable sizes (allow_cluster)
    (1, SM90, False, False),  # one chunk: nothing to exchange
    (17, SM90, False, False), (32, SM90, False, False), (16, SM90, True, False),
    (16, SM89, False, False), (16, SM75, False, False), (16, GFX942, False, False)])
def test_cluster_mode_needs_sm90_a_single_launch_and_a_cluster_size(G, device, two_phase, want):
    assert exchange.cluster_mode(LaunchConfig.make(8, BLOCK=8192, CLUSTER=1), G, device, two_phase) is want
    assert exchange.cluster_mode(LaunchConfig.make(8, BLOCK=8192), G, device, two_phase) is False
    assert exchange.cluster_mode(LaunchConfig.make(1, BLOCK=8192, CLUSTER=1), G, device, two_phase) is False  # one warp


def test_search_space_offers_cluster_mode_where_a_row_makes_a_cluster():
    space = coop._configs(SM90, 8, 131072)
    offered = [c for c in space if clustered(c)]
    assert {c["BLOCK"] for c in offered} == {8192, 16384}  # 16 and 8 chunks; 4096 makes 32
    for c in offered:  # each beside the same config without it
        assert LaunchConfig.make(c.num_warps, **{k: v for k, v in c.meta if k != "CLUSTER"}) in space
    for device in (SM89, SM75, GFX942):
        assert not any(clustered(c) for c in coop._configs(device, 8, 131072))
    assert not any(clustered(c) for c in coop._configs(SM90, 8, 1024))  # one chunk a row


@needs_gluon
def test_smem_search_space_offers_cluster_mode_where_a_row_makes_a_cluster():
    for family, N in ((smem().FAMILY, 65536), (smem().BWD_FAMILY, 131072)):
        space = family.configs(SM90, 4096, N)
        offered = [c for c in space if clustered(c)]
        assert offered and all(2 <= sizing.chunks(N, dict(c.meta)) <= 16 for c in offered)
        for c in offered:
            assert LaunchConfig.make(c.num_warps, **{k: v for k, v in c.meta if k != "CLUSTER"}) in space
        plain = [c for c in space if not clustered(c)]
        assert len(offered) == sum(2 <= sizing.chunks(N, dict(c.meta)) <= 16 for c in plain)
        assert not any(clustered(c) for c in family.configs(SM89, 4096, N))


@needs_gluon
def test_smem_launch_keeps_the_per_word_departure_off_its_cluster_launch():
    """Many rows of 16 chunks take depart's PER_WORD in the ticketed launch; the cluster launch, which
    departs from nothing, does not."""
    x = torch.empty(4096, 131072, dtype=torch.bfloat16)
    launch = smem().FAMILY.prepare(matrix_problem(x, x), smem_cluster_config(131072, 8192), SM90, flags=FWD_FLAGS,
                                   two_phase=False, modes=sm90_launch_modes())
    assert launch._cluster.cluster == 16 and launch._cluster.config["CLUSTER"] == 1
    assert "PER_WORD" not in launch._cluster.flags
    assert launch.per_word and [p.flags["PER_WORD"] for p in launch.launches] == [1]
    assert [p.config["CLUSTER"] for p in launch.launches] == [0]


def test_coop_launch_prepares_the_cluster_launch_and_a_fallback():
    x = torch.empty(8, 131072)
    config = cluster_config(131072, 8192)
    launch = coop.FAMILY.prepare(matrix_problem(x, x), config, SM90, flags=FWD_FLAGS, two_phase=False)
    assert launch._cluster.cluster == 16 and launch._cluster.cluster_smem == SLOT_BYTES.value * 16 + MBAR_BYTES
    assert launch._cluster.config["CLUSTER"] == 1 and launch._cluster.flags["PHASE"] == 0
    # What runs should the driver refuse the cluster launch: the same config without it.
    assert [p.config["CLUSTER"] for p in launch.launches] == [0]
    assert launch._resident is not None and launch._resident.config["CLUSTER"] == 0
    assert launch.mode == "ticketed" and launch.config == config  # decided on the first call


def test_a_cluster_launch_needs_a_config():
    x = torch.empty(8, 131072)
    with pytest.raises(ValueError, match="needs a config"):
        launches.PreparedLaunch(coop.FAMILY, matrix_problem(x, x), None, SM90, cluster=16, cluster_smem=128)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's two launches")
@pytest.mark.parametrize("backward", [False, True])
def test_a_cluster_config_under_the_interpreter_runs_two_phases(backward):
    """The interpreter cannot run programs together: CLUSTER is turned off and the two launches run."""
    M, N = 3, 5000
    config = cluster_config(N, 1024, 1)  # 5 chunks
    x = random_input((M, N), torch.float32, DEVICE, seed=5)
    info = device_info(x.device)
    if backward:
        y = torch.softmax(x, -1)
        dy = random_input((M, N), torch.float32, DEVICE, seed=6)
        dx = poisoned_like(x)
        launch = coop.BWD_FAMILY.prepare(matrix_problem(dy, dx), config, info, flags={"LOG": 0})
        launch(dy, dx, y, 1.0)
        assert_grad_close(dx, dy, y)
    else:
        y = poisoned_like(x)
        launch = coop.FAMILY.prepare(matrix_problem(x, y), config, info, flags=FWD_FLAGS)
        launch(x, y, 1.0)
        assert_softmax_close(y, x)
    assert launch.mode == "two-phase"
    assert all(p.config["CLUSTER"] == 0 for p in launch.launches)


# ---------------------------------------------------------------- the PTX (CPU, offline sm_90 compile)

CLUSTER_CASES = [["fwd", {"CLUSTER": 1, "BLOCK_G": 16, "BLOCK": 8192}],
                 ["bwd", {"CLUSTER": 1, "BLOCK_G": 16, "BLOCK": 8192}],
                 ["fwd", {"CLUSTER": 0, "BLOCK_G": 16, "BLOCK": 8192, "RESIDENT": 1}]]


SMEM_CLUSTER_CASES = [["fwd", "bf16", "bf16", {"BLOCK": 2048, "TILES": 8, "BLOCK_G": 4, "CLUSTER": 1}, 4, {}],
                      ["bwd", "fp16", "fp16", {"BLOCK": 2048, "TILES": 4, "BLOCK_G": 16, "CLUSTER": 1}, 4, {}]]


@pytest.fixture(scope="module")
def cluster_ptx() -> list:
    return run_compile_script("coop_compile.py", "cuda:90", json.dumps(CLUSTER_CASES))


@pytest.fixture(scope="module")
def smem_cluster_ptx() -> list:
    return [r["ptx"] for r in run_compile_script("smem_compile.py", json.dumps(SMEM_CLUSTER_CASES))]


@pytest.mark.parametrize("case", [0, 1], ids=["fwd", "bwd"])
def test_cluster_exchange_ptx(cluster_ptx, case):
    """The mbarrier initialised and fenced before the start arrive; the cluster waited for before the
    remote stores (st.async, counted on the receiver's mbarrier, which the receiver waits on with
    acquire at cluster scope); the slots and the mbarrier found from the dynamic shared memory's
    size; no workspace atomics, no polling of global memory."""
    assert_cluster_exchange(cluster_ptx[case], "ld.global")


@needs_gluon
@pytest.mark.parametrize("case", [0, 1], ids=["fwd", "bwd"])
def test_smem_cluster_exchange_ptx(smem_cluster_ptx, case):
    """The same in smem's kernels, after the last copy group has landed."""
    assert_cluster_exchange(smem_cluster_ptx[case], "cp.async.wait_group")


def assert_cluster_exchange(ptx: str, before: str) -> None:
    """The cluster exchange's instructions in order, ``before`` (the chunk's reads) ahead of them."""
    order = ["mbarrier.init.shared::cta.b64", "fence.mbarrier_init.release.cluster",
             "barrier.cluster.arrive.relaxed.aligned", "barrier.cluster.wait.aligned",
             "mbarrier.arrive.expect_tx.shared::cta.b64", "mapa.shared::cluster.u32",
             "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32",
             "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64", "ld.shared.v2.f32"]
    at = [ptx.find(op) for op in order]
    assert all(a >= 0 for a in at), dict(zip(order, at, strict=True))
    assert at == sorted(at), dict(zip(order, at, strict=True))
    assert 0 <= ptx.find(before) < at[4], "the chunk's reads come before the exchange"
    assert "barrier.cluster.arrive.release" not in ptx, "no barrier round trip after the remote stores"
    assert "%dynamic_smem_size" in ptx and "global_smem" in ptx
    assert "atom." not in ptx and "ld.volatile" not in ptx


def test_without_cluster_no_cluster_instructions(cluster_ptx):
    assert "barrier.cluster" not in cluster_ptx[2] and "mapa" not in cluster_ptx[2]


# ---------------------------------------------------------------- on the GPU

def _run_forward(x, config, log=False):
    y = poisoned_like(x)
    launch = coop.FAMILY.prepare(matrix_problem(x, y), config, device_info(x.device),
                                 flags={"LOG": int(log), "ZERO_MASKED": 0})
    launch(x, y, 1.0)
    return launch, y


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N,block", [(8, 131072, 8192), (8, 131072, 16384), (3, 131067, 8192), (5, 40000, 8192),
                                       (1, 16384, 8192), (2, 1000, 128), (4, 100003, 8192), (32, 152064, 16384)])
def test_gpu_cluster_forward(M, N, block, dtype):
    x = random_input((M, N), dtype, DEVICE, seed=N + M)
    launch, y = _run_forward(x, cluster_config(N, block, 8 if block >= 8192 else 2, device_info(x.device)))
    assert launch.mode == "cluster", launch.cluster_error
    assert_softmax_close(y, x)
    for _ in range(3):  # warm calls: the same launch again, the same result
        y2 = poisoned_like(x)
        launch(x, y2, 1.0)
        assert torch.equal(y, y2)
    _, logy = _run_forward(x, launch.config, log=True)
    ref = torch.log_softmax(x.double(), -1)
    rel = LOG_REL[dtype]
    assert ((logy.double() - ref).abs() <= rel * ref.abs() + 1e-5).all()


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("kind,M,N,size", [("coop", 8, 131072, 8192), ("coop", 4, 131067, 16384),
                                           pytest.param("smem", 8, 131072, 8192, marks=needs_gluon),
                                           pytest.param("smem", 64, 65536, 16384, marks=needs_gluon)])
def test_gpu_cluster_backward(kind, M, N, size, dtype, log):
    """coop (size: BLOCK, 8 warps) and smem (size: the chunk) backward in cluster mode."""
    x = random_input((M, N), dtype, DEVICE, seed=N)
    y = (torch.log_softmax if log else torch.softmax)(x.float(), -1).to(dtype)
    dy = random_input((M, N), dtype, DEVICE, seed=N + 1)
    dx = poisoned_like(x)
    if kind == "coop":
        family, config = coop.BWD_FAMILY, cluster_config(N, size, 8, device_info(x.device))
    else:
        family, config = smem().BWD_FAMILY, smem_cluster_config(N, size)
    launch = family.prepare(matrix_problem(dy, dx), config, device_info(x.device), flags={"LOG": int(log)})
    launch(dy, dx, y, 1.0)
    assert launch.mode == "cluster" and getattr(launch, "fallbacks", 0) == 0, launch.cluster_error
    assert_grad_close(dx, dy, y, 1.0, log)


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
def test_gpu_cluster_extreme_values_and_strided_rows():
    """-inf entries, a whole -inf chunk, huge magnitudes; rows 2 bytes off 16 (realigned) and a softmax
    down the columns of a row-major matrix (a column stride)."""
    N = 131072
    x = random_input((6, N), torch.float32, DEVICE, seed=9)
    x[0, ::7] = float("-inf")
    x[1, 8192:16384] = float("-inf")  # chunk 1 of 16 holds nothing but -inf
    x[2] *= 1e4
    x[3, 5] = 3e38
    x[4] = -1e30
    launch, y = _run_forward(x, cluster_config(N, 8192, 8, device_info(x.device)))
    assert launch.mode == "cluster", launch.cluster_error
    assert_softmax_close(y, x)
    base = random_input((4, N + 1), torch.bfloat16, DEVICE, seed=10)  # an odd row stride: rows start off 16 bytes
    x, out = base[:, :N], poisoned_like(base)[:, :N]  # the output in the input's layout
    launch = coop.FAMILY.prepare(matrix_problem(x, out), cluster_config(N, 8192, 8, device_info(x.device)),
                                 device_info(x.device), flags=FWD_FLAGS)
    launch(x, out, 1.0)
    assert launch.mode == "cluster" and launch.launches[0].flags["ALIGN"] > 1
    assert_softmax_close(out, x)
    cols = random_input((N, 3), torch.float16, DEVICE, seed=11)
    y = poisoned_like(cols)
    launch = coop.FAMILY.prepare(matrix_problem(cols.t(), y.t()), cluster_config(N, 8192, 8, device_info(cols.device)),
                                 device_info(cols.device), flags=FWD_FLAGS)
    launch(cols.t(), y.t(), 1.0)
    assert launch.mode == "cluster", launch.cluster_error
    assert_softmax_close(y, cols, dim=0)


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
def test_gpu_cluster_launch_more_than_2_pow_31_elements():
    M, N = 16385, 131072  # 2^31 + 131072 elements, bf16
    x = torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16).normal_(0, 3)
    launch, y = _run_forward(x, cluster_config(N, 8192, 8, device_info(x.device)))
    assert launch.mode == "cluster", launch.cluster_error
    worst = 0.0
    for r in range(0, M, 1024):
        ref = torch.softmax(x[r:r + 1024].double(), -1)
        worst = max(worst, (y[r:r + 1024].double() - ref).abs().max().item())
    assert worst <= 8e-3, f"max abs error {worst}"


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
def test_gpu_cluster_launch_in_a_cuda_graph_and_under_launch_hooks():
    from triton import knobs

    x = random_input((4, 131072), torch.bfloat16, DEVICE, seed=12)
    launch, y = _run_forward(x, cluster_config(131072, 8192, 8, device_info(x.device)))
    assert launch.mode == "cluster", launch.cluster_error
    want = y.clone()
    out = poisoned_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        launch(x, out, 1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    hook = knobs.runtime.launch_enter_hook
    if not hasattr(hook, "add"):
        pytest.skip("this triton has no HookChain launch hooks")
    calls = []
    fn = lambda metadata: calls.append(metadata)  # noqa: E731
    hook.add(fn)
    try:
        out = poisoned_like(x)
        launch(x, out, 1.0)  # Triton's runner path, with the cluster's launch metadata
    finally:
        hook.remove(fn)
    assert len(calls) == 1 and torch.equal(out, want)


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
def test_gpu_refused_cluster_launch_falls_back(monkeypatch):
    def refuse(self, *args):
        raise RuntimeError("cluster launch refused (test)")

    monkeypatch.setattr(launches.PreparedLaunch, "_start_clusters", refuse)
    x = random_input((8, 131072), torch.float16, DEVICE, seed=13)
    launch, y = _run_forward(x, cluster_config(131072, 8192, 8, device_info(x.device)))
    assert launch.mode == "resident" and "refused" in launch.cluster_error
    assert_softmax_close(y, x)


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
def test_gpu_api_takes_a_stored_cluster_config():
    """Through tritonsoftmax.softmax: a tuning-table entry with CLUSTER 1 runs in cluster mode."""
    import tritonsoftmax
    from tritonsoftmax import dispatch, execute

    x = random_input((4, 131072), torch.bfloat16, DEVICE, seed=14)
    plan = dispatch.plan("auto", 4, 131072, x.dtype, x.dtype, x.device, False, True, True)
    if plan.family.name != "coop" or not plan.config or not clustered(plan.config):
        pytest.fail(f"the table's 4x131072 bf16 entry is {plan.family.name} {plan.config}: expected coop CLUSTER 1")
    assert_softmax_close(tritonsoftmax.softmax(x), x)
    *_, prepared = execute._prepared[execute._signature(x, -1, None, "auto", False, False)]  # this call's launch
    assert prepared.mode == "cluster", prepared.mode


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
@needs_gluon
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N,chunk,warps", [(8, 131072, 8192, 4), (8, 131072, 8192, 8), (64, 65536, 16384, 4),
                                             (5, 65536, 32768, 8), (3, 100000, 8192, 4)])
def test_gpu_smem_cluster_forward(M, N, chunk, warps, dtype):
    """smem in cluster mode: softmax and log_softmax, a -inf chunk and huge values in the first rows."""
    x = random_input((M, N), torch.float32, DEVICE, seed=N + M)
    x[0, :chunk] = float("-inf")
    x[1, N - 1] = 3e4
    x = x.to(dtype)
    for log in (False, True):
        y = poisoned_like(x)
        launch = smem().FAMILY.prepare(matrix_problem(x, y), smem_cluster_config(N, chunk, warps=warps),
                                       device_info(x.device), flags={"LOG": int(log), "ZERO_MASKED": 0})
        launch(x, y, 1.0)
        assert launch.mode == "cluster" and launch.fallbacks == 0, launch.cluster_error
        if log:
            ref = torch.log_softmax(x.double(), -1)
            finite = ref.isfinite()
            assert torch.equal(y.isfinite(), finite)
            rel = LOG_REL[dtype]
            assert ((y.double() - ref)[finite].abs() <= rel * ref[finite].abs() + 1e-5).all()
        else:
            assert_softmax_close(y, x)
            y2 = poisoned_like(x)
            launch(x, y2, 1.0)  # the warm call
            assert torch.equal(y, y2)


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
@needs_gluon
@pytest.mark.parametrize("M,N", [(40, 152064), (100, 65536), (48, 131072), (150, 50000), (200, 262144),
                                 (32, 152064), (20, 140004)])
def test_gpu_few_fp32_rows_run_smem_clusters_through_auto(M, N):
    """Few fp32 rows past what coop holds at once (dispatch.smem_fp32_cluster_config; rows past 128K from half of it,
    32x152064, 20x140004): the plan's launch runs smem in cluster mode, LEAD where rows start off 128-byte lines
    (50000, 140004); softmax and log_softmax of a row with a -inf chunk and one with a huge value; the public call
    gives the same bits."""
    import tritonsoftmax
    from tritonsoftmax import dispatch

    x = random_input((M, N), torch.float32, DEVICE, seed=M + N)
    x[0, : N // 3] = float("-inf")
    x[1, N - 1] = 3e4
    info = device_info(x.device)
    for log in (False, True):
        y = poisoned_like(x)
        p = dispatch.plan("auto", M, N, torch.float32, torch.float32, x.device, False, True, True)
        launch = p.family.prepare(matrix_problem(x, y), p.config, p.device, p.from_store,
                                  {"LOG": int(log), "ZERO_MASKED": 0}, modes=p.modes)
        launch(x, y, 1.0)
        assert p.impl == "smem" and launch.mode == "cluster" and launch.fallbacks == 0, launch.cluster_error
        assert ("LEAD" in dict(launch.config.meta)) == (N * 4 % 128 != 0) and info.sm_version >= 90
        if log:
            ref = torch.log_softmax(x.double(), -1)
            finite = ref.isfinite()
            assert torch.equal(y.isfinite(), finite)
            assert ((y.double() - ref)[finite].abs() <= LOG_REL[torch.float32] * ref[finite].abs() + 1e-5).all()
        else:
            assert_softmax_close(y, x)
        public = (tritonsoftmax.log_softmax if log else tritonsoftmax.softmax)(x)
        assert torch.equal(public, y)


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
@needs_gluon
@pytest.mark.parametrize("M,N", [(40, 152064), (100, 65536), (150, 50000), (4096, 50257), (300, 151936),
                                 (264, 65536), (32, 152064), (28, 135000)])
@pytest.mark.parametrize("log", [False, True])
def test_gpu_few_fp32_rows_backward_run_smem_clusters_through_auto(M, N, log):
    """The backward of few fp32 rows past what coop-bwd holds at once (rows past 128K from 0.58 of it: 32x152064,
    28x135000), and of many rows up to 160K (odd 50257 in the odd-row form), chunks of at most 10240 elements
    (dispatch.smem_fp32_cluster_config): smem-bwd in cluster mode through the plan, LEAD off 128-byte lines."""
    from tritonsoftmax import dispatch

    x = random_input((M, N), torch.float32, DEVICE, seed=M * N)
    y = (torch.log_softmax if log else torch.softmax)(x, -1)
    dy = random_input((M, N), torch.float32, DEVICE, seed=M + 1)
    dx = poisoned_like(x)
    p = dispatch.plan("auto", M, N, torch.float32, torch.float32, x.device, True, whole_vectors(N, 4), True)
    launch = p.family.prepare(matrix_problem(dy, dx), p.config, p.device, p.from_store, {"LOG": int(log)},
                              modes=p.modes)
    launch(dy, dx, y, 1.0)
    assert p.impl == "smem" and launch.mode == "cluster" and launch.fallbacks == 0, launch.cluster_error
    assert ("LEAD" in dict(launch.config.meta)) == (N * 4 % 128 != 0)
    assert_grad_close(dx, dy, y, 1.0, log)


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
@needs_gluon
@pytest.mark.parametrize("scale", [1.0, -0.5])
def test_gpu_smem_cluster_rows_off_lines(scale):
    """Rows off 128-byte lines: the stored-entry path cuts the config to the row with LEAD (balanced_config)
    and keeps cluster mode; a row whose values all fall below 0 after the scale (a zero-filled lane before
    it must not win) and a -inf row."""
    M, N = 16, 50264
    x = random_input((M, N), torch.float32, DEVICE, scale=1.0, seed=5)
    x[2] = -(x[2].abs() + 1.0) / scale
    x[3] = float("-inf") if scale > 0 else float("inf")
    x = x.to(torch.bfloat16)
    y = poisoned_like(x)
    launch = smem().FAMILY.prepare(matrix_problem(x, y), smem_cluster_config(65536, 16384), device_info(x.device),
                                   from_store=True, flags={"LOG": 0, "ZERO_MASKED": 1})
    launch(x, y, scale)
    assert launch.config["LEAD"] == 56 and launch.mode == "cluster" and launch.fallbacks == 0, launch.cluster_error
    want = torch.softmax(x.double() * scale, -1)
    want[3] = 0.0
    assert (y.double() - want).abs().max().item() <= 8e-3


# ---------------------------------------------------------------- smem-bwd's heuristic in cluster mode (dispatch rule)

@needs_gluon
@pytest.mark.parametrize("dtype,M,N,device,want", [
    (torch.bfloat16, 4096, 65536, SM90, True),  # 4 chunks a row
    (torch.float16, 2048, 100000, SM90, True),  # 7 chunks, LEAD
    (torch.float16, 1024, 131072, SM90, True),  # 8 chunks, 8192 programs
    (torch.bfloat16, 4096, 131072, SM90, False),  # 8 chunks, 32768 programs
    (torch.bfloat16, 4096, 262144, SM90, False),  # 16 chunks, 65536 programs
    (torch.float32, 64, 1048576, SM90, False),  # fp32: not measured
    (torch.bfloat16, 4096, 65536, SM89, False)])  # no clusters
def test_smem_backward_heuristic_takes_cluster_mode_by_the_rule(dtype, M, N, device, want):
    x = torch.empty(M, N, dtype=dtype)
    modes = launch_modes(policy_for(device))  # what the device's policy gives its launches (none for sm_89)
    launch = smem().BWD_FAMILY.prepare(matrix_problem(x, x), None, device, flags={"LOG": 0}, two_phase=False,
                                       modes=modes)
    assert clustered(launch.config) is want and (launch._cluster is not None) is want
    assert smem_launch.backward_cluster(matrix_problem(x, x), launch.config, device,
                                        sm90_launch_modes().smem_bwd_cluster) is want
    forward = smem().FAMILY.prepare(matrix_problem(x, x), None, device, flags=FWD_FLAGS, two_phase=False,
                                    modes=modes)
    assert not clustered(forward.config)  # the forward is not ruled into cluster mode


@needs_gluon
def test_smem_backward_keeps_given_and_stored_configs_as_they_are():
    x = torch.empty(4096, 65536, dtype=torch.bfloat16)
    base = smem().BWD_FAMILY.default_config(SM90, matrix_problem(x, x))
    for from_store in (False, True):
        launch = smem().BWD_FAMILY.prepare(matrix_problem(x, x), base, SM90, from_store, {"LOG": 0}, False)
        assert not clustered(launch.config) and launch._cluster is None


@pytest.mark.gpu
@pytest.mark.needs("clusters", "smem")
@needs_gluon
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_smem_backward_through_autograd_in_cluster_mode(dtype):
    """A 16-bit backward the rule puts in cluster mode, through torch.autograd and tritonsoftmax.softmax."""
    import tritonsoftmax
    from tritonsoftmax import execute

    M, N = 512, 65536
    x = random_input((M, N), torch.float32, DEVICE, seed=21).to(dtype).requires_grad_()
    y = tritonsoftmax.softmax(x)
    dy = random_input((M, N), dtype, DEVICE, seed=22)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert_grad_close(dx, dy, y.detach(), 1.0, False)
    modes = {p.family.name: getattr(p, "mode", None) for *_, p in execute._prepared.values()
             if hasattr(p, "family") and (p.problem.M, p.problem.N, p.problem.dtype) == (M, N, dtype)}
    assert modes.get("smem-bwd") == "cluster", modes  # this shape's launches only: other tests' share the cache
