"""How close a pack's kernels run to their GPU's ceilings: achieved HBM bandwidth and TFLOP/s.

Why: a pack is only as good as the kernels it timed. A decode attention kernel that reads the KV
cache at half the memory bandwidth (PyTorch's FlashAttention-2 on Hopper: 2.2-2.7 of 4.8 TB/s)
makes every long decode look twice as slow as a serving engine runs it. Bytes moved and FLOPs done
follow from the model shape alone, so a pack's op times can be checked against physics without
any other measurement:

* decode attention of ``b`` sequences with ``c`` cached tokens reads ``b (c+1)`` tokens of K and V
  (``2 kv_heads head_dim`` values of ``dtype_bytes`` each, per layer): bandwidth-bound;
* a GEMM of ``T`` tokens with a ``K x N`` weight reads the weight once: at small ``T`` it is
  bandwidth-bound (``2 K N`` bytes), at large ``T`` compute-bound (``2 T K N`` FLOPs);
* causal prefill attention of ``t`` tokens over ``c`` cached ones does ``4 heads head_dim t
  (c + (t+1)/2)`` FLOPs.

The peaks are the datasheet figures of :data:`servesim.hardware.GPUS`; a measured pack may also
carry the ceilings its machine reached (``device_peaks`` in the YAML: a large copy and a large
GEMM), reported beside them. ``DECODE_FLOOR`` is the physical floor a shipped pack must meet
(tests/test_pack_efficiency.py).
"""

from __future__ import annotations

import numpy as np

from servesim.hardware import GPUS
from servesim.models import ModelShape, weight_format
from servesim.perf.pack import Pack

#: decode attention at batch >= DECODE_MIN_BATCH must read KV at >= this share of HBM peak
DECODE_FLOOR = 0.70
DECODE_MIN_BATCH = 64
#: a decode point counts as bandwidth-bound when its KV read takes at least this long at peak
#: bandwidth (shorter reads are dominated by launch and tail effects, not bandwidth)
BOUND_US = 50.0
SMALL_TOKENS = 16       # GEMMs at <= this many tokens: bandwidth-bound (weight bytes)
LARGE_TOKENS = 4096     # GEMMs at >= this many tokens: compute-bound (FLOPs)
LONG_PREFILL = 2048     # prefill attention chunks at >= this: compute-bound


def _rank(shape: ModelShape, tp: int) -> dict:
    heads = max(1, shape.num_heads // tp)
    kv = max(1, shape.num_kv_heads // tp)
    h, d, i = shape.hidden_size, shape.head_dim, shape.intermediate_size // tp
    return dict(heads=heads, kv=kv, d=d,
                gemms={"qkv_proj": (h, (heads + 2 * kv) * d), "o_proj": (heads * d, h),
                       "gate_up_proj": (h, 2 * i), "down_proj": (i, h),
                       "lm_head": (h, -(-shape.vocab_size // tp))})


def decode_bandwidth(pack: Pack) -> dict[str, np.ndarray]:
    """Per decode attention row: batch, context, KV bytes read per layer, achieved bytes/s, share
    of the GPU's HBM peak, and whether the point is bandwidth-bound (``BOUND_US``)."""
    shape = pack.shape()  # in the pack's precision: an fp8 KV cache reads 1 byte per value
    r = _rank(shape, pack.tp)
    rows = pack.rows("attn_decode")
    kv_bytes = rows.batch * (rows.context + 1.0) * 2 * r["kv"] * r["d"] * shape.kv_dtype_bytes
    bps = kv_bytes / (rows.time_ms * 1e-3)
    peak = GPUS[pack.gpu].hbm_bytes_per_s
    return dict(batch=rows.batch, context=rows.context, bytes=kv_bytes, bytes_per_s=bps,
                share=bps / peak, bound=kv_bytes / peak * 1e6 >= BOUND_US)


def decode_floor_points(pack: Pack) -> np.ndarray:
    """Shares of HBM peak of the bandwidth-bound decode points at batch >= DECODE_MIN_BATCH."""
    d = decode_bandwidth(pack)
    return d["share"][(d["batch"] >= DECODE_MIN_BATCH) & d["bound"]]


def pack_efficiency(pack: Pack) -> dict:
    """Achieved bandwidth and TFLOP/s of a pack's kernels against its GPU's peaks (a summary for
    the pack YAML, the docs and the tests)."""
    shape = pack.shape()
    wb = weight_format(shape.quantization).bytes_per_param or shape.dtype_bytes  # bytes per weight
    gpu = GPUS[pack.gpu]
    r = _rank(shape, pack.tp)
    out: dict = {"peaks": {"hbm_TBps": gpu.hbm_bytes_per_s / 1e12,
                           "bf16_TFLOPps": gpu.bf16_flops_per_s / 1e12, "source": "datasheet"}}
    measured = (pack.meta.get("device_peaks") or {}) if isinstance(pack.meta, dict) else {}
    if measured.get("copy_bytes_per_s"):
        out["peaks"]["measured_copy_TBps"] = measured["copy_bytes_per_s"] / 1e12
    if measured.get("bf16_gemm_flops_per_s"):
        out["peaks"]["measured_gemm_TFLOPps"] = measured["bf16_gemm_flops_per_s"] / 1e12

    def summary(x: np.ndarray, scale: float) -> dict:
        if x.size == 0:
            return {"points": 0}
        return {"points": int(x.size), "median": round(float(np.median(x)) / scale, 3),
                "max": round(float(x.max()) / scale, 3), "min": round(float(x.min()) / scale, 3)}

    if pack.has("attn_decode"):
        d = decode_bandwidth(pack)
        sel = (d["batch"] >= DECODE_MIN_BATCH) & d["bound"]
        out["attn_decode_TBps"] = summary(d["bytes_per_s"][sel], 1e12)
        out["attn_decode_share_of_hbm_peak"] = summary(d["share"][sel], 1.0)
        out["attn_decode_rule"] = (f"batch >= {DECODE_MIN_BATCH}, KV read >= {BOUND_US:.0f} us at "
                                   f"peak bandwidth; bytes = batch (context+1) 2 kv_heads head_dim "
                                   f"{shape.kv_dtype_bytes}")
    small_bw, large_fl = [], []
    for op, (k, n) in r["gemms"].items():
        if not pack.has(op):
            continue
        rows = pack.rows(op)
        t = rows.tokens.astype(np.float64)
        s = rows.time_ms * 1e-3
        lo = t <= SMALL_TOKENS
        w = shape.dtype_bytes if op == "lm_head" else wb  # the LM head stays in the model dtype
        small_bw.append((w * k * n + 2.0 * t[lo] * (k + n)) / s[lo])
        hi = t >= LARGE_TOKENS
        large_fl.append(2.0 * t[hi] * k * n / s[hi])
    if small_bw:
        out[f"gemm_tokens_le_{SMALL_TOKENS}_TBps"] = summary(np.concatenate(small_bw), 1e12)
    if large_fl:
        out[f"gemm_tokens_ge_{LARGE_TOKENS}_TFLOPps"] = summary(np.concatenate(large_fl), 1e12)
    if pack.has("attn_prefill"):
        rows = pack.rows("attn_prefill")
        t, c = rows.tokens.astype(np.float64), rows.context.astype(np.float64)
        sel = t >= LONG_PREFILL
        flops = 4.0 * r["heads"] * r["d"] * t[sel] * (c[sel] + (t[sel] + 1) / 2)
        out[f"attn_prefill_chunk_ge_{LONG_PREFILL}_TFLOPps"] = summary(flops / (rows.time_ms[sel] * 1e-3), 1e12)
    return out
