"""Is the compiled engine built on this machine? Build it (``servesim warm``), in the background.

numba compiles the engine's kernels the first time they run on a machine (about a minute on two
cores) and caches them on disk (servesim/jit.py; keyed by the kernels' sources, where they are
installed and their modification stamps, as numba's own index is, so an upgrade, an edit or a new
install rebuilds them). A marker in the cache folder records that a compiled run completed, so a
caller can tell a warm machine (start-up well under a second) from a cold one.

The CLI does not make a small run wait for that minute: on a cold machine it runs the same source
uncompiled and builds the compiled engine in a background process for the next runs (one at a
time, a lock file says who); the library (``simulate``) compiles when asked to run compiled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from servesim import aot, kernel_cache

STALE_LOCK_S = 900.0


def marker() -> Path | None:
    d = kernel_cache.cache_dir()
    return Path(d) / "READY" if d else None


def compiled_ready() -> bool:
    """True when the compiled engine is in the disk cache (or there is no cache to check)."""
    m = marker()
    return m is None or m.exists()


def mark_ready() -> None:
    m = marker()
    if m is not None and not m.exists():
        try:
            m.write_text(f"compiled engine cached {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        except OSError:
            pass


def warming() -> bool:
    m = marker()
    if m is None:
        return False
    lock = m.with_name("WARMING")
    try:
        return time.time() - lock.stat().st_mtime < STALE_LOCK_S
    except OSError:
        return False


def aot_pending() -> bool:
    """The ahead-of-time engine (servesim/aot.py) is neither built nor known to fail here."""
    return aot.state() == "missing"


def warm_in_background() -> bool:
    """Start ``python -m servesim.warmup`` detached (the compiled engine, then the ahead-of-time
    one), unless one is running or both are built; True if one is running.
    ``SERVESIM_BACKGROUND_WARM=0`` turns it off (test suites, batch jobs that compile anyway)."""
    if (compiled_ready() and not aot_pending()) or os.environ.get("SERVESIM_BACKGROUND_WARM", "1") == "0":
        return False
    if warming():
        return True
    # ``-m`` puts the working folder first on the path: run from the folder that holds *this*
    # servesim, or a source checkout in the user's folder (``pip install .`` then ``servesim run``
    # in the repository) would be warmed instead of the installed copy that asked
    home = Path(kernel_cache.__file__).resolve().parents[1]
    try:
        subprocess.Popen([sys.executable, "-m", "servesim.warmup"], stdin=subprocess.DEVNULL, cwd=home,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return False
    return True
