"""tritonsoftmax.distributed on the CPU: 1, 2 and 4 processes over gloo, uneven slices (of width 1 and 0), a row all
-inf on one rank only and one on every rank, ignore_index, label smoothing, fp32 and fp16, forward and backward, every
element of every rank's slice against torch on the whole tensor."""

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
import distributed_worker  # noqa: E402

needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


@needs_gloo
@pytest.mark.parametrize("widths,compilers", [([37, 26], ("aot_eager", "inductor")), ([20, 1, 0, 29], ("aot_eager",)),
                                              ([63], ("aot_eager",)), ([5000, 4000], ())],
                         ids=["2-ranks", "4-ranks-widths-1-and-0", "world-of-one", "2-ranks-chunked"])
def test_vocab_parallel_softmax_log_softmax_and_cross_entropy_match_torch(tmp_path, widths, compilers):
    """Every check of distributed_worker.run on each rank; inside torch.compile (one graph) with aot_eager, and with
    inductor's generated code on two ranks. Slices of thousands of columns: the split passes cut a row into several
    chunks on each rank, which the small kernels around the collective combine."""
    init = f"file://{tmp_path / 'store'}"
    mp.spawn(distributed_worker.run, args=(len(widths), init, widths, "gloo", compilers), nprocs=len(widths),
             join=True)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()), reason="needs a GPU and NCCL")
@pytest.mark.parametrize("widths", [[63], [37, 26]], ids=["world-of-one", "2-gpus"])
def test_nccl_gpus_match_torch(tmp_path, widths):
    """The same checks over NCCL, one rank a GPU (a world of one: the whole row on the one rank), inside
    torch.compile with aot_eager and inductor, and captured in a CUDA graph and replayed on new data (with the
    collectives in the graph on two GPUs)."""
    if torch.cuda.device_count() < len(widths):
        pytest.skip(f"needs {len(widths)} GPUs, this machine has {torch.cuda.device_count()}")
    init = f"file://{tmp_path / 'store'}"
    mp.spawn(distributed_worker.run, args=(len(widths), init, widths, "nccl", ("aot_eager", "inductor")),
             nprocs=len(widths), join=True)


def test_inputs_it_refuses():
    import tritonsoftmax.distributed as tsd

    with pytest.raises(TypeError):
        tsd.softmax(torch.arange(3), -1)
    with pytest.raises(ValueError):
        tsd.softmax(torch.tensor(1.0), 0)
    with pytest.raises(IndexError):
        tsd.log_softmax(torch.zeros(2, 3), 2)
    with pytest.raises(ValueError, match="reduction"):
        tsd.cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), reduction="avg")
    with pytest.raises(ValueError, match="rows"):
        tsd.cross_entropy(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))


def _bench_rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from bench import distributed as bench_distributed

    assert bench_distributed.main(["--rows", "3", "--vocab", "53", "--dtype", "float32", "--iters", "2",
                                   "--out", out]) == 0


@needs_gloo
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU harness check; on GPUs it runs under torchrun")
def test_distributed_benchmark_checks_every_line_then_writes_its_summary(tmp_path):
    """bench.distributed over 2 gloo processes on a tiny point: its providers pass their checks against torch on the
    whole tensor (a failing one raises), and rank 0 writes the summary with the command first and both ratios."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_bench_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("Command: `torchrun --nproc-per-node 2 -m bench.distributed")
    row = [line for line in summary.splitlines() if line.startswith("| 3×53 |")]
    assert len(row) == 1 and row[0].count("|") == summary.splitlines()[4].count("|")
    assert (tmp_path / "distributed.csv").read_text().startswith("M,V,dtype,ranks")
