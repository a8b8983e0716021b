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
    """servesim.perf.kernels, imported on the first prediction (it loads numba, ~0.5 s)."""
    from servesim.perf import kernels

    return kernels


@lru_cache(maxsize=4)
def _entry_points(tables_type):
    """The compiled ``iteration_seconds`` / ``decode_seconds`` for one tables type (every model's
    tables share one), as machine-code entry points resolved once: numba's dispatcher would type
    the StepTables argument on its slow path at every call (~8 us, many times the kernels' work).
    Entry points do not check argument types: :class:`KernelCalls` passes exactly these."""
    from numba import types

    k = _kernels()
    sig_i = (tables_type, types.int64[::1], types.int64[::1], types.int64)
    sig_d = (tables_type, types.int64, types.int64, types.int64, types.float64[::1])
    k.iteration_seconds.compile(sig_i)
    k.decode_seconds.compile(sig_d)
    return k.iteration_seconds.overloads[sig_i].entry_point, k.decode_seconds.overloads[sig_d].entry_point


class KernelCalls:
    """``predict`` / ``predict_decode_run`` of a built-in model: the kernels on its tables."""

    def __init__(self, tab):
        from numba import typeof

        self.tab = tab
        self._iteration, self._decode = _entry_points(typeof(tab))

    def iteration(self, new_tokens, context) -> float:
        new, ctx = composition(new_tokens, context)
        return float(self._iteration(self.tab, new, ctx, new.shape[0]))

    def decode_run(self, num_seqs: int, context_sum: int, steps: int) -> np.ndarray:
        out = np.empty(max(int(steps), 0))
        self._decode(self.tab, int(num_seqs), int(context_sum), out.shape[0], out)
        return out


class KernelModel:
    """Base of the built-in models: ``predict`` / ``predict_decode_run`` run the kernels on the
    tables the subclass builds in ``_tables()`` (numba loads on the first prediction)."""

    _kernel_calls: KernelCalls | None = None

    def _tables(self):  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _calls(self) -> KernelCalls:
        if self._kernel_calls is None:
            self._kernel_calls = KernelCalls(self._tables())
        return self._kernel_calls

    def predict(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        return self._calls().iteration(new_tokens, context)

    def predict_decode_run(self, num_seqs: int, context_sum: int, steps: int) -> np.ndarray:
        return self._calls().decode_run(num_seqs, context_sum, steps)
