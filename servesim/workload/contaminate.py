"""Abnormal traffic: a fraction of a stream's requests get lengths from another distribution.

Field reports test engines with "10 % of requests over 16K tokens" mixed into normal traffic:
what does the engine do with them (reject, preempt, stall), and what does it cost everyone else?
:func:`contaminate` picks each request of a stream independently with probability ``fraction``,
redraws its prompt (and output, when configured) length, and moves it to the abnormal stream, so
results show the abnormal requests and the rest apart. Arrival times are unchanged: the abnormal
requests arrive through the same door as the others.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from servesim.request import Workload
from servesim.workload.dists import mean_length, sample_lengths
from servesim.config.streams import ContaminateConfig, StreamSpec


def contaminate(w: Workload, rows: np.ndarray, cfg: ContaminateConfig, specs: tuple[StreamSpec, ...],
                rng: np.random.Generator, source: str = "default") -> Workload:
    """``w`` with each of ``rows`` (a boolean mask) abnormal with probability ``cfg.fraction``.

    ``specs`` are the workload's streams (the abnormal stream among them, by ``cfg.stream``);
    ``source`` names the contaminated stream in the header note. The pick, prompt and output
    draws come from three children of ``rng``."""
    target = next(s.index for s in specs if s.name == cfg.stream)
    r_pick, r_prompt, r_output = rng.spawn(3)
    cand = np.flatnonzero(rows)
    hit = cand[r_pick.random(len(cand)) < cfg.fraction]
    prompt = w.prompt_tokens.copy()
    prompt[hit] = sample_lengths(cfg.prompt, len(hit), r_prompt)
    output = w.output_tokens
    if cfg.output is not None:
        output = output.copy()
        output[hit] = sample_lengths(cfg.output, len(hit), r_output)
    col = w.stream.copy()
    col[hit] = target
    klass = w.klass
    if cfg.priority is not None:
        klass = klass.copy()
        klass[hit] = cfg.priority
    share = len(hit) / len(cand) if len(cand) else 0.0
    note = (f"contaminate: {len(hit):,} of {len(cand):,} requests of stream {source!r} ({share:.1%}) are abnormal "
            f"(prompt mean {mean_length(cfg.prompt):,.0f} tokens"
            + (f", output mean {mean_length(cfg.output):,.0f}" if cfg.output is not None else "")
            + f"); reported as stream {cfg.stream!r}")
    return dataclasses.replace(w, prompt_tokens=prompt, output_tokens=output, klass=klass, stream=col,
                               stream_names=tuple(s.name for s in specs), notes=w.notes + (note,))
