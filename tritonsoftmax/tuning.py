"""The tuning store: winning launch configs persisted as YAML, one file per GPU arch.

Layout of a file (``<root>/<backend>/<arch>.yaml``; schema in ``tune_cache/README.md``)::

    schema: 1
    header: {device: NVIDIA H200, backend: cuda, arch: sm_90, triton: 3.6.0, torch: 2.11.0}
    entries:
      <family>:
        <dtype>:                # float32 | float16 | bfloat16
          <N key>:              # the N bucket (next power of two of the row length), or a length
                                # below it: an entry for the bucket's rows up to that length
            <M bucket>:         # coarse row-count bucket (powers of 4, see config.m_bucket)
              {config: {BLOCK: 4096, num_warps: 8, num_stages: 1}, ms: 0.0123, triton: 3.6.0}

Two roots are read, user first: the user directory (``TRITONSOFTMAX_TUNE_CACHE``, default
``~/.cache/tritonsoftmax``) and the tables shipped with the package. Files are read once per
process; a corrupt, truncated or unknown-schema file is skipped with one warning naming it.
Writes are atomic (temporary file + rename) under an exclusive lock, so two tuners writing the
same file both keep their entries.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from .config import LaunchConfig, m_bucket, n_bucket
from .device import DeviceInfo

SCHEMA = 1
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def user_dir() -> Path:
    """The user's tuning directory: ``$TRITONSOFTMAX_TUNE_CACHE`` or ``~/.cache/tritonsoftmax``."""
    env = os.environ.get("TRITONSOFTMAX_TUNE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tritonsoftmax"


def repo_dir() -> Path | None:
    """The checkout's ``tune_cache/`` (when running from a source tree), else None."""
    path = Path(__file__).resolve().parent.parent / "tune_cache"
    return path if path.is_dir() else None


def shipped_dir() -> Path | None:
    """The tables shipped with the package: package data in a wheel, the checkout otherwise."""
    try:
        from importlib.resources import files

        path = Path(str(files("tritonsoftmax.tune_cache")))
        if path.is_dir():
            return path
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    return repo_dir()


def table_path(root: Path, device: DeviceInfo) -> Path:
    return Path(root) / device.backend / f"{device.arch}.yaml"


@dataclass(frozen=True)
class Entry:
    config: LaunchConfig
    ms: float | None
    source: Path


_loaded: dict[Path, dict] = {}
_warned: set[Path] = set()


def _read_doc(path: Path) -> dict:
    """One arch file ({} when absent; {} with one warning when unreadable): schema, header, entries and, where
    the tuner measured it, the dispatch policy."""
    if path in _loaded:
        return _loaded[path]
    doc: dict = {}
    if path.is_file():
        try:
            doc = yaml.safe_load(path.read_text())
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("entries"), dict):
                raise ValueError(f"unknown schema (expected a mapping with schema: {SCHEMA} and entries)")
        except (OSError, yaml.YAMLError, ValueError) as e:
            if path not in _warned:
                _warned.add(path)
                warnings.warn(f"tritonsoftmax: ignoring tuning table {path}: {str(e).splitlines()[0]}",
                              RuntimeWarning, stacklevel=3)
            doc = {}
    _loaded[path] = doc
    return doc


def _read(path: Path) -> dict:
    """The ``entries`` of one file ({} when absent or unreadable)."""
    return _read_doc(path).get("entries", {})


def policy_values(device: DeviceInfo) -> dict:
    """The ``policy`` mapping of ``device``'s arch files (the dispatch thresholds measured on that arch, see
    tritonsoftmax.policy): the shipped table's, with the user's table's keys over it. {} where neither has one."""
    out: dict = {}
    for root in reversed(roots()):
        section = _read_doc(table_path(root, device)).get("policy")
        if isinstance(section, dict):
            out.update(section)
    return out


def forget() -> None:
    """Drop what was read, so the next lookup reads the files again."""
    _loaded.clear()


def roots() -> list[Path]:
    """Where lookups search, in order: the user directory, then the shipped tables (unless
    ``TRITONSOFTMAX_TUNE_CACHE_SHIPPED=0``)."""
    out = [user_dir()]
    if os.environ.get("TRITONSOFTMAX_TUNE_CACHE_SHIPPED", "1") in ("0", ""):
        return out
    shipped = shipped_dir()
    if shipped is not None and shipped.resolve() != out[0].resolve():
        out.append(shipped)
    return out


NEAREST_M = 16  # an entry serves row counts up to this factor away from the one it was tuned at
# ... except, for families that size their chunks, and so their grid, from M (split, coop), fewer
# rows than half the tuned count: such a config leaves the GPU underfilled (a split config tuned at
# 128 rows of 1M ran 8 rows at 649 GB/s against 2140 with the heuristic, H200). More rows only add
# programs, so those entries still serve up to NEAREST_M times the rows they were tuned at. (M
# buckets are powers of four, so fewer rows than the entry's own bucket are refused.)
NEAREST_M_FEWER_ROWS_GRID_FROM_M = 2


def n_keys(keys, N: int) -> list[int]:
    """The N keys of a table (``keys``) that can serve a row of N, best first: those in N's bucket
    (n_bucket), the least that is at least N first (an entry under a key below its bucket serves
    the bucket's rows up to that length), then the larger ones, then the smaller ones, nearest first
    (a bucket whose keys all lie below N still serves it)."""
    nb = n_bucket(N)
    inside = [k for k in keys if isinstance(k, int) and not isinstance(k, bool) and k >= 1 and n_bucket(k) == nb]
    return sorted(k for k in inside if k >= N) + sorted((k for k in inside if k < N), reverse=True)


def lookup(device: DeviceInfo, family: str, dtype: torch.dtype, N: int, M: int,
           fewer_rows_factor: int = NEAREST_M, within: Path | None = None) -> Entry | None:
    """The stored config for this shape, or None. The N key must lie in N's bucket (n_keys gives
    the order when a bucket holds several); among its M buckets the exact one wins, else the
    nearest (in powers of 4) within a factor of NEAREST_M, and within ``fewer_rows_factor`` when M
    is below the entry's: a config tuned on thousands of rows (several rows a program, chunks sized
    to fill the GPU with many rows) is not used for a handful. The first root that has a usable
    entry wins. ``within``: search that root only (the tuner's table)."""
    if dtype not in DTYPE_NAMES:
        return None
    mb = m_bucket(M)
    up, down = NEAREST_M.bit_length() - 1, fewer_rows_factor.bit_length() - 1
    for root in [within] if within is not None else roots():
        path = table_path(root, device)
        by_n = _family_entries(path, family, dtype)
        if not isinstance(by_n, dict):
            continue
        for key in n_keys(by_n, N):
            by_m = by_n[key]
            if not isinstance(by_m, dict) or not by_m:
                continue
            try:
                usable = [k for k in map(int, by_m) if -up <= k.bit_length() - mb.bit_length() <= down]
                if not usable:
                    continue
                best = min(usable, key=lambda k: (abs(k.bit_length() - mb.bit_length()), k))
                item = by_m[best]
                return Entry(LaunchConfig.from_dict(item["config"]), item.get("ms"), path)
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                if path not in _warned:
                    _warned.add(path)
                    warnings.warn(f"tritonsoftmax: ignoring malformed entry in {path}: {e}", RuntimeWarning,
                                  stacklevel=2)
    return None


def _family_entries(path: Path, family: str, dtype: torch.dtype):
    """One family's entries for one dtype in the table at ``path``: {N key: {M bucket: item}} (or whatever a
    hand-edited file holds there)."""
    return _read(path).get(family, {}).get(DTYPE_NAMES[dtype], {})


def _slot(N: int, M: int, up_to_n: bool = False) -> tuple[int, int]:
    """Where an entry for (N, M) lives: N's bucket (or N itself, ``up_to_n``) and M's bucket."""
    return (N if up_to_n else n_bucket(N)), m_bucket(M)


def stored_config(root: Path, device: DeviceInfo, family: str, dtype: torch.dtype, N: int, M: int,
                  up_to_n: bool = False) -> LaunchConfig | None:
    """The config ``root``'s table holds in exactly the slot that :func:`record` would write (N, M) to (no
    nearest-bucket search), or None: what a tuner run is about to replace."""
    n_key, m_key = _slot(N, M, up_to_n)
    try:
        return LaunchConfig.from_dict(_family_entries(table_path(root, device), family, dtype)[n_key][m_key]["config"])
    except (AttributeError, TypeError, ValueError, KeyError):
        return None


# A family's lead at one row count is trusted for that row count's M bucket only (4x wide): with fewer rows the GPU
# is filled differently (the rules' few-rows and rows-an-SM bounds move), with more the launch runs in more waves.
WINNER_M_BUCKETS = 0


def _winners(path: Path, direction: str, dtype_name: str) -> dict:
    """{N: {M: item}} of one direction and dtype in the ``dispatch`` mapping of the table at ``path``."""
    section = _read_doc(path).get("dispatch")
    found = section.get(direction, {}).get(dtype_name, {}) if isinstance(section, dict) else {}
    return found if isinstance(found, dict) else {}


def stored_winner(root: Path, device: DeviceInfo, direction: str, dtype_name: str, N: int, M: int) -> str | None:
    """The family ``root``'s table records as fastest at exactly this point (the family tuner's), or None."""
    item = _winners(table_path(root, device), direction, dtype_name).get(N, {}).get(M)
    return item.get("family") if isinstance(item, dict) else None


def dispatch_winner(device: DeviceInfo, backward: bool, dtype: torch.dtype, N: int, M: int) -> str | None:
    """The family the tables' family tuner found fastest for rows of exactly N elements at the nearest row count it
    measured, in its M bucket (powers of 4; WINNER_M_BUCKETS more either way); the user's table first. None where no
    table measured N: the rules decide."""
    if dtype not in DTYPE_NAMES:
        return None
    direction = "bwd" if backward else "fwd"
    for root in roots():
        by_m = _winners(table_path(root, device), direction, DTYPE_NAMES[dtype]).get(N)
        if not isinstance(by_m, dict):
            continue
        near = [k for k in by_m if isinstance(k, int) and abs(m_bucket(k).bit_length() - m_bucket(M).bit_length())
                <= 2 * WINNER_M_BUCKETS]
        if near:
            best = min(near, key=lambda k: (abs(m_bucket(k).bit_length() - m_bucket(M).bit_length()), abs(k - M)))
            family = by_m[best].get("family") if isinstance(by_m[best], dict) else None
            if isinstance(family, str):
                return family
    return None


def record_winner(root: Path, device: DeviceInfo, point: tuple[str, str, int, int], family: str,
                  times: dict[str, float]) -> Path:
    """Write the family tuner's result at ``point`` (direction, dtype name, N, M): the winner and every family's
    ms, into ``root``'s table (atomic, under the table's lock, as :func:`record`)."""
    direction, dtype_name, N, M = point

    def merge(doc: dict) -> None:
        section = doc.setdefault("dispatch", {})
        section.setdefault(direction, {}).setdefault(dtype_name, {}).setdefault(N, {})[M] = {
            "family": family, "ms": {k: round(float(v), 6) for k, v in sorted(times.items())}}

    return _rewrite(root, device, merge)


def record_policy(root: Path, device: DeviceInfo, field: str, value) -> Path:
    """Write a tuner's measured value of the policy's ``field`` into ``root``'s table (replacing the table's; None
    removes it), atomic and under the table's lock as :func:`record`."""

    def merge(doc: dict) -> None:
        section = doc.get("policy") if isinstance(doc.get("policy"), dict) else {}
        if value is None:
            section.pop(field, None)
        else:
            section[field] = value
        if section:
            doc["policy"] = section
        else:
            doc.pop("policy", None)

    return _rewrite(root, device, merge)


@contextlib.contextmanager
def _locked(path: Path):
    lock = path.with_suffix(path.suffix + ".lock")
    with open(lock, "a+") as f:
        try:
            import fcntl

            fcntl.flock(f, fcntl.LOCK_EX)
        except ImportError:  # no fcntl (Windows): the rename below is still atomic
            pass
        yield


def header(device: DeviceInfo) -> dict:
    """What a table is for (the device, its backend and arch) and the versions of its last write. It holds no
    account of the runs that wrote it: each entry carries its own time, timer and triton version."""
    import triton

    return {"device": device.name, "backend": device.backend, "arch": device.arch,
            "triton": triton.__version__, "torch": torch.__version__.split("+")[0]}


def record(root: Path, device: DeviceInfo,
           results: list[tuple[str, torch.dtype, int, int, LaunchConfig, float | None]], *,
           timer: str = "events", up_to_n: bool = False) -> Path:
    """Merge ``results`` — (family, dtype, N, M, config, ms) — into ``root``'s file for ``device``,
    each under N's bucket, or with ``up_to_n`` under N itself (an entry for its bucket's rows up to N).
    ``timer``: how ``ms`` was measured; entries timed by kernel time (``tritonsoftmax.kernel_timer``)
    say so (``timer: kernel``), since their ms leave out what do_bench's count in.

    Atomic and safe against concurrent writers: read-merge-write under an exclusive lock, the new
    file written beside the old one and renamed over it. Returns the file's path.
    """
    import triton

    def merge(doc: dict) -> None:
        entries = doc.get("entries") if isinstance(doc.get("entries"), dict) else {}
        for family, dtype, N, M, config, ms in results:
            n_key, m_key = _slot(N, M, up_to_n)
            slot = entries.setdefault(family, {}).setdefault(DTYPE_NAMES[dtype], {}).setdefault(n_key, {})
            slot[m_key] = {"config": config.as_dict(), "ms": None if ms is None else round(float(ms), 6),
                           "triton": triton.__version__, **({"timer": timer} if timer != "events" else {})}
        doc["entries"] = entries

    return _rewrite(root, device, merge)


def _rewrite(root: Path, device: DeviceInfo, merge: Callable[[dict], None]) -> Path:
    """Read ``root``'s table for ``device``, let ``merge`` change the document in place, write it back with a fresh
    header (header(): anything else an older file held there is dropped): under an exclusive lock, the new file
    written beside the old one and renamed over it. Returns the file's path."""
    path = table_path(root, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        doc: dict = {}
        if path.is_file():
            try:
                doc = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError:
                doc = {}
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
                doc = {}
        doc.setdefault("entries", {})
        merge(doc)
        doc["header"] = header(device)
        doc["schema"] = SCHEMA
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(doc, f, sort_keys=True, default_flow_style=None, width=120)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    _loaded.pop(path, None)
    return path
