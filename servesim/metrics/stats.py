"""Percentiles, plain and weighted, with one definition everywhere.

We use numpy's default ("linear") percentile, as vLLM's ``benchmark_serving`` does. A weighted
sample with integer weights is treated exactly as the sample with each value repeated ``weight``
times, without materializing the repetition.
"""

from __future__ import annotations

import numpy as np

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
PCT_KEYS = ("p50", "p90", "p95", "p99", "p999")


def _empty() -> dict:
    return {"mean": None, **{k: None for k in PCT_KEYS}, "max": None, "count": 0}


def describe(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    if nan.any():
        x = x[~nan]
    if len(x) == 0:
        return _empty()
    pcts = np.percentile(x, PERCENTILES)
    return {"mean": float(x.mean()), **{k: float(v) for k, v in zip(PCT_KEYS, pcts)}, "max": float(x.max()),
            "count": int(len(x))}


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, q) -> np.ndarray:
    """np.percentile(np.repeat(values, weights), q), computed without the repeat."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    cw = np.cumsum(weights[order])
    n = int(cw[-1])
    pos = np.asarray(q, dtype=np.float64) / 100.0 * (n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    frac = pos - lo
    v_lo = v[np.searchsorted(cw, lo, side="right")]
    v_hi = v[np.searchsorted(cw, hi, side="right")]
    return v_lo + frac * (v_hi - v_lo)


def weighted_sum(values: np.ndarray, weights: np.ndarray) -> float:
    """sum(values * weights), the same to the last bit whatever the machine's BLAS threads:
    ``np.dot`` hands the sum to BLAS, whose threads split it differently with 1 thread (a Dask
    worker) and with several (an interactive process), so a mean differed in its last bit and
    sweep rows depended on where they ran. numpy's own (pairwise) sum of the exact products has
    one order, fixed by the array alone."""
    return float(np.sum(np.asarray(values, dtype=np.float64) * np.asarray(weights, dtype=np.float64)))


def describe_weighted(values: np.ndarray, weights: np.ndarray) -> dict:
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return _empty()
    pcts = weighted_percentiles(values, weights, PERCENTILES)
    total = int(weights.sum())
    mean = float(weighted_sum(values, weights) / total)
    return {"mean": mean, **{k: float(v) for k, v in zip(PCT_KEYS, pcts)}, "max": float(values.max()),
            "count": total}
