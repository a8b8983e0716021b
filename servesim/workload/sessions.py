"""Multi-turn sessions: each session's turns (new input, output, think time), their arrival
times after the session's start, and their prefix chains (:mod:`servesim.workload.chains`): a
shared system prompt, then the session's own growing history. :func:`topped_up_sessions` draws
more sessions until ``stop.requests`` turns are delivered.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servesim.errors import ScenarioError
from servesim.fields import MAX_REQUESTS, MAX_TOKENS
from servesim.request import Workload
from servesim.workload.chains import (SESSION_NS, SYSTEM_NS, exclusive_group_cumsum, mix, ragged_positions,
                                      stream_chains)
from servesim.workload.dists import sample_lengths
from servesim.workload.traces import sample_length_pairs
from servesim.config.traces import SessionsConfig


def synthesize_sessions(
    cfg: SessionsConfig,
    session_starts: np.ndarray,
    rng: np.random.Generator,
    base_dir=None,
    max_requests: int | None = None,
    until_s: float | None = None,
) -> Workload:
    """Multi-turn chat sessions, one per entry of ``session_starts`` (seconds, from the scenario's
    arrival process). Returns every turn arriving before ``until_s`` as a request, sorted by
    arrival (the first ``max_requests`` when given), with ``session`` ids and prefix chains in
    ``cfg.block_tokens`` blocks. Classes are all 0 (apply class rules afterwards).

    Random draws come from independent children of ``rng`` (turn counts, system prompt choice,
    lengths, think times), so changing one distribution does not move the others' numbers."""
    starts = np.asarray(session_starts, dtype=np.float64)
    r_turns, r_system, r_lengths, r_think = rng.spawn(4)
    n_sessions = len(starts)
    turns = sample_lengths(cfg.turns, n_sessions, r_turns)
    if max_requests is not None:
        # turn k of a session arrives after its turns 0..k-1, so only its first max_requests
        # turns can be among the first max_requests requests: later ones are never drawn (a
        # session of 10^9 turns took 22 GB for a one-request run)
        turns = np.minimum(turns, max_requests)
    drawn = int(turns.sum())
    if drawn > MAX_REQUESTS:
        raise ScenarioError(
            f"workload.sessions.turns: {n_sessions:,} sessions of up to {int(turns.max()):,} turns draw "
            f"{drawn:,} requests, more than the {MAX_REQUESTS:,} a simulation may have; shorten the "
            f"sessions or the run (stop.requests, stop.duration_s)")
    system_id = r_system.integers(0, cfg.num_system_prompts, n_sessions)
    sess, k = ragged_positions(turns)
    n = len(sess)
    pair_notes: tuple[str, ...] = ()
    if cfg.pairs is not None:
        new_input, output, pair_notes = sample_length_pairs(cfg.pairs, base_dir, n, r_lengths)
    else:
        r_in, r_out = r_lengths.spawn(2)
        new_input = sample_lengths(cfg.new_input, n, r_in)
        output = sample_lengths(cfg.output, n, r_out)
    if cfg.think_dist == "exponential":
        think = r_think.exponential(cfg.think_s, n) if cfg.think_s > 0 else np.zeros(n)
    else:
        think = np.full(n, float(cfg.think_s))
    first = k == 0
    think[first] = 0.0
    arrival = starts[sess] + exclusive_group_cumsum(think, first) + think
    L0 = cfg.system_prompt_tokens
    prompt = L0 + exclusive_group_cumsum(new_input + output, first) + new_input
    keep = np.ones(n, dtype=bool)
    if cfg.max_context_tokens is not None:
        over = (prompt + output) > cfg.max_context_tokens
        # a session ends at its first turn over the limit: drop it and every later turn
        keep = exclusive_group_cumsum(over.astype(np.int64), first) + over == 0
    stream_key = mix(SESSION_NS, sess)
    system_key = mix(SYSTEM_NS, system_id[sess])
    if until_s is not None:
        keep &= arrival < until_s
    order = np.flatnonzero(keep)
    order = order[np.argsort(arrival[order], kind="stable")]
    if max_requests is not None:
        order = order[:max_requests]
    prompt_k = prompt[order]
    if len(prompt_k) and int(prompt_k.max()) > MAX_TOKENS:
        raise ScenarioError(
            f"workload.sessions: a turn's prompt (its session's whole history) reaches "
            f"{int(prompt_k.max()):,} tokens, more than the {MAX_TOKENS:,} a request may have; "
            f"set sessions.max_context_tokens or shorten the turns"
        )
    offsets, hashes = stream_chains(stream_key[order], prompt_k, cfg.block_tokens, system_key[order], L0)
    kept_turns = len(order)
    shared = _history_share(prompt_k, new_input[order])
    notes = pair_notes + (
        f"sessions: {n_sessions:,} sessions, {n:,} turns drawn (mean {n / max(n_sessions, 1):.2f} a session)"
        + (f", {n - int(keep.sum()):,} cut by max_context_tokens or the end of the run" if not keep.all() else "")
        + f"; {kept_turns:,} requests kept",
        f"sessions: mean prompt {prompt_k.mean() if kept_turns else 0:,.0f} tokens, {shared:.0%} of prompt tokens "
        f"are history (an upper bound on prefix-cache hits); chains in {cfg.block_tokens}-token blocks",
    )
    return Workload(
        arrival_s=arrival[order],
        prompt_tokens=prompt_k,
        output_tokens=output[order],
        klass=np.zeros(kept_turns, dtype=np.int8),
        session=sess[order].astype(np.int64),
        prefix_offsets=offsets,
        prefix_hashes=hashes,
        prefix_block_tokens=cfg.block_tokens,
        notes=notes,
    )


def _history_share(prompt: np.ndarray, new_input: np.ndarray) -> float:
    total = float(prompt.sum())
    return float((prompt - new_input).sum()) / total if total > 0 else 0.0


SESSION_TOP_UPS = 6  # rounds of drawing more sessions to reach stop.requests
SESSIONS_PER_REQUEST = 64  # at most this many sessions drawn per requested request


def topped_up_sessions(cfg, draw_starts, rng, base: Path, n_stop: int | None, t_stop: float | None,
                       where: str) -> tuple[Workload, tuple[str, ...]]:
    """Sessions (``cfg``) started at ``draw_starts(m)`` (``m`` starts: ``(times, notes)``) until
    they give ``n_stop`` turns, drawing more starts while they give fewer (see :func:`servesim.workload.generate._sessions`);
    ``rng()`` restarts the sessions' random stream. The workload and the starts' notes."""
    m = n_stop
    cap_m = None if n_stop is None else SESSIONS_PER_REQUEST * n_stop
    for _ in range(SESSION_TOP_UPS):
        arrivals, notes = draw_starts(m)
        wl = synthesize_sessions(cfg, arrivals, rng(), base, max_requests=n_stop, until_s=t_stop)
        # enough; or the session starts ran out (a duration or the data's end binds, not the count)
        if n_stop is None or len(wl) >= n_stop or len(arrivals) < m:
            return wl, tuple(notes)
        if m >= cap_m:
            break
        # draw enough sessions for the observed yield of requests per session, with a margin
        m = min(cap_m, 16 * m if len(wl) == 0 else int(m * n_stop / len(wl) * 1.2) + 16)
    cap = cfg.max_context_tokens
    why = (f"sessions.max_context_tokens {cap:,} drops most turns" if cap is not None
           else "the sessions are too short")
    raise ScenarioError(
        f"{where}: {len(arrivals):,} sessions gave only {len(wl):,} of the {n_stop:,} requests "
        f"stop.requests asks for ({why}; raise it, shorten new_input/output/system_prompt_tokens, "
        f"or ask for fewer requests)"
    )
