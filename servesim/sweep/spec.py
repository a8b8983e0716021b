"""Sweep spec files: a base scenario, axes by dotted path, a design, seeds, the metrics to keep.

::

    name: rate-x-batch
    base: ../quickstart.yaml          # a scenario file (relative to this spec) or an inline mapping
    set: {stop.requests: 2000}        # fixed overrides on the base
    axes:
      workload.arrival.rate: {start: 1, stop: 16, num: 5, scale: log}
      engine.max_num_seqs: [32, 64, 128, 256]
    zip:                              # axes that move together: one design dimension per group
      - {engine.enable_chunked_prefill: [false, true], engine.max_num_batched_tokens: [8192, 2048]}
    design: grid                      # or {kind: random | lhs | sobol, samples: 64, seed: 0}
    seeds: 3                          # replications per point, or a list of seeds
                                      # (default: the base's stop.replications, 1 unless set)
    metrics: [ttft_p99, tpot_p99, req_per_s]   # default: every metric
    invalid: error                    # error | skip (points the scenario rejects)

Loading checks everything that can be checked without running: the spec's own fields, every
axis, and every point's scenario (each point is the base with the point's values, validated like
``--set``). A bad point stops the load with one line naming it, unless ``invalid: skip``, which
sets it aside in a list the runner writes out (never dropped silently). docs/sweeps.md has it all.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from servesim.errors import ScenarioError, ServesimError
from servesim.metrics.flat import METRIC_NAMES, check_metric_name
from servesim.scenario import Scenario, load_scenario, read_yaml_file, scenario_from_dict
from servesim.sweep.design import Dimension, SpecError, expand, grid_size, parse_axis
from servesim.version import __version__

TOP_KEYS = ("name", "base", "set", "axes", "zip", "design", "seeds", "metrics", "invalid")
MAX_POINTS = 1_000_000


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep: its place in the design, its axis values, its scenario and
    the key that names it in the store (a hash of the scenario, so equal configs share results)."""

    index: int
    values: dict[str, Any]
    scenario: Scenario
    key: str


@dataclass
class SweepSpec:
    name: str
    base: Scenario
    dims: list[Dimension]
    design: str
    samples: int | None
    design_seed: int
    seeds: tuple[int, ...] | int  # a count (seed + 0..n-1 of each point's scenario) or explicit seeds
    metrics: tuple[str, ...]
    invalid: str
    source: str
    points: list[Point] = field(default_factory=list)
    invalid_points: list[tuple[int, dict[str, Any], str]] = field(default_factory=list)
    duplicates: int = 0

    @property
    def paths(self) -> list[str]:
        return [a.path for d in self.dims for a in d.axes]

    def seeds_of(self, point: Point) -> list[int]:
        """Seeds of a point's replications: from the point, never from who runs it."""
        if isinstance(self.seeds, int):
            return [point.scenario.seed + r for r in range(self.seeds)]
        return list(self.seeds)


def scenario_key(sc: Scenario, digests: dict[str, str] | None = None) -> str:
    """A stable name for a configuration: everything that can change results, hashed: the
    scenario's fields, the servesim version, and the contents of every file the scenario reads
    (length files, traces, ServeGen folders, calibration packs), so editing a file, or upgrading,
    never reuses a stale row. The name and the folder the base was read from are left out (they
    change no number; a relative path's file counts by its contents). ``digests``: a cache of file
    digests by path, shared by a sweep's points so each file is read once."""
    d = sc.model_dump(mode="json", exclude={"name", "base_dir"})
    d = {"scenario": d, "servesim": __version__, "files": input_digests(sc, {} if digests is None else digests)}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:20]


def input_files(sc: Scenario) -> list[Path]:
    """Every data file (or ServeGen folder) ``sc`` names, absolute, found through its config
    models (servesim/config/traces.py), plus the calibration packs its step-time models read."""
    from servesim.config.traces import LengthsConfig, ServeGenArrivalConfig, TraceConfig
    from servesim.scenario import ModelRefConfig
    from servesim.workload.trace_readers import resolve_path
    from pydantic import BaseModel

    found: list[Path] = []

    def walk(x: Any) -> None:
        if isinstance(x, (LengthsConfig, TraceConfig)):
            found.append(resolve_path(x.file, sc.base_dir).absolute())
        elif isinstance(x, ServeGenArrivalConfig):
            found.append(resolve_path(x.dir, sc.base_dir).absolute())
        elif isinstance(x, ModelRefConfig) and x.config is not None:
            p = resolve_path(x.config, sc.base_dir).absolute()
            found.append(p / "config.json" if p.is_dir() else p)
        if isinstance(x, BaseModel):
            for name in type(x).model_fields:
                walk(getattr(x, name))
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)

    walk(sc)
    return list(dict.fromkeys(found)) + _pack_files(sc)


def _pack_files(sc: Scenario) -> list[Path]:
    """The calibration pack files (CSV and YAML) of every replica group's step-time model:
    ``step_time: {model: pack}`` (or the default ``auto`` where a pack fits) reads its pack, a roofline ``fit:`` the pack
    named (servesim/perf/pack.py finds them in the installed package)."""
    from servesim.perf.pack import pack_path
    from servesim.perf.select import choose
    from servesim.scenario import AutoStepConfig, PackStepConfig, RooflineStepConfig, pack_ref_parts

    out: list[Path] = []
    for g in [grp.scenario for grp in sc.replica_groups]:
        st = g.step_time
        try:
            if isinstance(st, PackStepConfig) or (isinstance(st, AutoStepConfig) and choose(g).model == "pack"):
                # the file the choice reads: the model's own, a twin's, a transfer's or the FP8 KV rule's base
                csv = choose(g).pack_csv
                if csv is None:
                    continue
            elif isinstance(st, RooflineStepConfig) and st.fit is not None:
                csv = pack_path(*pack_ref_parts(st.fit))
            else:
                continue
        except (ValueError, ServesimError):  # a name no pack can have: the run says so
            continue
        out += [csv, csv.with_suffix(".yaml")]
    return list(dict.fromkeys(out))


def input_digests(sc: Scenario, cache: dict[str, str]) -> list[list[str]]:
    """``[path, sha256]`` of every file :func:`input_files` names (a folder: of its files, by
    name; a missing path: "missing", so a run that fails on it is not keyed like one that ran)."""
    out = []
    for p in input_files(sc):
        k = str(p)
        if k not in cache:
            cache[k] = _digest(p)
        out.append([k, cache[k]])
    return out


def _digest(p: Path) -> str:
    h = hashlib.sha256()
    if p.is_file():
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    elif p.is_dir():
        for f in sorted(x for x in p.iterdir() if x.is_file()):
            h.update(f.name.encode() + b"\0" + bytes.fromhex(_digest(f)))
    else:
        return "missing"
    return h.hexdigest()


def load_spec(path: str | Path) -> SweepSpec:
    p = Path(path)
    src = str(path)
    try:  # the scenario loader's reading: plain YAML data only, one line for anything else
        raw = read_yaml_file(p, src, "sweep spec")
    except ScenarioError as exc:
        raise SpecError(str(exc)) from None
    return spec_from_dict(raw, src, p.resolve().parent)


def spec_from_dict(raw: Any, source: str = "spec", base_dir: Path | str = ".") -> SweepSpec:
    """Validate a spec mapping and expand its points (every point's scenario validated)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a sweep spec must be a YAML mapping, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise SpecError(f"{source}: {unknown[0]}: unknown field (allowed: {', '.join(TOP_KEYS)})")
    if "base" not in raw:
        raise SpecError(f"{source}: base: required field is missing (a scenario file or an inline mapping)")
    fixed = raw.get("set") or {}
    if not isinstance(fixed, dict):
        raise SpecError(f"{source}: set: {fixed!r} is not a mapping of dotted paths to values")
    base = _base(raw["base"], fixed, source, Path(base_dir))
    dims = _dims(raw, source)
    design, samples, dseed = _design(raw.get("design", "grid"), source)
    spec = SweepSpec(
        name=_name(raw.get("name"), source), base=base, dims=dims, design=design, samples=samples,
        design_seed=dseed, seeds=_seeds(raw.get("seeds", base.stop.replications), source), metrics=_metrics(raw.get("metrics"), source),
        invalid=_invalid(raw.get("invalid", "error"), source), source=source)
    if design == "grid" and grid_size(dims) > MAX_POINTS:
        raise SpecError(f"{source}: the grid has {grid_size(dims):,} points; at most {MAX_POINTS:,} "
                        f"(use a sampled design: random, lhs, sobol)")
    try:
        values = expand(dims, design, samples, dseed)
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None
    resolve_points(spec, values)
    _check_class_metrics(spec)
    return spec


def _check_class_metrics(spec: SweepSpec) -> None:
    """A ``NAME@LABEL`` metric must name a class some point reports: an unknown label was a
    column of NaN in every row, never a word."""
    scenarios = [p.scenario for p in spec.points] or [spec.base]
    labels = list(dict.fromkeys(lab for sc in scenarios for lab in sc.workload.class_labels()))
    for m in spec.metrics:
        if "@" in m and m.split("@", 1)[1] not in labels:
            raise SpecError(f"{spec.source}: metrics: {m!r}: {m.split('@', 1)[1]!r} is not a class of any point "
                            f"(the classes: {', '.join(labels)})")


def resolve_points(spec: SweepSpec, values: list[dict[str, Any]]) -> None:
    """Each point's scenario (validated) and its key. Points with identical configurations stay
    points (each gets its rows) but share their runs; ``duplicates`` counts them."""
    seen: set[str] = set()
    digests: dict[str, str] = {}  # each file the points read is hashed once per sweep
    for i, v in enumerate(values):
        label = ", ".join(f"{k}={_short(x)}" for k, x in v.items())
        where = f"{spec.source}: point {i} ({label})"
        try:
            sc = spec.base.override(v, source=where)
            check_fits(sc, where)
        except ScenarioError as exc:
            if spec.invalid == "skip":
                spec.invalid_points.append((i, v, str(exc)))
                continue
            raise SpecError(f"{exc} (or set invalid: skip in the spec)") from None
        key = scenario_key(sc, digests)
        spec.duplicates += key in seen
        seen.add(key)
        spec.points.append(Point(i, v, sc, key))


def check_fits(sc: Scenario, where: str) -> None:
    """The model and its KV cache fit the GPU (checked when a run is built; here too, so a point
    that cannot run is found before any point runs)."""
    from servesim.memory import plan_memory

    try:
        plan_memory(sc)
    except ValueError as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def _short(x: Any) -> str:
    t = json.dumps(x) if isinstance(x, (dict, list)) else str(x)
    return t if len(t) <= 40 else t[:37] + "..."


def _base(raw: Any, fixed: dict, source: str, base_dir: Path) -> Scenario:
    """The base scenario with the spec's ``set:`` applied. A mistake is blamed on where it is:
    the base file, or the spec's ``set:`` (a bad ``set:`` value was reported as the base file's)."""
    if isinstance(raw, str):
        path = Path(raw) if Path(raw).is_absolute() else base_dir / raw
        if not path.is_file():
            raise SpecError(f"{source}: base = {raw!r}: no such scenario file "
                            f"(paths are relative to the spec's folder)")

        def load(overrides):
            return load_scenario(path, overrides)
    elif isinstance(raw, dict):
        def load(overrides):
            return scenario_from_dict(raw, f"{source}: base", overrides, base_dir=base_dir)
    else:
        raise SpecError(f"{source}: base = {raw!r}: give a scenario file path or an inline scenario mapping")
    try:
        return load(fixed)
    except ScenarioError:
        if not fixed:
            raise
    alone = load(None)  # the base's own mistake is the base's (raises it)
    return alone.override(fixed, source=f"{source}: set")  # else the set's (raises it, named so)


def _dims(raw: dict, source: str) -> list[Dimension]:
    axes = raw.get("axes") or {}
    if not isinstance(axes, dict):
        raise SpecError(f"{source}: axes: {axes!r} is not a mapping of dotted paths to values")
    dims = [Dimension((parse_axis(str(k), v, f"{source}: axes.{k}"),)) for k, v in axes.items()]
    groups = raw.get("zip") or []
    if not isinstance(groups, list):
        raise SpecError(f"{source}: zip: {groups!r} is not a list of groups (each a mapping of paths to values)")
    for g, group in enumerate(groups):
        if not isinstance(group, dict) or not group:
            raise SpecError(f"{source}: zip[{g}]: {group!r} is not a mapping of dotted paths to values")
        members = tuple(parse_axis(str(k), v, f"{source}: zip[{g}].{k}") for k, v in group.items())
        if any(a.values is None for a in members):
            raise SpecError(f"{source}: zip[{g}]: zipped axes need listed values (a list or start/stop/num), "
                            f"not low/high")
        sizes = {a.path: len(a.values) for a in members}
        if len(set(sizes.values())) != 1:
            raise SpecError(f"{source}: zip[{g}]: zipped axes need equally many values, got {sizes}")
        dims.append(Dimension(members))
    paths = [a.path for d in dims for a in d.axes]
    dup = sorted({p for p in paths if paths.count(p) > 1})
    if dup:
        raise SpecError(f"{source}: axis {dup[0]} appears twice (in axes and/or zip groups)")
    return dims


def _design(raw: Any, source: str) -> tuple[str, int | None, int]:
    kinds = ("grid", "random", "lhs", "sobol")
    if isinstance(raw, str):
        raw = {"kind": raw}
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: design = {raw!r}: give grid, or {{kind: random|lhs|sobol, samples: N, seed: S}}")
    extra = set(raw) - {"kind", "samples", "seed"}
    if extra:
        raise SpecError(f"{source}: design.{sorted(extra)[0]}: unknown field (allowed: kind, samples, seed)")
    kind = raw.get("kind", "grid")
    if kind not in kinds:
        raise SpecError(f"{source}: design.kind = {kind!r}: allowed: {', '.join(kinds)}")
    samples = raw.get("samples")
    if kind == "grid" and samples is not None:
        raise SpecError(f"{source}: design.samples: a grid has every combination; samples goes with random, lhs, sobol")
    if kind != "grid" and (not isinstance(samples, int) or isinstance(samples, bool) or not 1 <= samples <= MAX_POINTS):
        raise SpecError(f"{source}: design.samples = {samples!r}: {kind} needs an integer from 1 to {MAX_POINTS:,}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise SpecError(f"{source}: design.seed = {seed!r}: must be an integer >= 0")
    return kind, samples, seed


def _seeds(raw: Any, source: str) -> tuple[int, ...] | int:
    if isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= 10_000:
        return raw
    if isinstance(raw, list) and raw and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in raw):
        if len(set(raw)) != len(raw):
            raise SpecError(f"{source}: seeds = {raw!r}: seeds repeat")
        return tuple(raw)
    raise SpecError(f"{source}: seeds = {raw!r}: give a count from 1 to 10,000 or a list of distinct seeds >= 0")


def _metrics(raw: Any, source: str) -> tuple[str, ...]:
    if raw is None:
        return METRIC_NAMES
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{source}: metrics = {raw!r}: give a list of metric names (or leave it out for all)")
    for m in raw:
        why = check_metric_name(str(m))
        if why:
            raise SpecError(f"{source}: metrics: {why}")
    return tuple(dict.fromkeys(str(m) for m in raw))


def _invalid(raw: Any, source: str) -> str:
    if raw not in ("error", "skip"):
        raise SpecError(f"{source}: invalid = {raw!r}: allowed: error, skip")
    return raw


def _name(raw: Any, source: str) -> str:
    if raw is None:
        return Path(source).stem
    if not isinstance(raw, str) or not raw.strip():
        raise SpecError(f"{source}: name = {raw!r}: must be a non-empty string")
    return raw
