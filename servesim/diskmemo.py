"""Derived data kept on disk between processes, keyed by what it was derived from.

A one-off ``servesim run`` of 10k requests spends more time deriving its inputs than simulating:
parsing a calibration pack and building its step-time tables (~0.15 s), reading a length trace of
tens of thousands of rows (~0.1 s). Both are pure functions of files that rarely change and of
servesim's own code, so the result is kept in the user's cache folder and read back (~2 ms) by
the next process whose inputs carry the same stamps.

The key of an entry is the caller's arguments, the (path, size, modification time) of every input
file, and the same stamps of the source files that derive it (a changed file or an edited module
is a new key: stale entries are never read, only left to expire). Entries unused for
:data:`UNUSED_DAYS` are removed. A damaged or unreadable entry is rebuilt; a cache folder that
cannot be written only costs the speed-up. ``SERVESIM_NO_DISK_MEMO=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
UNUSED_DAYS = 14
_PKG = Path(__file__).resolve().parent


def cache_bases() -> tuple[Path, ...]:
    """Where servesim keeps caches, in order of preference: ``SERVESIM_CACHE_DIR``, the XDG cache
    folder or ``~/.cache``, then the temporary folder (when home is read-only)."""
    base = os.environ.get("SERVESIM_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base), Path(tempfile.gettempdir())


def stamp(path: Path | str) -> str:
    """A file's identity for a key: resolved path, size and modification time."""
    p = Path(path).resolve()
    st = p.stat()
    return f"{p}:{st.st_size}:{st.st_mtime_ns}"


def code_stamp(modules: Iterable[str]) -> str:
    """Stamps of servesim's own source files (paths relative to the package folder)."""
    return ";".join(stamp(_PKG / m) for m in modules)


def _folder(kind: str) -> Path | None:
    for base in cache_bases():
        d = base / "servesim-data" / kind
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    return None


def _expire(folder: Path, keep: Path) -> None:
    cutoff = time.time() - UNUSED_DAYS * 86400
    try:
        for f in folder.iterdir():
            if f != keep and f.stat().st_mtime < cutoff:
                f.unlink(missing_ok=True)
    except OSError:
        pass


def disk_memo(kind: str, key: tuple, build: Callable[[], T]) -> T:
    """``build()``, or the value an earlier process built under the same ``kind`` and ``key``
    (a tuple of strings and numbers: arguments and :func:`stamp`s, made by the caller)."""
    if os.environ.get("SERVESIM_NO_DISK_MEMO"):
        return build()
    folder = _folder(kind)
    if folder is None:
        return build()
    # pickles of another Python or numpy are not read back: they may not load, or load differently
    versions = (sys.version, sys.modules["numpy"].__version__ if "numpy" in sys.modules else "")
    digest = hashlib.sha256(repr((kind, versions, key)).encode()).hexdigest()[:24]
    path = folder / f"{digest}.pkl"
    try:
        with open(path, "rb") as fh:
            value = pickle.load(fh)
        os.utime(path)  # used now: keeps it from expiring
        return value
    except FileNotFoundError:
        pass
    except Exception:  # damaged or written by an incompatible version: rebuild it
        pass
    value = build()
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old entry or the whole new one
        _expire(folder, keep=path)
    except OSError:
        try:
            os.unlink(tmp)
        except (OSError, UnboundLocalError):
            pass
    return value
