"""The textbook HIP softmax kernels (v0-v3), built with hipcc or nvcc and driven through subprocess.

    from hip_reference import build, run
    result = run(x)                     # x: a float32 (M, N) tensor; builds the binary on first use
    result.versions["v3"].max_diff      # against torch.softmax, like the chapter's verification step

Command lines: ``python -m hip_reference.build`` (print the binary's path, building it if needed)
and ``python -m bench.hip_compare`` (the side-by-side tables with the Triton kernels).
"""

from .build import BuildError, build, find_compiler
from .driver import HipReferenceError, RunResult, VersionResult, run

__all__ = ["build", "find_compiler", "run", "BuildError", "HipReferenceError", "RunResult", "VersionResult"]
