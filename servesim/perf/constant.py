"""Constant step time: every iteration takes the same time, whatever it computes.

Used by theory tests (M/D/1, M/G/1 queues) and golden traces, where a closed form or a hand-written
timeline must be matched exactly.
"""

from __future__ import annotations

import numpy as np


class ConstantStepModel:
    name = "constant"

    def __init__(self, seconds: float):
        if not seconds > 0:
            raise ValueError(f"constant step time must be positive, got {seconds}")
        self.seconds = float(seconds)

    def predict(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        return self.seconds

    def predict_decode_run(self, num_seqs: int, context_sum: int, steps: int) -> np.ndarray:
        return np.full(steps, self.seconds)

    def describe(self) -> str:
        return f"constant {self.seconds * 1e3:.3f} ms per iteration"
