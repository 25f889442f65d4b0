"""Copy an earlier version of tritonsoftmax beside this one, so that one benchmark process times both:

    python -m bench.baseline COMMIT DIR
    python -m bench.sweep ... --providers auto previous --baseline DIR

The package at COMMIT (and its tune_cache/) is written to DIR as ``tritonsoftmax_base``: its operators
registered as ``tritonsoftmax_base::*`` and its environment variables read as ``TRITONSOFTMAX_BASE_*``, so
neither collides with the package under test (set ``TRITONSOFTMAX_BASE_AUTOTUNE=0`` beside
``TRITONSOFTMAX_AUTOTUNE=0``). Needs git and the commit in this checkout.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

NAME = "tritonsoftmax_base"


def rewrite(text: str) -> str:
    """One module of the copy: its own operator namespace, package name and environment variables."""
    text = text.replace("tritonsoftmax::", f"{NAME}::").replace("TRITONSOFTMAX_", "TRITONSOFTMAX_BASE_")
    return re.sub(r"\btritonsoftmax\b(?=[.:\s\"'])", NAME, text)


def copy(commit: str, out: Path) -> Path:
    """Write the package at ``commit`` to ``out``/tritonsoftmax_base (and ``out``/tune_cache); returns the package."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "tritonsoftmax", "tune_cache"],
                             check=True, capture_output=True).stdout
    out.mkdir(parents=True, exist_ok=True)
    for sub in (NAME, "tune_cache"):
        shutil.rmtree(out / sub, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    (out / "tritonsoftmax").rename(out / NAME)
    for path in (out / NAME).rglob("*.py"):
        path.write_text(rewrite(path.read_text()))
    (out / NAME / "BASELINE").write_text(subprocess.run(["git", "rev-parse", commit], check=True, capture_output=True,
                                                        text=True).stdout)
    return out / NAME


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(copy(sys.argv[1], Path(sys.argv[2])))
