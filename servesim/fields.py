"""Field types shared by every config (scenario, KV, workload): strict and physically bounded.

A config value must mean what it says, or be refused with one line naming the field, the value
and what is allowed. The engine stores token counts in 32-bit columns (a 10-million-request run
must fit in memory), so a count that cannot be represented is refused here, before any cast,
instead of wrapping into a negative prompt.

Bounds are generous physical limits, not tuning advice:

==================  ==========================================================================
token counts        at most ``MAX_TOKENS`` (1e9) per prompt, output or limit, so that prompt +
                    output fits in an int32 column; no model has a context near that
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# Largest prompt or output length (and max_model_len, and any length bound) in tokens: prompt +
# output (<= 2e9) stays below 2**31 - 1, the limit of the engine's int32 token columns.
MAX_TOKENS = 1_000_000_000

# A token count of one request or a length bound: 1 .. MAX_TOKENS
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
# A token count that may be zero (a lower bound, a system prompt): 0 .. MAX_TOKENS
TokenCount0 = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
