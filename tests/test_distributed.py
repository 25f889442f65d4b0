"""tritonsoftmax.distributed on the CPU: 2 and 3 processes over gloo, uneven slices (one of width 1), a row all -inf
on one rank only and one on every rank, ignore_index, label smoothing, fp32 and fp16, forward and backward, every
element of every rank's slice against torch on the whole tensor."""

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
@pytest.mark.parametrize("widths", [[37, 26], [20, 1, 29]], ids=["2-ranks", "3-ranks-one-of-width-1"])
def test_vocab_parallel_softmax_log_softmax_and_cross_entropy_match_torch(tmp_path, widths):
    init = f"file://{tmp_path / 'store'}"
    mp.spawn(distributed_worker.run, args=(len(widths), init, widths), nprocs=len(widths), join=True)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()), reason="needs a GPU and NCCL")
def test_nccl_world_of_one_gpu_matches_torch(tmp_path):
    """The same checks over NCCL on one GPU (world size 1: the whole row on the one rank), where no machine with
    two GPUs is lent."""
    init = f"file://{tmp_path / 'store'}"
    mp.spawn(distributed_worker.run, args=(1, init, [63], "nccl"), nprocs=1, join=True)


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
