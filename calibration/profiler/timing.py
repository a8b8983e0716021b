"""Timing: median of repeats, ops as CUDA-graph replays of R back-to-back calls, whole forwards
eager or as one graph replay (wall clock on CPU, for logic tests)."""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

import numpy as np
import torch

from .common import Budget, BudgetExceeded, Meas, log  # noqa: F401 - BudgetExceeded: raised via Budget.check


class Timer:
    """Median-of-repeats timing that never returns a zero, negative or non-finite time.

    CUDA: op time = (CUDA-event time of a graph replay holding R back-to-back calls) / R; falls back
    to events around R eager calls if capture fails. CPU: wall clock around R calls.
    """

    def __init__(self, device: torch.device, budget: Budget, quick: bool = False,
                 max_rep: Optional[int] = None):
        self.device = device
        self.cuda = device.type == "cuda"
        self.budget = budget
        self.quick = quick
        self.warmup = 2 if quick else 5
        self.min_rep = 3 if quick else 5
        self.max_rep = 5 if quick else (max_rep or 20)
        self.target_graph_ms = 1.0     # make one replay at least this long (amortizes its launch)
        self.budget_ms = 200.0         # GPU time spent on the timed repeats of one point, about
        self.max_r = 64
        self.fwd_budget_ms = 400.0     # the same for whole forwards
        self.fwd_max_rep = 5 if quick else 15
        self.capture_failures: dict[str, str] = {}
        self.dropped: list[str] = []
        self._stream = torch.cuda.Stream(device) if self.cuda else None

    # --- helpers -------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    @staticmethod
    def _event():
        return torch.cuda.Event(enable_timing=True)

    def capture(self, body: Callable[[], object]) -> "torch.cuda.CUDAGraph":
        """Capture ``body`` into a CUDA graph on a side stream.

        Done by hand rather than with ``torch.cuda.graph`` because that context manager empties the
        allocator cache on every capture, which makes hundreds of captures slow.
        """
        g = torch.cuda.CUDAGraph()
        s = self._stream
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            g.capture_begin()
            try:
                body()
            finally:
                g.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(s)
        return g

    @staticmethod
    def _summarize(times: list[float], method: str) -> Optional[Meas]:
        good = [t for t in times if math.isfinite(t) and t > 0]
        if not good or len(good) < max(1, len(times) // 2):
            return None
        arr = np.asarray(good, dtype=np.float64)
        med = float(np.median(arr))
        std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
        if not (math.isfinite(med) and med > 0):
            return None
        return Meas(med, std, len(arr), method)

    def _reps(self, one_ms: float, budget_ms: float, max_rep: int) -> int:
        if self.budget.fast():
            return self.min_rep
        n = int(budget_ms / max(one_ms, 1e-6))
        return max(self.min_rep, min(max_rep, n))

    # --- ops -----------------------------------------------------------------------------
    def measure(self, fns: list[Callable[[], object]], label: str = "",
                max_rep: Optional[int] = None) -> Optional[Meas]:
        """Time one op given as ``len(fns)`` variants (same op on rotated copies of its inputs);
        ``max_rep`` lowers the most timed replays for this op (surveys)."""
        self.budget.check()
        saved = self.max_rep
        if max_rep:
            self.max_rep = max(self.min_rep, min(self.max_rep, max_rep))
        try:
            for attempt in range(3):
                m = self._measure_cuda(fns, label) if self.cuda else self._measure_cpu(fns)
                if m is not None:
                    return m
                log(f"  re-measuring {label}: attempt {attempt + 1} gave no positive finite time")
        finally:
            self.max_rep = saved
        self.dropped.append(label)
        log(f"  DROPPED {label}: no positive finite time after 3 attempts")
        return None

    def _measure_cpu(self, fns) -> Optional[Meas]:
        k = len(fns)
        for i in range(max(self.warmup, k)):
            fns[i % k]()
        t0 = time.perf_counter()
        for f in fns:
            f()
        one = (time.perf_counter() - t0) * 1e3 / k
        r = max(k, min(self.max_r, math.ceil(self.target_graph_ms / max(one, 1e-4))))
        n = self._reps(one * r, self.budget_ms, self.max_rep)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            for i in range(r):
                fns[i % k]()
            times.append((time.perf_counter() - t0) * 1e3 / r)
        return self._summarize(times, "wall-clock")

    def _measure_cuda(self, fns, label) -> Optional[Meas]:
        k = len(fns)
        for i in range(max(self.warmup, k)):
            fns[i % k]()
        self.sync()
        e0, e1 = self._event(), self._event()
        e0.record()
        for f in fns:
            f()
        e1.record()
        self.sync()
        one = e0.elapsed_time(e1) / k
        r = max(k, min(self.max_r, math.ceil(self.target_graph_ms / max(one, 1e-4))))
        n = self._reps(one * r, self.budget_ms, self.max_rep)
        try:
            g = self.capture(lambda: [fns[i % k]() for i in range(r)])
        except Exception as exc:  # fall back to eager, and say so in the metadata
            self.capture_failures.setdefault(label.split(" ")[0], f"{type(exc).__name__}: {exc}"[:300])
            g = None
            self.sync()
        starts = [self._event() for _ in range(n)]
        ends = [self._event() for _ in range(n)]
        if g is not None:
            g.replay()
            g.replay()
            for j in range(n):
                starts[j].record()
                g.replay()
                ends[j].record()
            method = "cuda-graph"
        else:
            for j in range(n):
                starts[j].record()
                for i in range(r):
                    fns[i % k]()
                ends[j].record()
            method = "eager-events"
        self.sync()
        times = [starts[j].elapsed_time(ends[j]) / r for j in range(n)]
        del g
        return self._summarize(times, method)

    # --- whole forwards ---------------------------------------------------------------------
    def measure_forward(self, fwd: Callable[[], object], graph: bool, label: str = "") -> Optional[Meas]:
        """Wall time of one forward: synchronize, event, forward (or graph replay), event, sync.

        Synchronizing before each repeat keeps the CPU launch time in the eager number, as in a
        serving loop that waits for each step's tokens before launching the next step.
        """
        self.budget.check()
        for attempt in range(3):
            m = self._measure_forward_once(fwd, graph)
            if m is not None:
                return m
            log(f"  re-measuring {label}: attempt {attempt + 1} gave no positive finite time")
        self.dropped.append(label)
        log(f"  DROPPED {label}: no positive finite time after 3 attempts")
        return None

    def _measure_forward_once(self, fwd, graph: bool) -> Optional[Meas]:
        warm = 1 if self.quick else 2
        if not self.cuda:
            if graph:
                raise RuntimeError("CUDA graphs need a CUDA device")
            for _ in range(warm):
                fwd()
            t0 = time.perf_counter()
            fwd()
            one = (time.perf_counter() - t0) * 1e3
            n = self._reps(one, self.fwd_budget_ms, self.fwd_max_rep)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                fwd()
                times.append((time.perf_counter() - t0) * 1e3)
            return self._summarize(times, "wall-clock")
        for _ in range(warm):
            fwd()
        self.sync()
        run: Callable[[], object] = fwd
        g = None
        if graph:
            g = self.capture(fwd)
            run = g.replay
            for _ in range(warm):
                run()
            self.sync()
        e0, e1 = self._event(), self._event()
        e0.record()
        run()
        e1.record()
        self.sync()
        one = e0.elapsed_time(e1)
        n = self._reps(one, self.fwd_budget_ms, self.fwd_max_rep)
        times = []
        for _ in range(n):
            self.sync()
            e0.record()
            run()
            e1.record()
            self.sync()
            times.append(e0.elapsed_time(e1))
        del g, run
        return self._summarize(times, "cuda-graph" if graph else "eager")

