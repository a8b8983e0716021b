"""Config blocks for replaying real workloads: length files, traces, ServeGen fits, class rules,
multi-turn sessions.

These are plain, frozen, validated data; reading files happens in :mod:`servesim.workload.traces`,
:mod:`servesim.workload.servegen` and :mod:`servesim.workload.sessions`, never here (loading a
config has no side effects). Paths stay as written: loaders resolve a relative path against the
folder of the scenario file (their ``base_dir`` argument), so a scenario folder can be moved
together with its traces.

YAML shapes (inside ``workload:``)::

    lengths:  {file: PATH, prompt_column: num_prefill_tokens, output_column: num_decode_tokens,
               min_prompt: 4, max_prompt: 1024, min_output: 4, max_total: 2048}
    trace:    {file: PATH, format: azure | mooncake | burstgpt, rate_scale: 1.0,
               start_s: 0, duration_s: null, max_gap_s: null}
    arrival:  {process: servegen, dir: PATH, clients: [5, 38], start_s: 338400, rate_scale: 0.01}
    classes:  {column: Model, values: {GPT-4: 0, ChatGPT: 2},
               rules: [{when: {prompt_gt: 4096}, klass: P2}], default: 0}
    sessions: {turns: {dist: geometric, mean: 4}, think_s: 10, think_dist: exponential,
               new_input: {dist: lognormal, mean: 200, sigma: 1}, output: {dist: fixed, value: 200},
               system_prompt_tokens: 512, block_tokens: 16}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from servesim.fields import MAX_TOKENS, NUM_CLASSES, Scale, Seconds, Seconds0, StrictModel, TokenCount, TokenCount0, TokenTotal
from servesim.config.dists import GeometricDist, LengthDist


OnBadRow = Literal["error", "skip"]
TraceFormat = Literal["azure", "mooncake", "burstgpt"]


_Frozen = StrictModel  # frozen, unknown fields refused, strict types, finite floats


def _check_path(v: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{v!r} is not a file path (give a path, relative to the scenario file's folder)")
    return v


def _parse_klass(v: Any) -> int:
    """A class is an int 0..4 or a name 'P0'..'P4' (case-insensitive)."""
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a class (allowed: 0..4 or P0..P4)")
    if isinstance(v, str) and v.strip().upper().startswith("P") and v.strip()[1:].isdigit():
        v = int(v.strip()[1:])
    if isinstance(v, int) and 0 <= v < NUM_CLASSES:
        return v
    raise ValueError(f"{v!r} is not a class (allowed: 0..{NUM_CLASSES - 1} or P0..P{NUM_CLASSES - 1})")


# ------------------------------------------------------------------------------ length filter
class LengthFilter(_Frozen):
    """Serving-benchmark filters: a (prompt, output) pair outside any bound is dropped, never
    clipped, so the kept pairs keep their joint distribution (what vLLM's and Sarathi's benchmark
    samplers do). ``None`` means unbounded. The run header reports how many rows each bound
    dropped."""

    min_prompt: TokenCount = 1
    max_prompt: TokenCount | None = None
    min_output: TokenCount = 1
    max_output: TokenCount | None = None
    max_total: TokenTotal | None = None
    on_bad_row: OnBadRow = "error"

    @field_validator("min_prompt", mode="before")
    @classmethod
    def _prompt_not_empty(cls, v):
        # rows with an empty prompt were kept and never served (13 of 30 "in flight" forever); a
        # real engine refuses them (vLLM v1/engine/processor.py: "The decoder prompt cannot
        # be empty"; tests/entrypoints/llm/test_prompt_validation.py), so the filter drops them
        if isinstance(v, int) and not isinstance(v, bool) and v == 0:
            raise ValueError("a prompt of 0 tokens cannot be served (vLLM refuses an empty prompt); "
                             "allowed: >= 1 (rows below it are dropped and counted)")
        return v

    @field_validator("min_output", mode="before")
    @classmethod
    def _output_not_empty(cls, v):
        # rows of 0 output tokens were kept and "completed" with no token (no TTFT, no TPOT); a real
        # engine asks for at least one (vLLM sampling_params.py _verify_args: "max_tokens must be at
        # least 1"); BurstGPT's failed requests are such rows
        if isinstance(v, int) and not isinstance(v, bool) and v == 0:
            raise ValueError("an output of 0 tokens cannot be served (an engine generates at least one token; "
                             "vLLM refuses max_tokens 0); allowed: >= 1 (rows below it are dropped and counted)")
        return v

    @model_validator(mode="after")
    def _bounds_ordered(self) -> "LengthFilter":
        for lo, hi in (("min_prompt", "max_prompt"), ("min_output", "max_output")):
            a, b = getattr(self, lo), getattr(self, hi)
            if b is not None and a > b:
                raise ValueError(f"{lo} {a} exceeds {hi} {b}: no row could be kept")
        if self.max_total is not None and self.min_prompt + self.min_output > self.max_total:
            raise ValueError(
                f"min_prompt {self.min_prompt} + min_output {self.min_output} exceeds "
                f"max_total {self.max_total}: no row could be kept"
            )
        return self


class LengthsConfig(LengthFilter):
    """Paired (prompt, output) lengths sampled jointly, row by row, from a CSV (with a header) or
    JSONL file. Replaces the ``prompt``/``output`` distributions; arrivals come from
    ``workload.arrival``."""

    file: str
    prompt_column: str = "num_prefill_tokens"
    output_column: str = "num_decode_tokens"
    # Truncate instead of drop: a pair longer than clip_total tokens loses the excess from prompt
    # and output in proportion to their shares (each keeps >= 1 token). Applied after the filters.
    # This is how Vidur bounds trace lengths (its max_tokens), used by the speed benchmark.
    clip_total: TokenTotal | None = None

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        return _check_path(v)

    @field_validator("prompt_column", "output_column")
    @classmethod
    def _column_named(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a column name must not be empty")
        return v


# ------------------------------------------------------------------------------------- trace
class TraceSessionsConfig(_Frozen):
    """Session ids in a trace (e.g. BurstGPT_3's ``Session ID``): turns of one session share
    their history as a prefix.

    ``prompt: full`` means the trace's prompt length already includes the history (what a chat
    API bills); ``prompt: new`` means it is only the new user input, so the replayed prompt is
    every earlier turn's prompt and output plus this input. Prefix chains are built in
    ``block_tokens``-token blocks (see :mod:`servesim.workload.sessions`)."""

    column: str
    prompt: Literal["full", "new"] = "full"
    block_tokens: Annotated[int, Field(ge=1, le=4096)] = 16


class TraceConfig(LengthFilter):
    """A full trace replay: arrival times, lengths (and, for Mooncake, prefix hashes) come from
    the file; replaces ``workload.arrival`` and the length distributions.

    Trace time: Azure timestamps are wall clock, so trace time 0 is the first row; Mooncake (ms)
    and BurstGPT (s) timestamps are already relative and used as they are. The replay keeps the
    rows with ``start_s <= t < start_s + duration_s``, shifts ``start_s`` to simulated time 0,
    shortens every gap longer than ``max_gap_s`` to ``max_gap_s`` (time compression of idle
    periods), and divides all times by ``rate_scale`` (2 = twice the request rate, half the gaps).
    """

    file: str
    format: TraceFormat
    rate_scale: Scale = 1.0
    start_s: Seconds0 = 0.0
    duration_s: Seconds | None = None
    max_gap_s: Seconds | None = None
    # Mooncake hash block size; other JSONL traces of the same schema use other sizes
    # (Qwen-Bailian traces: 16).
    hash_block_tokens: Annotated[int, Field(ge=1, le=1 << 20)] = 512
    sessions: TraceSessionsConfig | None = None

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        return _check_path(v)

    @model_validator(mode="after")
    def _format_options(self) -> "TraceConfig":
        if self.sessions is not None and self.format == "mooncake":
            raise ValueError(
                "sessions: mooncake traces carry no session ids; their hash_ids already give "
                "the shared prefixes (remove trace.sessions)"
            )
        return self


# ------------------------------------------------------------------------------------ servegen
class ServeGenArrivalConfig(_Frozen):
    """Arrivals generated from ServeGen's per-client, per-600-s-window fits
    (``chunk-<client>-trace.csv``: rate, cv, Gamma/Weibull shape and scale).

    ``clients``: which client files to use (default: every ``chunk-*-trace.csv`` in ``dir``).
    ``start_s``/``duration_s`` pick a slice of the data's time axis (seconds from its start);
    ``start_s`` becomes simulated time 0. ``rate_scale`` multiplies every window's rate and keeps
    the windows' length, so a diurnal pattern keeps its shape in real time."""

    process: Literal["servegen"]
    dir: str
    clients: list[Union[int, str]] | None = None
    start_s: Seconds0 = 0.0
    duration_s: Seconds | None = None
    rate_scale: Scale = 1.0

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str) -> str:
        return _check_path(v)

    @field_validator("clients")
    @classmethod
    def _clients(cls, v: list[int | str] | None) -> list[int | str] | None:
        if v is not None and not v:
            raise ValueError("clients [] selects nothing (give client ids, or leave it out for all)")
        return v


ServeGenConfig = ServeGenArrivalConfig  # the name used in the issue


# ---------------------------------------------------------------------------- class assignment
class ClassCondition(_Frozen):
    """All given tests must hold (AND). Token bounds are strict; ``column``/``equals`` compares a
    raw trace column (string equality) and only works for trace replays."""

    prompt_gt: TokenCount0 | None = None
    prompt_lt: TokenCount | None = None
    output_gt: TokenCount0 | None = None
    output_lt: TokenCount | None = None
    total_gt: Annotated[int, Field(ge=0, le=2 * MAX_TOKENS)] | None = None
    total_lt: Annotated[int, Field(ge=1, le=2 * MAX_TOKENS)] | None = None
    column: str | None = None
    equals: str | None = None

    @model_validator(mode="after")
    def _meaningful(self) -> "ClassCondition":
        if (self.column is None) != (self.equals is None):
            raise ValueError("column and equals go together: {column: Model, equals: GPT-4}")
        if all(getattr(self, f) is None for f in type(self).model_fields):
            raise ValueError(
                "an empty condition matches everything; use 'default' instead "
                "(allowed tests: prompt_gt, prompt_lt, output_gt, output_lt, total_gt, total_lt, column+equals)"
            )
        return self

    @field_validator("equals", mode="before")
    @classmethod
    def _as_text(cls, v: Any) -> Any:
        return v if v is None or isinstance(v, str) else str(v)


class ClassRule(_Frozen):
    """``{when: {prompt_gt: 4096}, klass: 2}``: requests matching ``when`` get class ``klass``."""

    when: ClassCondition
    klass: int

    @field_validator("klass", mode="before")
    @classmethod
    def _klass(cls, v: Any) -> int:
        return _parse_klass(v)


class ClassAssignmentConfig(_Frozen):
    """Deterministic class assignment, in priority order:

    1. the first rule in ``rules`` whose condition holds;
    2. else, when ``column`` is set, the column's value mapped through ``values`` (a value not in
       ``values`` is read as a class itself: ``2`` or ``P2``; anything else is an error);
    3. else ``default``.
    """

    column: str | None = None
    values: dict[str, int] = Field(default_factory=dict)
    rules: list[ClassRule] = Field(default_factory=list)
    default: int = 0

    @field_validator("default", mode="before")
    @classmethod
    def _default(cls, v: Any) -> int:
        return _parse_klass(v)

    @field_validator("values", mode="before")
    @classmethod
    def _values(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError(f"{v!r} is not a mapping of column value -> class")
        return {str(k): _parse_klass(c) for k, c in v.items()}

    @model_validator(mode="after")
    def _values_need_column(self) -> "ClassAssignmentConfig":
        if self.values and self.column is None:
            raise ValueError("values map a column's values to classes: give 'column' too")
        return self

    @property
    def columns(self) -> tuple[str, ...]:
        """Raw trace columns this assignment reads."""
        cols = [self.column] if self.column else []
        cols += [r.when.column for r in self.rules if r.when.column and r.when.column not in cols]
        return tuple(cols)


# ------------------------------------------------------------------------------------ sessions
# Session lengths use the scenario's length distributions (one definition, no copies).
SessionDist = LengthDist


def _int_shorthand(v: Any) -> Any:
    """``turns: 3`` is short for ``{dist: fixed, value: 3}``."""
    if isinstance(v, int) and not isinstance(v, bool):
        return {"dist": "fixed", "value": v}
    return v


class SessionsConfig(_Frozen):
    """Synthetic multi-turn chat sessions. Session starts come from ``workload.arrival``; each
    session has ``turns`` turns; turn k+1 arrives ``think`` seconds after turn k *arrived* (an
    open-loop approximation; see docs/traces.md). Turn k's prompt is the whole history — an
    optional system prompt, every earlier turn's new input and output — plus its new input; its
    prefix chain covers that prompt in ``block_tokens``-token blocks, so a prefix cache can hit
    on the history.

    New input and output lengths come either from ``new_input``/``output`` distributions or,
    jointly, from a length file (``pairs``). A session stops early before a turn whose prompt
    plus output would exceed ``max_context_tokens``."""

    turns: SessionDist = GeometricDist(dist="geometric", mean=4.0)
    think_s: Seconds0 = 10.0
    think_dist: Literal["fixed", "exponential"] = "exponential"
    new_input: SessionDist | None = None
    output: SessionDist | None = None
    pairs: LengthsConfig | None = None
    system_prompt_tokens: TokenCount0 = 0
    num_system_prompts: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    max_context_tokens: TokenTotal | None = None
    block_tokens: Annotated[int, Field(ge=1, le=4096)] = 16

    @field_validator("turns", "new_input", "output", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return _int_shorthand(v)

    @model_validator(mode="after")
    def _one_length_source(self) -> "SessionsConfig":
        dists = self.new_input is not None and self.output is not None
        if self.pairs is not None and (self.new_input is not None or self.output is not None):
            raise ValueError("give either pairs (a length file) or new_input + output, not both")
        if self.pairs is None and not dists:
            raise ValueError("give new_input and output distributions, or pairs: {file: ...}")
        if self.max_context_tokens is not None and self.system_prompt_tokens >= self.max_context_tokens:
            raise ValueError(
                f"system_prompt_tokens {self.system_prompt_tokens} leaves no room under "
                f"max_context_tokens {self.max_context_tokens}"
            )
        return self


__all__ = [
    "ClassAssignmentConfig",
    "ClassCondition",
    "ClassRule",
    "LengthFilter",
    "LengthsConfig",
    "OnBadRow",
    "ServeGenArrivalConfig",
    "ServeGenConfig",
    "SessionDist",
    "SessionsConfig",
    "TraceConfig",
    "TraceFormat",
    "TraceSessionsConfig",
]
