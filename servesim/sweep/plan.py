"""``servesim plan``: the cheapest fleet that meets every SLO, over a space of choices.

A plan names a base scenario, the choices to weigh (GPU kind, precision, TP/PP, scheduler knobs,
router: any dotted scenario field with a list of alternatives), GPU-hour prices, and SLOs. Each
*option* (one value per choice) is answered by a min-replicas search (servesim/sweep/capacity.py):
the fewest replicas meeting every SLO, verified (that count passes, one fewer fails), so its cost
is ``replicas x GPUs per replica x price per GPU-hour``. The answer is the options sorted by cost,
each with its binding SLO (least headroom at the answer) and the headroom there.

Which options are tried:

    grid     every combination (the default while the space has at most ``trials`` options)
    optuna   an adaptive search (Optuna's TPE sampler, seeded) over the choices for ``trials``
             options, steering toward cheap feasible ones; for spaces too large to enumerate

Work is never done twice: every option's answer is kept in ``options.jsonl`` of the plan folder
and every probe run in its probe store, so a plan asked again (more trials, another method, an
added choice) reuses both. An option is not searched past the cost of the cheapest answer found
so far: its search stops at the replica count that would cost more (said so: "costlier than").

Prices are the user's: a YAML mapping of GPU name to price per GPU-hour (``prices:`` in the plan,
inline or a file); servesim ships an example with illustrative numbers only
(servesim/data/prices.yaml), never a quote.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from servesim.errors import ScenarioError, ServesimError
from servesim.scenario import Scenario, read_yaml_file
from servesim.sweep.capacity import SLO, Budget, ProbeStore, find_min_replicas, merge_slos, parse_slo, scenario_slos
from servesim.sweep.slo import CapacityError
from servesim.sweep.spec import _base, check_fits, scenario_key

PLAN_KEYS = ("name", "base", "set", "choices", "prices", "slos", "scenario_slos", "search", "budget",
             "max_replicas", "top")
METHODS = ("auto", "grid", "optuna")


class PlanError(ServesimError):
    """A plan that cannot be run as written (one line: the field, the value, what is allowed)."""


@dataclass(frozen=True)
class PlanSpec:
    name: str
    base: Scenario
    choices: dict[str, tuple]  # dotted scenario path -> alternatives
    prices: dict[str, float]  # GPU name -> price per GPU-hour
    currency: str
    slos: tuple[SLO, ...]
    method: str = "auto"
    trials: int = 64
    seed: int = 0
    budget: Budget = field(default_factory=lambda: Budget(seeds=3, max_seeds=12))
    max_replicas: int = 4096
    top: int = 5
    source: str = "plan"

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.choices.values()) if self.choices else 1

    @property
    def resolved_method(self) -> str:
        if self.method != "auto":
            return self.method
        return "grid" if self.size <= self.trials else "optuna"


@dataclass
class Option:
    """One point of the space and its answer."""

    values: dict[str, Any]
    key: str | None = None
    gpu: str | None = None
    gpus_per_replica: int | None = None
    price: float | None = None
    replicas: int | None = None
    cost_per_hour: float | None = None
    refused: str | None = None  # why it has no answer (cannot run, SLOs missed, costlier than the best)
    binding: str | None = None  # the SLO with the least headroom at the answer
    headroom: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # SLO metric estimates at the answer
    fails_below: bool | None = None  # one replica fewer verified to fail (None: the answer is 1)
    probes: int = 0
    step_model: str | None = None  # what timed its iterations (pack, transferred, roofline: perf/select.py)

    @property
    def feasible(self) -> bool:
        return self.replicas is not None and self.refused is None

    def label(self) -> str:
        return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in self.values.items()) or "(base)"


def _rank(o: "Option") -> tuple:
    """Cheapest first; at equal cost the one with more headroom on its binding SLO."""
    return (o.cost_per_hour, -(o.headroom if o.headroom is not None else -math.inf), o.replicas)


# ------------------------------------------------------------------------------------ reading
def default_prices_path() -> Path:
    return Path(str(resources.files("servesim") / "data" / "prices.yaml"))


def _prices(raw: Any, source: str, base_dir: Path) -> tuple[dict[str, float], str]:
    where = f"{source}: prices"
    if raw is None:
        raw = str(default_prices_path())
    if isinstance(raw, str):
        p = Path(raw) if Path(raw).is_absolute() else base_dir / raw
        if not p.is_file():
            raise PlanError(f"{where} = {raw!r}: no such file (a YAML mapping of GPU name to price per GPU-hour)")
        try:
            raw = read_yaml_file(p, str(p), "prices")
        except ScenarioError as exc:
            raise PlanError(str(exc)) from None
        where = str(p)
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: expected a mapping like {{currency: USD, per_gpu_hour: {{h200: 3.5}}}}")
    table = raw.get("per_gpu_hour", raw)
    currency = str(raw.get("currency", "USD")) if "per_gpu_hour" in raw else "USD"
    if not isinstance(table, dict) or not table:
        raise PlanError(f"{where}: per_gpu_hour must map GPU names to prices per GPU-hour")
    out = {}
    for gpu, v in table.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise PlanError(f"{where}: {gpu}: {v!r} is not a price (a number > 0 per GPU-hour)")
        out[str(gpu)] = float(v)
    return out, currency


def _choices(raw: Any, source: str) -> dict[str, tuple]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise PlanError(f"{source}: choices: a mapping of dotted scenario fields to lists of alternatives, "
                        f"e.g. {{hardware.gpu: [a100-80g, h200], engine.tensor_parallel_size: [1, 2]}}")
    out = {}
    for k, v in raw.items():
        if not isinstance(v, list) or not v:
            raise PlanError(f"{source}: choices.{k}: {v!r} is not a non-empty list of alternatives")
        if len({json.dumps(x, sort_keys=True, default=str) for x in v}) != len(v):
            raise PlanError(f"{source}: choices.{k}: {v!r} lists an alternative twice")
        out[str(k)] = tuple(v)
    return out


def _int(raw: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise PlanError(f"{where}: {raw!r} must be a whole number from {lo} to {hi}")
    return raw


def plan_from_dict(raw: Any, source: str = "plan", base_dir: Path | str = ".") -> PlanSpec:
    base_dir = Path(base_dir)
    if not isinstance(raw, dict):
        raise PlanError(f"{source}: a plan must be a YAML mapping, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in PLAN_KEYS]
    if unknown:
        raise PlanError(f"{source}: {unknown[0]}: unknown field (allowed: {', '.join(PLAN_KEYS)})")
    if "base" not in raw:
        raise PlanError(f"{source}: base: required field is missing (a scenario file or an inline mapping)")
    fixed = raw.get("set") or {}
    if not isinstance(fixed, dict):
        raise PlanError(f"{source}: set: {fixed!r} is not a mapping of dotted paths to values")
    try:
        base = _base(raw["base"], fixed, source, base_dir)
    except ServesimError as exc:
        raise PlanError(str(exc)) from None
    choices = _choices(raw.get("choices"), source)
    prices, currency = _prices(raw.get("prices"), source, base_dir)
    given = raw.get("slos") or []
    if not isinstance(given, list):
        raise PlanError(f"{source}: slos: {given!r} is not a list like [ttft_p99=0.8, tpot_p99=0.1]")
    try:
        slos = merge_slos([parse_slo(str(t)) for t in given],
                          scenario_slos(base) if raw.get("scenario_slos", True) else [])
    except CapacityError as exc:
        raise PlanError(f"{source}: slos: {exc}") from None
    if not slos:
        raise PlanError(f"{source}: slos: no SLO to meet (give slos: [ttft_p99=0.8] or SLOs on the base's streams)")
    search = raw.get("search") or {}
    if not isinstance(search, dict) or set(search) - {"method", "trials", "seed"}:
        raise PlanError(f"{source}: search: {search!r}: allowed keys method ({', '.join(METHODS)}), trials, seed")
    method = search.get("method", "auto")
    if method not in METHODS:
        raise PlanError(f"{source}: search.method: {method!r} (allowed: {', '.join(METHODS)})")
    bud = raw.get("budget") or {}
    if not isinstance(bud, dict) or set(bud) - {"seeds", "max_seeds", "confidence"}:
        raise PlanError(f"{source}: budget: {bud!r}: allowed keys seeds, max_seeds, confidence")
    budget = Budget(seeds=_int(bud.get("seeds", 3), f"{source}: budget.seeds", 2, 1000),
                    max_seeds=_int(bud.get("max_seeds", 12), f"{source}: budget.max_seeds", 2, 10000),
                    confidence=float(bud.get("confidence", 0.95)))
    try:
        budget.check()
    except CapacityError as exc:
        raise PlanError(f"{source}: budget: {exc}") from None
    return PlanSpec(
        name=str(raw.get("name") or base.name), base=base, choices=choices, prices=prices, currency=currency,
        slos=tuple(slos), method=method, trials=_int(search.get("trials", 64), f"{source}: search.trials", 1, 100000),
        seed=_int(search.get("seed", 0), f"{source}: search.seed", 0, 2**31 - 1), budget=budget,
        max_replicas=_int(raw.get("max_replicas", 4096), f"{source}: max_replicas", 1, 65536),
        top=_int(raw.get("top", 5), f"{source}: top", 1, 1000), source=source)


def load_plan(path: str | Path) -> PlanSpec:
    p = Path(path)
    try:
        raw = read_yaml_file(p, str(path), "plan")
    except ScenarioError as exc:
        raise PlanError(str(exc)) from None
    return plan_from_dict(raw, str(path), p.resolve().parent)


# ---------------------------------------------------------------------------------- options
class OptionStore:
    """``options.jsonl``: one answered option per line, keyed by its scenario key (+ SLOs)."""

    def __init__(self, root: Path, slos: tuple[SLO, ...]):
        self.path = Path(root) / "options.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tag = "; ".join(str(s) for s in slos)
        self._rows: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    r = json.loads(line)
                    if r.get("slos") == self.tag:
                        self._rows[r["option"]["key"]] = r["option"]
                except (ValueError, KeyError, TypeError):
                    continue

    def get(self, key: str, cap: float | None) -> Option | None:
        r = self._rows.get(key)
        if r is None:
            return None
        o = Option(**r)
        # an option stopped at an earlier cost cap holds only a lower bound on its cost: still
        # costlier than the best found now when that bound reaches the current cap; without a cap
        # (nothing answered yet in this plan) or under a higher one it must be searched again
        if o.refused and o.refused.startswith("costlier") and (cap is None or (o.cost_per_hour or 0) < cap):
            return None
        return o

    def put(self, o: Option) -> None:
        self._rows[o.key] = asdict(o)
        with self.path.open("a") as f:
            f.write(json.dumps({"slos": self.tag, "option": asdict(o)}, default=str) + "\n")


@dataclass
class Planner:
    spec: PlanSpec
    executor: Any = None
    out: Path | None = None
    progress: Callable[[str], None] | None = None
    options: list[Option] = field(default_factory=list)
    _cache: dict = field(default_factory=dict)

    def __post_init__(self):
        self.probes = ProbeStore(self.out / "probes") if self.out is not None else None
        self.store = OptionStore(self.out, self.spec.slos) if self.out is not None else None
        self._hint: dict[int, int] = {}  # GPUs per replica -> a replica count answered before

    def best(self) -> Option | None:
        ok = [o for o in self.options if o.feasible]
        return min(ok, key=_rank) if ok else None

    def evaluate(self, values: dict[str, Any]) -> Option:
        """The fewest replicas of this option meeting every SLO, and its cost."""
        tag = json.dumps(values, sort_keys=True, default=str)
        if tag in self._cache:
            return self._cache[tag]
        o = Option(dict(values))
        where = f"{self.spec.source}: option ({o.label()})"
        try:
            sc = self.spec.base.override(values, source=where)
            check_fits(sc, where)
        except ServesimError as exc:
            o.refused = f"cannot run: {exc}"
            return self._keep(tag, o, stored=False)
        o.key = scenario_key(sc)
        o.gpu, o.gpus_per_replica = sc.hardware.gpu, sc.gpus_per_replica
        o.price = self.spec.prices.get(o.gpu)
        if o.price is None:
            o.refused = (f"no price for GPU {o.gpu!r} (prices list: {', '.join(sorted(self.spec.prices))}; "
                         f"add it to the prices file)")
            return self._keep(tag, o, stored=False)
        best = self.best()
        cap = best.cost_per_hour if best is not None else None
        got = self.store.get(o.key, cap) if self.store is not None else None
        if got is not None:
            got.values = dict(values)
            return self._keep(tag, got, stored=False)
        per_replica = o.gpus_per_replica * o.price
        limit = self.spec.max_replicas if cap is None else max(1, min(self.spec.max_replicas,
                                                                      math.floor(cap / per_replica + 1e-9)))
        start = max(1, min(limit, self._hint.get(o.gpus_per_replica, 1)))
        try:
            s = find_min_replicas(sc, list(self.spec.slos), self.spec.budget, start=start, executor=self.executor,
                                  store=self.probes, limit=limit)
        except ServesimError as exc:
            o.refused = f"cannot run: {exc}"
            return self._keep(tag, o)
        o.probes = len(s.path)
        o.step_model = (s.step_model or {}).get("label")
        if s.answered:
            o.replicas = int(s.best.x)
            o.cost_per_hour = o.replicas * per_replica
            o.fails_below = None if o.replicas == 1 else (s.bound is not None and int(s.bound.x) == o.replicas - 1)
            margins = s.margins()
            bind = min(margins, key=lambda m: m[2] if math.isfinite(m[2]) else math.inf)
            o.binding, o.headroom = str(bind[0]), float(bind[2])
            o.metrics = {str(sl): float(iv.estimate) for sl, iv, _ in margins}
            self._hint[o.gpus_per_replica] = o.replicas
        elif cap is not None and limit < self.spec.max_replicas and "not met even with" in (s.refused or ""):
            o.cost_per_hour = (limit + 1) * per_replica
            o.refused = (f"costlier than the best found: needs more than {limit} replicas "
                         f"({o.cost_per_hour:,.2f} {self.spec.currency}/h or more)")
        else:
            o.refused = s.refused
        return self._keep(tag, o)

    def _keep(self, tag: str, o: Option, stored: bool = True) -> Option:
        self._cache[tag] = o
        self.options.append(o)
        if stored and self.store is not None and o.key is not None:
            self.store.put(o)
        if self.progress:
            what = (f"{o.replicas} x {o.gpus_per_replica} {o.gpu}: {o.cost_per_hour:,.2f} {self.spec.currency}/h, "
                    f"binding {o.binding} (headroom {o.headroom:.1%})" if o.feasible
                    else (o.refused or "").removeprefix("no answer: "))
            self.progress(f"option {len(self.options)}: {o.label()}: {what}")
        return o

    # -------------------------------------------------------------------------- the searches
    def grid(self) -> None:
        keys = list(self.spec.choices)
        for combo in itertools.product(*(self.spec.choices[k] for k in keys)):
            self.evaluate(dict(zip(keys, combo)))

    def optuna(self) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        keys = list(self.spec.choices)
        # categorical choices by index: any YAML value (a mapping, a list) is a choice
        dists = {k: optuna.distributions.CategoricalDistribution(list(range(len(self.spec.choices[k]))))
                 for k in keys}
        study = optuna.create_study(direction="minimize",
                                    sampler=optuna.samplers.TPESampler(seed=self.spec.seed, n_startup_trials=8))
        penalty = 10.0 * self.spec.max_replicas * max(self.spec.prices.values()) * 64
        tried: set[tuple] = set()
        for _ in range(min(self.spec.trials, self.spec.size)):
            trial = study.ask(dists)
            idx = tuple(trial.params[k] for k in keys)
            o = self.evaluate({k: self.spec.choices[k][i] for k, i in zip(keys, idx)})
            tried.add(idx)
            value = o.cost_per_hour if o.feasible else (o.cost_per_hour or penalty) * 1.5
            study.tell(trial, value)
            if len(tried) >= self.spec.size:
                break

    def run(self) -> "PlanResult":
        self.grid() if self.spec.resolved_method == "grid" else self.optuna()
        return PlanResult(self.spec, list(self.options))  # evaluate() keeps each option once


@dataclass
class PlanResult:
    spec: PlanSpec
    options: list[Option]

    def ranked(self) -> list[Option]:
        uniq = {json.dumps(o.values, sort_keys=True, default=str): o for o in self.options}
        feas = sorted((o for o in uniq.values() if o.feasible), key=_rank)
        return feas + [o for o in uniq.values() if not o.feasible]

    @property
    def best(self) -> Option | None:
        r = self.ranked()
        return r[0] if r and r[0].feasible else None

    def to_dict(self) -> dict:
        s = self.spec
        return {"name": s.name, "method": s.resolved_method, "space_size": s.size, "trials": s.trials,
                "slos": [str(x) for x in s.slos], "currency": s.currency, "prices": s.prices,
                "choices": {k: list(v) for k, v in s.choices.items()},
                "best": None if self.best is None else asdict(self.best),
                "options": [asdict(o) for o in self.ranked()]}


def run_plan(spec: PlanSpec, *, executor=None, out: str | Path | None = None,
             progress: Callable[[str], None] | None = None) -> PlanResult:
    if spec.resolved_method == "grid" and spec.size > 4096:
        raise PlanError(f"{spec.source}: the grid has {spec.size:,} options; at most 4,096 (search: {{method: optuna}})")
    return Planner(spec, executor, Path(out) if out is not None else None, progress).run()
