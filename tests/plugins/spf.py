"""A user policy for tests and docs/schedulers.md: shortest prompt first within vLLM's batching."""

import numpy as np


def shortest_prompt(cfg, st, now):
    best, rid = -1, st.q_head[0]
    while rid >= 0:  # walk the waiting queue
        if best < 0 or st.prompt[rid] < st.prompt[best]:
            best = rid
        rid = st.q_next[rid]
    return best, np.int64(0), np.int64(st.klass[best]) if best >= 0 else np.int64(0)


class ShortestPromptFirst:
    """vLLM's continuous batching, admitting the shortest waiting prompt first."""

    base = "vllm"
    parts = {"head": shortest_prompt}


class NoParts:
    base = "vllm"
    parts = {}


class BadPart:
    base = "vllm"
    parts = {"admission": shortest_prompt}
