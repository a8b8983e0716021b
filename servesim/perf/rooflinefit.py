"""A roofline fitted to a calibration pack: the fallback for a (GPU, model, TP) with no pack.

``step_time: {model: roofline, fit: a100-80g/llama-3-8b}`` takes the roofline's three free numbers
-- the share of peak FLOP/s its GEMMs and attention reach (``mfu``), the share of peak bandwidth
its memory-bound ops reach (``mbu``) and a fixed per-iteration time (``overhead_s``) -- from a pack
measured (or derived) on the same GPU, instead of the stated defaults (0.6, 0.8, 2 ms), and then
predicts any model on that GPU.

Why these three and not more: a pack of one model says how fast that GPU runs GEMMs and attention
of that model's shapes; the roofline transfers that to other shapes through FLOPs and bytes.

How: the pack model (CUDA graph for every iteration: GPU time, no CPU launch floor, as the
roofline has none) predicts a fixed design of iterations -- decode batches 1-256 over contexts
128-8192, prefill chunks 64-8192 with and without cached context, and mixed batches -- within the
pack's grid. ``mfu`` and ``mbu`` are searched on a grid (0.05-1.0, then refined) and, for each pair,
``overhead_s`` is the least-squares optimum of the relative error (closed form, clipped at 0).
The fit's error on its own design is reported in ``describe()``; how it transfers to other models
is in VALIDATION.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from servesim.errors import PackError
from servesim.hardware import GPUS


@dataclass(frozen=True)
class RooflineFit:
    pack: str
    mfu: float
    mbu: float
    overhead_s: float
    points: int
    median_abs_err: float
    max_abs_err: float


def parse_pack_ref(ref: str) -> tuple[str, str, int]:
    """``gpu/model`` or ``gpu/model-tpN`` -> (gpu, model, tp); a PackError names what is allowed
    (the rule is the scenario's, :func:`servesim.scenario.pack_ref_parts`)."""
    from servesim.scenario import pack_ref_parts

    try:
        return pack_ref_parts(ref)
    except ValueError as exc:
        raise PackError(str(exc)) from None


def design(max_ctx: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The iterations the fit matches: (new tokens, context) per sequence."""
    out = []
    for b in (1, 4, 16, 64, 256):
        for c in (128, 1024, 4096, 8192):
            if c < max_ctx:
                out.append((np.ones(b, np.int64), np.full(b, c, np.int64)))
    for t in (64, 256, 1024, 4096, 8192):
        for c in (0, 2048):
            if t + c <= max_ctx:
                out.append((np.array([t]), np.array([c])))
    for t, b, c in ((256, 32, 1024), (1024, 64, 2048), (2048, 128, 1024)):
        if t + c <= max_ctx:
            out.append((np.concatenate([[t], np.ones(b, np.int64)]), np.concatenate([[0], np.full(b, c)])))
    return out


def _roofline_ms(gpu, shape, tp, comps, mfu, mbu) -> np.ndarray:
    from servesim.perf.roofline import RooflineStepModel

    m = RooflineStepModel(gpu, shape, tp, 1, mfu, mbu, 0.0)
    return np.array([m.predict(n, c) for n, c in comps]) * 1e3


@lru_cache(maxsize=16)
def fit_roofline(ref: str) -> RooflineFit:
    """Fit (mfu, mbu, overhead_s) to the pack named by ``ref`` (cached: immutable)."""
    from servesim.perf.packmodel import load_pack_model

    from servesim.perf.pack import pack_shape

    gpu, model, tp = parse_pack_ref(ref)
    shape = pack_shape(model)  # a pack name of another precision fits the roofline in that precision
    pm = load_pack_model(gpu, model, tp=tp, cuda_graph=True, graph_scope="all")
    comps = design(shape.max_model_len)
    y = np.array([pm.predict(n, c) for n, c in comps]) * 1e3

    def score(mfu: float, mbu: float) -> tuple[float, float]:
        r = _roofline_ms(GPUS[gpu], shape, tp, comps, mfu, mbu)
        # minimise sum(((r + o) / y - 1)^2) over o >= 0
        o = max(float(np.sum((y - r) / y ** 2) / np.sum(1.0 / y ** 2)), 0.0)
        return float(np.sum(((r + o) / y - 1) ** 2)), o

    grid = np.round(np.arange(0.05, 1.0001, 0.05), 4)
    best = min(((score(a, b)[0], a, b) for a in grid for b in grid))
    _, a0, b0 = best
    fine = [(score(a, b)[0], a, b)
            for a in np.clip(a0 + np.arange(-0.04, 0.0401, 0.01), 0.01, 1.0)
            for b in np.clip(b0 + np.arange(-0.04, 0.0401, 0.01), 0.01, 1.0)]
    _, mfu, mbu = min(fine)
    _, over = score(mfu, mbu)
    err = (_roofline_ms(GPUS[gpu], shape, tp, comps, mfu, mbu) + over) / y - 1
    return RooflineFit(pack=ref, mfu=round(float(mfu), 4), mbu=round(float(mbu), 4),
                       overhead_s=round(over * 1e-3, 7), points=len(comps),
                       median_abs_err=float(np.median(np.abs(err))), max_abs_err=float(np.abs(err).max()))
