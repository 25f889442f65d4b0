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


def _target_device():
    """The device GPU tests are gated for: the synthetic one TRITONSOFTMAX_TEST_AS names (collection only), else
    this machine's GPU, else None."""
    arch = os.environ.get("TRITONSOFTMAX_TEST_AS")
    if arch:
        import synthetic_devices

        found = [d for d in vars(synthetic_devices).values() if getattr(d, "arch", None) == arch]
        if not found:
            raise pytest.UsageError(f"TRITONSOFTMAX_TEST_AS={arch}: no synthetic device of that arch")
        return found[0]
    if HAS_GPU:
        from tritonsoftmax.device import device_info

        return device_info(torch.device("cuda"))
    return None


def pytest_collection_modifyitems(config, items):
    """GPU tests: skipped without a GPU; on a GPU (or the TRITONSOFTMAX_TEST_AS device) skipped where it lacks a
    capability the test needs (tests/capabilities.py)."""
    from capabilities import missing

    device = _target_device()
    for item in items:
        if "gpu" not in item.keywords:
            continue
        if device is None:
            item.add_marker(pytest.mark.skip(reason="needs a GPU (runs in the H200 suite)"))
            continue
        lacks = missing(item, device)
        if lacks:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(lacks)}, which {device.arch} lacks"))
    listing = os.environ.get("TRITONSOFTMAX_TEST_LIST")
    if listing:  # the GPU tests that would run on the device (tests/test_structure.py)
        runs = [i.nodeid for i in items if "gpu" in i.keywords and not i.get_closest_marker("skip")
                and not any(m.args and m.args[0] for m in i.iter_markers("skipif"))]
        with open(listing, "w") as f:
            f.write("\n".join(runs) + "\n")


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
