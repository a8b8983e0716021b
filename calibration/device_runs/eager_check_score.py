#!/usr/bin/env python3
"""Score the eager floor on eager_check.sh's forwards (issue 28): measured eager and CUDA-graph
decode forwards of h200/llama-3-8b against the pack model with the floor fitted on the CPU-bound
calibration rows (servesim/perf/packmodel.py, current) and with the earlier floor (the walls of
every calibration row, ``W(b)``, recomputed here from the same pack rows).

    python calibration/device_runs/eager_check_score.py FOLDER   (FOLDER holds run*.csv)

Prints one markdown table row per (run, batch, context) and a summary per rule.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from servesim.perf.packmodel import Curve, load_pack_model, pool_median  # noqa: E402


def old_floor(m) -> Curve:
    """The floor before issue 28: every calibration row's wall (kernels at c0 + overhead_eager)."""
    rows = m.pack.rows("overhead_eager")
    b, over = pool_median(rows.batch, rows.time_ms)
    c0 = float((m.pack.meta.get("overhead") or {}).get("calibration_context", 0) or 0)
    kernels = np.array([m._lin_at(int(x)) + float(m._per_seq_ms(np.array([x]))[0]) - float(m._gaps(np.array([x]))[0])
                        + m.layers * float(m.decode_attn.reference(int(x), np.array([x * c0]))[0]) for x in b])
    return Curve(b, kernels + over)


def main(folder: Path) -> None:
    runs = sorted(folder.glob("run*.csv"))
    if not runs:
        raise SystemExit(f"{folder}: no run*.csv")
    eager = load_pack_model("h200", "llama-3-8b")
    graph = load_pack_model("h200", "llama-3-8b", cuda_graph=True)
    w = old_floor(eager)
    rows = []
    for path in runs:
        df = pd.read_csv(path)
        df = df[df.n_prefill == 0]
        for (b, c), g in df.groupby(["n_decode", "decode_ctx"]):
            meas = {bool(str(x).lower() == "true"): float(y) for x, y in zip(g.cuda_graph, g.measured_ms)}
            new, ctx = np.ones(int(b), np.int64), np.full(int(b), int(c))
            k = graph.predict(new, ctx) * 1e3
            e_new = eager.predict(new, ctx) * 1e3
            e_old = max(k, float(w(b)))
            rows.append(dict(run=path.stem, batch=int(b), ctx=int(c), eager_ms=meas.get(False, np.nan),
                             graph_ms=meas.get(True, np.nan), pred_graph=k, pred_eager_old=e_old,
                             pred_eager_new=e_new))
    r = pd.DataFrame(rows)
    r["err_old"] = r.pred_eager_old / r.eager_ms - 1
    r["err_new"] = r.pred_eager_new / r.eager_ms - 1
    r["err_graph"] = r.pred_graph / r.graph_ms - 1
    print("| run | batch | context | eager measured (ms) | graph measured | eager pred., old floor | error | eager pred., new floor | error | graph pred. | error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for x in r.sort_values(["run", "ctx", "batch"]).itertuples():
        print(f"| {x.run} | {x.batch} | {x.ctx} | {x.eager_ms:.2f} | {x.graph_ms:.2f} | {x.pred_eager_old:.2f} | "
              f"{100 * x.err_old:+.1f}% | {x.pred_eager_new:.2f} | {100 * x.err_new:+.1f}% | {x.pred_graph:.2f} | "
              f"{100 * x.err_graph:+.1f}% |")
    for name, sel in (("all", r), ("batch >= 256", r[r.batch >= 256])):
        for col in ("err_old", "err_new", "err_graph"):
            e = sel[col].abs().dropna() * 100
            print(f"- {name}, {col}: n {len(e)}, median {e.median():.1f}%, max {e.max():.1f}%, "
                  f"mean signed {100 * sel[col].mean():+.1f}%")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "calibration" / "validation" / "h200_eager_check")
