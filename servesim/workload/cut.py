"""The stop condition applied to a drawn workload: its first ``stop.requests`` rows arriving
before ``stop.duration_s``, with a note when the data ends first."""

from __future__ import annotations

import dataclasses

import numpy as np

from servesim.request import Workload


def cut(w: Workload, n: int | None, duration_s: float | None) -> Workload:
    """The first ``n`` requests arriving before ``duration_s`` (arrivals are sorted)."""
    keep = len(w)
    if duration_s is not None:
        keep = int(np.searchsorted(w.arrival_s, duration_s, side="left"))
    short: tuple[str, ...] = ()
    if n is not None:
        if keep < n:  # the data ends (or the stop time comes) first: say so, never silently
            short = (f"run: the workload gives {keep:,} requests"
                     + (" before stop.duration_s" if keep < len(w) else "")
                     + f", fewer than stop.requests {n:,}; all of them run",)
        keep = min(keep, n)
    if keep == len(w):
        return dataclasses.replace(w, notes=w.notes + short) if short else w
    return dataclasses.replace(
        take_rows(w, slice(0, keep)),
        notes=w.notes + short + (f"run: first {keep:,} of {len(w):,} requests (stop condition)",))


def take_rows(w: Workload, rows: slice) -> Workload:
    """Rows ``rows`` (a slice from 0) of every column, prefix chains included."""
    keep = rows.stop
    off = w.prefix_offsets
    return dataclasses.replace(
        w, arrival_s=w.arrival_s[:keep], prompt_tokens=w.prompt_tokens[:keep], output_tokens=w.output_tokens[:keep],
        klass=w.klass[:keep], session=None if w.session is None else w.session[:keep], stream=w.stream[:keep],
        prefix_offsets=None if off is None else off[: keep + 1],
        prefix_hashes=None if off is None else w.prefix_hashes[: off[keep]])
