"""tritonsoftmax: an autotuned Triton softmax for PyTorch (NVIDIA and AMD GPUs).

    >>> import torch, tritonsoftmax
    >>> y = tritonsoftmax.softmax(torch.randn(8, 2048, device="cuda"), dim=-1)
"""

from . import ops  # noqa: F401  (registers the torch.library operators tritonsoftmax::*)
from .api import clear_caches, log_softmax, softmax
from .config import LaunchConfig
from .device import DeviceInfo
from .modules import LogSoftmax, Softmax
from .patch import patch_torch

__all__ = ["softmax", "log_softmax", "Softmax", "LogSoftmax", "patch_torch", "clear_caches", "LaunchConfig",
           "DeviceInfo", "__version__"]
__version__ = "0.1.0"
