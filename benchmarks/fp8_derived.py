"""The FP8 derivation rule (bf16 pack + the GPU's FP8 GEMM survey) checked against measurements
it never read: the measured dynamic-FP8 packs and their validation forwards of device calls 30-34
(2026-12-06, calibration/COMMANDS.md; the H100's and the H200's). For each GPU and model the
derived pack is built in a temporary folder from that GPU's bf16 pack and GEMM survey, then both
packs predict the same whole-iteration forwards (CUDA graph and eager). Numbers quoted in
calibration/VALIDATION.md, "FP8 on the H100 and the H200: derived vs measured".

    python benchmarks/fp8_derived.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servesim.tools.derive_checks import fp8_from_bf16  # noqa: E402

GPUS = ("h100-80g", "h200")
MODELS = ("llama-3.1-8b", "qwen3-8b", "qwen3-14b")


def main() -> None:
    rows = []
    for gpu in GPUS:
        for model in MODELS:
            _, its = fp8_from_bf16(gpu, model)
            its.insert(0, "model", f"{gpu}/{model}-fp8")
            rows.append(its)
    out = pd.concat(rows, ignore_index=True)
    for col in ("median", "p90", "max", "mean signed"):
        if col in out.columns:
            out[col] = [f"{100 * v:+.1f} %" if col == "mean signed" else f"{100 * v:.1f} %" for v in out[col]]
    print(out.to_string(index=False))


if __name__ == "__main__":
    main()
