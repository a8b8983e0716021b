"""Import Vidur's public A100 profiles (github.com/microsoft/vidur, MIT) as servesim packs.

What Vidur measured and how it maps (units: ms of CUDA kernel time, medians, one layer, one rank):

    mlp.csv column                servesim op       note
    input_layernorm               input_norm
    attn_pre_proj                 qkv_proj
    attn_rope                     rope
    attn_post_proj                o_proj
    post_attention_layernorm      post_attn_norm
    mlp_up_proj                   gate_up_proj
    mlp_act                       act
    mlp_down_proj                 down_proj
    add                           residual_add      Vidur times one add per layer; the model counts it twice
    emb                           embed             profiled by Vidur, unused by its simulator

Derived here because Vidur has no timing for them (each flagged in the pack YAML ``derived``):

* ``final_norm(t) = input_norm(t)``: the same RMSNorm kernel on the same width.
* ``kv_write(t) = residual_add(t * 4*kv_dim_rank / (3*hidden))``: both are pure bandwidth kernels;
  an add moves 3 hidden-wide vectors per token, ``reshape_and_cache`` reads and writes K and V
  (4 kv-wide vectors), so the write of ``t`` tokens moves the bytes of an add of fewer tokens.
* ``lm_head(t) = gate_up_proj(t) * vocab / (2*intermediate)``: both GEMMs have K = hidden; time
  scales with N in the memory-bound regime (weight bytes K*N) and the compute-bound one (t*K*N).
  The same rule predicting ``qkv_proj`` from ``gate_up_proj`` is checked in the benchmark.
* attention: the only A100 attention profile is Llama-2-70B at TP2 (per GPU 32 q / 4 kv heads,
  head dim 128, FlashAttention, legacy commit acb95f6). It is transferred to the target's per-rank
  heads (see :func:`transfer_attention`).
* ``overhead_eager`` / ``overhead_cuda_graph``: Vidur does not measure the framework's launch
  overhead (its simulator skips CPU overhead by default); the pack carries a stated estimate.

All-reduce and send/recv come from ``network/a100_dgx`` (DGX A100, NVLink): all-reduce rows with
``num_workers == devices_per_node == TP`` (Vidur's own choice), send/recv rows with
``devices_per_node == 2`` (both stages in one node).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import PackError
from servesim.models import MODELS, ModelShape
from servesim.perf.pack import SHAPE_KEYS, pack_stem, write_pack

VIDUR_REPO = "github.com/microsoft/vidur"
MAIN_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
LEGACY_COMMIT = "acb95f6cd118071401fa805a0b0bc11bd2018fc6"
LICENSE_NOTE = ("Vidur profiling data, MIT License, Copyright (c) Microsoft Corporation; "
                "timings converted, no code copied. Keep this notice with derived packs.")

#: servesim model -> Vidur model folder
VIDUR_MODELS: dict[str, str] = {"llama-3-8b": "meta-llama/Meta-Llama-3-8B", "llama-2-7b": "meta-llama/Llama-2-7b-hf"}

TOKEN_OPS: dict[str, str] = {
    "input_layernorm": "input_norm", "attn_pre_proj": "qkv_proj", "attn_rope": "rope",
    "attn_post_proj": "o_proj", "post_attention_layernorm": "post_attn_norm",
    "mlp_up_proj": "gate_up_proj", "mlp_act": "act", "mlp_down_proj": "down_proj",
    "add": "residual_add", "emb": "embed",
}


@dataclass(frozen=True)
class HeadShape:
    """Attention heads on one GPU (per rank)."""

    q_heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, shape: ModelShape, tp: int) -> "HeadShape":
        return cls(max(1, shape.num_heads // tp), max(1, shape.num_kv_heads // tp), shape.head_dim)


#: The legacy profile: Llama-2-70B (64 q / 8 kv heads, head dim 128) at TP2.
SOURCE_HEADS = HeadShape(q_heads=32, kv_heads=4, head_dim=128)

#: Not measured by Vidur (its simulator skips CPU overhead by default): stated estimates, in ms.
#: overhead_cuda_graph = GPU idle between a forward's kernels (the H200 profiler measured 0.35-0.7
#: ms for ~700 unfused kernels at batch <= 128; a vLLM forward launches about half as many).
#: overhead_eager rows = wall - kernels of a decode calibration forward at context 0: an eager
#: Llama-3-8B decode on A100 runs >= 11 ms of kernels, longer than the CPU needs to launch them
#: (~5 ms estimated from the H200 profiler's eager forwards), so the wall time is kernels + gaps.
OVERHEAD_GRAPH_MS = {1: 0.3, 256: 0.3}
OVERHEAD_EAGER_MS = {1: 0.5, 256: 0.5}


def overhead_note() -> str:
    return ("overhead_eager / overhead_cuda_graph are NOT measured (Vidur has no such profile): "
            f"estimates {OVERHEAD_GRAPH_MS[1]} ms of GPU gaps per forward (graph and eager) and an "
            f"eager CPU floor of the decode kernels + {OVERHEAD_EAGER_MS[1]} ms (calibration context "
            "0): A100 decode of this model is GPU-bound, the CPU launch cost hidden")


# --- reading the source -----------------------------------------------------------------------

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _need(path: Path) -> Path:
    if not path.is_file():
        raise PackError(f"{path}: Vidur profile file not found (expected the layout of "
                        f"shared/calibration/vidur_profiles, see its PROVENANCE.md)")
    return path


def source_files(src: Path, model: str) -> dict[str, Path]:
    if model not in VIDUR_MODELS:
        raise PackError(f"no Vidur profile mapping for model '{model}'; allowed: {', '.join(VIDUR_MODELS)}")
    return {
        "mlp": _need(src / "profiling/compute/a100" / VIDUR_MODELS[model] / "mlp.csv"),
        "attention": _need(src / "profiling_legacy_acb95f6/a100/attention.csv"),
        "all_reduce": _need(src / "profiling/network/a100_dgx/all_reduce.csv"),
        "send_recv": _need(src / "profiling/network/a100_dgx/send_recv.csv"),
    }


def read_token_ops(mlp_csv: Path, shape: ModelShape, tp: int) -> pd.DataFrame:
    """Vidur token-level rows for one TP degree (long format: op, tokens, time_ms, std_ms)."""
    df = pd.read_csv(mlp_csv)
    sel = df[(df["num_tensor_parallel_workers"] == tp) & (df["n_embd"] == shape.hidden_size)
             & (df["n_head"] == shape.num_heads) & (df["n_kv_head"] == shape.num_kv_heads)
             & (df["n_expanded_embd"] == shape.intermediate_size)]
    if sel.empty:
        raise PackError(f"{mlp_csv}: no rows for tp={tp} and the shape of {shape.name}")
    parts = [pd.DataFrame({"op": ours, "tokens": sel["num_tokens"].to_numpy(),
                           "time_ms": sel[f"time_stats.{theirs}.median"].to_numpy(),
                           "std_ms": sel[f"time_stats.{theirs}.std"].to_numpy()})
             for theirs, ours in TOKEN_OPS.items()]
    return pd.concat(parts, ignore_index=True)


def tp_degrees(mlp_csv: Path) -> list[int]:
    return sorted(int(t) for t in pd.read_csv(mlp_csv, usecols=["num_tensor_parallel_workers"])
                  ["num_tensor_parallel_workers"].unique())


def read_attention(attn_csv: Path) -> tuple[pd.Series, pd.Series]:
    """Median decode time by (batch, context) and prefill time by (chunk, context), source heads."""
    df = pd.read_csv(attn_csv)
    n_q = df["n_q_head"] // df["num_tensor_parallel_workers"]
    n_kv = df["n_kv_head"] // df["num_tensor_parallel_workers"]
    hd = df["n_embd"] // df["n_q_head"]
    ok = (n_q == SOURCE_HEADS.q_heads) & (n_kv == SOURCE_HEADS.kv_heads) & (hd == SOURCE_HEADS.head_dim)
    if not ok.all():
        raise PackError(f"{attn_csv}: expected only the Llama-2-70B TP2 shape (32 q / 4 kv heads per "
                        f"GPU, head dim 128)")
    dec = df[~df["is_prefill"]].groupby(["batch_size", "kv_cache_size"])["time_stats.attn_decode.median"].median()
    pre = df[df["is_prefill"]].groupby(["prefill_chunk_size", "kv_cache_size"])["time_stats.attn_prefill.median"].median()
    return dec, pre


# --- the attention transfer -------------------------------------------------------------------

def transfer_attention(dec: pd.Series, pre: pd.Series, src: HeadShape, dst: HeadShape
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Map measured attention of ``src`` heads to ``dst`` heads (per GPU).

    Decode is bound by the KV bytes it reads and runs one work unit per (sequence, kv head). With
    ``r = dst.kv_heads*dst.head_dim / (src.kv_heads*src.head_dim)``, ``b`` target sequences of
    context ``c`` are the same units and bytes as ``u = r*b`` source sequences of context ``c``:
    ``t_dst(b, c) = t_src(u, c)`` (linear between measured batches). When ``u < 1`` there is less
    than one source sequence of work; the bytes then equal one source sequence of context ``u*c``:
    ``t_dst(b, c) = t_src(1, u*c)``.

    Prefill is bound by attention FLOPs, proportional to ``q_heads*head_dim``; with
    ``rho = dst.q_heads*dst.head_dim / (src.q_heads*src.head_dim)`` the time above the launch floor
    ``f`` (the smallest measured prefill time) scales by ``rho``: ``t_dst = f + rho*(t_src - f)``.
    """
    r = dst.kv_heads * dst.head_dim / (src.kv_heads * src.head_dim)
    rho = dst.q_heads * dst.head_dim / (src.q_heads * src.head_dim)
    table = dec.unstack()  # batch x context
    b_src = table.index.to_numpy(np.float64)
    ctx = table.columns.to_numpy(np.float64)
    vals = table.to_numpy(np.float64)
    if np.isnan(vals).any():
        raise PackError("decode attention profile is not a full (batch x context) grid")
    targets = sorted({int(round(b / r)) for b in b_src if abs(b / r - round(b / r)) < 1e-9 and b / r >= 1}
                     | set(range(1, int(np.ceil(1 / r)))))
    rows = []
    for b in targets:
        u = r * b
        if u >= 1:
            i = np.clip(np.searchsorted(b_src, u, side="right") - 1, 0, len(b_src) - 2)
            w = min(max((u - b_src[i]) / (b_src[i + 1] - b_src[i]), 0.0), 1.0)
            t = vals[i] + w * (vals[i + 1] - vals[i])
        else:
            t = np.interp(u * ctx, ctx, vals[0])
        rows.append(pd.DataFrame({"batch": b, "context": ctx.astype(np.int64), "time_ms": t}))
    dec_out = pd.concat(rows, ignore_index=True)
    floor = float(pre.min())
    pre_out = pre.rename("time_ms").reset_index().rename(
        columns={"prefill_chunk_size": "tokens", "kv_cache_size": "context"})
    pre_out["time_ms"] = floor + rho * (pre_out["time_ms"] - floor)
    pre_out.loc[pre_out["time_ms"] <= 0, "time_ms"] = floor
    return dec_out, pre_out


# --- derived ops ------------------------------------------------------------------------------

def _curve(df: pd.DataFrame, op: str) -> tuple[np.ndarray, np.ndarray]:
    g = df[df["op"] == op].groupby("tokens")["time_ms"].median()
    return g.index.to_numpy(np.float64), g.to_numpy(np.float64)


def derive_token_ops(ops: pd.DataFrame, shape: ModelShape, tp: int) -> pd.DataFrame:
    """final_norm, kv_write and lm_head on the measured token grid (rules in the module doc)."""
    x_norm, y_norm = _curve(ops, "input_norm")
    x_add, y_add = _curve(ops, "residual_add")
    x_up, y_up = _curve(ops, "gate_up_proj")
    kv_dim_rank = max(1, shape.num_kv_heads // tp) * shape.head_dim
    byte_ratio = 4 * kv_dim_rank / (3 * shape.hidden_size)
    n_ratio = shape.vocab_size / (2 * shape.intermediate_size)
    return pd.concat([
        pd.DataFrame({"op": "final_norm", "tokens": x_norm, "time_ms": y_norm, "std_ms": np.nan}),
        pd.DataFrame({"op": "kv_write", "tokens": x_add,
                      "time_ms": np.interp(x_add * byte_ratio, x_add, y_add), "std_ms": np.nan}),
        pd.DataFrame({"op": "lm_head", "tokens": x_up, "time_ms": y_up * n_ratio, "std_ms": np.nan}),
    ], ignore_index=True)


def derived_notes(shape: ModelShape, tp: int) -> dict[str, str]:
    dst = HeadShape.of(shape, tp)
    kv_dim_rank = dst.kv_heads * shape.head_dim
    return {
        "final_norm": "= input_norm (same RMSNorm kernel and width)",
        "kv_write": (f"= residual_add at tokens * {4 * kv_dim_rank}/{3 * shape.hidden_size} "
                     "(bandwidth-bound; bytes of K/V read+write vs an add)"),
        "lm_head": (f"= gate_up_proj * {shape.vocab_size}/{2 * shape.intermediate_size} "
                    "(same K = hidden; time scales with N in both regimes)"),
        "attn_decode": (f"transferred from Llama-2-70B TP2 ({SOURCE_HEADS.q_heads} q / "
                        f"{SOURCE_HEADS.kv_heads} kv heads per GPU) to {dst.q_heads} q / {dst.kv_heads} kv: "
                        "t(b, c) = t_src(r*b, c), r = kv-head ratio (same work units and KV bytes); "
                        "t_src(1, r*b*c) when r*b < 1"),
        "attn_prefill": ("transferred: t = f + rho*(t_src - f), rho = q-head ratio "
                         f"{dst.q_heads}/{SOURCE_HEADS.q_heads}, f = smallest measured prefill time"),
        "overhead_eager": overhead_note(),
        "overhead_cuda_graph": overhead_note(),
    }


# --- network ----------------------------------------------------------------------------------

def read_collective(csv: Path, collective: str, workers: int, per_node: int) -> pd.DataFrame:
    df = pd.read_csv(csv)
    sel = df[(df["num_workers"] == workers) & (df["devices_per_node"] == per_node)
             & (df["collective"] == collective)]
    return pd.DataFrame({"bytes": sel["size"].to_numpy(np.int64),
                         "time_ms": sel[f"time_stats.{collective}.median"].to_numpy(np.float64),
                         "std_ms": sel[f"time_stats.{collective}.std"].to_numpy(np.float64)})


# --- one pack ---------------------------------------------------------------------------------

def build_rows(src: Path, model: str, tp: int) -> tuple[list[tuple], dict]:
    """All pack rows and YAML metadata for (A100, model, tp)."""
    shape = MODELS[model]
    files = source_files(src, model)
    rows: list[tuple] = []
    ops = read_token_ops(files["mlp"], shape, tp)
    for r in ops.itertuples(index=False):
        rows.append((r.op, r.tokens, 0, 0, 0, r.time_ms, r.std_ms))
    for r in derive_token_ops(ops, shape, tp).itertuples(index=False):
        rows.append((r.op, r.tokens, 0, 0, 0, r.time_ms, None))
    dec, pre = read_attention(files["attention"])
    dec_t, pre_t = transfer_attention(dec, pre, SOURCE_HEADS, HeadShape.of(shape, tp))
    for r in pre_t.itertuples(index=False):
        rows.append(("attn_prefill", r.tokens, 0, r.context, 0, r.time_ms, None))
    for r in dec_t.itertuples(index=False):
        rows.append(("attn_decode", 0, r.batch, r.context, 0, r.time_ms, None))
    for table, op in ((OVERHEAD_EAGER_MS, "overhead_eager"), (OVERHEAD_GRAPH_MS, "overhead_cuda_graph")):
        for b, t in table.items():
            rows.append((op, 0, b, 0, 0, t, None))
    if tp > 1:
        ar = read_collective(files["all_reduce"], "all_reduce", tp, tp)
        if ar.empty:
            raise PackError(f"{files['all_reduce']}: no all_reduce rows with num_workers == "
                            f"devices_per_node == {tp}")
        rows += [("all_reduce", 0, tp, 0, r.bytes, r.time_ms, r.std_ms) for r in ar.itertuples(index=False)]
    sr = read_collective(files["send_recv"], "send_recv", 2, 2)
    rows += [("send_recv", 0, 2, 0, r.bytes, r.time_ms, r.std_ms) for r in sr.itertuples(index=False)]
    meta = {
        "gpu": "a100-80g", "model": model, "tp": tp, "dtype": "fp16",
        "shape": {k: getattr(shape, k) for k in SHAPE_KEYS},
        "source": "imported",
        "origin": f"Vidur profiling data ({VIDUR_REPO}), commit {MAIN_COMMIT[:12]}; attention from "
                  f"legacy commit {LEGACY_COMMIT[:12]}",
        "license": LICENSE_NOTE,
        "date": _dt.date.today().isoformat(),
        "device": "NVIDIA A100-SXM4-80GB (DGX A100), as profiled by Vidur",
        "method": "Vidur profiler: CUDA kernel time per op, one layer, one rank; medians (ms)",
        "command": f"python calibration/import_vidur.py --src <shared>/calibration/vidur_profiles --model {model}",
        "files": [{"path": str(p.relative_to(src)), "sha256": _sha256(p),
                   "commit": LEGACY_COMMIT if key == "attention" else MAIN_COMMIT}
                  for key, p in files.items()],
        "derived": derived_notes(shape, tp),
        "overhead": {"calibration_context": 0, "estimated": True},
        "notes": ("Measured by Vidur: every token op except final_norm, kv_write, lm_head; attention "
                  "measured for another head shape and transferred; " + overhead_note() + "."),
    }
    return rows, meta


def import_vidur(src: Path, out: Path, model: str = "llama-3-8b",
                 tps: list[int] | None = None) -> list[Path]:
    """Write A100 packs for every TP degree the Vidur data has (or ``tps``); returns CSV paths."""
    src, out = Path(src), Path(out)
    files = source_files(src, model)
    written = []
    for tp in tps or tp_degrees(files["mlp"]):
        rows, meta = build_rows(src, model, tp)
        path = out / "a100-80g" / f"{pack_stem(model, tp)}.csv"
        write_pack(rows, meta, path)
        written.append(path)
    return written
