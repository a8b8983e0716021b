"""The step-time contract.

One engine iteration computes, for every scheduled request ``i``, ``new_tokens[i]`` tokens on top
of ``context[i]`` tokens whose KV is already cached. A decode is ``new_tokens == 1``; a prefill (or
a prefill chunk) has ``new_tokens > 1`` and ``context`` equal to the prompt tokens already computed
(earlier chunks or prefix-cache hits). A model maps that composition to seconds.

Two entry points, both vectorized numpy because they sit in the simulator's hot loop:

``predict(new_tokens, context) -> float``
    one iteration of any composition.

``predict_decode_run(num_seqs, context_sum, steps) -> ndarray[steps]``
    the times of ``steps`` consecutive pure-decode iterations of the same ``num_seqs`` requests,
    whose cached contexts sum to ``context_sum`` at the first step and grow by ``num_seqs`` each
    step. The engine's fast path advances such runs in one call. Element ``j`` must equal
    ``predict(ones(num_seqs), c_j)`` for any ``c_j`` summing to ``context_sum + j * num_seqs``:
    decode cost depends on the batch size and the total KV tokens read, not on how they are split.
    Models implement both through one code path so that equality is exact, not approximate.

Models are built for one (GPU, model shape, TP, PP) and carry no mutable state. The built-in
models are thin wrappers over the kernels of :mod:`servesim.perf.kernels` (``tables(max_tokens,
max_seqs)`` gives the engine their arrays, so its compiled loop asks the same code directly).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class StepTimeModel(Protocol):
    name: str

    def predict(self, new_tokens: np.ndarray, context: np.ndarray) -> float: ...

    def predict_decode_run(self, num_seqs: int, context_sum: int, steps: int) -> np.ndarray: ...

    def describe(self) -> str: ...


def composition(new_tokens, context) -> tuple[np.ndarray, np.ndarray]:
    """``(new, ctx)`` as the kernels take them: C-contiguous int64 vectors of equal length."""
    new = np.ascontiguousarray(new_tokens, dtype=np.int64)
    ctx = np.ascontiguousarray(context, dtype=np.int64)
    if new.ndim != 1 or new.shape != ctx.shape:
        raise ValueError(f"new_tokens and context must be vectors of equal length, got shapes "
                         f"{new.shape} and {ctx.shape}")
    return new, ctx


def check_bounds(max_tokens: int, max_seqs: int) -> None:
    """``tables(max_tokens, max_seqs)``: the engine's largest tokens per iteration and batch."""
    for name, v in (("max_tokens", max_tokens), ("max_seqs", max_seqs)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


@lru_cache(maxsize=1)
def _kernels():
    """servesim.perf.kernels, imported on the first prediction (it loads numba, ~0.5 s), then
    without the ~1 us of an import statement per call."""
    from servesim.perf import kernels

    return kernels


def run_iteration(tab, new_tokens, context) -> float:
    """``predict`` of a built-in model: the kernel on the model's tables."""
    new, ctx = composition(new_tokens, context)
    return float(_kernels().iteration_seconds(tab, new, ctx, new.shape[0]))


def run_decode(tab, num_seqs: int, context_sum: int, steps: int) -> np.ndarray:
    """``predict_decode_run`` of a built-in model: the kernel on the model's tables."""
    out = np.empty(max(int(steps), 0))
    _kernels().decode_seconds(tab, int(num_seqs), int(context_sum), out.shape[0], out)
    return out
