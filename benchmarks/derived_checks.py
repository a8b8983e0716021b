"""Fidelity checks of the kernel-efficiency floor, the derived packs and the fitted roofline
(sections of benchmarks/calibration_fidelity.py; numbers quoted in calibration/VALIDATION.md).

Every check scores a rule on data it did not use: the A100 derivation leaves each Vidur model out
and predicts it from the other three; the H200 derivation predicts qwen3 packs from llama-3-8b's
alone and scores them against the qwen3 packs and the whole-iteration validation forwards; the
roofline fitted to one pack predicts the other models' validation forwards.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesim.hardware import GPUS  # noqa: E402
from servesim.models import MODELS  # noqa: E402
from servesim.tools.calibrate_cli import predict_frame, read_validation  # noqa: E402
from servesim.tools.derived_packs import (compare_with_pack, from_measured_pack,  # noqa: E402
                                         leave_one_out)
from servesim.perf.efficiency import DECODE_FLOOR, decode_floor_points, pack_efficiency  # noqa: E402
from servesim.perf.pack import available_packs, load_pack, read_pack, write_pack  # noqa: E402
from servesim.perf.packmodel import PackStepModel  # noqa: E402
from servesim.perf.roofline import RooflineStepModel  # noqa: E402
from servesim.perf.rooflinefit import fit_roofline  # noqa: E402

VALIDATION = REPO / "calibration" / "validation"


def pct(x) -> str:
    return f"{100 * x:.1f}%"


def efficiency_table() -> pd.DataFrame:
    rows = []
    for gpu, model, tp in available_packs():
        p = load_pack(gpu, model, tp)
        e = pack_efficiency(p)
        share = decode_floor_points(p)
        none = share.size == 0  # no decode row at batch >= 64 (a100-80g/llama-2-7b: its decode rows stop at batch 16)
        rows.append({"pack": f"{gpu}/{p.csv_path.stem}", "source": p.meta.get("source"),
                     "decode attn b>=64: median share of HBM peak": "-" if none else pct(np.median(share)),
                     "min": "-" if none else pct(share.min()),
                     f"floor {DECODE_FLOOR:.0%}": "no rows" if none else "met" if np.median(share) >= DECODE_FLOOR else "MISSED",
                     "GEMM <=16 tok TB/s (median)": e["gemm_tokens_le_16_TBps"].get("median"),
                     "GEMM >=4096 tok TFLOP/s (median)": e["gemm_tokens_ge_4096_TFLOPps"].get("median"),
                     "prefill attn >=2048 TFLOP/s (median)": e["attn_prefill_chunk_ge_2048_TFLOPps"].get("median")})
    return pd.DataFrame(rows)


def a100_leave_one_out(src: Path) -> pd.DataFrame:
    df = leave_one_out(src)
    gemm = df[df.op.isin(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])]
    other = df[~df.op.isin(["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "layer token-op sum"])]
    rows = []
    for m, g in df.groupby("left out"):
        s = g[g.op == "layer token-op sum"].iloc[0]
        rows.append({"left out": m,
                     "GEMMs: median of per-op medians": pct(gemm[gemm["left out"] == m]["median"].median()),
                     "bandwidth ops: median of per-op medians": pct(other[other["left out"] == m]["median"].median()),
                     "layer token-op sum: median": pct(s["median"]), "p90": pct(s["p90"]), "max": pct(s["max"])})
    return pd.DataFrame(rows)


def _derived_model(rows, meta, model, tp, graph, scope="all"):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / meta["gpu"] / f"{model}{'' if tp == 1 else f'-tp{tp}'}.csv"
        write_pack(rows, meta, path)
        return PackStepModel(read_pack(path), MODELS[model], tp=tp, cuda_graph=graph, graph_scope=scope)


def h200_from_llama() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-op errors of qwen3 packs derived from llama-3-8b's, whole-iteration errors of those
    derived packs and of the measured ones on the same validation forwards)."""
    srcs = [load_pack("h200", "llama-3-8b", tp) for tp in (1, 2)]
    val = read_validation(VALIDATION / "h200")
    ops, its = [], []
    for model in ("qwen3-4b", "qwen3-8b", "qwen3-14b"):
        for tp in (1, 2):
            rows, meta = from_measured_pack(srcs, model, tp)
            f = compare_with_pack(rows, load_pack("h200", model, tp))
            for _, r in f.iterrows():
                ops.append({"target": f"{model}{'' if tp == 1 else f'-tp{tp}'}", "op": r.op,
                            "points": int(r.points), "median": pct(r["median"]), "p90": pct(r.p90),
                            "max": pct(r["max"])})
            if tp != 1:
                continue
            for graph in (True, False):
                v = val[(val.model == model) & (val.cuda_graph == graph)]
                for name, m in (("derived from llama-3-8b", _derived_model(rows, meta, model, tp, graph)),
                                ("measured pack", PackStepModel(load_pack("h200", model, tp), MODELS[model],
                                                                cuda_graph=graph, graph_scope="all"))):
                    e = predict_frame(v, m) / v.measured_ms.to_numpy() - 1
                    its.append({"model": model, "mode": "graph" if graph else "eager", "pack": name,
                                "n": len(e), "median": pct(np.median(np.abs(e))),
                                "p90": pct(np.quantile(np.abs(e), 0.9)), "max": pct(np.abs(e).max()),
                                "mean signed": pct(e.mean())})
    return pd.DataFrame(ops), pd.DataFrame(its)


def roofline_fit_table() -> pd.DataFrame:
    """The roofline fitted to h200/llama-3-8b (and, for reference, the default factors) against
    every model's graph-mode validation forwards."""
    val = read_validation(VALIDATION / "h200")
    val = val[val.cuda_graph]
    f = fit_roofline("h200/llama-3-8b")
    rows = []
    for model in sorted(val.model.unique()):
        v = val[val.model == model]
        for name, (a, b, o) in ((f"fit h200/llama-3-8b (mfu {f.mfu}, mbu {f.mbu}, {f.overhead_s * 1e3:.2f} ms)",
                                 (f.mfu, f.mbu, f.overhead_s)), ("default (0.6, 0.8, 2 ms)", (0.6, 0.8, 0.002))):
            m = RooflineStepModel(GPUS["h200"], MODELS[model], 1, 1, a, b, o)
            e = predict_frame(v, m) / v.measured_ms.to_numpy() - 1
            rows.append({"model": model, "roofline": name, "median": pct(np.median(np.abs(e))),
                         "p90": pct(np.quantile(np.abs(e), 0.9)), "max": pct(np.abs(e).max()),
                         "mean signed": pct(e.mean())})
    for ref in ("a100-80g/llama-3-8b", "h200/qwen3-14b"):
        g = fit_roofline(ref)
        rows.append({"model": f"(fit {ref}: mfu {g.mfu}, mbu {g.mbu}, {g.overhead_s * 1e3:.2f} ms)",
                     "roofline": f"own design, {g.points} iterations", "median": pct(g.median_abs_err),
                     "p90": "", "max": pct(g.max_abs_err), "mean signed": ""})
    return pd.DataFrame(rows)
