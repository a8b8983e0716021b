"""The ``workload`` block: one stream of requests, or several (``workload.streams``).

Real services carry several kinds of traffic at once, each with its own arrival process, lengths,
SLA class and SLO. A stream says all of that for one kind::

    workload:
      streams:
        - {name: chat, class: P0, arrival: {process: poisson, rate: 3},
           prompt: {...}, output: {...}, slo: {ttft_p99: 0.8}}
        - {name: docs, class: P2, arrival: {process: poisson, rate: 0.5}, ...}

or shares one arrival process with other streams (``share``: the 3:5:2 mix)::

    workload:
      arrival: {process: poisson, rate: 10}
      streams: [{name: chat, share: 3, ...}, {name: edu, share: 5, ...}, {name: code, share: 2, ...}]

The single-stream form (``arrival`` + ``prompt``/``output`` | ``lengths`` | ``trace`` |
``sessions``, with ``classes``) stays valid and means one stream named ``default`` whose requests
are grouped in results by their SLA class (P0..P4).

``contaminate`` turns a fraction of a stream's requests abnormal: their lengths are drawn from
another distribution and they are reported as a stream of their own (default name ``abnormal``),
so their fate and everyone else's are both visible.

Plain, frozen, validated data: generation is in :mod:`servesim.workload.generate` and
:mod:`servesim.workload.mix`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Optional, Union

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from servesim.fields import NUM_CLASSES, Seconds, StrictModel, Weight
from servesim.config.arrivals import ArrivalConfig, ClosedArrival, PoissonArrival
from servesim.config.dists import FixedDist, LengthDist
from servesim.config.traces import (
    ClassAssignmentConfig,
    LengthsConfig,
    SessionsConfig,
    TraceConfig,
    _parse_klass,
)



Frozen = StrictModel  # frozen, unknown fields refused, strict types, finite floats (servesim.fields)


# ------------------------------------------------------------------------------------ SLOs
SLO_METRICS = ("ttft", "tpot", "e2e")
SLO_PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
SloSeconds = Seconds


class _SLOTargets(Frozen):
    """Percentile targets ``<metric>_<percentile>`` in seconds: ``{ttft_p99: 0.8, e2e_p99: 5}``.

    Two readings, both reported: the target is *met* when that percentile of the stream's
    measured requests is at most the target; a request is *good* (counts toward goodput and SLO
    attainment) when each named metric of its own is at most its target."""

    @model_validator(mode="after")
    def _some_target(self):
        if not self.targets():
            allowed = ", ".join(f"{m}_{p}" for m in SLO_METRICS for p in SLO_PERCENTILES)
            raise ValueError(f"an slo needs at least one target (allowed: {allowed})")
        return self

    def targets(self) -> dict[str, float]:
        """Given targets by key, in field order."""
        return {k: v for k in type(self).model_fields if (v := getattr(self, k)) is not None}



def split_target(key: str) -> tuple[str, float]:
    """``"ttft_p999"`` -> ``("ttft", 99.9)``."""
    metric, pct = key.split("_", 1)
    return metric, SLO_PERCENTILES[pct]


StreamSLO = create_model(  # the 15 fields are data, not 15 hand-written lines
    "StreamSLO",
    __base__=_SLOTargets,
    __doc__=_SLOTargets.__doc__,
    **{f"{m}_{p}": (Optional[SloSeconds], None) for m in SLO_METRICS for p in SLO_PERCENTILES},
)


# ---------------------------------------------------------------------------------- labels
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,63}$")


def _check_name(v: Any, what: str) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise ValueError(f"{v!r} is not a valid {what} (letters, digits and _ . : + -, at most 64 characters)")
    return v


def priority_of_label(label: str) -> int | None:
    """``"P2"`` / ``"p2"`` -> 2; any other label -> None."""
    s = label.strip()
    if len(s) == 2 and s[0] in "Pp" and s[1].isdigit() and int(s[1]) < NUM_CLASSES:
        return int(s[1])
    return None


def _label(v: Any) -> Any:
    """Class labels: P0..P4 (any case, or 0..4) become ``"P<n>"``; other labels stay as written."""
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a class (P0..P4 or a label of your own)")
    if isinstance(v, int):
        return f"P{_parse_klass(v)}"
    v = _check_name(v, "class label")
    if re.fullmatch(r"[Pp][0-9]+", v) and priority_of_label(v) is None:
        raise ValueError(f"{v!r} is not a class (P0..P4, or a label of your own not of the form P<number>)")
    p = priority_of_label(v)
    return f"P{p}" if p is not None else v


Label = Annotated[str, Field(min_length=1)]


def _priority(v: Any) -> Any:
    return None if v is None else _parse_klass(v)


# ------------------------------------------------------------------------------ contaminate
class ContaminateConfig(Frozen):
    """A ``fraction`` of a stream's requests, chosen at random, are abnormal: their prompt (and
    output, when given) lengths are drawn from these distributions instead of the stream's. They
    keep their arrival time and are reported as the stream ``stream`` (class label ``class``,
    default the same name), with the SLA priority of the stream they came from unless
    ``priority`` is given."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
    prompt: LengthDist
    output: LengthDist | None = None
    stream: str = "abnormal"
    klass: str | None = Field(None, alias="class")
    priority: int | None = None
    slo: StreamSLO | None = None  # type: ignore[valid-type]

    @field_validator("stream")
    @classmethod
    def _stream_name(cls, v: Any) -> str:
        return _check_name(v, "stream name")

    @field_validator("klass", mode="before")
    @classmethod
    def _klass_label(cls, v: Any) -> Any:
        return None if v is None else _label(v)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_parse(cls, v: Any) -> Any:
        return _priority(v)

    @property
    def label(self) -> str:
        return self.klass or self.stream


# ----------------------------------------------------------------------------------- stream
class StreamConfig(Frozen):
    """One kind of traffic: where its requests come from (``arrival``, a ``share`` of the
    workload's arrival process, or a ``trace``), their lengths (``prompt`` + ``output``,
    ``lengths`` from a file, ``sessions`` or the trace), its class and its SLO.

    ``class`` is P0..P4 (then also the SLA priority the scheduler sees) or a label of your own
    (then give ``priority``); results are reported per class label."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str
    klass: str = Field("P0", alias="class")
    priority: int | None = None
    arrival: ArrivalConfig | None = None
    share: Annotated[float, Field(gt=0, le=1e9)] | None = None
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    lengths: LengthsConfig | None = None
    trace: TraceConfig | None = None
    sessions: SessionsConfig | None = None
    contaminate: ContaminateConfig | None = None
    slo: StreamSLO | None = None  # type: ignore[valid-type]

    @field_validator("name")
    @classmethod
    def _name(cls, v: Any) -> str:
        return _check_name(v, "stream name")

    @field_validator("klass", mode="before")
    @classmethod
    def _klass_label(cls, v: Any) -> Any:
        return _label(v)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_parse(cls, v: Any) -> Any:
        return _priority(v)

    @model_validator(mode="after")
    def _consistent(self) -> "StreamConfig":
        n = self.name
        sources = [k for k in ("arrival", "share", "trace") if getattr(self, k) is not None]
        if len(sources) > 1:
            raise ValueError(f"stream {n!r}: give one of arrival, share or trace (got {', '.join(sources)})")
        if not sources:
            raise ValueError(f"stream {n!r}: needs arrival (its own process), share (a part of "
                             f"workload.arrival) or trace")
        dists = self.prompt is not None or self.output is not None
        lengths = [k for k, on in (("prompt/output", dists), ("lengths", self.lengths is not None),
                                   ("sessions", self.sessions is not None), ("trace", self.trace is not None)) if on]
        if len(lengths) > 1:
            raise ValueError(f"stream {n!r}: lengths come from one of prompt/output, lengths, sessions "
                             f"or trace (got {' and '.join(lengths)})")
        if not lengths:
            raise ValueError(f"stream {n!r}: give its lengths: prompt and output, lengths (a file), "
                             f"sessions or trace")
        if dists and (self.prompt is None or self.output is None):
            raise ValueError(f"stream {n!r}: give both prompt and output")
        if self.sessions is not None and isinstance(self.arrival, ClosedArrival):
            raise ValueError(f"stream {n!r}: sessions need an open-loop arrival (sessions start at its arrivals)")
        if self.contaminate is not None and (self.sessions is not None or self.trace is not None):
            raise ValueError(f"stream {n!r}: contaminate replaces request lengths, which would break the "
                             f"prefix chains of sessions and traces; add an abnormal stream instead")
        own = priority_of_label(self.klass)
        if own is None and self.priority is None:
            raise ValueError(f"stream {n!r}: class {self.klass!r} is a label of your own; give priority "
                             f"(P0..P4), the SLA class the scheduler sees")
        if own is not None and self.priority is not None and self.priority != own:
            raise ValueError(f"stream {n!r}: class {self.klass} and priority P{self.priority} disagree "
                             f"(a P-class is its own priority; use a label of your own to decouple them)")
        return self

    @property
    def sla_class(self) -> int:
        """The SLA priority the scheduler sees (0 = P0, the most urgent)."""
        own = priority_of_label(self.klass)
        return own if own is not None else int(self.priority)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------- class mix
class ClassMix(Frozen):
    """Request SLA classes P0..P4 drawn independently with these weights (normalized)."""

    weights: Annotated[list[Weight], Field(min_length=1, max_length=5)] = [1.0]

    @model_validator(mode="after")
    def _positive(self):
        if sum(self.weights) <= 0:
            raise ValueError("at least one class weight must be positive")
        return self


# ------------------------------------------------------------------------------ stream specs
@dataclass(frozen=True)
class StreamSpec:
    """What results need to know about stream ``index``: its name, the class label it is
    reported under (None: by SLA class P0..P4, the single-stream form) and its SLO (None: the
    scenario's ``slo``)."""

    index: int
    name: str
    label: str | None
    slo: Any = None  # StreamSLO | None


# ---------------------------------------------------------------------------------- workload
class WorkloadConfig(Frozen):
    """Where requests come from. Either one stream (``arrival`` + ``prompt``/``output`` or
    ``lengths`` pairs from a file, optionally ``sessions``; or a ``trace`` replay; classes by
    random ``weights`` or rules, see docs/traces.md), or several ``streams``. ``rate_scale``
    multiplies every open-loop arrival rate (traces and ServeGen fits included)."""

    arrival: ArrivalConfig = PoissonArrival(process="poisson", rate=1.0)
    prompt: LengthDist = FixedDist(dist="fixed", value=512)
    output: LengthDist = FixedDist(dist="fixed", value=128)
    lengths: LengthsConfig | None = None
    trace: TraceConfig | None = None
    sessions: SessionsConfig | None = None
    classes: Union[ClassMix, ClassAssignmentConfig] = ClassMix()
    streams: Annotated[list[StreamConfig], Field(min_length=1, max_length=1000)] | None = None
    contaminate: ContaminateConfig | None = None
    rate_scale: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0

    @model_validator(mode="after")
    def _sources(self) -> "WorkloadConfig":
        if self.streams is not None:
            return self._check_streams()
        given = self.model_fields_set
        if self.trace is not None:
            clash = sorted(given & {"arrival", "prompt", "output", "lengths", "sessions"})
            if clash:
                raise ValueError(f"workload.trace gives arrivals and lengths itself; remove workload.{clash[0]}")
        if self.lengths is not None and given & {"prompt", "output"}:
            raise ValueError("workload.lengths replaces workload.prompt/output; give one or the other")
        if self.sessions is not None:
            if isinstance(self.arrival, ClosedArrival):
                raise ValueError("workload.sessions needs an open-loop arrival process (sessions start at its arrivals)")
            if given & {"prompt", "output", "lengths"}:
                raise ValueError("workload.sessions draws its own lengths (new_input, output or pairs); "
                                 "remove workload.prompt/output/lengths")
        if self.contaminate is not None and (self.sessions is not None or self.trace is not None):
            raise ValueError("workload.contaminate replaces request lengths, which would break the prefix "
                             "chains of sessions and traces; use workload.streams with an abnormal stream")
        if self.contaminate is not None and self.contaminate.stream == "default":
            raise ValueError("workload.contaminate.stream 'default' is the name of the single stream itself; "
                             "abnormal requests are reported as a stream of their own, give it another name "
                             "(e.g. abnormal, the default)")
        if self.rate_scale != 1.0 and self.trace is None and isinstance(self.arrival, ClosedArrival):
            raise ValueError(f"workload.rate_scale {self.rate_scale:g}: a closed loop has no rate to scale "
                             f"(change workload.arrival.clients or think_s)")
        return self

    def _check_streams(self) -> "WorkloadConfig":
        given = self.model_fields_set
        single = sorted(given & {"prompt", "output", "lengths", "trace", "sessions", "classes"})
        if single:
            raise ValueError(f"workload.{single[0]} belongs to the single-stream form; with workload.streams "
                             f"give it inside each stream")
        streams = self.streams or []
        names = [s.name for s in streams]
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise ValueError(f"workload.streams: stream name {dup[0]!r} is used twice (names must differ)")
        sharing = [s.name for s in streams if s.share is not None]
        if sharing and "arrival" not in given:
            raise ValueError(f"workload.streams: {sharing[0]!r} has a share of workload.arrival, which is not "
                             f"given (give workload.arrival, the process the shares split)")
        if not sharing and "arrival" in given:
            raise ValueError("workload.arrival is unused: every stream has its own arrival or trace "
                             "(give streams a share to split workload.arrival between them)")
        if sharing and isinstance(self.arrival, ClosedArrival):
            for s in streams:
                if s.share is not None and s.sessions is not None:
                    raise ValueError(f"stream {s.name!r}: sessions need an open-loop arrival, and "
                                     f"workload.arrival is a closed loop")
        if self.contaminate is not None:
            for s in streams:
                if s.contaminate is None and (s.sessions is not None or s.trace is not None):
                    raise ValueError(f"workload.contaminate applies to every stream, but stream {s.name!r} has "
                                     f"{'sessions' if s.sessions is not None else 'a trace'} (prefix chains); "
                                     f"put contaminate on the streams it should apply to")
        # one SLO per class label: results are reported per label
        slo_of: dict[str, tuple[str, Any]] = {}
        for name, label, slo in self._labelled():
            if label in slo_of and slo_of[label][1] != slo:
                raise ValueError(f"streams {slo_of[label][0]!r} and {name!r} share class {label!r} but give "
                                 f"different slo; results are per class, so give them the same slo "
                                 f"(or different class labels)")
            slo_of.setdefault(label, (name, slo))
        derived = {c.stream for _, c in self._contaminations()}
        clash = sorted(derived & set(names))
        if clash:
            raise ValueError(f"contaminate.stream {clash[0]!r} is also the name of a configured stream; "
                             f"abnormal requests are reported as a stream of their own, give it another name")
        if self.rate_scale != 1.0 and all(isinstance(self._arrival_of(s), ClosedArrival) for s in streams):
            raise ValueError(f"workload.rate_scale {self.rate_scale:g}: every stream is a closed loop, which "
                             f"has no rate to scale (change the clients or think_s)")
        return self

    # -- derived views ----------------------------------------------------------------------
    def resolved_fields(self) -> set[str]:
        """The fields a resolved scenario writes: the active ones, every default included. Fields
        this form does not use are left out, since giving them is an error (a trace replay has no
        arrival process) and their defaults would only mislead."""
        out = {"rate_scale"}
        if self.contaminate is not None:
            out.add("contaminate")
        if self.streams is not None:
            out.add("streams")
            if any(s.share is not None for s in self.streams):
                out.add("arrival")
            return out
        out.add("classes")
        if self.trace is not None:
            return out | {"trace"}
        out.add("arrival")
        if self.sessions is not None:
            return out | {"sessions"}
        return out | ({"lengths"} if self.lengths is not None else {"prompt", "output"})

    def _arrival_of(self, s: StreamConfig):
        if s.trace is not None:
            return None
        return s.arrival if s.arrival is not None else self.arrival

    def _contaminations(self) -> list[tuple[int, ContaminateConfig]]:
        """(stream index, config) of every contaminated stream, in stream order."""
        if self.streams is None:
            return [(0, self.contaminate)] if self.contaminate is not None else []
        out = []
        for i, s in enumerate(self.streams):
            c = s.contaminate if s.contaminate is not None else self.contaminate
            if c is not None:
                out.append((i, c))
        return out

    def _labelled(self) -> list[tuple[str, str, Any]]:
        """(stream name, class label, slo) of configured and derived streams."""
        out = [(s.name, s.klass, s.slo) for s in self.streams or []]
        out += [(c.stream, c.label, c.slo) for _, c in self._contaminations()]
        return out

    def stream_specs(self) -> tuple[StreamSpec, ...]:
        """Every stream a generated workload can hold, in index order: the configured streams
        (or ``default`` in the single-stream form), then one per distinct ``contaminate.stream``."""
        if self.streams is None:
            specs = [StreamSpec(0, "default", None, None)]
        else:
            specs = [StreamSpec(i, s.name, s.klass, s.slo) for i, s in enumerate(self.streams)]
        for _, c in self._contaminations():
            if all(sp.name != c.stream for sp in specs):
                specs.append(StreamSpec(len(specs), c.stream, c.label, c.slo))
        return tuple(specs)

    def class_labels(self) -> tuple[str, ...]:
        """The labels ``summary.by_class`` can hold for this workload: P0..P4 where a stream has
        no class label (its requests group by SLA class), then the streams' own labels. A metric
        ``NAME@LABEL`` (an SLO, a sweep column) must name one of them."""
        specs = self.stream_specs()
        out = [f"P{i}" for i in range(NUM_CLASSES)] if any(sp.label is None for sp in specs) else []
        out += [sp.label for sp in specs if sp.label is not None and sp.label not in out]
        return tuple(out)

    def closed_loops(self) -> list[ClosedArrival]:
        """The closed-loop processes of this workload (each a group of clients of its own)."""
        if self.streams is None:
            return [self.arrival] if self.trace is None and isinstance(self.arrival, ClosedArrival) else []
        out = [s.arrival for s in self.streams if isinstance(s.arrival, ClosedArrival)]
        if any(s.share is not None for s in self.streams) and isinstance(self.arrival, ClosedArrival):
            out.append(self.arrival)
        return out

    def has_open_loop(self) -> bool:
        if self.streams is None:
            return not self.closed_loops()
        shared_open = not isinstance(self.arrival, ClosedArrival)
        return any(s.trace is not None or (s.arrival is not None and not isinstance(s.arrival, ClosedArrival))
                   or (s.share is not None and shared_open) for s in self.streams)

    def needs_stream_clock(self) -> bool:
        """Whether requests can only be numbered per stream (several closed loops, or closed and
        open loops together): then "the first N requests" is not "the first N to arrive"."""
        loops = self.closed_loops()
        return len(loops) > 1 or (len(loops) == 1 and self.has_open_loop())
