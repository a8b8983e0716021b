"""What the H100's own op surveys (device call 26, calibration/COMMANDS.md) change, each number on
data the rule did not read (quoted in calibration/VALIDATION.md, "Op surveys (H100)").

1. The FP8 KV rule: before, an H100 run took the H200's decode_kv ratio (fp8 / bf16 cache, same
   Triton kernel); here that ratio is scored at the H100's surveyed points against the H100's own.
2. The FP8 and int4 GEMM rules and the MoE rule, leave one surveyed shape / configuration out, on
   the H100's survey (the H200's figures are in the same VALIDATION section).
3. A derived qwen3-30b-a3b on the H100 (from h100-80g/llama-3-8b and the H100's surveys only)
   against the whole-iteration validation forwards of the measured h100-80g/qwen3-30b-a3b pack.
4. The H100's derived llama-3.1-8b-fp8 against the H200's derived one transferred (no truth: a
   dynamic-FP8 pack was never measured on the H100; the difference users see).

    python benchmarks/h100_surveys.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesim.models import MODELS, with_precision  # noqa: E402
from servesim.perf.kvfp8 import BF16, FP8, GridRatio, survey_root  # noqa: E402
from servesim.perf.pack import load_pack, read_pack, write_pack  # noqa: E402
from servesim.perf.packmodel import PackStepModel  # noqa: E402
from servesim.perf.transfer import transfer_pack  # noqa: E402
from servesim.tools.calibrate_cli import predict_frame, read_validation  # noqa: E402
from servesim.tools.derive_checks import _md, gemm_leave_one_shape_out, moe_leave_one_out  # noqa: E402
from servesim.tools.derive_variants import derive_any  # noqa: E402

GPU = "h100-80g"
VAL = REPO / "calibration" / "validation" / GPU


def stats(e) -> str:
    a = np.abs(np.asarray(e, np.float64))
    return f"median {100 * np.median(a):.1f} %, max {100 * a.max():.1f} %, signed median {100 * np.median(e):+.1f} %"


def kv_ratio() -> str:
    own = pd.read_csv(survey_root() / GPU / "decode_kv.csv")
    p = own.pivot_table(index=["batch", "context"], columns="variant", values="time_ms").dropna()
    b, c = (np.array(v) for v in zip(*p.index))
    r_own = (p[FP8] / p[BF16]).to_numpy()
    r_h200 = GridRatio(pd.read_csv(survey_root() / "h200" / "decode_kv.csv"), FP8, BF16)(b, c)
    big = (b >= 32) & (c >= 4096)
    return (f"{len(r_own)} points; the H100's own fp8/bf16 ratio median {np.median(r_own):.3f} "
            f"({r_own.min():.3f}-{r_own.max():.3f}); the H200's at the same points: {stats(r_h200 / r_own - 1)}; "
            f"batch >= 32 and context >= 4096: H100 {np.median(r_own[big]):.3f}, H200 {np.median(r_h200[big]):.3f}")


def derived_moe() -> pd.DataFrame:
    shape = MODELS["qwen3-30b-a3b"]
    rows, meta = derive_any(GPU, shape, 1, [load_pack(GPU, "llama-3-8b", 1)])
    val = read_validation(VAL, "qwen3-30b-a3b")
    out = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / GPU / "qwen3-30b-a3b.csv"
        write_pack(rows, meta, path)
        packs = (("derived (h100-80g/llama-3-8b + H100 surveys)", read_pack(path)),
                 ("measured h100-80g/qwen3-30b-a3b", load_pack(GPU, "qwen3-30b-a3b", 1)))
        for graph in (True, False):
            v = val[val.cuda_graph == graph]
            for name, p in packs:
                e = predict_frame(v, PackStepModel(p, shape, cuda_graph=graph, graph_scope="all")) / v.measured_ms.to_numpy() - 1
                out.append({"forwards": "graph" if graph else "eager", "n": len(v), "pack": name, "error": stats(e)})
    return pd.DataFrame(out)


def fp8_own_vs_transferred() -> pd.DataFrame:
    shape = with_precision(MODELS["llama-3.1-8b"], "fp8", "auto")
    own = load_pack(GPU, shape, 1)
    moved = transfer_pack(load_pack("h200", shape, 1), GPU, shape)
    val = read_validation(VAL, "llama-3.1-8b")
    out = []
    for graph in (True, False):
        v = val[val.cuda_graph == graph]
        a = predict_frame(v, PackStepModel(own, shape, cuda_graph=graph, graph_scope="all"))
        b = predict_frame(v, PackStepModel(moved, shape, cuda_graph=graph, graph_scope="all"))
        r = b / a - 1
        out.append({"forwards": "graph" if graph else "eager", "n": len(v),
                    "H200-derived transferred / H100-derived": f"median {100 * np.median(r):+.1f} %, "
                    f"{100 * r.min():+.1f} to {100 * r.max():+.1f} %"})
    return pd.DataFrame(out)


def main() -> None:
    print("### 1. FP8 KV decode ratio\n\n" + kv_ratio() + "\n")
    g = gemm_leave_one_shape_out(GPU)
    print("### 2. GEMM rules, leave one surveyed shape out (H100)\n")
    print(_md(g) + "\n")
    m = moe_leave_one_out(GPU)
    print("### 2b. MoE rule, leave one configuration out (H100)\n")
    print(_md(m) + "\n")
    print("### 3. Derived qwen3-30b-a3b vs the measured H100 validation forwards\n")
    print(_md(derived_moe()) + "\n")
    print("### 4. FP8 llama-3.1-8b: the H200's derived pack transferred vs the H100's own\n")
    print(_md(fp8_own_vs_transferred()))


if __name__ == "__main__":
    main()
