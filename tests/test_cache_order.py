"""CACHE_OPT: the tile and online kernels' second pass in reverse order (default) or forward order, the same
answer either way, forward and backward, every element against float64."""

import pytest
import torch
from conftest import DEVICE
from softmax_ref import assert_grad_close, assert_softmax_close, poisoned_like, random_input

from tritonsoftmax.config import LaunchConfig
from tritonsoftmax.device import device_info
from tritonsoftmax.kernels import backward_family, family
from tritonsoftmax.layout import matrix_problem


@pytest.mark.parametrize("cache_opt", [0, 1])
@pytest.mark.parametrize("impl", ["tile", "online"])
@pytest.mark.parametrize("N", [3000, 1024])  # several tiles, the last one partial; one tile
def test_either_order_gives_the_softmax(impl, N, cache_opt):
    x = random_input((5, N), torch.float32, DEVICE, seed=N)
    x[1, 7] = 50.0  # the row max in the first tile, read again last in the reverse order
    y = poisoned_like(x)
    config = LaunchConfig.make(4, BLOCK=1024, CACHE_OPT=cache_opt)
    launch = family(impl).prepare(matrix_problem(x, y), config, device_info(x.device),
                                  flags={"LOG": 0, "ZERO_MASKED": 0})
    launch(x, y, 1.0)
    assert_softmax_close(y, x)


@pytest.mark.parametrize("cache_opt", [0, 1])
def test_online_backward_in_either_order(cache_opt):
    probs = torch.softmax(random_input((4, 3000), torch.float32, DEVICE, seed=3), -1)
    dy = random_input((4, 3000), torch.float32, DEVICE, seed=4)
    dx = poisoned_like(dy)
    config = LaunchConfig.make(4, BLOCK=1024, CACHE_OPT=cache_opt)
    back = backward_family("online").prepare(matrix_problem(dy, dx), config, device_info(dy.device),
                                             flags={"LOG": 0})
    back(dy, dx, probs, 1.0)
    assert_grad_close(dx, dy, probs)
