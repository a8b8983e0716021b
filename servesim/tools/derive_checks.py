"""Held-out errors of the derivation rules of :mod:`servesim.tools.derive_variants` (numbers in
calibration/VALIDATION.md, "Derived packs for precisions, experts and latent attention").

Every check scores a rule on measurements the rule did not read:

* :func:`fp8_from_bf16`: h200/llama-3-8b-fp8 derived from the bf16 pack and the GEMM survey,
  against the measured FP8 pack (per op) and the FP8 validation forwards (whole iterations);
* :func:`gemm_leave_one_shape_out`: each surveyed GEMM shape's FP8 / int4 times predicted from
  its bf16 time by the rule fitted on (FP8) or interpolated from (int4) the other shapes;
* :func:`moe_leave_one_out`: each surveyed MoE configuration's layer (router, experts, combine)
  predicted from the other three;
* :func:`grid_leave_one_out`: each interior context of the FP8-KV and MLA decode surveys
  predicted from the neighbouring contexts by the interpolation the derivation uses.

Run: ``python -m servesim.tools.derive_checks`` (prints markdown tables).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.models import MODELS, with_precision
from servesim.perf.pack import load_pack, pack_root, read_pack, write_pack
from servesim.tools.derive_variants import (Fp8Rule, GemmRatio, MoeRule, MoeShape, derive_any,
                                            mla_decode_rows, read_survey)


def _stats(e: np.ndarray) -> dict:
    a = np.abs(np.asarray(e, np.float64))
    return {"points": int(a.size), "median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)),
            "max": float(a.max()), "mean signed": float(np.mean(e))}


def fp8_check_pair(gpu: str) -> tuple[str, str]:
    """(GPU, model) of the whole-iteration check of the FP8 rule: the first model of that GPU (then
    of the H200) with a measured dynamic-FP8 pack, its bf16 pack and FP8 validation forwards."""
    from servesim.perf.pack import available_packs

    packs = set(available_packs())
    for g in dict.fromkeys((gpu, "h200")):
        for m in ("llama-3-8b", "llama-3.1-8b"):
            if ((g, f"{m}-fp8", 1) in packs and (g, m, 1) in packs
                    and load_pack(g, f"{m}-fp8", 1).meta.get("source") == "measured"
                    and (pack_root().parent / "validation" / g / f"{m}-fp8.csv").exists()):
                return g, m
    return "h200", "llama-3-8b"


def fp8_from_bf16(gpu: str = "h200", model: str = "llama-3-8b") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-op errors, whole-iteration errors) of the FP8 pack derived from the bf16 pack + the
    GEMM survey, against the measured FP8 pack and the FP8 validation forwards; the measured FP8
    pack on the same forwards for reference."""
    from servesim.perf.packmodel import PackStepModel
    from servesim.tools.calibrate_cli import predict_frame, read_validation
    from servesim.tools.derived_packs import compare_with_pack

    shape = with_precision(MODELS[model], "fp8", "auto")
    rows, meta = derive_any(gpu, shape, 1, [load_pack(gpu, model, 1)])
    truth = load_pack(gpu, f"{model}-fp8", 1)
    ops = compare_with_pack(rows, truth)
    val = read_validation(pack_root().parent / "validation" / gpu, f"{model}-fp8")
    its = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / gpu / f"{model}-fp8.csv"
        write_pack(rows, meta, path)
        derived = read_pack(path)
        for graph in (True, False):
            v = val[val.cuda_graph == graph]
            for name, p in (("derived (bf16 pack + GEMM survey)", derived), ("measured FP8 pack", truth)):
                m = PackStepModel(p, shape, cuda_graph=graph, graph_scope="all")
                e = predict_frame(v, m) / v.measured_ms.to_numpy() - 1
                its.append({"mode": "graph" if graph else "eager", "pack": name, **_stats(e)})
    return ops, pd.DataFrame(its)


def gemm_leave_one_shape_out(gpu: str = "h200", variants=("fp8", "int4")) -> pd.DataFrame:
    g = read_survey(gpu, "gemm")
    out = []
    for variant in variants:
        for (n, k), s in g.groupby(["n", "k"]):
            cap = 1.0 if variant == "int4" else None
            ex = ((int(k), int(n)),)
            rule = Fp8Rule(g, exclude=ex) if variant == "fp8" else GemmRatio(g, variant, cap=cap, exclude=ex)
            p = s.pivot_table(index="tokens", columns="variant", values="time_ms")
            M = p.index.to_numpy(np.float64)
            truth = p[variant].to_numpy()
            pred = rule.time(int(k), int(n), M, p["bf16"].to_numpy())
            keep = np.ones(M.size, bool)
            if cap is not None:  # the capped rule uses the survey only where the kernel beats bf16
                keep = truth < p["bf16"].to_numpy()
            out.append({"variant": variant + (" (tokens where it beats bf16)" if cap else ""),
                        "held-out shape (K x N)": f"{k} x {n}", **_stats(pred[keep] / truth[keep] - 1)})
    return pd.DataFrame(out)


def moe_leave_one_out(gpu: str = "h200", backend: str | None = None) -> pd.DataFrame:
    """Each surveyed MoE configuration's ops predicted from the other configurations, on one
    experts backend's rows (default: the one derive uses, derive_moe.moe_survey)."""
    from servesim.tools.derive_moe import moe_survey

    m, _, survey_gpu = moe_survey(gpu, backend)
    gpu = survey_gpu  # scored where it was timed
    out = []
    for (E, k, inter, h), s in m.groupby(["experts", "top_k", "inter", "k"]):
        cfg = MoeShape(int(E), int(k), int(inter), int(h))
        rule = MoeRule(m, gpu, exclude=cfg)
        p = s.pivot_table(index="tokens", columns="variant", values="time_ms")
        M = p.index.to_numpy(np.float64)
        pred = {"experts": rule.experts_ms(cfg, M), "gate": rule.gate_ms(cfg, M), "combine": rule.combine_ms(cfg, M)}
        for op in ("experts", "gate", "combine"):
            out.append({"held-out config": cfg.label(), "op": op, **_stats(pred[op] / p[op].to_numpy() - 1)})
        layer = sum(pred.values()) / p[["experts", "gate", "combine"]].sum(axis=1).to_numpy() - 1
        out.append({"held-out config": cfg.label(), "op": "layer (sum)", **_stats(layer)})
    return pd.DataFrame(out)


def grid_leave_one_out(gpu: str = "h200") -> pd.DataFrame:
    """Each interior context of the decode surveys predicted from its neighbours: the FP8/bf16
    ratio (FP8 KV rule) and the MLA decode time (MLA rule), at every batch."""
    from servesim.tools.derive_variants import GridRatio

    out = []
    d = read_survey(gpu, "decode_kv")
    ctx = np.array(sorted(set(d.context)))
    errs = []
    for c in ctx[1:-1]:
        rule = GridRatio(d[d.context != c], "triton-fp8", "triton-bf16")
        s = d[d.context == c].pivot_table(index="batch", columns="variant", values="time_ms")
        pred = s["triton-bf16"].to_numpy() * rule(s.index.to_numpy(), np.full(len(s), c))
        errs.append(pred / s["triton-fp8"].to_numpy() - 1)
    out.append({"rule": "FP8 KV decode: triton-fp8 from triton-bf16 x ratio of neighbouring contexts",
                **_stats(np.concatenate(errs))})
    m = read_survey(gpu, "mla")
    ctx = np.array(sorted(set(m.context)))
    for heads in sorted(set(m.n)):
        errs = []
        shape = MODELS["deepseek-v3"]
        tp = shape.num_heads // int(heads)
        for c in ctx[1:-1]:
            part = m[(m.context != c) & (m.n == heads)]
            pred = mla_decode_rows(part, shape, tp, "triton-bf16", np.array([c]))
            truth = m[(m.context == c) & (m.n == heads) & (m.variant == "triton-bf16")].set_index("batch").time_ms
            errs.append(pred.set_index("batch").time_ms.reindex(truth.index).to_numpy() / truth.to_numpy() - 1)
        out.append({"rule": f"MLA decode, {heads} heads: a context from its neighbours (linear)",
                    **_stats(np.concatenate(errs))})
    return pd.DataFrame(out)


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        cells = []
        for col, v in zip(cols, r):
            if isinstance(v, float):
                cells.append(f"{100 * v:.1f} %" if col in ("median", "p90", "max", "mean signed", "signed median") else f"{v:.3g}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ops, its = fp8_from_bf16()
    print("### fp8 from bf16: ops vs the measured FP8 pack\n")
    print(_md(ops.assign(mean=0).drop(columns="mean")))
    print("\n### fp8 from bf16: whole iterations (FP8 validation forwards)\n")
    print(_md(its))
    print("\n### GEMM survey, leave one shape out\n")
    print(_md(gemm_leave_one_shape_out()))
    print("\n### MoE survey, leave one configuration out\n")
    print(_md(moe_leave_one_out()))
    print("\n### decode surveys, leave one context out\n")
    print(_md(grid_leave_one_out()))
    from servesim.tools.derive_launches import launch_check, validation_check

    print("\n### eager floor: launch-count rule, CPU-bound calibration walls from llama-3-8b's\n")
    print(_md(launch_check()))
    print("\n### eager floor: the same on the CPU-bound eager validation forwards\n")
    print(_md(validation_check()))


if __name__ == "__main__":
    main()


def held_out_summary(gpu: str, shape, cross_model: bool) -> dict:
    """One line per rule a derived pack of ``shape`` used: the rule's held-out error, computed now
    on the GPU's measurements the rule did not read (a derived pack's YAML records it under
    ``held_out_error``)."""
    def rng(df: pd.DataFrame, col: str = "median") -> str:
        return f"{100 * df[col].min():.1f}-{100 * df[col].max():.1f} %"

    out = {}
    if cross_model:
        out["dense ops"] = ("from another model's packs: qwen3-4b/8b/14b derived from llama-3-8b alone predict their "
                            "H200 validation forwards at 1.9-3.1 % median (calibration/VALIDATION.md, 'Derived packs')")
    if shape.quantization == "fp8":
        g = gemm_leave_one_shape_out(gpu, ("fp8",))
        # the whole-iteration check needs a measured FP8 pack with validation forwards of the same
        # model: this GPU's where it has one (the H100 since 2026-12-06: llama-3.1-8b), else the H200's
        check, base = fp8_check_pair(gpu)
        _, its = fp8_from_bf16(check, base)
        d = its[(its["mode"] == "graph") & its["pack"].str.startswith("derived")].iloc[0]
        where = "" if check == gpu else f" (on the {check.upper()}: {gpu} has no measured FP8 pack of this recipe)"
        out["fp8 weights"] = (f"leave one surveyed GEMM shape out: {rng(g)} median (max {100 * g['max'].max():.1f} %); "
                              f"{base}-fp8 derived from its bf16 pack vs its FP8 validation forwards{where}: "
                              f"{100 * d['median']:.1f} % median, max {100 * d['max']:.1f} %")
    elif shape.quantization in ("awq", "gptq"):
        g = gemm_leave_one_shape_out(gpu, ("int4",))
        out["int4 weights"] = (f"leave one surveyed GEMM shape out, 1-4 tokens: {rng(g)} median; beyond, the bf16 "
                               f"GEMM (not validated)")
    grid = grid_leave_one_out(gpu)
    if shape.kv_cache_dtype != "auto" and not shape.is_mla:
        r = grid.iloc[0]
        out["fp8 kv"] = (f"decode ratio, leave one surveyed context out: {100 * r['median']:.1f} % median, max "
                         f"{100 * r['max']:.1f} %; no FP8-KV pack measured to check the whole")
    if shape.is_moe:
        from servesim.tools.derive_moe import moe_survey

        _, backend, survey_gpu = moe_survey(gpu)
        m = moe_leave_one_out(gpu)
        layer = m[m.op == "layer (sum)"]
        kernel = ("a fused MoE Triton kernel of the engines' class (calibration/profiler/triton_moe.py)"
                  if backend == "triton-fused" else "torch._grouped_mm (about half vLLM's fused-MoE speed at "
                  "batch 10: docs/models.md, 'MoE and MLA on one GPU')")
        where = f" on {survey_gpu}" if survey_gpu != gpu else ""
        out["experts"] = (f"MoE layer, leave one surveyed configuration out ({backend} rows{where}): {rng(layer)} median "
                          f"(max {100 * layer['max'].max():.1f} %); survey kernel {kernel}")
    if shape.is_moe or shape.is_mla:
        from servesim.tools.derive_launches import launch_check

        lc = launch_check(gpu).set_index("target")["signed median"]
        out["eager floor"] = ("launch-count rule on the profiler's own forwards, llama-3-8b's CPU-bound eager walls "
                              "predicting each measured pack's (signed median): "
                              + ", ".join(f"{t.split('/')[-1]} {100 * v:+.0f} %" for t, v in lc.items())
                              + " (calibration/VALIDATION.md, 'Eager floor of derived packs')")
    if shape.is_mla:
        mla = grid[grid.rule.str.startswith("MLA")]
        out["latent attention"] = (f"MLA decode, leave one surveyed context out: {rng(mla)} median; the surveyed "
                                   f"kernel is Triton (not FlashMLA); prefill rule not validated")
    return out
