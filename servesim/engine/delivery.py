"""Token delivery to the clients: ITL pairs, and vLLM 0.6's one-call lag (``cfg.lag``).

Apart from engine/kernel.py (the replica's loop) because the lag is a rule of its own: which
requests' sampled tokens still wait for the engine's next call to return, and what their
clients see when it does (docs/schedulers.md "Asynchronous output processing").
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.request import FINISHED


@kernel(inline=True)
def itl_add(st, gap, weight):
    i = st.s.itl_len
    st.itl_v[i] = gap
    st.itl_w[i] = weight
    st.s.itl_len = i + 1


@kernel
def deliver_pending(st, t, t0):
    """``cfg.lag`` (vLLM 0.6's asynchronous output processing, docs/schedulers.md): the tokens the
    requests in ``p_ids`` sampled in the previous iteration reach their clients at ``t``. vLLM
    0.6.0 turns a step's samples into RequestOutputs inside the *next* step's model call (the
    ``async_callback`` run after compute_logits: worker/model_runner.py, and for multi-step
    worker/multi_step_model_runner.py ``_async_process_outputs``; llm_engine.py ``step`` queues
    the outputs in ``ctx.output_queue``), in the executor thread, whose ``put_nowait`` into the
    request's asyncio queue (engine/async_llm_engine.py AsyncStream) wakes no event loop: the
    stream moves when that call returns. Returns how many had their last delivery at ``t0`` (their
    gap is the recorder row ``t0..t``: its ITL weight); NaN ``t0``: none is counted so."""
    n_row = 0
    for i in range(st.s.p_len):
        r = st.p_ids[i]
        last = st.t_last[r]
        if np.isnan(last):
            st.t_first[r] = t  # (set when sampled, as the engine's time, in case no delivery follows)
        elif last == t0:
            n_row += 1
        elif t >= st.s.itl_from:
            itl_add(st, t - last, 1)
        st.t_last[r] = t
        if st.status[r] == FINISHED:
            st.t_finish[r] = t  # the client's end (the engine freed the request when it sampled it)
    st.s.p_len = 0
    return n_row


@kernel(inline=True)
def pend(st, r, t):
    """``cfg.lag``: request ``r`` sampled at ``t``; its tokens wait for the next delivery."""
    if np.isnan(st.t_first[r]):
        st.t_first[r] = t
    st.p_ids[st.s.p_len] = r
    st.s.p_len += 1
