"""Error of pack transfer where both GPUs were measured.

* Across generations: the A100 packs (imported from Vidur's profiles) and the H200 packs (measured)
  of llama-3-8b at TP 1 and 2. Each GPU's pack is predicted from the other's alone
  (servesim/perf/transfer.py) and scored against its own, per op at the held-out pack's rows and per
  iteration (pack step models, eager, on a grid of decode and prefill batches).
* Within the Hopper class (``--within``), the transfer users get at run time: the H200 packs of
  llama-3-8b, llama-3.1-8b, qwen3-30b-a3b, qwen3-14b and qwen3-8b transferred to the H100 SXM, scored per op against the measured H100
  packs and, what matters, on the H100's whole-iteration validation forwards
  (calibration/validation/h100-80g/, never read by any pack), beside the measured H100 pack's error
  on the same forwards: the part of the error the transfer adds.

Numbers quoted in calibration/VALIDATION.md, "Transferred packs".
Run: ``python benchmarks/transfer_check.py [--within]``."""

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


WITHIN_MODELS = ("llama-3-8b", "llama-3.1-8b", "qwen3-30b-a3b", "qwen3-14b", "qwen3-8b")
NOT_TOKEN_OPS = ("attn_decode", "attn_prefill", "overhead_eager", "overhead_cuda_graph", "all_reduce", "send_recv")


def _stats(e: np.ndarray) -> str:
    a = np.abs(e)
    return (f"{a.size} | {100 * np.median(a):.1f} % | {100 * np.quantile(a, 0.9):.1f} % | {100 * a.max():.1f} % | "
            f"{100 * np.mean(e):+.1f} %")


def within_class(src: str = "h200", dst: str = "h100-80g") -> None:
    """The H200 packs transferred to the H100 against the H100's measured packs and forwards."""
    from servesim.perf.pack import pack_shape
    from servesim.tools.calibrate_cli import predict_frame, read_validation, validate_frame

    val = read_validation(Path(__file__).resolve().parents[1] / "calibration" / "validation" / dst)
    print(f"Per op: {src} pack transferred to {dst}, at the measured {dst} pack's rows (error = "
          "transferred / measured - 1)\n")
    print("| model | op | points | median abs err | p90 | max | mean signed |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model in WITHIN_MODELS:
        truth, pred = load_pack(dst, model), transfer_pack(load_pack(src, model), dst)
        errs = {}
        for op in sorted(truth.ops):
            if op in NOT_TOKEN_OPS or not pred.has(op):
                continue
            t, p = truth.rows(op), pred.rows(op)
            order = np.argsort(p.tokens, kind="stable")
            errs[op] = np.interp(t.tokens, p.tokens[order], p.time_ms[order]) / t.time_ms - 1
        errs.update({k: v for k, v in op_errors(pred, truth).items() if k.startswith("attn")})
        errs["all token ops"] = np.concatenate([v for k, v in errs.items() if not k.startswith("attn")])
        for op, e in errs.items():
            print(f"| {model} | {op} | {_stats(e)} |")
    print(f"\nWhole iterations: {dst}'s validation forwards (calibration/validation/{dst}/), predicted by the "
          f"{src} pack transferred to {dst} (what every {dst} run got before 2026-12-05) and by the measured "
          f"{dst} pack (error = predicted / measured - 1)\n")
    print("| model | mode | kind | pack | n | median abs err | p90 | max | mean signed |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    measured = validate_frame(dst, val)
    for model in WITHIN_MODELS:
        shape = pack_shape(model)
        moved = transfer_pack(load_pack(src, model), dst, shape)
        for graph in (True, False):
            rows = measured[(measured["pack"] == model) & (measured["cuda_graph"] == graph)]
            m = PackStepModel(moved, shape, tp=1, cuda_graph=graph, graph_scope="all")
            err_t = predict_frame(rows, m) / rows["measured_ms"].to_numpy() - 1
            err_m = rows["error"].to_numpy()
            mode = "graph" if graph else "eager"
            for kind in ("all", "decode-only", "prefill-only", "prefill-with-context", "mixed"):
                sel = np.ones(len(rows), bool) if kind == "all" else (rows["kind"] == kind).to_numpy()
                if not sel.any():
                    continue
                for name, e in ((f"transferred from {src}", err_t), (f"measured {dst}", err_m)):
                    print(f"| {model} | {mode} | {kind} | {name} | {_stats(e[sel])} |", flush=True)


def main() -> None:
    if "--within" in sys.argv[1:]:
        within_class()
        return
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
