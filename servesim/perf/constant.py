"""Constant step time: every iteration takes the same time, whatever it computes.

Used by theory tests (M/D/1, M/G/1 queues) and golden traces, where a closed form or a hand-written
timeline must be matched exactly.
"""

from __future__ import annotations

from servesim.perf.base import KernelModel, check_bounds


class ConstantStepModel(KernelModel):
    """``predict`` / ``predict_decode_run`` (from :class:`KernelModel`) run the kernels."""

    name = "constant"

    def __init__(self, seconds: float):
        if not seconds > 0:
            raise ValueError(f"constant step time must be positive, got {seconds}")
        self.seconds = float(seconds)
        self._tab = None

    def tables(self, max_tokens: int, max_seqs: int):
        """The kernels' :class:`~servesim.perf.kernels.StepTables` (no per-count tables)."""
        check_bounds(max_tokens, max_seqs)
        return self._tables()

    def _tables(self):
        if self._tab is None:
            from servesim.perf.kernels import CONSTANT, step_tables

            self._tab = step_tables(CONSTANT, seconds=self.seconds)
        return self._tab

    def describe(self) -> str:
        return f"constant {self.seconds * 1e3:.3f} ms per iteration"
