"""Axes and designs: from "these fields take these values" to the list of points to run.

An *axis* is one dotted scenario path with its values; a *dimension* is what a design moves
independently: one axis, or a zip group of axes that move together (``[2048, 4096]`` with
``[2048, 4096]``: two axes, one dimension). Every dimension is either

* discrete: a finite list of values (a list, ``{start, stop, step}`` or ``{start, stop, num}``), or
* continuous: ``{low, high}`` (optionally ``scale: log``), for sampled designs only; with
  ``type: int`` the integers within ``[low, high]``, each equally likely (or their logs).

Designs::

    grid     every combination of the discrete dimensions (the product, first axis slowest)
    random   ``samples`` points, each coordinate uniform on [0, 1)         (numpy, seeded)
    lhs      Latin hypercube: each dimension's range cut in ``samples`` strata, one point in each
    sobol    scrambled Sobol' sequence (balanced when ``samples`` is a power of two)

A sampled design maps a coordinate ``u`` in [0, 1) to a value: the ``floor(u * k)``-th of a
discrete dimension's ``k`` values, or a point of the continuous range. The design is a pure
function of the spec (its ``seed`` included), so every machine expands the same points.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from servesim.errors import ServesimError


class SpecError(ServesimError):
    """A sweep spec is malformed: one line naming the field, the value and what is allowed."""


@dataclass(frozen=True)
class Axis:
    """One dotted path and, when discrete, its values."""

    path: str
    values: tuple[Any, ...] | None = None  # None: continuous
    low: float = 0.0
    high: float = 1.0
    log: bool = False
    integer: bool = False

    def at(self, u: float) -> Any:
        """The value at coordinate ``u`` in [0, 1)."""
        if self.values is not None:
            return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
        if self.integer:  # uniform over the integers low..high (or their logs)
            if self.log:
                lo, hi = math.log(self.low), math.log(self.high + 1)
                return int(min(math.floor(math.exp(lo + u * (hi - lo))), self.high))
            return int(min(math.floor(self.low + u * (self.high - self.low + 1)), self.high))
        if self.log:
            return float(math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low))))
        return float(self.low + u * (self.high - self.low))


@dataclass(frozen=True)
class Dimension:
    """Axes that move together: one axis, or a zip group whose axes have equally many values."""

    axes: tuple[Axis, ...]

    @property
    def discrete(self) -> bool:
        return self.axes[0].values is not None

    def __len__(self) -> int:
        return len(self.axes[0].values or ())

    def item(self, i: int) -> dict[str, Any]:
        return {a.path: a.values[i] for a in self.axes}

    def at(self, u: float) -> dict[str, Any]:
        if self.discrete:
            return self.item(min(int(u * len(self)), len(self) - 1))
        return {a.path: a.at(u) for a in self.axes}


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_axis(path: str, raw: Any, where: str) -> Axis:
    """An axis from its YAML form; ``where`` prefixes error lines (``spec.yaml: axes.PATH``)."""
    forms = "[v1, v2, ...], {start, stop, step}, {start, stop, num, scale: linear|log} or {low, high, scale, type}"
    if isinstance(raw, list):
        if not raw:
            raise SpecError(f"{where}: [] has no values (give at least one)")
        return Axis(path, _uniform_types(tuple(raw)))
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: {raw!r} is not an axis (forms: {forms})")
    keys = set(raw)
    allowed = {"start", "stop", "step", "num", "scale", "low", "high", "type"}
    if keys - allowed:
        raise SpecError(f"{where}: unknown key {sorted(keys - allowed)[0]!r} (forms: {forms})")
    scale = raw.get("scale", "linear")
    if scale not in ("linear", "log"):
        raise SpecError(f"{where}.scale = {scale!r}: allowed: linear, log")
    kind = raw.get("type")
    if kind not in (None, "int", "float"):
        raise SpecError(f"{where}.type = {kind!r}: allowed: int, float")
    if {"low", "high"} & keys:
        if not {"low", "high"} <= keys or keys & {"start", "stop", "step", "num"}:
            raise SpecError(f"{where}: a continuous range is {{low, high, scale, type}}; got keys {sorted(keys)}")
        lo, hi = raw["low"], raw["high"]
        if not (_num(lo) and _num(hi) and lo < hi):
            raise SpecError(f"{where}: low {lo!r} and high {hi!r} must be numbers with low < high")
        if scale == "log" and lo <= 0:
            raise SpecError(f"{where}: low {lo!r} must be > 0 on a log scale")
        if kind != "int":  # a continuous range, whatever the bounds look like (docs/sweeps.md)
            return Axis(path, None, float(lo), float(hi), scale == "log", False)
        first, last = math.ceil(lo), math.floor(hi)  # the integers within [low, high], no others
        if first > last:
            raise SpecError(f"{where}: no integer lies between low {lo!r} and high {hi!r} (type: int)")
        return Axis(path, None, float(first), float(last), scale == "log", True)
    if not {"start", "stop"} <= keys or ("step" in keys) == ("num" in keys):
        raise SpecError(f"{where}: give start, stop and one of step or num (forms: {forms})")
    start, stop = raw["start"], raw["stop"]
    if not (_num(start) and _num(stop)):
        raise SpecError(f"{where}: start {start!r} and stop {stop!r} must be numbers")
    if "step" in keys:
        step = raw["step"]
        if not _num(step) or step == 0 or (stop - start) / step < 0:
            raise SpecError(f"{where}.step = {step!r}: must be a non-zero number going from start {start} "
                            f"to stop {stop}")
        if scale == "log":
            raise SpecError(f"{where}: scale: log goes with num, not step")
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        if count > 100_000:
            raise SpecError(f"{where}: {count:,} values; at most 100,000 per axis")
        vals = [start + i * step for i in range(count)]
        ints = all(isinstance(x, int) for x in (start, stop, step))
    else:
        num = raw["num"]
        if not isinstance(num, int) or isinstance(num, bool) or not 1 <= num <= 100_000:
            raise SpecError(f"{where}.num = {num!r}: must be an integer from 1 to 100,000")
        if scale == "log":
            if start <= 0 or stop <= 0:
                raise SpecError(f"{where}: start {start!r} and stop {stop!r} must be > 0 on a log scale")
            vals = list(np.geomspace(start, stop, num))
        else:
            vals = list(np.linspace(start, stop, num))
        ints = isinstance(start, int) and isinstance(stop, int) and all(abs(v - round(v)) < 1e-9 for v in vals)
    if kind == "int" or (kind is None and ints):
        out = [int(round(v)) for v in vals]
        if len(set(out)) != len(out):
            raise SpecError(f"{where}: rounding to integers repeats values {out}; use fewer values or type: float")
    else:
        out = [float(v) for v in vals]
    return Axis(path, tuple(out))


def _uniform_types(values: tuple) -> tuple:
    """Numbers of one axis share one type (ints and floats mixed become floats) so the axis is one
    parquet column; mappings and lists stay as given (stored as JSON text)."""
    if all(_num(v) for v in values) and any(isinstance(v, float) for v in values):
        return tuple(float(v) for v in values)
    return values


def grid_size(dims: list[Dimension]) -> int:
    return math.prod(len(d) for d in dims) if dims else 1


def expand(dims: list[Dimension], kind: str, samples: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """The design's points in order, each ``{path: value}``."""
    if kind == "grid":
        if any(not d.discrete for d in dims):
            path = next(d.axes[0].path for d in dims if not d.discrete)
            raise SpecError(f"axes.{path}: a {{low, high}} range has no grid; give values or start/stop/num, "
                            f"or a sampled design (random, lhs, sobol)")
        points = []
        for combo in product(*(range(len(d)) for d in dims)):
            p: dict[str, Any] = {}
            for d, i in zip(dims, combo):
                p.update(d.item(i))
            points.append(p)
        return points
    if not samples:
        raise SpecError(f"design: {kind} needs samples: N (the number of points)")
    u = unit_samples(kind, len(dims), samples, seed)
    out = []
    for row in u:
        p = {}
        for d, x in zip(dims, row):
            p.update(d.at(float(x)))
        out.append(p)
    return out


def unit_samples(kind: str, d: int, n: int, seed: int) -> np.ndarray:
    """``n`` x ``d`` coordinates in [0, 1) from the named design."""
    if d == 0:
        return np.zeros((n, 0))
    if kind == "random":
        return np.random.default_rng(seed).random((n, d))
    from scipy.stats import qmc

    cls = {"lhs": qmc.LatinHypercube, "sobol": qmc.Sobol}.get(kind)
    if cls is None:
        raise SpecError(f"design.kind = {kind!r}: allowed: grid, random, lhs, sobol")
    try:
        engine = cls(d, scramble=True, rng=np.random.default_rng(seed))
    except TypeError:  # scipy < 1.15 names the generator seed=
        engine = cls(d, scramble=True, seed=np.random.default_rng(seed))
    with warnings.catch_warnings():  # Sobol' balance wants powers of two; documented, not an error
        warnings.simplefilter("ignore", UserWarning)
        return np.asarray(engine.random(n))
