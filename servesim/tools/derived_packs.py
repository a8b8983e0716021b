"""The derived packs servesim ships, and the checks of their rules where truth exists.

* :func:`a100_from_vidur`: an A100 pack for any catalogue model and TP degree, from Vidur's A100
  token-op profiles of four models (GEMMs by shape, bandwidth ops by width:
  :mod:`servesim.tools.derive`), Vidur's Llama-2-70B attention by the importer's head transfer,
  Vidur's DGX-A100 collectives and the importer's stated overhead estimates.
* :func:`from_measured_pack`: a pack of another model on the same GPU from one measured model's
  packs (used to check the rules on the H200, where the targets were measured too).
* :func:`leave_one_out` / :func:`compare_with_pack`: per-op and per-iteration errors of the rules
  (VALIDATION.md, "Derived packs"; ``benchmarks/calibration_fidelity.py`` prints them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import PackError
from servesim.models import MODELS
from servesim.tools.derive import (GEMM_OPS, WIDTH_OPS, OpTransfer, RankDims, derive_pack,
                                  sources_from_pack, sources_from_vidur, transfer_pack_attention)
from servesim.perf.pack import LAYER_TOKEN_OPS, Pack, load_pack, pack_stem, write_pack

VIDUR_A100_GRID_MODEL = "meta-llama/Meta-Llama-3-8B"  # the widest token grid (1..32768)


def _vidur_sources(src: Path):
    return sources_from_vidur(src, "a100")


def a100_from_vidur(src: Path, model: str, tp: int, sources=None) -> tuple[list[tuple], dict]:
    """Rows and metadata of the derived A100 pack for (model, tp)."""
    from servesim.tools.vidur import (LEGACY_COMMIT, LICENSE_NOTE, MAIN_COMMIT, OVERHEAD_EAGER_MS,
                                     OVERHEAD_GRAPH_MS, SOURCE_HEADS, HeadShape, overhead_note,
                                     read_attention, read_collective, transfer_attention)

    if model not in MODELS:
        raise PackError(f"unknown model '{model}'; allowed: {', '.join(sorted(MODELS))}")
    shape = MODELS[model]
    src = Path(src)
    sources = sources if sources is not None else _vidur_sources(src)
    transfer = OpTransfer(sources, "a100-80g")
    grid_src = next((s for s in sources if s.model == VIDUR_A100_GRID_MODEL), sources[0])
    grid = grid_src.curves["qkv_proj"][0]
    dims = RankDims.of_shape(shape, tp)
    extra: list[tuple] = []
    # A100 sources have no kv_write / final_norm: the importer's rules (bytes; the same kernel).
    # lm_head is a GEMM like the others (derive_token_rows).
    kv_tokens = grid * 4 * dims.kv_heads * dims.head_dim / (3 * dims.hidden)
    extra += [("kv_write", int(m), 0, 0, 0, float(t), None)
              for m, t in zip(grid, transfer.width_ms("residual_add", dims.hidden, kv_tokens))]
    extra += [("final_norm", int(m), 0, 0, 0, float(t), None)
              for m, t in zip(grid, transfer.width_ms("input_norm", dims.hidden, grid))]
    attn = src / "profiling_legacy_acb95f6/a100/attention.csv"
    dec, pre = read_attention(attn)
    attention = transfer_attention(dec, pre, SOURCE_HEADS, HeadShape.of(shape, tp))
    for table, op in ((OVERHEAD_EAGER_MS, "overhead_eager"), (OVERHEAD_GRAPH_MS, "overhead_cuda_graph")):
        extra += [(op, 0, b, 0, 0, t, None) for b, t in table.items()]
    net = src / "profiling/network/a100_dgx"
    if tp > 1:
        ar = read_collective(net / "all_reduce.csv", "all_reduce", tp, tp)
        if ar.empty:
            raise PackError(f"{net / 'all_reduce.csv'}: no all_reduce rows with num_workers == "
                            f"devices_per_node == {tp}")
        extra += [("all_reduce", 0, tp, 0, int(r.bytes), float(r.time_ms), float(r.std_ms))
                  for r in ar.itertuples(index=False)]
    sr = read_collective(net / "send_recv.csv", "send_recv", 2, 2)
    extra += [("send_recv", 0, 2, 0, int(r.bytes), float(r.time_ms), float(r.std_ms))
              for r in sr.itertuples(index=False)]
    dst = HeadShape.of(shape, tp)
    notes = {
        "kv_write": "= residual_add (derived) at tokens * 4 kv_dim / (3 hidden) (bytes; the importer's rule)",
        "final_norm": "= input_norm (derived): same RMSNorm kernel and width",
        "attn_decode": (f"Vidur Llama-2-70B TP2 ({SOURCE_HEADS.q_heads} q / {SOURCE_HEADS.kv_heads} kv "
                        f"heads per GPU) -> {dst.q_heads} q / {dst.kv_heads} kv: t(b, c) = t_src(r b, c), "
                        f"r = kv-head ratio"),
        "attn_prefill": (f"transferred: t = f + rho (t_src - f), rho = q-head ratio "
                         f"{dst.q_heads}/{SOURCE_HEADS.q_heads}"),
        "overhead_eager": overhead_note(), "overhead_cuda_graph": overhead_note(),
        "all_reduce": "Vidur network/a100_dgx rows with num_workers == devices_per_node == tp",
        "send_recv": "Vidur network/a100_dgx rows with devices_per_node == 2",
    }
    origin = (f"derived from Vidur A100 profiles of {len({s.model for s in sources})} models "
              f"({', '.join(sorted({s.model.split('/')[-1] for s in sources}))}; commit "
              f"{MAIN_COMMIT[:12]}), attention from Llama-2-70B TP2 (commit {LEGACY_COMMIT[:12]})")
    rows, meta = derive_pack("a100-80g", model, tp, transfer, grid, attention, extra, origin, notes)
    meta.update(dtype="fp16", device="NVIDIA A100-SXM4-80GB (DGX A100), as profiled by Vidur",
                license=LICENSE_NOTE, overhead={"calibration_context": 0, "estimated": True},
                command=f"servesim calibrate derive --gpu a100-80g --model {model} --tp {tp}",
                notes=("Nothing of this model was measured on A100: every op is derived from other "
                       "models' measurements (rules and held-out errors: docs/calibration.md, "
                       "calibration/VALIDATION.md 'Derived packs')."))
    return rows, meta


def write_a100_packs(src: Path, out: Path, models: list[str], tps: list[int]) -> list[Path]:
    sources = _vidur_sources(Path(src))
    written = []
    for model in models:
        for tp in tps:
            shape = MODELS[model]
            if shape.num_heads % tp or shape.intermediate_size % tp:
                continue
            rows, meta = a100_from_vidur(src, model, tp, sources)
            path = Path(out) / "a100-80g" / f"{pack_stem(model, tp)}.csv"
            write_pack(rows, meta, path)
            written.append(path)
    return written


def write_measured_gpu_packs(gpu: str, out: Path, models: list[str], tps: list[int],
                             source: str = "llama-3-8b") -> list[Path]:
    """Derived packs of ``models`` on ``gpu`` from its measured packs of ``source`` (every TP it has);
    held-out error of the rule: VALIDATION.md 'Derived packs' (H200: qwen3 from llama-3-8b)."""
    from servesim.perf.pack import available_packs

    from servesim.tools.derive_variants import check_tps

    srcs = [load_pack(gpu, source, t) for g, m, t in available_packs() if g == gpu and m == source]
    if not srcs:
        raise PackError(f"no measured pack of {source} on {gpu} to derive from")
    check_tps(gpu, tps)  # a derived pack copies the measured all-reduce rows
    written = []
    for model in models:
        shape = MODELS[model]
        for tp in tps:
            if shape.num_heads % tp or shape.intermediate_size % tp:
                continue
            rows, meta = from_measured_pack(srcs, model, tp)
            meta["command"] = f"servesim calibrate derive --gpu {gpu} --model {model} --tp {tp}"
            path = Path(out) / gpu / f"{pack_stem(model, tp)}.csv"
            write_pack(rows, meta, path)
            written.append(path)
    return written


def from_measured_pack(source_packs: list[Pack], model: str, tp: int, shape=None) -> tuple[list[tuple], dict]:
    """A pack of ``model`` on the sources' GPU from other models' measured packs (attention from
    the source pack with the same TP, overheads scaled by the layer ratio, collectives copied).
    ``shape``: the model's shape when it is not the library's (another precision)."""
    gpu = source_packs[0].gpu
    shape = shape if shape is not None else MODELS[model]
    transfer = OpTransfer([sources_from_pack(p) for p in source_packs], gpu)
    base = next((p for p in source_packs if p.tp == tp), source_packs[0])
    grid = np.unique(base.rows("qkv_proj").tokens).astype(np.float64)
    sampled = int(base.rows("lm_head").tokens.max())
    ratio = shape.num_layers / MODELS[base.model].num_layers
    extra = []
    for op in ("overhead_eager", "overhead_cuda_graph"):
        if base.has(op):
            r = base.rows(op)
            extra += [(op, 0, int(b), 0, 0, float(t) * ratio, None) for b, t in zip(r.batch, r.time_ms)]
    for op in ("all_reduce", "send_recv"):
        if base.has(op):
            r = base.rows(op)
            extra += [(op, 0, int(b), 0, int(n), float(t), None) for b, n, t in zip(r.batch, r.bytes, r.time_ms)]
    attention = transfer_pack_attention(base, shape, tp)
    notes = {"attn_decode": f"transferred from {base.gpu}/{base.stem} (kv-head ratio)",
             "attn_prefill": f"transferred from {base.gpu}/{base.stem} (q-head ratio)",
             "overheads": f"rows of {base.stem} x layer ratio {ratio:.3f}",
             "collectives": "copied (keyed by bytes)"}
    origin = "derived from " + ", ".join(f"{p.gpu}/{p.stem}" for p in source_packs)
    rows, meta = derive_pack(gpu, model, tp, transfer, grid, attention, extra, origin, notes,
                             sampled_max=sampled, shape=shape)
    meta["overhead"] = dict(base.meta.get("overhead") or {})
    return rows, meta


# --- checks ---------------------------------------------------------------------------------

def _layer_sum(curves: dict, layers: int, M: np.ndarray) -> np.ndarray:
    from servesim.perf.packtables import Curve

    tot = np.zeros_like(M, dtype=np.float64)
    for op in LAYER_TOKEN_OPS + ("residual_add",):
        if op in curves:
            x, y = curves[op]
            tot += Curve(x, y, monotone=False)(M)
    return layers * tot


def leave_one_out(src: Path, max_tokens: int = 4096) -> pd.DataFrame:
    """A100: each Vidur model's token ops predicted from the other three models' (every TP),
    at the tokens it measured (<= max_tokens: beyond, only one model has data). One row per
    (left-out model, op), plus the per-layer token-op sum (kv_write and final_norm excluded:
    no A100 truth)."""
    sources = _vidur_sources(Path(src))
    rows = []
    for model in sorted({s.model for s in sources}):
        transfer = OpTransfer([s for s in sources if s.model != model], "a100-80g")
        errs: dict[str, list] = {}
        for s in (s for s in sources if s.model == model):
            sums_true, sums_pred = 0.0, 0.0
            x = s.curves["qkv_proj"][0]
            x = x[x <= max_tokens]
            for op in GEMM_OPS + WIDTH_OPS:
                if op not in s.curves:
                    continue
                mx, my = s.curves[op]
                sel = mx <= max_tokens
                pred = transfer.op_ms(op, s.dims, mx[sel])
                if pred is None:
                    continue
                errs.setdefault(op, []).append(pred / my[sel] - 1)
                if op in LAYER_TOKEN_OPS:
                    k = 2 if op == "residual_add" else 1
                    sums_true = sums_true + k * np.interp(x, mx, my)
                    sums_pred = sums_pred + k * np.interp(x, mx[sel], pred)
            errs.setdefault("layer token-op sum", []).append(sums_pred / sums_true - 1)
        for op, v in errs.items():
            e = np.abs(np.concatenate(v))
            rows.append({"left out": model.split("/")[-1], "op": op, "points": e.size,
                         "median": np.median(e), "p90": np.quantile(e, 0.9), "max": e.max()})
    return pd.DataFrame(rows)


def compare_with_pack(derived_rows: list[tuple], truth: Pack) -> pd.DataFrame:
    """Per-op errors of a derived pack against a measured one at the measured points."""
    d = pd.DataFrame(derived_rows, columns=["op", "tokens", "batch", "context", "bytes", "time_ms", "std"])
    out = []
    for op in GEMM_OPS + WIDTH_OPS + ("attn_decode", "attn_prefill"):
        if not truth.has(op):
            continue
        t = truth.rows(op)
        g = d[d.op == op]
        if g.empty:
            continue
        if op == "attn_decode":
            key = pd.MultiIndex.from_arrays([t.batch, t.context])
            pred = g.set_index(["batch", "context"])["time_ms"].groupby(level=[0, 1]).median().reindex(key).to_numpy()
        elif op == "attn_prefill":
            key = pd.MultiIndex.from_arrays([t.tokens, t.context])
            pred = g.set_index(["tokens", "context"])["time_ms"].groupby(level=[0, 1]).median().reindex(key).to_numpy()
        else:
            pred = np.interp(t.tokens, g.tokens.to_numpy(np.float64), g.time_ms.to_numpy())
        ok = np.isfinite(pred)
        e = np.abs(pred[ok] / t.time_ms[ok] - 1)
        if e.size:
            out.append({"op": op, "points": int(e.size), "median": np.median(e), "p90": np.quantile(e, 0.9),
                        "max": e.max()})
    return pd.DataFrame(out)


def h200_cross_model(source: str = "llama-3-8b", targets=("qwen3-4b", "qwen3-8b", "qwen3-14b"),
                     tps=(1, 2)) -> pd.DataFrame:
    """H200: each target's ops predicted from ``source``'s packs (all its TP degrees), against the
    target's measured pack."""
    srcs = [load_pack("h200", source, tp) for tp in tps]
    frames = []
    for model in targets:
        for tp in tps:
            rows, _ = from_measured_pack(srcs, model, tp)
            f = compare_with_pack(rows, load_pack("h200", model, tp))
            f.insert(0, "target", pack_stem(model, tp))
            frames.append(f)
    return pd.concat(frames, ignore_index=True)
