"""Requests, stored as columns.

A workload of millions of requests is held as one :class:`Workload`: parallel numpy arrays, one
entry per request, in arrival order. The engine never builds a Python object per request or per
token; it indexes these arrays by request id (the row number).

A request is: an SLA class (0 = P0, the most urgent, .. 4 = P4), an arrival time, a prompt length,
an output length, and optionally a chain of prefix block hashes. Progress is derived, never
flagged: a request has computed ``num_computed`` tokens of the ``prompt + outputs so far`` it
knows; it is "in prefill" while ``num_computed < prompt`` and "decoding" after.

Prefix hashes are ragged: request ``i`` owns ``prefix_hashes[prefix_offsets[i]:prefix_offsets[i+1]]``,
one hash per ``prefix_block_tokens`` tokens of its prompt, chained (a block's hash already depends
on every block before it, as in vLLM's and Mooncake's hashing), so equal hashes mean equal prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Sequence

import numpy as np

from servesim.errors import WorkloadError
from servesim.fields import MAX_SECONDS, MAX_TOKENS, NUM_CLASSES

CLASS_NAMES = tuple(f"P{i}" for i in range(NUM_CLASSES))
# public (servesim/__init__.py): what a user's policy part, checker or hook reads in the state
__all__ = ["CLASS_NAMES", "NUM_CLASSES", "Cause", "PENDING", "WAITING", "RUNNING", "FINISHED", "REJECTED",
           "RequestTable", "Workload"]


class Cause(IntEnum):
    """Why a waiting request was not admitted. Every waiting second has exactly one cause."""

    KV_BLOCKS = 0  # the head request's KV allocation failed
    TOKEN_BUDGET = 1  # max_num_batched_tokens spent by requests ahead
    BATCH_SLOTS = 2  # max_num_seqs / max_running_requests / max batch size reached
    HIGHER_CLASS = 3  # a request of a higher SLA class is ahead and blocked
    STATIC_BATCH = 4  # a static (request-level) batch is still running
    TIER_TRANSFER = 5  # the request's KV is being fetched from a lower tier
    PREEMPTED = 6  # evicted from the running set, waiting to resume
    ITERATION = 7  # arrived during an iteration; waits for the next boundary


NUM_CAUSES = len(Cause)
CAUSE_NAMES = tuple(c.name.lower() for c in Cause)
CAUSE_LABELS = {
    Cause.KV_BLOCKS: "no free KV blocks",
    Cause.TOKEN_BUDGET: "token budget spent",
    Cause.BATCH_SLOTS: "batch slots full",
    Cause.HIGHER_CLASS: "a higher class ahead",
    Cause.STATIC_BATCH: "static batch in progress",
    Cause.TIER_TRANSFER: "waiting for a KV tier transfer",
    Cause.PREEMPTED: "preempted",
    Cause.ITERATION: "waiting for the iteration boundary",
}


# request status codes
PENDING, WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3, 4


class Reject:
    NONE = 0
    MAX_MODEL_LEN = 1
    KV_CAPACITY = 2
    TOKEN_BUDGET = 3
    REPLICA_FAILED = 4  # its replica failed while it was there (cluster.faults, on_failure: lost)
    NAMES = {1: "exceeds_max_model_len", 2: "exceeds_kv_capacity", 3: "prompt_exceeds_token_budget",
             4: "replica_failed"}


class RequestTable:
    """Per-request columns: the workload's inputs plus progress and timestamps."""

    def __init__(self, workload: Workload):
        n = len(workload)
        self.n = n
        # compact columns (a 10M-request run must fit in memory): token counts in int32, classes
        # in int8; the workload's columns are shared when they already have these types
        closed = n > 0 and bool(np.isnan(workload.arrival_s[0]))
        self.arrival = workload.arrival_s.astype(np.float64, copy=closed)  # closed loop writes it
        self.prompt = workload.prompt_tokens.astype(np.int32, copy=False)
        self.output = workload.output_tokens.astype(np.int32, copy=False)
        self.klass = workload.klass.astype(np.int8, copy=False)
        self.stream = workload.stream  # int16 stream index (workload.streams), for results only
        self.computed = np.zeros(n, dtype=np.int32)
        self.num_output = np.zeros(n, dtype=np.int32)
        self.t_first_sched = np.full(n, np.nan)
        self.t_first_token = np.full(n, np.nan)
        self.t_finish = np.full(n, np.nan)
        self.t_last_token = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int16)
        self.status = np.zeros(n, dtype=np.int8)
        self.reject_reason = np.zeros(n, dtype=np.int8)
        self.blocked = np.zeros((n, NUM_CAUSES), dtype=np.float64)
        self.replica: np.ndarray | None = None  # a fleet: the replica each request was sent to (-1: none)
        self.end_s: float | None = None  # when the run ended (set by the run): rows not sent by then are no requests
        # engine.api_server_count: the API servers' queue (engine/api_queue.py ApiQueue), which
        # holds the client send times the results are restored to; None: the latency model
        self.api_queue = None

    def known_tokens(self, ids):
        """Tokens whose ids are known (prompt + outputs so far): what a prefill must cover."""
        return self.prompt[ids] + self.num_output[ids]


@dataclass(frozen=True)
class Request:
    """One request, for building small workloads by hand (tests, examples)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    klass: int = 0
    prefix_hashes: tuple[int, ...] = ()
    session: int = -1


@dataclass(frozen=True, eq=False)
class ClosedGroup:
    """Rows ``lo..hi-1`` of a workload are one closed loop's requests, in the order its clients
    send them: ``clients`` users, client ``c`` sends its first request at ``start_s[c]``; when a
    request of the group ends, the group's next row arrives ``think_s[row - lo]`` seconds later.
    Several groups (one per closed-loop stream) keep their own concurrency."""

    lo: int
    hi: int
    clients: int
    start_s: np.ndarray  # float64 [clients]
    think_s: np.ndarray  # float64 [hi - lo]


@dataclass(frozen=True, eq=False)
class Workload:
    """Columns of a workload, sorted by arrival (``arrival_s`` is NaN for closed-loop requests,
    whose arrival is decided during the run by their client's think time).

    ``stream`` is each request's index into ``stream_names`` (``workload.streams``; all 0 in the
    single-stream form); ``klass`` stays the SLA priority the schedulers see. With
    ``closed_groups`` (closed loops with a ramp-up, or several closed-loop streams), those rows
    come first, each group contiguous, and the remaining rows are open-loop arrivals by time."""

    arrival_s: np.ndarray  # float64 [n]
    prompt_tokens: np.ndarray  # int64 [n]
    output_tokens: np.ndarray  # int64 [n]
    klass: np.ndarray  # int8 [n]
    session: np.ndarray | None = None  # int64 [n], -1 = no session
    prefix_offsets: np.ndarray | None = None  # int64 [n+1]
    prefix_hashes: np.ndarray | None = None  # int64 [total blocks]
    prefix_block_tokens: int = 0
    notes: tuple[str, ...] = field(default=())  # human-readable lines for the run header
    stream: np.ndarray | None = None  # int16 [n]; None: all 0
    stream_names: tuple[str, ...] = ("default",)
    closed_groups: tuple[ClosedGroup, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if self.stream is None or self.stream.dtype != np.int16:
            col = np.zeros(n, dtype=np.int16) if self.stream is None else self.stream.astype(np.int16)
            object.__setattr__(self, "stream", col)
        if n and int(self.stream.max()) >= len(self.stream_names):
            raise ValueError(f"Workload.stream has index {int(self.stream.max())} but only "
                             f"{len(self.stream_names)} stream names")
        for name in ("prompt_tokens", "output_tokens", "klass", "stream"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Workload.{name} has {len(getattr(self, name))} rows, expected {n}")
        if self.prefix_offsets is not None:
            if len(self.prefix_offsets) != n + 1 or self.prefix_hashes is None:
                raise ValueError("Workload.prefix_offsets must have n+1 entries and come with prefix_hashes")
            if self.prefix_block_tokens <= 0:
                raise ValueError("Workload.prefix_block_tokens must be positive when hashes are given")
        for name in ("prompt_tokens", "output_tokens"):
            _check_token_counts(name, getattr(self, name))
        check_time_bound(self.arrival_s)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def has_prefixes(self) -> bool:
        return self.prefix_offsets is not None

    def hashes_of(self, i: int) -> np.ndarray:
        if self.prefix_offsets is None:
            return np.empty(0, dtype=np.int64)
        return self.prefix_hashes[self.prefix_offsets[i] : self.prefix_offsets[i + 1]]

    @classmethod
    def from_requests(cls, requests: Sequence[Request], prefix_block_tokens: int = 0) -> "Workload":
        reqs = sorted(requests, key=lambda r: r.arrival_s)
        has_hashes = any(r.prefix_hashes for r in reqs)
        offsets = hashes = None
        if has_hashes:
            lens = [len(r.prefix_hashes) for r in reqs]
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            hashes = np.array([h for r in reqs for h in r.prefix_hashes], dtype=np.int64)
        return cls(
            arrival_s=np.array([r.arrival_s for r in reqs], dtype=np.float64),
            prompt_tokens=np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in reqs], dtype=np.int64),
            klass=np.array([r.klass for r in reqs], dtype=np.int8),
            session=np.array([r.session for r in reqs], dtype=np.int64),
            prefix_offsets=offsets,
            prefix_hashes=hashes,
            prefix_block_tokens=prefix_block_tokens if has_hashes else 0,
        )


TIME_BOUND_WHY = ("simulated times are bounded at 1e8 s (about 3 years): beyond it float64 seconds lose the "
                  "microseconds latencies are made of")


def check_time_bound(arrival_s: np.ndarray) -> None:
    """Arrival times (NaN: decided during the run, a closed loop) must be finite and at most
    ``MAX_SECONDS``. A rate of 1e-12 put the first arrival near 1e12 s, where a float64 second
    resolves only 0.1 ms: a 10 ms TTFT read 7.8-11.7 ms; a trace row at 1e300 ms read 0 s."""
    a = np.asarray(arrival_s, dtype=np.float64)
    over = ~(a <= MAX_SECONDS) & ~np.isnan(a)
    if over.any():
        i = int(np.argmax(over))
        raise WorkloadError(
            f"workload: request {i} arrives at {a[i]:.4g} s; {TIME_BOUND_WHY} (raise the arrival rate, or "
            f"shorten the trace window or the run)"
        )


def _check_token_counts(name: str, values: np.ndarray) -> None:
    """Token counts must be integers in 0..MAX_TOKENS (prompts: from 1, as a real engine refuses
    an empty prompt, which the engine would never schedule): the engine keeps them in int32 columns,
    where a larger count would wrap (a 3e9-token prompt became -1.29e9, negative TPOT)."""
    a = np.asarray(values)
    if len(a) == 0:
        return
    if a.dtype.kind not in "iu":
        if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or not np.all(a == np.floor(a)):
            raise WorkloadError(f"workload: {name} must hold whole token counts (got dtype {a.dtype})")
    lo, hi = a.min(), a.max()
    if name == "prompt_tokens" and lo == 0:  # an empty prompt: never served (13 of 30 in flight forever)
        bad = int(np.argmax(a == 0))
        raise WorkloadError(
            f"workload: request {bad} has prompt_tokens = 0; a prompt of 0 tokens cannot be served "
            f"(vLLM refuses an empty prompt); allowed: 1..{MAX_TOKENS:,} tokens"
        )
    if name == "output_tokens" and lo == 0:  # "completed" with no token: no TTFT, yet counted as served
        bad = int(np.argmax(a == 0))
        raise WorkloadError(
            f"workload: request {bad} has output_tokens = 0; an engine generates at least one token "
            f"(vLLM refuses max_tokens 0); allowed: 1..{MAX_TOKENS:,} tokens"
        )
    if lo < 0 or hi > MAX_TOKENS:
        bad = int(np.argmax(a < 0)) if lo < 0 else int(np.argmax(a > MAX_TOKENS))
        raise WorkloadError(
            f"workload: request {bad} has {name} = {int(a[bad]):,}; allowed: 0..{MAX_TOKENS:,} tokens "
            f"(counts are stored in 32 bits; no model has a context near that)"
        )
