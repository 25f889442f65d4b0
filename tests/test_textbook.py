"""The textbook Triton kernels the sweep runs beside ours (bench/textbook.py): every element against float64, rows
shorter than, equal to and longer than a tile, -inf entries, 16-bit inputs; what they refuse."""

import pytest
import torch
from conftest import DEVICE
from softmax_ref import poisoned_like, random_input

from bench import peers
from bench.textbook import FUSED_MAX_N, KERNELS, TEXTBOOK_TILE, textbook
from tritonsoftmax.kernels.triton_launcher import COMPILE_OPTIONS

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}
LENGTHS = (1, 37, TEXTBOOK_TILE, TEXTBOOK_TILE + 1, 3 * TEXTBOOK_TILE - 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("kind", list(KERNELS))
def test_textbook_kernels_write_every_element_of_torchs_softmax(kind, n, dtype):
    x = random_input((3, n), dtype, DEVICE, seed=n)
    if n > 2:
        x[1, n // 2:] = float("-inf")  # a row whose second half is -inf: a lane of online's that never sees a value
    y = poisoned_like(x)
    size = {"BLOCK": max(1, 1 << (n - 1).bit_length())} if kind == "fused" else {"TILE": TEXTBOOK_TILE}
    KERNELS[kind][(3,)](x, y, x.stride(0), y.stride(0), n, **size, **COMPILE_OPTIONS)
    ref = torch.softmax(x.double(), -1)
    assert not torch.isnan(y).any(), "an element was left unwritten"
    assert (y.double() - ref).abs().max().item() <= TOL[dtype]


@pytest.mark.parametrize("name", peers.TEXTBOOK)
def test_textbook_providers_run_on_padded_rows_and_are_forward_only(name):
    base = random_input((4, 2100), torch.float32, DEVICE, seed=2)
    x = base[:, :2000]  # rows 2100 elements apart
    y = peers.prepare(name, x)()
    assert (y.double() - torch.softmax(x.double(), -1)).abs().max().item() <= TOL[torch.float32]
    with pytest.raises(peers.Unavailable, match="forward only"):
        peers.prepare_backward(name, x, y, y)


def test_textbook_refuses_what_it_cannot_take():
    with pytest.raises(peers.Unavailable, match="whole row in registers"):
        peers.prepare("textbook-fused", torch.empty(1, FUSED_MAX_N + 1, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous rows"):
        textbook("tile", torch.empty(8, 4, device=DEVICE).t())
    with pytest.raises(ValueError, match="unknown textbook kernel"):
        textbook("blocked", torch.empty(2, 2, device=DEVICE))
