"""The numbers the dispatch rules compare a shape against, per GPU arch.

A :class:`Policy` holds every threshold ``dispatch`` uses. Where it comes from:

- **default** (a GPU with no table): :func:`default_policy`, written in device quantities: how many
  registers and threads an SM has, how many SMs, whether CTA clusters exist. It keeps the rules that
  follow from those (fused while a row fits in registers, coop while every program fits at once,
  split for few rows, smem where shared memory holds a chunk, online otherwise) and leaves out every
  special case that was found by measuring one GPU: those are ``None`` (rule off) here.
- **measured** (``tune_cache/<backend>/<arch>.yaml``, its ``policy:`` mapping): the values found on that
  arch, over the defaults key by key (the user's table over the shipped one). The H200's are in
  ``tune_cache/cuda/sm_90.yaml``; docs/dispatch.md gives the evidence for each.

Field names say what they bound; docs/dispatch.md says, rule by rule, why each bound exists.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

from . import tuning
from .device import DeviceInfo
from .kernels.launch_modes import NO_MODES, LaunchModes

# The coop forward program (4 warps holding a COOP_CHUNK chunk) compiles to about this many registers a thread
# on NVIDIA: the programs an SM holds at once follow from the register file.
COOP_PROGRAM_REGISTERS = 96
COOP_PROGRAM_THREADS = 128
# The shortest block the default policy holds as half a block plus a tail: many rows of 1K+ run one row a program
# (shorter rows share a program, where the tail is a second tile of every row).
HELD_MIN_BLOCK = 1024


@dataclass(frozen=True, eq=False)
class Policy:
    """The thresholds of the dispatch rules on one device (see the module docstring for where they come from)."""

    # Programs an SM that a fused row in registers leaves room for (fused_capacity: registers an SM / this).
    fused_programs_per_sm: int = 4
    # Many rows: one program an SM is enough (read once, no exchange); the 16-bit backward holds two rows.
    fused_many_rows_programs_per_sm: int = 2
    # Fewer rows than this many an SM leave SMs idle with one program a row: spread each row over programs.
    few_rows_per_sm: int = 2
    # Coop forward programs an SM holds at once (register file / COOP_PROGRAM_REGISTERS a thread).
    coop_resident_per_sm: int = 5
    # Many 16-bit forward rows of up to this length: online (its second read hits L2) over coop.
    online_16bit_max_n: int = 65536
    # Many rows longer than this go to smem (shared memory holds a chunk in the input dtype).
    smem_min_n: int = 32768
    # fp32 rows from this bucket: the backward goes to smem (unless coop holds all and reads once).
    smem_fp32_min_n: int = 524288
    # Fused rows held as half a block plus a small tail: warps for this many values a thread of the half,
    # on blocks of held_min_block and up.
    held_values_per_thread: int = 32
    held_min_block: int = 4096
    # Many rows held as half a block plus any shorter power-of-two tail (HELD: 1152 as 1024 + 128, not 2048), by
    # direction and element size: {"fwd" | "bwd": {bytes: (least block, most block)}}; None: small tails only.
    held_tails: dict | None = None
    # Many rows held as half the block, a power of two and a shorter tail (HELD 2: 6464 as 4096 + 2048 + 512,
    # 10816 as 8192 + 2048 + 1024) where that holds fewer positions than half plus one tail, same form as
    # held_tails; None: off (no GPU's measurements turn it on yet).
    held_pieces: dict | None = None
    # Many rows on 16-byte boundaries of a block between two lengths, held as half the block plus any shorter tail
    # (HELD), on a measured warp count (over held_tails and held_values_per_thread): {"fwd" | "bwd": {bytes: {block:
    # [shortest row, longest row, warps]}}}; None: off. The warps a tail wants are not the whole block's.
    held_rows: dict | None = None

    # Measured special cases; None (or empty) leaves the rule out.
    # Many 16-bit forward rows off 16 bytes in this bucket: realigned online.
    off_align_online_bucket: int | None = None
    # Many 16-bit rows held whole in shared memory, one chunk a row: {min_n, rows_per_sm_16k, fwd_max_n,
    # bwd_max_n, bwd_max_n_ticketed, reload_over_smem_max_n}.
    smem_one_chunk: dict | None = None
    # 16-bit rows of this bucket that fused would hold with a tail: smem, its chunks cut to the row.
    smem_held_bucket: int | None = None
    # Few 16-bit backward rows of at most this many coop chunks an SM with a tuned coop-bwd config: coop.
    coop_bwd_16bit_chunks_per_sm: int = 0
    # Few fp32 forward rows up to max_n holding more than `beyond` times what coop holds at once: smem.
    smem_fp32_few_rows: dict | None = None
    # fp32 rows in CTA clusters of smem programs: {min_n, max_n, chunks, block, warps, bwd_max_chunk,
    # many_rows_bwd_chunk, held_share, held_share_bwd, held_share_max_chunk}.
    smem_fp32_cluster: dict | None = None
    # The fused backward's RELOAD configs for many rows that fill their block: {fill_parts, fill_parts_of,
    # max_registers, min_threads_per_sm, rows: {bytes: {block: [rows, warps, least, most]}},
    # dense_rows: {bytes: {block: [rows, warps]}}}.
    reload: dict | None = None
    # The bounds of the modes a launch picks for itself (kernels/launch_modes.py): {"stagger": {read_share, max_wave,
    # max_grouped_wave, min_cycles, max_cycles, max_groups, min_group_cycles}, "per_word": {min_chunks, max_chunks,
    # rows_per_sm}, "smem_bwd_cluster": {max_chunks, max_programs}}; a mode left out stays off.
    launch_modes: dict | None = None
    # Where the measured values came from (a file), for diagnostics; empty for the default policy.
    source: tuple[str, ...] = field(default=(), compare=False)


def launch_modes(policy: Policy) -> LaunchModes:
    """The policy's launch_modes as the launches take them (NO_MODES where it has none)."""
    return LaunchModes.from_values(policy.launch_modes) if policy.launch_modes else NO_MODES


def default_policy(device: DeviceInfo) -> Policy:
    """The policy for a GPU with no measured one, from its quantities: programs an SM from its register file,
    smem from twice what fused holds; the forward's one-row fused tiles (HELD_MIN_BLOCK up to what fused holds)
    hold a row past a power of two as half the block plus a tail, which takes registers and instructions for
    the row's length, not for the next power of two."""
    coop_resident = max(1, device.regs_per_sm // (COOP_PROGRAM_REGISTERS * COOP_PROGRAM_THREADS))
    fused_cap = fused_capacity(device, Policy.fused_programs_per_sm)
    blocks = (HELD_MIN_BLOCK, fused_cap)
    return Policy(coop_resident_per_sm=coop_resident, smem_min_n=2 * fused_cap,
                  held_tails={"fwd": {2: blocks, 4: blocks}})


def fused_capacity(device: DeviceInfo, programs_per_sm: int) -> int:
    """Longest row (power of two, elements) the fused family keeps in registers on ``device`` with
    ``programs_per_sm`` programs resident on each SM."""
    cap = max(1, device.regs_per_sm // programs_per_sm)
    return 1 << (cap.bit_length() - 1)


_FIELDS = {f.name for f in dataclasses.fields(Policy)} - {"source"}
_policies: dict[DeviceInfo, Policy] = {}


def policy_for(device: DeviceInfo) -> Policy:
    """The default policy with the arch file's measured values over it (cached; tuning.forget and
    dispatch.clear_cache drop it)."""
    p = _policies.get(device)
    if p is None:
        measured = tuning.policy_values(device)
        unknown = sorted(set(measured) - _FIELDS)
        if unknown:
            warnings.warn(f"tritonsoftmax: ignoring unknown policy keys for {device.arch}: {', '.join(unknown)}",
                          RuntimeWarning, stacklevel=2)
        values = {k: _keys_as_ints(v) for k, v in measured.items() if k in _FIELDS}
        p = dataclasses.replace(default_policy(device), **values, source=(device.arch,) if values else ())
        _policies[device] = p
    return p


def pin(device: DeviceInfo, p: Policy) -> None:
    """Decide with ``p`` for ``device`` until the next forget (a tuner measuring the rules without one of the
    policy's fields; clear the dispatcher's and the launches' caches around it, as api.clear_caches does)."""
    _policies[device] = p


def _keys_as_ints(value):
    """YAML mappings keyed by numbers (element bytes, blocks) as int keys, lists as tuples, all the way down."""
    if isinstance(value, dict):
        return {(int(k) if isinstance(k, str) and k.isdigit() else k): _keys_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_keys_as_ints(v) for v in value)
    return value


def forget() -> None:
    """Drop the cached policies (the next decision reads the arch files again)."""
    _policies.clear()
