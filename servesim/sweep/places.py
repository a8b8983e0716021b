"""Where a command writes, checked before it runs: a run's folder, a sweep's folder, the
capacity search's file. A bad place must not cost a whole run, sweep or search, and a run and a
sweep never share a folder (``--force`` replaces a run, never a sweep's rows). Each refusal is
one line naming the option, the place and what is allowed (:class:`PlaceError`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from servesim.errors import ServesimError


class PlaceError(ServesimError):
    """An output place that cannot be used as given."""


def out_path(text: Optional[str], option: str = "--out") -> Optional[Path]:
    """``--out`` as a path; an empty one is refused (``Path("")`` is the current folder, where a
    run's files would land unasked)."""
    if text is None:
        return None
    if not text.strip():
        raise PlaceError(f"{option} {text!r}: empty; give a folder (or for capacity a file), e.g. {option} out/run1")
    return Path(text)


def check_out(out: Path, force: bool, kind: str = "run") -> None:
    """Before the run: ``out`` must be a folder we can write into (or create), and must not
    hold an earlier run unless ``--force``; a run and a sweep never share a folder (``--force``
    does not remove a sweep's rows, nor a sweep a run's files)."""
    from servesim.metrics.runfiles import holds_run
    from servesim.sweep.store import holds_sweep

    if out.exists():
        if not out.is_dir():
            raise PlaceError(f"--out {out}: is a file, not a folder (give a folder for the {kind}'s files)")
        found, sweep_found = holds_run(out), holds_sweep(out)
        if kind == "run" and sweep_found:
            raise PlaceError(f"--out {out}: holds a sweep ({sweep_found}); a run needs a folder of its own (choose another)")
        if kind == "sweep" and found:
            raise PlaceError(f"--out {out}: holds a run ({found}); a sweep needs a folder of its own (choose another)")
        if kind == "run" and found and not force:
            raise PlaceError(f"--out {out}: already holds a run ({found}); pass --force to replace it, or choose "
                  f"another folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise PlaceError(f"--out {out}: the folder is not writable")
        return
    check_creatable(out)


def check_creatable(out: Path) -> None:
    """``out`` does not exist: its nearest existing parent must be a writable folder."""
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise PlaceError(f"--out {out}: cannot create it, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PlaceError(f"--out {out}: cannot create it, {parent} is not writable")


def check_file_out(out: Path) -> None:
    """A file to write (capacity's JSON): not a folder, writable, or creatable."""
    if out.is_dir():
        raise PlaceError(f"--out {out}: is a folder; capacity writes one JSON file (e.g. --out {out / 'capacity.json'})")
    if out.exists() and not os.access(out, os.W_OK):
        raise PlaceError(f"--out {out}: the file is not writable")
    if not out.exists():
        check_creatable(out)
