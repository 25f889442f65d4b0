"""Run the suite compiled on a GPU, or under the Triton interpreter when there is none.

TRITON_INTERPRET must be set before any @triton.jit kernel is defined, so this happens at
import time, before the tests import tritonsoftmax's kernel modules.
"""

import os
import tempfile

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
else:
    # Hundreds of (family, shape bucket, dtype) cases would each pay a full autotuning run;
    # the suite launches heuristic configs and test_gpu.py exercises the autotuner itself.
    os.environ.setdefault("TRITONSOFTMAX_AUTOTUNE", "0")

# Hermetic: the suite never reads or writes the user's tuning directory.
os.environ["TRITONSOFTMAX_TUNE_CACHE"] = tempfile.mkdtemp(prefix="tritonsoftmax-test-tune-")
os.environ.pop("TRITONSOFTMAX_TUNE_SAVE", None)
os.environ["HIP_REFERENCE_CACHE"] = tempfile.mkdtemp(prefix="tritonsoftmax-test-hipref-")

DEVICE = "cuda" if HAS_GPU else "cpu"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (runs in the H200 suite)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    """On a GPU the suite's parallel workers share one device: each test gives the blocks its worker's caching
    allocator keeps back, so that one worker's cache of earlier large tensors cannot run another out of memory."""
    yield
    if HAS_GPU:
        torch.cuda.empty_cache()
