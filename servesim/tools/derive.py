"""Derived packs: op timings for a (GPU, model, TP) nobody measured, from ops measured on the same
GPU for other model shapes.

Why: the only A100 data are Vidur's profiles (Llama-3-8B, Llama-2-7B, Llama-2-70B, Qwen-72B at TP
1/2/4/8; attention for one head shape). Falling back to an uncalibrated roofline for qwen3-4b/8b/14b
on A100 was 16-42% optimistic against measured packs; every op of those models is a kernel the
profiles *did* time, at another shape.

How, op family by op family (rules documented in docs/calibration.md, errors in VALIDATION.md):

* **GEMMs** (qkv, o, gate+up, down, lm_head) are ``M x K x N`` products with ``M`` = tokens. Each
  measured GEMM curve gives an efficiency ``e(M) = t_ideal(M, K, N) / t`` with ``t_ideal = max(2MKN
  / peak FLOP/s, 2(KN + MK + MN) / peak bytes/s)``. A target ``(K, N)`` takes, at every ``M``, the
  inverse-distance-weighted efficiency (power 2) of the ``GEMM_NEIGHBOURS`` measured curves nearest
  in ``(log K, log N)`` -- whatever their role in their model (a GEMM is a GEMM) -- and
  ``t = t_ideal / e``. Efficiencies are interpolated in ``log M`` along each curve and held at the
  ends of a curve's range.
* **Bandwidth-bound token ops** (norms, residual add, embedding, activation, rope, KV write) move a
  fixed number of values per token (their *width*: hidden, intermediate, (heads + kv heads) x
  head_dim, kv heads x head_dim), so ``t_target(M) = t_src(M w_target / w_src)`` (same bytes), from
  the ``WIDTH_NEIGHBOURS`` sources nearest in ``log w``, weighted alike. Ops no source measured
  (A100: kv_write, final_norm) keep the importer's rules (:mod:`servesim.tools.vidur`).
* **Attention** by the head transfer of :func:`servesim.tools.vidur.transfer_attention` (decode: the
  same KV work units; prefill: scaled by query heads above the launch floor).
* **Collectives** are model-independent (keyed by bytes): copied. **Overheads** (GPU gaps between a
  forward's kernels, CPU launch floor): the source's rows scaled by the layer ratio (gaps and
  launches are per kernel); A100 keeps the importer's stated estimates.

``derive_pack`` returns rows and YAML metadata with ``source: derived`` and an ``origin`` naming the
sources, which :meth:`PackStepModel.describe` prints in a run's header.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from servesim.errors import PackError
from servesim.hardware import GPUS
from servesim.models import MODELS, ModelShape
from servesim.perf.dims import RankDims
from servesim.perf.pack import SHAPE_KEYS, Pack

GEMM_OPS: tuple[str, ...] = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
WIDTH_OPS: tuple[str, ...] = ("input_norm", "post_attn_norm", "final_norm", "residual_add", "embed",
                              "act", "rope", "kv_write")
GEMM_NEIGHBOURS = 4
WIDTH_NEIGHBOURS = 2
IDW_POWER = 2.0


@dataclass
class SourceOps:
    """Measured token-op curves of one (model, TP) on the target GPU: op -> (tokens, ms)."""

    label: str
    model: str
    dims: RankDims
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def _pooled(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from servesim.perf.packtables import pool_median

    return pool_median(np.asarray(x, np.float64), np.asarray(y, np.float64))


def sources_from_pack(pack: Pack, label: Optional[str] = None) -> SourceOps:
    """A measured pack's token-op curves as a source."""
    shape = MODELS[pack.model]
    src = SourceOps(label or f"{pack.gpu}/{pack.stem}", pack.model,
                    RankDims.of_shape(shape, pack.tp))
    for op in GEMM_OPS + WIDTH_OPS:
        if pack.has(op):
            r = pack.rows(op)
            src.curves[op] = _pooled(r.tokens, r.time_ms)
    return src


def sources_from_vidur(src_dir: Path, gpu: str = "a100") -> list[SourceOps]:
    """Every model and TP degree of Vidur's ``compute/<gpu>/*/*/mlp.csv`` as sources."""
    import pandas as pd

    from servesim.tools.vidur import TOKEN_OPS

    out = []
    files = sorted((Path(src_dir) / "profiling" / "compute" / gpu).glob("*/*/mlp.csv"))
    if not files:
        raise PackError(f"{src_dir}: no profiling/compute/{gpu}/*/*/mlp.csv (the layout of "
                        f"shared/calibration/vidur_profiles, see its PROVENANCE.md)")
    for f in files:
        df = pd.read_csv(f)
        name = f"{f.parent.parent.name}/{f.parent.name}"
        for tp, g in df.groupby("num_tensor_parallel_workers"):
            r = g.iloc[0]
            dims = RankDims.of(int(r.n_embd), int(r.n_head), int(r.n_kv_head), int(r.n_embd // r.n_head),
                               int(r.n_expanded_embd), int(r.vocab_size), 0, int(tp))
            src = SourceOps(f"vidur {gpu}/{name} tp{int(tp)}", name, dims)
            for theirs, ours in TOKEN_OPS.items():
                src.curves[ours] = _pooled(g["num_tokens"].to_numpy(), g[f"time_stats.{theirs}.median"].to_numpy())
            out.append(src)
    return out


class OpTransfer:
    """Predict token-op times of a target rank shape from source curves (rules: module doc)."""

    def __init__(self, sources: list[SourceOps], gpu: str):
        if not sources:
            raise PackError("a derived pack needs at least one source")
        self.sources = sources
        spec = GPUS[gpu]
        self.flops, self.bw = spec.bf16_flops_per_s, spec.hbm_bytes_per_s
        self.gemms = [(s, op, *s.dims.gemm(op)) for s in sources for op in GEMM_OPS if op in s.curves]

    def ideal_ms(self, M: np.ndarray, K: float, N: float) -> np.ndarray:
        M = np.asarray(M, np.float64)
        return 1e3 * np.maximum(2 * M * K * N / self.flops, 2 * (K * N + M * K + M * N) / self.bw)

    def _weights(self, d: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx = np.argsort(d, kind="stable")[:n]
        if d[idx[0]] < 1e-12:
            return idx[:1], np.ones(1)
        return idx, 1.0 / d[idx] ** IDW_POWER

    def gemm_ms(self, K: int, N: int, M: np.ndarray) -> np.ndarray:
        if not self.gemms:
            raise PackError("no source has a GEMM curve")
        M = np.asarray(M, np.float64)
        d = np.array([np.hypot(np.log(k / K), np.log(n / N)) for _, _, k, n in self.gemms])
        idx, w = self._weights(d, GEMM_NEIGHBOURS)
        eff = np.zeros_like(M)
        for i, wi in zip(idx, w):
            s, op, k, n = self.gemms[i]
            x, y = s.curves[op]
            e = self.ideal_ms(x, k, n) / y
            eff += wi * np.interp(np.log(M), np.log(x), e)
        return self.ideal_ms(M, K, N) / (eff / w.sum())

    def width_ms(self, op: str, width: int, M: np.ndarray) -> Optional[np.ndarray]:
        """None when no source measured ``op``."""
        from servesim.perf.packtables import Curve

        have = [s for s in self.sources if op in s.curves]
        if not have:
            return None
        M = np.asarray(M, np.float64)
        d = np.array([abs(np.log(s.dims.width(op) / width)) for s in have])
        idx, w = self._weights(d, WIDTH_NEIGHBOURS)
        out = np.zeros_like(M)
        for i, wi in zip(idx, w):
            s = have[i]
            x, y = s.curves[op]
            out += wi * Curve(x, y, monotone=False)(M * width / s.dims.width(op))
        return out / w.sum()

    def op_ms(self, op: str, dims: RankDims, M: np.ndarray) -> Optional[np.ndarray]:
        if op in GEMM_OPS:
            return self.gemm_ms(*dims.gemm(op), M)
        return self.width_ms(op, dims.width(op), M)


# --- attention ---------------------------------------------------------------------------------

def pack_attention_series(pack: Pack):
    """A measured pack's attention as the series :func:`vidur.transfer_attention` takes."""
    import pandas as pd

    d = pack.rows("attn_decode")
    dec = pd.Series(d.time_ms, index=pd.MultiIndex.from_arrays([d.batch, d.context],
                                                               names=["batch_size", "kv_cache_size"]))
    p = pack.rows("attn_prefill")
    pre = pd.Series(p.time_ms, index=pd.MultiIndex.from_arrays([p.tokens, p.context],
                                                               names=["prefill_chunk_size", "kv_cache_size"]))
    return dec.groupby(level=[0, 1]).median(), pre.groupby(level=[0, 1]).median()


def transfer_pack_attention(pack: Pack, shape: ModelShape, tp: int):
    """Attention rows of (shape, tp) from a measured pack of another head shape, by the importer's
    transfer. The decode rows keep only batches the transfer maps exactly; a full grid is needed."""
    from servesim.tools.vidur import HeadShape, transfer_attention

    dec, pre = pack_attention_series(pack)
    src = HeadShape.of(MODELS[pack.model], pack.tp)
    table = dec.unstack()
    if table.isna().any().any():  # the transfer needs a full (batch x context) decode grid
        keep = table.columns[~table.isna().any(axis=0)]
        dec = table[keep].stack()
    return transfer_attention(dec, pre, src, HeadShape.of(shape, tp))


# --- a whole pack --------------------------------------------------------------------------------

def derive_token_rows(transfer: OpTransfer, shape: ModelShape, tp: int, grid: np.ndarray,
                      sampled_max: Optional[int] = None) -> tuple[list[tuple], dict]:
    """Token-op rows of (shape, tp) on ``grid`` and the rule used per op."""
    dims = RankDims.of_shape(shape, tp)
    rows, rules = [], {}
    for op in GEMM_OPS + WIDTH_OPS:
        M = grid if (op not in ("lm_head", "final_norm") or sampled_max is None) else grid[grid <= sampled_max]
        t = transfer.op_ms(op, dims, M)
        if t is None:
            continue
        if op in GEMM_OPS:
            K, N = dims.gemm(op)
            rules[op] = (f"GEMM K={K} N={N}: efficiency vs roofline interpolated (IDW, power "
                         f"{IDW_POWER:g}) over the {GEMM_NEIGHBOURS} measured GEMM curves nearest in "
                         f"(log K, log N)")
        else:
            rules[op] = (f"bandwidth-bound, width {dims.width(op)}: t(M) = t_src(M w / w_src) from the "
                         f"{WIDTH_NEIGHBOURS} sources nearest in log width")
        rows += [(op, int(m), 0, 0, 0, float(x), None) for m, x in zip(M, t)]
    return rows, rules


def derive_pack(gpu: str, model: str, tp: int, transfer: OpTransfer, grid: np.ndarray,
                attention: tuple, extra_rows: list[tuple], origin: str, notes: dict,
                sampled_max: Optional[int] = None, shape: Optional[ModelShape] = None) -> tuple[list[tuple], dict]:
    """Rows and YAML metadata of a derived pack. ``attention`` = (decode frame, prefill frame) from
    a transfer; ``extra_rows`` = collectives, overheads and ops derived by other rules; ``shape``
    when it is not the library's (another precision)."""
    shape = shape if shape is not None else MODELS[model]
    rows, rules = derive_token_rows(transfer, shape, tp, np.asarray(grid, np.float64), sampled_max)
    have = {r[0] for r in rows}
    rows += [r for r in extra_rows if r[0] not in have]
    dec, pre = attention
    rows += [("attn_prefill", int(r.tokens), 0, int(r.context), 0, float(r.time_ms), None)
             for r in pre.itertuples(index=False)]
    rows += [("attn_decode", 0, int(r.batch), int(r.context), 0, float(r.time_ms), None)
             for r in dec.itertuples(index=False)]
    rules.update(notes)
    meta = {
        "gpu": gpu, "model": model, "tp": tp, "dtype": "bf16",
        "shape": {k: getattr(shape, k) for k in SHAPE_KEYS},
        "source": "derived",
        "origin": origin,
        "date": _dt.date.today().isoformat(),
        # (the module's path when the shipped derived packs were written; a fresh derivation must
        # equal them byte for byte, tests/test_derive.py: changes with the next regeneration)
        "method": "servesim/perf/derive.py (rules in its module doc and docs/calibration.md); "
                  "errors of the rules in calibration/VALIDATION.md, 'Derived packs'",
        "sources": [s.label for s in transfer.sources],
        "derived": rules,
    }
    return rows, meta
