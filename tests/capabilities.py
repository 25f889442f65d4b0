"""What a GPU test needs beyond a GPU, as capabilities of the device (``@pytest.mark.needs("clusters")``).

conftest skips a ``gpu`` test on a device that lacks one of its needs, so the suite runs as it is on an AMD
GPU (every test left is one AMD can run) as on NVIDIA. ``TRITONSOFTMAX_TEST_AS=<arch>`` collects the suite as
if on one of the synthetic devices (tests/synthetic_devices.py): ``pytest --collect-only -m gpu`` then lists
the GPU tests that would run there.
"""

from __future__ import annotations

import re

from tritonsoftmax.device import DeviceInfo

# Words a test's source holds when it exercises something only NVIDIA has in this package: the cooperative launch
# (resident mode), CTA clusters, programmatic dependent launch, the Gluon smem kernels, CUPTI, Triton's CUDA
# launcher, the late-row stagger (PTX clock reads), the H200's shipped table.
NVIDIA_ONLY = re.compile(r"resident|cluster|CLUSTER|\bpdl\b|PDL|smem|kernel_timer|kernel_ms|kernel_profile|"
                         r"c_launch|C_LAUNCH|stagger|STAGGER|tune_cache")


def capabilities(device: DeviceInfo) -> set[str]:
    """The capabilities ``device`` has, of those tests ask for."""
    from tritonsoftmax.kernels import SMEM_MIN_SM, exchange, gluon_available, sizing

    cuda = device.backend == "cuda"
    out = {"cuda"} if cuda else set()
    if cuda:
        out |= {"cooperative", "stagger", "cupti", "cuda_launcher"}
    if sizing.supports_pdl(device) and cuda:
        out.add("pdl")
    if exchange.has_clusters(device):
        out.add("clusters")
    if cuda and device.sm_version >= SMEM_MIN_SM and gluon_available():
        out.add("smem")
    if cuda and device.arch == "sm_90":
        out.add("sm90_table")
    return out


def missing(item, device: DeviceInfo) -> list[str]:
    """The needs of a collected test item that ``device`` lacks."""
    have = capabilities(device)
    return sorted({need for mark in item.iter_markers("needs") for need in mark.args} - have)
