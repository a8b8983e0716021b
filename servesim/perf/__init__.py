"""Step-time models: batch composition -> seconds of one engine iteration."""

from servesim.perf.base import StepTimeModel

__all__ = ["StepTimeModel"]
