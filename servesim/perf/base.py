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

Models are built for one (GPU, model shape, TP, PP) and carry no mutable state.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class StepTimeModel(Protocol):
    name: str

    def predict(self, new_tokens: np.ndarray, context: np.ndarray) -> float: ...

    def predict_decode_run(self, num_seqs: int, context_sum: int, steps: int) -> np.ndarray: ...

    def describe(self) -> str: ...


def split_batch(new_tokens: np.ndarray, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Split a composition into prefill rows (new > 1) and decode aggregate (count, context sum).

    Returns ``(prefill_new, prefill_ctx, n_decode, decode_ctx_sum)``.
    """
    new_tokens = np.asarray(new_tokens)
    context = np.asarray(context)
    is_decode = new_tokens == 1
    n_decode = int(is_decode.sum())
    if n_decode == len(new_tokens):
        return new_tokens[:0], context[:0], n_decode, int(context.sum())
    is_prefill = ~is_decode
    return (
        new_tokens[is_prefill],
        context[is_prefill],
        n_decode,
        int(context[is_decode].sum()) if n_decode else 0,
    )
