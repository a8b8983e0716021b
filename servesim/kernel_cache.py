"""Where the compiled engine lives on disk: a folder keyed by the sources it was compiled from.

numba's on-disk cache (:mod:`servesim.jit`) and the ahead-of-time engine module
(:mod:`servesim.aot`) both live in one folder per version of the kernels' sources. This module
finds that folder without importing numba, so a process can tell whether an ahead-of-time engine
is built before it decides whether to load numba at all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from servesim.diskmemo import cache_bases

# modules that define kernels, relative to the package folder; their sources key the cache
KERNEL_MODULES = (
    "jit.py",
    "kv/kernels.py",
    "perf/kernels.py",
    "sched/state.py",
    "sched/queues.py",
    "sched/parts.py",
    "sched/reserve.py",
    "sched/policies.py",
    "engine/inbox.py",
    "engine/kernel.py",
)
_PKG = Path(__file__).resolve().parent


def _source_hash() -> str:
    """The kernels' sources, where they are and their modification stamps. numba keys its own
    cache index by each file's path and stamp, so an install at another path (a new venv) or a
    touched file recompiles whatever the READY marker (engine/warm.py) of a shared folder said;
    keying the folder the same way keeps the marker truthful."""
    h = hashlib.sha256()
    for rel in KERNEL_MODULES:
        p = _PKG / rel
        if p.is_file():
            h.update(rel.encode())
            h.update(p.read_bytes())
            h.update(f"{p}:{p.stat().st_mtime_ns}".encode())
    return h.hexdigest()[:16]


UNUSED_DAYS = 14  # a cache folder no import has used this long is removed (each is ~200 MB)


def _prune(root: Path, keep: Path) -> None:
    """Remove other versions' and installs' folders unused for UNUSED_DAYS (every import marks
    its own folder used), so upgrades and new environments do not pile up compiled code."""
    cutoff = time.time() - UNUSED_DAYS * 86400
    try:
        for sib in root.iterdir():
            if sib != keep and sib.is_dir() and sib.stat().st_mtime < cutoff:
                shutil.rmtree(sib, ignore_errors=True)
    except OSError:
        pass


def _cache_dir() -> str:
    """A writable folder for compiled kernels, keyed by the kernels' sources."""
    for root in (base / "servesim-numba" for base in cache_bases()):
        d = root / _source_hash()
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / ".probe"
            probe.write_text("")
            probe.unlink()
            os.utime(d)  # last used now
            _prune(root, keep=d)
            return str(d)
        except OSError:
            continue
    return ""


_CACHE_DIR: str | None = None


def cache_dir() -> str:
    """The folder of this kernel version's compiled code, created on first use ("" when no
    folder is writable: numba then picks its own and no ahead-of-time engine is kept)."""
    global _CACHE_DIR
    if _CACHE_DIR is None:
        _CACHE_DIR = "" if os.environ.get("NUMBA_CACHE_DIR") else _cache_dir()
    return _CACHE_DIR


