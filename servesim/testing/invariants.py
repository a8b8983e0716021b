"""The named invariants of a simulation, and the error that names the one a run broke.

Each name is a promise servesim makes about every run, whatever the policy, KV manager or
workload; :class:`servesim.testing.Checker` tests them while a run goes on (per scheduling
decision and per iteration) and when it ends, and :mod:`servesim.testing.pairs` tests the ones
that compare two runs. docs/reliability.md says how each is tested, and shows each failing on a
deliberately broken policy part or KV manager.
"""

from __future__ import annotations

INVARIANTS: dict[str, str] = {
    # -- while the run goes on: every scheduling decision, every iteration ----------------------
    "requests_conserved":
        "no request lost or duplicated: every waiting request is in exactly one waiting queue (or "
        "set aside for a KV tier transfer), every running one in the running set once, and nobody is both",
    "arrivals_accounted":
        "completed + rejected + in flight = arrived: the inbox's arrival count equals the requests "
        "finished, rejected, waiting and running, and the engine's count of ended requests equals "
        "finished + rejected",
    "kv_conserved":
        "KV blocks conserved: blocks held + free = the pool (prefix caching: blocks in use + free or "
        "cached = the pool, and ref counts match block tables); per lower tier, blocks sent down = "
        "stored + refreshed, stored - evicted = held, and the last tier's evictions are dropped",
    "kv_capacity":
        "capacity never exceeded: no block count is negative or above the pool, a running request "
        "holds slots for every token it has computed and is about to compute, a lower tier holds at "
        "most its capacity, and swapped-out KV fits the host swap space",
    "batch_limits":
        "token budget and batch limits: an iteration computes at most max_num_batched_tokens tokens, "
        "at least one per scheduled request and never more than a request still needs; at most "
        "max_num_seqs (max_running_requests, max_batch_size) requests run; a batch lists a request once",
    "time_monotone":
        "simulated time never goes back: decisions at non-decreasing times, iterations back to back "
        "(each starts at or after the previous one ended, and ends at or after it starts)",
    "causality":
        "causality: a request is scheduled only after it arrived; its first scheduling is the start "
        "of its first iteration; its first token comes at the end of an iteration that computed it "
        "(so not before arrival plus that prefill step); it finishes at the end of its last "
        "iteration, after its first token; a rejected request ends at its arrival, never scheduled",
    "fifo":
        "FIFO where the policy promises it: first admissions in arrival order -- no request is first "
        "admitted while a request of its class (FCFS policies: any request) that arrived earlier waits "
        "without ever having been admitted (requests set aside for a KV tier transfer excepted)",
    "priority_order":
        "no priority inversion beyond the documented aging bound: every first admission ranks, by "
        "(effective class, arrival, id), ahead of every request left waiting; the effective class is "
        "the class minus one per engine.options.aging_s waited (the class itself without aging)",
    "bounded_wait":
        "no starvation under a stated load: every arrived request of every class is first scheduled "
        "within the bound you state for the scenario (servesim.testing.check_bounded_wait; a request "
        "still waiting at the end counts with its wait so far)",
    "percentiles_monotone":
        "percentiles monotone: every latency summary (and every class's) has 0 <= p50 <= p90 <= p95 "
        "<= p99 <= p999 <= max and mean <= max",
    "fragmentation_bounded":
        "fragmentation within [0, 1]: KV utilization, internal fragmentation, reservation waste and "
        "external fragmentation, as shares of the pool and of allocated KV, in the summary and in "
        "every time bin",
    # -- comparing runs (servesim.testing.pairs) ----------------------------------------------
    "fast_path_exact":
        "fast path = single stepping: sim.fast_path on and off give the same per-request results "
        "and summary (to 1e-9 relative: one sum of step times against step-by-step sums)",
    "compiled_equals_reference":
        "compiled = reference: the compiled engine and the same source run as Python give "
        "bit-identical results",
    "reproducible":
        "same seed -> identical results: two runs of one scenario and seed agree bit for bit",
    "worker_independent":
        "results independent of worker count: a run's results do not depend on how many worker "
        "processes ran it or its neighbours",
}


class InvariantViolation(AssertionError):
    """A run broke a named invariant. ``invariant`` is its name (a key of :data:`INVARIANTS`),
    ``detail`` what was seen, ``time`` the simulated time (None after the run).

    Its ``args`` are the constructor's arguments, so code that rebuilds an exception from them
    (SimPy does, when a process fails) keeps it whole."""

    def __init__(self, invariant: str, detail: str, time: float | None = None):
        if invariant not in INVARIANTS:
            raise ValueError(f"unknown invariant {invariant!r}")
        super().__init__(invariant, detail, time)
        self.invariant = invariant
        self.detail = detail
        self.time = time

    def __str__(self) -> str:
        at = f" at t={self.time:.9g}" if self.time is not None else ""
        return f"invariant {self.invariant} violated{at}: {self.detail}"
