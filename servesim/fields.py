"""Field types shared by every config (scenario, KV, workload): strict and physically bounded.

A config value must mean what it says, or be refused with one line naming the field, the value
and what is allowed. Every config model derives from :class:`StrictModel`:

* **strict types**: no bool where a number is meant (``max_num_seqs: true``), no string read as a
  number (``"64"``), no float where a count is meant (``64.0``); an int is fine for a float.
* **finite floats**: ``.inf`` and ``.nan`` are refused everywhere (``rate: .inf`` is not a rate).
* **physical bounds**: every time, rate, size and count has an upper limit far beyond any real
  system, so ``seconds: 1e300`` or ``rate: 1e300`` is an error, not a run printing nonsense.

The engine stores token counts in 32-bit columns (a 10-million-request run must fit in memory),
so a count that cannot be represented is refused here, before any cast, instead of wrapping.

==================  ==========================================================================
token counts        at most ``MAX_TOKENS`` (1e9) per prompt, output or length bound, so that
                    prompt + output fits in an int32 column; no model has a context near that
durations           at most ``MAX_SECONDS`` (1e8 s, about 3 years): run lengths, think times,
                    SLOs, trace windows
iteration times     at most ``MAX_STEP_SECONDS`` (1 hour): step times, per-iteration overheads
rates               at most ``MAX_RATE`` (1e6 requests or sessions per second)
requests            at most ``MAX_REQUESTS`` (1e8) per simulation (about 20 GB of columns)
memory sizes        at most ``MAX_GIB`` (2**20 GiB)
==================  ==========================================================================
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

NUM_CLASSES = 5  # SLA classes P0..P4 (servesim.request re-exports it; configs read it here, without numpy)
MAX_TOKENS = 1_000_000_000  # prompt + output (<= 2e9) stays below 2**31 - 1
MAX_SECONDS = 1e8
MAX_STEP_SECONDS = 3600.0
MAX_RATE = 1e6
MAX_REQUESTS = 100_000_000
MAX_GIB = float(1 << 20)
MAX_SEED = (1 << 63) - 1


class StrictModel(BaseModel):
    """Base of every config model: frozen, unknown fields refused, strict types, finite floats."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


# -- counts ---------------------------------------------------------------------------------
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]  # one request's tokens, a length bound
TokenCount0 = Annotated[int, Field(ge=0, le=MAX_TOKENS)]  # may be zero (a lower bound, a system prompt)
TokenTotal = Annotated[int, Field(ge=2, le=2 * MAX_TOKENS)]  # a bound on prompt + output
RequestCount = Annotated[int, Field(ge=1, le=MAX_REQUESTS)]
RequestCount0 = Annotated[int, Field(ge=0, le=MAX_REQUESTS)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]

# -- times ----------------------------------------------------------------------------------
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]  # a positive duration
Seconds0 = Annotated[float, Field(ge=0, le=MAX_SECONDS)]  # a duration that may be zero
StepSeconds = Annotated[float, Field(gt=0, le=MAX_STEP_SECONDS)]  # one iteration's time
StepSeconds0 = Annotated[float, Field(ge=0, le=MAX_STEP_SECONDS)]  # a per-iteration overhead

# -- rates, shares, sizes -------------------------------------------------------------------
Rate = Annotated[float, Field(gt=0, le=MAX_RATE)]  # requests (or sessions) per second
Scale = Annotated[float, Field(gt=0, le=1e6)]  # a multiplier such as a trace's rate_scale
Share = Annotated[float, Field(gt=0, le=1)]  # a fraction in (0, 1]
Share0 = Annotated[float, Field(ge=0, le=1)]  # a fraction in [0, 1]
Weight = Annotated[float, Field(ge=0, le=1e9)]  # a relative weight (normalized by the sum)
GiB = Annotated[float, Field(gt=0, le=MAX_GIB)]


def finite_number(x: Any, lo: float, hi: float, *, lo_open: bool = False) -> bool:
    """For free-form options (``engine.options``): a real number (not a bool, not a string),
    finite, in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    if not math.isfinite(x) or x > hi:
        return False
    return x > lo if lo_open else x >= lo


def is_import_path(name: str) -> bool:
    """``package.module:Class`` -- how a user names a policy or router of their own (imported when
    the run is built)."""
    module, sep, cls = name.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and cls.isidentifier()
