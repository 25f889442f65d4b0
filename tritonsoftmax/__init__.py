"""tritonsoftmax: an autotuned Triton softmax for PyTorch (NVIDIA and AMD GPUs).

    >>> import torch, tritonsoftmax
    >>> y = tritonsoftmax.softmax(torch.randn(8, 2048, device="cuda"), dim=-1)
"""

from .api import clear_caches, softmax
from .config import LaunchConfig
from .device import DeviceInfo

__all__ = ["softmax", "clear_caches", "LaunchConfig", "DeviceInfo", "__version__"]
__version__ = "0.1.0"
