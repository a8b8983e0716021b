"""Long-context whole-iteration validation on the H100 (issue 28: "runs leave the calibration").

The forwards of `profile_gpu.py iterations --compositions long` (device call 27,
calibration/COMMANDS.md; `calibration/validation_long/<gpu>/`) are batches beyond the dense op grid
(tokens > 16,384, a chunk > 8,192 or its context > 24,576, a decode context > 32,768) and off the
long grid's points. No fit reads them. Each is predicted by

* the shipped pack, dense grid + the long rows of device call 25 (what runs use now), and
* the same pack as it was before call 25 (dense grid only: beyond it, extrapolation), read from
  git at ``BEFORE`` (the commit before the long rows were appended),

so the table says both how good the long rows are and what the extrapolation cost before.

    python benchmarks/long_validation.py          (needs a git checkout for the "before" packs)
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesim.models import MODELS  # noqa: E402
from servesim.perf.pack import load_pack, read_pack  # noqa: E402
from servesim.perf.packmodel import PackStepModel  # noqa: E402
from servesim.tools.calibrate_cli import predict_frame, read_validation  # noqa: E402

GPU = "h100-80g"
BEFORE = "82ae423"  # main before the H100 long rows (68f0a2d appended them)
FOLDER = REPO / "calibration" / "validation_long" / GPU


def before_pack(model: str, d: Path):
    """The pack's files at ``BEFORE`` (dense grid only), written under ``d``."""
    out = d / GPU
    out.mkdir(parents=True, exist_ok=True)
    for ext in ("csv", "yaml"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:calibration/packs/{GPU}/{model}.{ext}"],
                              capture_output=True, text=True, check=True).stdout
        (out / f"{model}.{ext}").write_text(text)
    return read_pack(out / f"{model}.csv")


def kind(r) -> str:
    if r.n_prefill and r.n_decode:
        return "mixed"
    if r.n_prefill:
        return "prefill" if r.prefill_ctx == 0 else "prefill+context"
    return "decode"


def stats(e: np.ndarray) -> dict:
    a = np.abs(e)
    return {"n": len(e), "median": f"{100 * np.median(a):.1f} %", "max": f"{100 * a.max():.1f} %",
            "signed median": f"{100 * np.median(e):+.1f} %"}


def main() -> None:
    val = read_validation(FOLDER)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for model in sorted(val.model.unique()):
            v = val[val.model == model].copy()
            v["kind"] = [kind(r) for r in v.itertuples()]
            packs = {"dense + long rows (shipped)": load_pack(GPU, model, 1),
                     "dense only (before call 25)": before_pack(model, Path(d))}
            for name, pack in packs.items():
                for graph in (True, False):
                    w = v[v.cuda_graph == graph]
                    if w.empty:
                        continue
                    m = PackStepModel(pack, MODELS[model], cuda_graph=graph, graph_scope="all")
                    e = predict_frame(w, m) / w.measured_ms.to_numpy() - 1
                    rows.append({"model": model, "pack": name, "forwards": "graph" if graph else "eager",
                                 "kind": "all", **stats(e)})
                    if graph:
                        for k in sorted(w.kind.unique()):
                            s = (w.kind == k).to_numpy()
                            rows.append({"model": model, "pack": name, "forwards": "graph", "kind": k,
                                         **stats(e[s])})
    df = pd.DataFrame(rows)
    cols = list(df.columns)
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in df.itertuples(index=False):
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
