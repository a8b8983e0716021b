"""A capacity probe: replications of one configuration until every SLO is decided.

A probe runs one configuration for seeds ``seed, seed+1, ...`` (the same seeds at every probe:
common random numbers, so two probes differ by their configuration, not their luck) and puts a
t interval (servesim/metrics/intervals.py) around each SLO metric. While an SLO's interval
straddles its bound the probe adds replications (``seeds`` at a time) until it is decided or
``max_seeds`` are spent: replications go where the answer is uncertain (sequential testing).

A search's budget (``Budget.max_probes``, ``Budget.max_time_s``) is checked before each probe;
when it is spent the prober raises :class:`BudgetSpent` and the search answers with what it
established. Runs are kept in a probe store (``ProbeStore``, one JSON line per run) when one is
given, so a re-run of the search with another tolerance or budget reuses every run it already has.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from servesim.metrics.flat import flat_metrics
from servesim.metrics.intervals import DEFAULT_CONFIDENCE, Interval, intervals
from servesim.scenario import Scenario
from servesim.sweep.executor import SerialExecutor
from servesim.sweep.runner import Progress, raise_errors, run_tasks
from servesim.sweep.slo import SLO, CapacityError, Verdict
from servesim.sweep.spec import Point, scenario_key
from servesim.sweep.task import Task

#: metrics every probe keeps beside its SLOs' (the zero-load check reads the busy fraction)
AUX_METRICS = ("busy_fraction",)


@dataclass
class Probe:
    x: float  # rate scale, or replica count
    scenario: Scenario
    n: int  # replications run
    checks: list[tuple[SLO, Interval, Verdict]]
    arrived: list[float] = field(default_factory=list)  # requests per second that arrived, each run
    aux: dict[str, Interval] = field(default_factory=dict)  # AUX_METRICS over the runs
    reused: int = 0  # replications read from the probe store instead of run
    rows: list[dict] = field(default_factory=list)  # each replication's metrics, seeds in order

    @property
    def measured_rate(self) -> float | None:
        """Mean over the runs of the request rate that arrived (None: not measured)."""
        vals = [v for v in self.arrived if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    @property
    def verdict(self) -> Verdict:
        vs = [v for _, _, v in self.checks]
        return "fail" if "fail" in vs else "pass" if all(v == "pass" for v in vs) else "open"

    def interval(self, slo: SLO) -> Interval | None:
        return next((iv for s, iv, _ in self.checks if s == slo), None)


@dataclass
class Budget:
    seeds: int = 5  # replications of a probe to begin with (and to add while one is open)
    max_seeds: int = 30
    confidence: float = DEFAULT_CONFIDENCE
    max_probes: int | None = None  # probes a search may run (None: the search's own limits)
    max_time_s: float | None = None  # wall seconds a search may take (checked before each probe)

    def check(self) -> None:
        if self.seeds < 2:
            raise CapacityError(f"--seeds {self.seeds}: intervals need at least 2 replications per probe")
        if self.max_seeds < self.seeds:
            raise CapacityError(f"--max-seeds {self.max_seeds}: must be at least --seeds {self.seeds}")
        if not 0.5 <= self.confidence < 1:
            raise CapacityError(f"--confidence {self.confidence}: must be in [0.5, 1)")
        if self.max_probes is not None and self.max_probes < 1:
            raise CapacityError(f"--budget {self.max_probes} probes: must be at least 1 probe")
        if self.max_time_s is not None and not self.max_time_s > 0:
            raise CapacityError(f"--budget {self.max_time_s:g}s: must be more than 0 seconds")


_BUDGET_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """``--budget``: ``20probes`` (or ``20 probes``, ``20p``) or a wall time ``90s``, ``15m``,
    ``1.5h``; several joined by commas (``20probes,10m``). Returns ``(max_probes, max_time_s)``."""
    probes: int | None = None
    secs: float | None = None
    allowed = "allowed: N probes (e.g. 20probes), a time (90s, 15m, 1.5h), or both joined by a comma"
    for part in (p.strip().replace(" ", "") for p in str(text).split(",")):
        low = part.lower()
        num = low.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = low[len(num):]
        try:
            v = float(num)
        except ValueError:
            raise CapacityError(f"--budget {text!r}: {part!r} is not a budget; {allowed}") from None
        if not math.isfinite(v) or v <= 0:
            raise CapacityError(f"--budget {text!r}: {part!r} must be more than 0; {allowed}")
        if unit in ("p", "probe", "probes"):
            if v != int(v):
                raise CapacityError(f"--budget {text!r}: {part!r}: a whole number of probes; {allowed}")
            probes = int(v)
        elif unit in _BUDGET_UNITS:
            secs = v * _BUDGET_UNITS[unit]
        else:
            raise CapacityError(f"--budget {text!r}: unit {unit or '(none)'!r} in {part!r}; {allowed}")
    return probes, secs


class BudgetSpent(Exception):
    """The search's probe or time budget is spent (raised before a probe starts)."""


class ProbeStore:
    """Runs of earlier probes, one JSON line per ``(configuration key, seed)``, so a search asked
    again (another --tol, --budget or SLO on the same metrics) reuses them. A key hashes the whole
    scenario, the servesim version and the files it reads (servesim/sweep/spec.py), so a stored run
    is reused only for exactly the configuration that produced it."""

    FILE = "probes.jsonl"

    def __init__(self, root: str | Path):
        self.path = Path(root) / self.FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rows: dict[tuple[str, int], dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    r = json.loads(line)
                    self._rows[(r["key"], int(r["seed"]))] = r
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a crash: that run simply runs again

    def get(self, key: str, seed: int, names: tuple[str, ...]) -> dict | None:
        r = self._rows.get((key, int(seed)))
        if r is None or not set(names) <= set(r["metrics"]):
            return None
        return r

    def put(self, key: str, seed: int, metrics: dict[str, float], arrived: float, step_model: str | None) -> None:
        old = self._rows.get((key, int(seed)), {}).get("metrics", {})
        clean = {k: (None if not math.isfinite(v) else v) for k, v in {**old, **metrics}.items()}
        r = {"key": key, "seed": int(seed), "metrics": clean,
             "arrived": None if not math.isfinite(arrived) else arrived, "step_model": step_model}
        self._rows[(key, int(seed))] = r
        with self.path.open("a") as f:
            f.write(json.dumps(r) + "\n")

    def __len__(self) -> int:
        return len(self._rows)


def _num(v) -> float:
    return math.nan if v is None else float(v)


def step_model_of(summary: dict) -> str | None:
    """The step-time model a run used, as its summary records it (None when it does not)."""
    st = summary.get("step_model") or summary.get("step_time")
    if isinstance(st, dict):
        return st.get("label") or st.get("describe") or st.get("kind") or json.dumps(st, sort_keys=True)
    return st if isinstance(st, str) else None


class Prober:
    """Runs a probe: replications of ``make(x)`` until every SLO is decided or the budget is
    spent (an SLO already failed decides the probe: no more runs)."""

    def __init__(self, make: Callable[[float], Scenario], slos: list[SLO], budget: Budget, executor=None,
                 progress: Callable[[str], None] | None = None, run_progress: Progress | None = None,
                 store: ProbeStore | None = None, clock: Callable[[], float] = time.monotonic,
                 describe: Callable[[float], str] | None = None):
        self.make, self.slos, self.budget = make, slos, budget
        self.describe = describe or (lambda x: f"x{x:.4g}")
        self.executor = executor or SerialExecutor()
        self.progress = progress
        self.run_progress = run_progress
        self.store = store
        self.clock = clock
        self.started = clock()
        self.runs = 0  # replications run (not counting those read from the store)
        self.probes = 0
        self.step_models: set[str] = set()
        self._digests: dict[str, str] = {}  # the files the probes read, hashed once a search

    def spent(self) -> str | None:
        """Why the budget allows no further probe (None while it does)."""
        b = self.budget
        if b.max_probes is not None and self.probes >= b.max_probes:
            return f"the probe budget (--budget {b.max_probes} probes) is spent"
        if b.max_time_s is not None and self.clock() - self.started >= b.max_time_s:
            return f"the time budget (--budget {b.max_time_s:g}s) is spent after {self.clock() - self.started:.0f} s"
        return None

    def _run(self, key: str, point: Point, sc: Scenario, seeds: list[tuple[int, int]],
             names: tuple[str, ...]) -> tuple[list[dict], list[float], int]:
        rows: dict[int, dict] = {}
        arrived: dict[int, float] = {}
        todo = []
        for rep, seed in seeds:
            got = self.store.get(key, seed, names) if self.store is not None else None
            if got is not None:
                rows[seed] = {k: _num(got["metrics"].get(k)) for k in names}
                arrived[seed] = _num(got.get("arrived"))
                if got.get("step_model"):
                    self.step_models.add(got["step_model"])
            else:
                todo.append(Task(key, seed, rep, sc))
        if todo:
            def keep(t: Task, out: dict) -> None:
                m = flat_metrics(out["summary"], names)
                rows[t.seed] = m
                arrived[t.seed] = float(out.get("arrived_req_per_s", math.nan))
                sm = out.get("step_model") or step_model_of(out["summary"])
                if sm:
                    self.step_models.add(sm)
                if self.store is not None:
                    self.store.put(key, t.seed, m, arrived[t.seed], sm)

            rep_ = run_tasks([point], todo, self.executor, metrics=(), progress=self.run_progress, on_result=keep)
            raise_errors(rep_)
        order = [s for _, s in seeds]
        return [rows[s] for s in order], [arrived[s] for s in order], len(seeds) - len(todo)

    def _names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*(s.metric for s in self.slos), *AUX_METRICS]))

    def _add(self, x: float, sc: Scenario, rows: list[dict], arrived: list[float], reused: int,
             add: int) -> Probe:
        """The probe at ``x`` with replications ``len(rows) .. len(rows) + add - 1`` run (or read
        from the store) beside those in ``rows``."""
        key = scenario_key(sc, self._digests)
        n = len(rows)
        seeds = [(r, sc.seed + r) for r in range(n, n + add)]
        got, arr, hit = self._run(key, Point(0, {}, sc, key), sc, seeds, self._names())
        rows, arrived = rows + got, arrived + arr
        self.runs += add - hit
        ivs = intervals(rows, self.budget.confidence)
        checks = [(s, ivs[s.metric], s.judge(ivs[s.metric])) for s in self.slos]
        return Probe(x, sc, len(rows), checks, arrived, {k: ivs[k] for k in AUX_METRICS if k in ivs}, reused + hit,
                     rows)

    def __call__(self, x: float) -> Probe:
        why = self.spent()
        if why is not None:
            raise BudgetSpent(why)
        self.probes += 1
        sc = self.make(x)
        probe = self._add(x, sc, [], [], 0, self.budget.seeds)
        while probe.verdict == "open" and probe.n < self.budget.max_seeds:
            probe = self._add(x, sc, probe.rows, probe.arrived, probe.reused,
                              min(self.budget.seeds, self.budget.max_seeds - probe.n))
        if self.progress:
            self.progress(probe_line(probe, self.probes, self.describe))
        return probe

    def extend(self, p: Probe, n: int) -> Probe:
        """``p`` with replications added up to ``n`` on the next seeds (the same seeds as any other
        probe with ``n``): the search measures the two probes its crossing interpolates between on
        the same seeds (servesim/sweep/search.py, ``_pair_up``). Not a new probe for the probe
        budget; the time budget still stops it (BudgetSpent)."""
        b = self.budget
        if b.max_time_s is not None and self.clock() - self.started >= b.max_time_s:
            raise BudgetSpent(f"the time budget (--budget {b.max_time_s:g}s) is spent after "
                              f"{self.clock() - self.started:.0f} s")
        if n <= p.n or len(p.rows) != p.n:
            return p
        return self._add(p.x, p.scenario, p.rows, p.arrived, p.reused, n - p.n)


def probe_line(p: Probe, index: int, describe: Callable[[float], str] = lambda x: f"x{x:.4g}") -> str:
    """One line per finished probe, for a log or a terminal: what ran, each SLO metric with its
    interval, the verdict."""
    def num(iv: Interval) -> str:
        if not math.isfinite(iv.estimate):
            return "nothing measured"
        pm = f" ± {iv.half_width:.2g}" if math.isfinite(iv.half_width) else ""
        return f"{iv.estimate:.4g}{pm}"
    parts = [f"{s.metric} {num(iv)} ({v})" for s, iv, v in p.checks]
    rate = p.measured_rate
    where = describe(p.x) + (f", {rate:.4g} req/s arrived" if rate is not None else "")
    reuse = f", {p.reused} reused" if p.reused else ""
    return f"probe {index}: {where}: {p.verdict} after {p.n} replications{reuse}; " + "; ".join(parts)
