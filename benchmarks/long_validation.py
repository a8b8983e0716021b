"""Long-context whole-iteration validation on the H100 and the H200 (issue 28: "runs leave the calibration").

The forwards of `profile_gpu.py iterations --compositions long` (device calls 27 and 29,
calibration/COMMANDS.md; `calibration/validation_long/<gpu>/`) are batches beyond the dense op grid
(tokens > 16,384, a chunk > 8,192 or its context > 24,576, a decode context > 32,768) and off the
long grid's points. No fit reads them. Each is predicted by

* the shipped pack, dense grid + the long rows (H100: call 25; H200 qwen3-14b: call 29; H200
  llama-3.1-8b and qwen3-8b: call 9 of the first H200 session), what runs use now, and
* the same pack as it was at ``BEFORE`` (the commit before this session's long rows: dense grid
  only, beyond it extrapolation -- except the H200's llama-3.1-8b and qwen3-8b, long already),

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

GPUS = ("h100-80g", "h200")
BEFORE = "82ae423"  # main before this session's long rows (68f0a2d: H100; the H200 qwen3-14b after)


def before_pack(gpu: str, model: str, d: Path):
    """The pack's files at ``BEFORE``, written under ``d``."""
    out = d / gpu
    out.mkdir(parents=True, exist_ok=True)
    for ext in ("csv", "yaml"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:calibration/packs/{gpu}/{model}.{ext}"],
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
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for gpu, model in ((g, m) for g in GPUS for m in sorted(read_validation(
                REPO / "calibration" / "validation_long" / g).model.unique())):
            val = read_validation(REPO / "calibration" / "validation_long" / gpu)
            v = val[val.model == model].copy()
            v["kind"] = [kind(r) for r in v.itertuples()]
            packs = {"shipped (with long rows)": load_pack(gpu, model, 1),
                     f"at {BEFORE}": before_pack(gpu, model, Path(d) / "before")}
            for name, pack in packs.items():
                for graph in (True, False):
                    w = v[v.cuda_graph == graph]
                    if w.empty:
                        continue
                    m = PackStepModel(pack, MODELS[model], cuda_graph=graph, graph_scope="all")
                    e = predict_frame(w, m) / w.measured_ms.to_numpy() - 1
                    rows.append({"gpu": gpu, "model": model, "pack": name, "forwards": "graph" if graph else "eager",
                                 "kind": "all", **stats(e)})
                    if graph:
                        for k in sorted(w.kind.unique()):
                            s = (w.kind == k).to_numpy()
                            rows.append({"gpu": gpu, "model": model, "pack": name, "forwards": "graph", "kind": k,
                                         **stats(e[s])})
    df = pd.DataFrame(rows)
    cols = list(df.columns)
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in df.itertuples(index=False):
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
