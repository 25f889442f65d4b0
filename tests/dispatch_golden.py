"""The H200's (sm_90) dispatch on a grid of shapes, as one line each: what `auto` runs (family and config) for M rows
of N elements, per dtype, direction and layout. ``tests/data/dispatch_sm90.txt`` holds it; test_dispatch checks that
the dispatcher still gives every line, so a change to the rules, the policy or the shipped table that moves a decision
shows up as a diff that has to be committed on purpose. Regenerate it with::

    python tests/dispatch_golden.py --write
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from synthetic_devices import SM90  # noqa: E402

from tritonsoftmax import dispatch  # noqa: E402
from tritonsoftmax.layout import ALIGN_BYTES  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "dispatch_sm90.txt"
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
ROWS = (1, 8, 32, 132, 512, 4096, 16384)
MOST_ELEMENTS = 2**28


def row_lengths() -> list[int]:
    """Powers of two and the lengths around them the rules tell apart: one short, one past, a small tail past,
    halfway to the next; and lengths of real models' rows."""
    out = {1, 2, 3, 7, 100, 200, 300, 1000, 1152, 4480, 6720, 9024, 9600, 12000, 16904, 32000, 50257, 50264, 100003,
           151936, 152064, 132 * 8192}
    for k in range(6, 24):
        p = 2**k
        out |= {p, p - 1, p + 1, p + 8, p + p // 64, 3 * p // 2}
    return sorted(n for n in out if n <= 2**23)


def text(config) -> str:
    """A config in one word: its constexprs and options, then num_warps (num_stages where not 1)."""
    return str(config).replace(", ", ",").replace(",num_stages=1", "")


def lines() -> list[str]:
    out = []
    for N in row_lengths():
        for M in ROWS:
            if M * N > MOST_ELEMENTS:
                continue
            for name, dtype in DTYPES.items():
                aligned = N * dtype.itemsize % ALIGN_BYTES == 0
                for backward in (False, True):
                    for dense in (True, False):  # contiguous rows; rows with a padded stride (on 16-byte lines)
                        p = dispatch.resolve("auto", M, N, dtype, SM90, backward, aligned or not dense, dense)
                        config = "-" if p.config is None else text(p.config)
                        out.append(f"{'bwd' if backward else 'fwd'} {name} {M} {N} {'dense' if dense else 'padded'} "
                                   f"{p.impl} {config}")
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text("\n".join(lines()) + "\n")
    print(f"wrote {GOLDEN}")
