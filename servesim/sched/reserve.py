"""SGLang's conservative admission (the ``chunked`` policy with ``options.admission: sglang``).

SGLang admits a waiting request only if its whole remaining prompt *and* its clipped output fit
beside a reservation for the future decode tokens of everyone running, weighted by a ratio that
adapts (python/sglang/srt/managers/schedule_policy.py ``PrefillAdder``; the ratio in
``new_token_ratio_tracker.py``; read at the commits listed in docs/schedulers.md)::

    rem_total = free tokens - (M + sum_running ratio * min(max_new - out, CLIP)
                               + sum_admitted_this_pass (page(extend) + page + min(max_new - out, CLIP)))
    rem_cur   = free tokens - (M + sum_admitted_this_pass (page(extend) + page))
    admit r  iff  prompt_left(r) + min(max_new - out, CLIP) + page < rem_total  and  rem_cur > 0

M is the running batch size when decodes mix into prefill batches. The reservation is a check, not
an allocation: KV is allocated chunk by chunk, and a later chunk of the one partial prefill takes
``min(chunk, rem_total)`` (the full chunk when nothing is left: it must make progress), never
preempting. The ratio starts at ``0.7 x schedule_conservativeness``, falls by ``(init - min) / 600``
per decode batch formed without a retraction down to ``0.14 x init``, returns to ``init`` when the
engine is idle, and after a retraction becomes ``min(1, (sum out + 20 n) / sum max_new)`` over the
``n`` requests that stay. After a failed admission nobody is admitted until the running batch
shrinks (SGLang's ``batch_is_full`` latch). ``max_new`` is the request's output length: what a
benchmark client sends as ``max_tokens``.
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.kernels import kv_free_blocks

CLIP_MAX_NEW = 4096  # SGLang's CLIP_MAX_NEW_TOKENS
RETRACT_STEPS = 20  # SGLang_RETRACT_DECODE_STEPS: decode steps a retraction assumes per survivor


@kernel(inline=True)
def out_reserve(cfg, st, rid):
    """``min(max_new - out_so_far, CLIP)`` of a request."""
    r = np.int64(st.output[rid]) - np.int64(st.num_output[rid])
    return r if r < CLIP_MAX_NEW else np.int64(CLIP_MAX_NEW)


@kernel(inline=True)
def page_of(cfg, tokens):
    return -(-np.int64(tokens) // cfg.block_size) * cfg.block_size


@kernel
def begin_reserve(cfg, st, mixed):
    """Offsets of a prefill pass: the running batch's ratio-weighted future decodes."""
    m = float(st.s.run_len) if mixed else 0.0
    total = m
    for i in range(st.s.run_len):
        total += st.s.ratio * float(out_reserve(cfg, st, st.run[i]))
    st.s.off_total = total
    st.s.off_cur = m


@kernel(inline=True)
def room_total(cfg, st, kv):
    return float(kv_free_blocks(kv) * cfg.block_size) - st.s.off_total


@kernel(inline=True)
def room_cur(cfg, st, kv):
    return float(kv_free_blocks(kv) * cfg.block_size) - st.s.off_cur


@kernel(inline=True)
def kv_waiting_blocks(kv, rid):
    """KV blocks a request holds while it waits. The count allocators free a request's KV when it
    stops running: 0. A prefix cache: a request whose KV came back from a lower tier waits
    holding blocks for every token it knows (parts.ready: so that fetched requests cannot fill
    the pool)."""
    if kv.prefix:
        return np.int64(kv.held[rid])
    return np.int64(0)


@kernel
def fits(cfg, st, kv, rid, whole):
    """May ``rid`` (``whole`` prompt tokens left) be admitted now? Blocks it already holds past
    its computed tokens (a tier fetch's) are room of its own, beside the free pool: without them
    a fetched request whose extend did not fit the free blocks waited forever, nothing running."""
    own = float((kv_waiting_blocks(kv, rid) - page_of(cfg, st.computed[rid]) // cfg.block_size) * cfg.block_size)
    own = own if own > 0.0 else 0.0
    need = float(whole + out_reserve(cfg, st, rid) + cfg.block_size)
    return need < room_total(cfg, st, kv) + own and room_cur(cfg, st, kv) + own > 0.0


@kernel
def take(cfg, st, rid, n, completes):
    """Account an admitted extend of ``n`` tokens (its output too if its prompt completes)."""
    page = float(page_of(cfg, n) + cfg.block_size)
    st.s.off_cur += page
    st.s.off_total += page + (float(out_reserve(cfg, st, rid)) if completes else 0.0)


@kernel
def chunk_cap(cfg, st, kv, n):
    """The next chunk of the partial prefill: ``min(n, rem_total)``, or ``n`` when nothing is left."""
    room = room_total(cfg, st, kv)
    if room <= 0.0:
        return n
    r = np.int64(room)
    return r if 0 < r < n else n


@kernel
def ratio_after_decode(cfg, st, retracted):
    """A decode batch was formed: the ratio decays, or after a retraction is re-estimated."""
    if retracted:
        out = 0.0
        new = 0.0
        for i in range(st.s.run_len):
            r = st.run[i]
            out += float(st.num_output[r])
            new += float(st.output[r])
        v = (out + RETRACT_STEPS * st.s.run_len) / new if new > 0 else 1.0
        st.s.ratio = v if v < 1.0 else 1.0
        return
    v = st.s.ratio - cfg.ratio_step
    st.s.ratio = v if v > cfg.ratio_min else cfg.ratio_min
