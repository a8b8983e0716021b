"""An FP8 KV cache priced on top of the pack of the model's own KV dtype, by one rule.

Why: an FP8 KV cache (vLLM ``--kv-cache-dtype fp8``, ``engine.kv_cache_dtype: fp8``) is common in
production, but packs are measured per KV dtype and few FP8-KV packs exist. What an FP8 cache
changes in an iteration is the decode attention's read of the cache (half the bytes, plus the
dequantization in the kernel); the GEMMs, the element-wise ops and the prefill attention (it
reads the new chunk in bf16) are the same kernels as with a bf16 cache. So the rule keeps every
row of the base pack (measured, derived or transferred) and multiplies its decode attention rows
by the op survey's ``triton-fp8 / triton-bf16`` ratio at the same (batch, context): bilinear in
(log batch, log context), held at the grid's edges (:class:`GridRatio`). Held-out: leave one
surveyed context out, 1.1 % median, 9.9 % max (calibration/VALIDATION.md, "Derived packs for
precisions, experts and latent attention"; no FP8-KV pack was measured to check the whole).

The same function prices the offline derivation (``servesim calibrate derive --kv-cache-dtype
fp8``, :mod:`servesim.tools.derive_variants`) and the selection at run time
(:mod:`servesim.perf.select`), so a derived kvfp8 pack and a run without one agree row for row.

The survey is a GPU's (``calibration/surveys/<gpu>/decode_kv.csv``); the H200 and the H100 have
one. On another GPU the H200's ratio is used: a ratio of two kernels timed on one GPU (the same
Triton split-KV decode reading bf16 or fp8), assumed to carry to another GPU -- the labels say so.
It is not a safe assumption: at the H100's surveyed points the H200's ratio is 34 % high (median). A
latent-attention (MLA) model is not priced by this rule (its FP8 latent decode is its own survey,
read by the derivation only).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from servesim.errors import PackError
from servesim.perf.pack import Pack, pack_root

#: the GPU whose decode_kv survey prices an FP8 KV cache on a GPU without its own
SURVEY_GPU = "h200"
FP8, BF16 = "triton-fp8", "triton-bf16"
RULE = "decode attention x {gpu} survey fp8/bf16"


def survey_root() -> Path:
    """``calibration/surveys`` of the source checkout, else the installed ``servesim/surveys`` (the wheel
    ships them beside ``servesim/packs``). Fixed by where the code lives, not by a pack root a caller
    points elsewhere: the surveys are the GPU's, whichever packs a run reads."""
    here = Path(__file__).resolve().parents[2] / "calibration" / "surveys"
    return here if here.is_dir() else pack_root().parent / "surveys"


class GridRatio:
    """``t_a / t_b`` over a survey's (batch, context) grid, bilinear in (log batch, log context),
    held at the edges (a batch row the survey stopped short of, for memory, holds its longest
    measured context's ratio)."""

    def __init__(self, frame, a: str, b: str):
        p = frame.pivot_table(index=["batch", "context"], columns="variant", values="time_ms")
        r = (p[a] / p[b]).unstack().ffill(axis=1).bfill(axis=1)
        self.b = np.log(r.index.to_numpy(np.float64))
        self.c = np.log(r.columns.to_numpy(np.float64))
        self.v = r.to_numpy(np.float64)

    def __call__(self, batch, context) -> np.ndarray:
        lb = np.log(np.maximum(np.asarray(batch, np.float64), 1.0))
        lc = np.log(np.maximum(np.asarray(context, np.float64), 1.0))
        rows = np.array([np.interp(lc, self.c, row) for row in self.v])  # (surveyed batches, n): a few
        if self.b.size == 1:
            return rows[0]
        # then along batch for every point at once (np.interp's arithmetic, held at the edges)
        j = np.clip(np.searchsorted(self.b, lb, side="right") - 1, 0, self.b.size - 2)
        n = np.arange(lb.size)
        lo, hi = rows[j, n], rows[j + 1, n]
        out = (hi - lo) / (self.b[j + 1] - self.b[j]) * (lb - self.b[j]) + lo
        return np.where(lb <= self.b[0], rows[0], np.where(lb >= self.b[-1], rows[-1], out))


def survey_gpu(gpu: str) -> str:
    """The GPU whose decode_kv survey prices ``gpu``: its own where surveyed, else the H200's."""
    return gpu if (survey_root() / gpu / "decode_kv.csv").is_file() else SURVEY_GPU


@lru_cache(maxsize=8)
def decode_ratio(gpu: str) -> GridRatio:
    """The FP8/bf16 decode-attention ratio of ``gpu``'s decode_kv survey (read once per process)."""
    import pandas as pd

    path = survey_root() / gpu / "decode_kv.csv"
    if not path.is_file():
        raise PackError(f"{path}: no decode_kv survey for gpu {gpu} (an FP8 KV cache is priced from it)")
    return GridRatio(pd.read_csv(path), FP8, BF16)


def fp8_decode_ms(batch, context, time_ms, ratio: GridRatio) -> np.ndarray:
    """Decode attention times over an FP8 cache: the bf16-cache times x the ratio at (batch, context)."""
    t = np.asarray(time_ms, np.float64)
    return t * ratio(np.atleast_1d(batch), np.atleast_1d(context)) if t.size else t


def rule_text(gpu: str) -> str:
    """``decode attention x H200 survey fp8/bf16`` (plus the assumption on another GPU)."""
    src = survey_gpu(gpu)
    text = RULE.format(gpu=src.upper())
    return text if src == gpu else f"{text}, assumed to hold on {gpu}"


def kv_rule_problem(shape) -> str | None:
    """Why the rule cannot price ``shape``'s KV cache (None when it can)."""
    if shape.kv_cache_dtype == "auto":
        return "the model runs its own KV dtype"
    if getattr(shape, "is_mla", False):
        return ("a latent-attention (MLA) model's FP8 latent decode is not the GQA rule's "
                "(servesim calibrate derive --kv-cache-dtype fp8 prices it from the MLA survey)")
    if not (survey_root() / SURVEY_GPU / "decode_kv.csv").is_file():
        return (f"no decode_kv survey under {survey_root()} (a source checkout has calibration/surveys/, "
                f"an installed servesim servesim/surveys/)")
    return None


def with_fp8_kv(pack: Pack, kv_cache_dtype: str, gpu: str | None = None) -> Pack:
    """``pack`` (a bf16 KV cache) with its decode attention rows over an FP8 cache of
    ``kv_cache_dtype``, by the ratio of ``gpu``'s survey (default: the pack's GPU; the H200's
    where that GPU has none)."""
    if pack.kv_cache_dtype != "auto":
        raise PackError(f"{pack.csv_path}: kv_cache_dtype is {pack.kv_cache_dtype}; the FP8 KV rule scales a "
                        f"pack of the model's own KV dtype (auto)")
    gpu = gpu or pack.gpu
    src = survey_gpu(gpu)
    ratio = decode_ratio(src)
    dec = pack.rows("attn_decode")
    f = fp8_decode_ms(dec.batch, dec.context, np.ones(len(dec)), ratio)
    ops = dict(pack.ops)
    ops["attn_decode"] = replace(dec, time_ms=dec.time_ms * f, std_ms=dec.std_ms * f)
    rule = rule_text(gpu)
    meta = {**dict(pack.meta), "kv_cache_dtype": kv_cache_dtype, "kv_rule": rule,
            "origin": f"{pack.meta.get('origin') or pack.meta.get('source') or '?'}; with an FP8 KV cache by rule ({rule})"}
    return Pack(pack.gpu, pack.model, pack.tp, pack.csv_path, meta, ops)
