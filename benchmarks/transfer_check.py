"""Error of pack transfer where both GPUs were measured: the A100 packs (imported from Vidur's
profiles) and the H200 packs (measured) of llama-3-8b at TP 1 and 2. Each GPU's pack is predicted
from the other's alone (servesim/perf/transfer.py) and scored against its own, per op at the
held-out pack's rows and per iteration (pack step models, eager, on a grid of decode and prefill
batches). Numbers quoted in calibration/VALIDATION.md, "Transferred packs".
Run: ``python benchmarks/transfer_check.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servesim.models import MODELS  # noqa: E402
from servesim.perf.pack import load_pack  # noqa: E402
from servesim.perf.packmodel import PackStepModel  # noqa: E402
from servesim.perf.transfer import transfer_pack  # noqa: E402

MODEL = "llama-3-8b"
TOKEN_OPS = ("input_norm", "qkv_proj", "rope", "o_proj", "post_attn_norm", "gate_up_proj", "act", "down_proj",
             "residual_add", "lm_head")
BATCHES = [("decode", n, c) for n in (1, 8, 32, 128, 256) for c in (256, 1024, 4096)] + \
          [("prefill", t, 0) for t in (128, 512, 2048, 4096)]


def op_errors(pred, truth) -> dict[str, np.ndarray]:
    out = {}
    for op in TOKEN_OPS:
        if truth.has(op) and pred.has(op):
            t, p = truth.rows(op), pred.rows(op)
            order = np.argsort(p.tokens, kind="stable")
            est = np.interp(t.tokens, p.tokens[order], p.time_ms[order])
            out[op] = est / t.time_ms - 1
    for op, keys in (("attn_decode", ("batch", "context")), ("attn_prefill", ("tokens", "context"))):
        t, p = truth.rows(op), pred.rows(op)
        have = {(a, b): v for a, b, v in zip(getattr(p, keys[0]), getattr(p, keys[1]), p.time_ms)}
        e = [have[(a, b)] / v - 1 for a, b, v in zip(getattr(t, keys[0]), getattr(t, keys[1]), t.time_ms)
             if (a, b) in have]
        if e:
            out[op] = np.array(e)
    return out


def iteration_errors(pred, truth, tp: int) -> np.ndarray:
    shape = MODELS[MODEL]
    mp, mt = PackStepModel(pred, shape, tp=tp), PackStepModel(truth, shape, tp=tp)
    errs = []
    for kind, a, c in BATCHES:
        new, ctx = (np.ones(a, np.int64), np.full(a, c, np.int64)) if kind == "decode" else \
            (np.array([a]), np.array([0]))
        errs.append(mp.predict(new, ctx) / mt.predict(new, ctx) - 1)
    return np.array(errs)


def main() -> None:
    print("| held out | from | tp | op / iteration | points | median abs err | p90 | max |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for dst, src in (("a100-80g", "h200"), ("h200", "a100-80g")):
        for tp in (1, 2):
            truth = load_pack(dst, MODEL, tp)
            pred = transfer_pack(load_pack(src, MODEL, tp), dst)
            rows = op_errors(pred, truth)
            rows["all token ops"] = np.concatenate([v for k, v in rows.items() if not k.startswith("attn")])
            rows["iteration (eager)"] = iteration_errors(pred, truth, tp)
            for op, e in rows.items():
                a = np.abs(e)
                print(f"| {dst} | {src} | {tp} | {op} | {a.size} | {100 * np.median(a):.1f} % | "
                      f"{100 * np.quantile(a, 0.9):.1f} % | {100 * a.max():.1f} % |", flush=True)


if __name__ == "__main__":
    main()
