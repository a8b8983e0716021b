"""How much of a run lay outside the calibration pack's measured grid (summary.json ``extrapolation``).

A pack measures each op on a grid (GEMMs by tokens, decode attention by batch and KV tokens per
sequence, prefill attention by chunk and cached context); beyond a grid's end the step-time
model extrapolates (docs/calibration.md states the rules and their measured errors). The engine
tallies, per committed iteration, which op kinds lay beyond their grid's end and how long the
iteration took (``count_iteration`` / ``count_decode_run`` in servesim/perf/kernels.py: a few
comparisons per iteration, into the engine's own copy of ``StepTables.pk_ex``). This module turns
those counters into shares of iterations and of step time, per op kind and for any kind, with a
warning above :data:`WARN_SHARE`.
"""

from __future__ import annotations

import numpy as np

#: (summary key, what a user reads) per op kind, in the counters' order
KINDS = (("gemm_tokens", "GEMM tokens per iteration"),
         ("decode_batch", "decode attention batch"),
         ("decode_kv_per_seq", "decode attention KV tokens per sequence"),
         ("prefill_chunk", "prefill attention chunk tokens"),
         ("prefill_context", "prefill attention cached context"))
#: a run with more than this share of its iterations or step time outside the grid gets a warning
WARN_SHARE = 0.05


def report(tables) -> dict:
    """summary.json's ``extrapolation`` from the engines' step tables (a lone replica's, or every
    replica's of a fleet; the same table twice is counted once). Without a pack (roofline,
    constant or a Python model) there is no measured grid, and the entry says so."""
    tables = [t for t in tables if t is not None]
    if tables:  # (built tables mean the kernels are loaded: importing them here costs nothing)
        from servesim.perf.kernels import EX_KINDS, EX_LEN, EX_N0, EX_S0, EX_TOTAL_N, EX_TOTAL_S, PACK
    seen: dict[int, np.ndarray] = {}
    for tab in tables:
        if int(tab.kind) != PACK or tab.pk_ex.shape[0] < EX_LEN:
            continue
        seen.setdefault(id(tab.pk_ex), tab.pk_ex)
    if not seen:
        return {"measured_grid": False, "note": "the step-time model is not a calibration pack: it has no "
                                               "measured grid (see step_model)"}
    arrays = list(seen.values())
    total = np.sum(arrays, axis=0)
    n, s = float(total[EX_TOTAL_N]), float(total[EX_TOTAL_S])

    def share(x: float, of: float) -> float | None:
        return x / of if of > 0 else None

    by_op = {}
    for k, (key, label) in enumerate(KINDS):
        ends = sorted({float(a[k]) for a in arrays})
        by_op[key] = {"what": label, "grid_end": ends[0] if len(ends) == 1 else ends,
                      "iterations": int(total[EX_N0 + k]), "iterations_share": share(total[EX_N0 + k], n),
                      "step_time_share": share(total[EX_S0 + k], s)}
    out = {"measured_grid": True, "iterations": int(n), "step_time_s": s,
           "iterations_outside": int(total[EX_N0 + EX_KINDS]),
           "iterations_share": share(total[EX_N0 + EX_KINDS], n),
           "step_time_share": share(total[EX_S0 + EX_KINDS], s),
           "by_op": by_op, "warn_share": WARN_SHARE, "warning": None}
    out["warning"] = warning(out)
    return out


def warning(ex: dict) -> str | None:
    """One line when more than :data:`WARN_SHARE` of the iterations or of the step time lay
    outside the measured grid, naming the op kinds that did (largest share of step time first)."""
    if not ex.get("measured_grid"):
        return None
    it, st = ex["iterations_share"] or 0.0, ex["step_time_share"] or 0.0
    if max(it, st) <= ex["warn_share"]:
        return None
    ops = sorted(((v["step_time_share"] or 0.0, v["iterations_share"] or 0.0, v) for v in ex["by_op"].values()
                  if v["iterations"]), key=lambda x: (-x[0], -x[1]))
    parts = [f"{v['what']} > {_end(v['grid_end'])} ({a:.0%} of iterations, {b:.0%} of step time)"
             for b, a, v in ops]
    return (f"{it:.0%} of iterations ({st:.0%} of step time) ran outside the calibration pack's measured grid, "
            f"extrapolated: " + "; ".join(parts))


def summary_line(ex: dict) -> str:
    """The console's one line on the run's calibration coverage."""
    if not ex.get("measured_grid"):
        return "no measured grid (the step-time model is not a pack)"
    it, st = ex["iterations_share"], ex["step_time_share"]
    if it is None:
        return "no iterations"
    return (f"{it:.1%} of iterations ({(st or 0.0):.1%} of step time) outside the pack's measured grid"
            + ("" if not ex["iterations_outside"] else " (" + ", ".join(
                f"{key} {v['iterations_share']:.1%}" for key, v in ex["by_op"].items() if v["iterations"]) + ")"))


def _end(end) -> str:
    return f"{end:,.0f}" if not isinstance(end, list) else "/".join(f"{e:,.0f}" for e in end)
