"""The invariants ``sim.check_invariants`` holds after every scheduling decision (engine/kernel.py).

Apart from the loop so that engine/kernel.py stays one screenful of the loop itself; the codes are
re-exported there (the driver explains each: engine/driver.py).
"""

from __future__ import annotations

import numpy as np

from servesim.engine.inbox import waiting_work, waiting_work_walk
from servesim.jit import kernel
from servesim.kv.kernels import kv_check, kv_slots_held

# invariant failures (E_STALL, E_HORIZON: the loop's own)
E_KV, E_BUDGET, E_SEQS, E_EMPTY_NEW, E_STALL, E_HORIZON, E_SLOTS, E_QWORK = 1, 2, 3, 4, 5, 6, 7, 8


@kernel
def check_batch(cfg, st, kv):
    """Invariants after a scheduling decision (``sim.check_invariants``): KV accounting, every
    running request inside the KV slots it holds, token budget, batch slots, every scheduled
    request computes a token, the waiting requests' running token count (``st.s.q_work``, the
    router's read) equal to a walk of the queues and the inbox. 0 or an E_* code.

    The slots check (E_SLOTS, ``error_arg`` the request) catches a policy part that admits past
    the pool (an allocation that grants without blocks, an admission that skips it), which ran to
    completion with no word before. It reads the slots through ``kv_slots_held``, bound to the
    KV in hand (a Python reference manager binds its own); where that says -1, a prefix cache
    whose shared blocks a per-request count cannot bound, the check is skipped for the pool
    rather than raise a false alarm (the prefix cache's own check, in ``kv_check``, stays)."""
    c = kv_check(kv, st.computed, st.run, st.s.run_len)
    if c != 0:
        st.s.error_arg = c
        return E_KV
    for j in range(st.s.run_len):
        r = st.run[j]
        slots = kv_slots_held(kv, r)
        if slots < 0:
            break  # the pool cannot say (a prefix cache): no check, for every request
        need = np.int64(st.computed[r])
        for i in range(st.s.b_len):
            if st.b_ids[i] == r:
                need += np.int64(st.b_new[i])
        if slots < need:
            st.s.error_arg = r
            return E_SLOTS
    total = 0
    for i in range(st.s.b_len):
        total += st.b_new[i]
        if st.b_new[i] < 1:
            return E_EMPTY_NEW
    if total > cfg.budget:
        st.s.error_arg = total
        return E_BUDGET
    if st.s.run_len > cfg.max_seqs:
        st.s.error_arg = st.s.run_len
        return E_SEQS
    off = waiting_work(cfg, st) - waiting_work_walk(cfg, st)
    if off != 0:
        st.s.error_arg = off
        return E_QWORK
    return 0
