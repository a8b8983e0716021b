"""The compiled replica: the Python engine's loop for the ``vllm`` policy, in numba.

The Python engine (:mod:`servesim.engine.replica` with :mod:`servesim.sched.continuous` and
:mod:`servesim.kv.paged`) is the reference and runs every configuration. For the configuration
most sweeps use -- the vllm policy with or without chunked prefill, recompute preemption, paged KV
without prefix caching, one replica -- this module runs the same algorithm compiled, to reach tens
of thousands of simulated requests per second. It mirrors the reference statement by statement
(same order of admissions, preemptions, float operations, and the same fast path) and writes into
the same request columns and recorder buffers; ``tests/test_compiled_engine.py`` holds the two equal
on random scenarios.

Each simulation segment costs one kernel call plus one vectorized step-time model call::

    Python                                   kernel (numba)
    ──────                                   ──────────────
    code = step(NONE)                  ──►   plan: arrivals, schedule, fast-path length
    dts = model.predict_decode_run(..) ◄──   (DECODE: batch size, context sum, k steps)
    code = step(DECODE, dts)           ──►   apply the run (cut at arrival), record, plan next
    ...                                      (MIXED: a batch of prefills + decodes -> model.predict)

The step-time model stays in Python (roofline, packs, user models), so nothing about step times is
duplicated. State lives in numpy arrays; scalars in two small arrays ``I`` (int64) and ``F`` (float64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# codes between the driver and the kernel
NONE, DECODE, MIXED, DONE = 0, 1, 2, 3
# causes (servesim.sched.base.Cause)
C_KV, C_BUDGET, C_SLOTS, C_PREEMPTED, C_ITERATION = 0, 1, 2, 6, 7
# request status (servesim.engine.state)
WAITING, RUNNING, FINISHED, REJECTED = 1, 2, 3, 4
# reject reasons (servesim.engine.state.Reject)
R_MML, R_KV, R_BUDGET = 1, 2, 3
MAX_RUN_STEPS = 1 << 14

# integer scalars
(I_N, I_CURSOR, I_WQ_HEAD, I_WQ_LEN, I_RUN_LEN, I_FREE, I_NBLOCKS, I_BS, I_BUDGET, I_MAXSEQS,
 I_CHUNKED, I_MML, I_MAXSLOTS, I_FAST, I_CLOSED, I_HEAP_LEN, I_NEXT_ID, I_WARMUP, I_FILL, I_IRR_LEN,
 I_ENDED, I_B_LEN, I_K, I_S, I_STABLE, I_NCLASS, I_BUF, I_ERROR, I_DRAIN, I_SIZE) = range(30)
# float scalars
F_NOW, F_CLOCK_T, F_STOP, F_ITL_FROM, F_CPU_C, F_CPU_P, F_CPU_S, F_SIZE = range(8)

INF = np.inf


# ----------------------------------------------------------------------------------- inbox
@njit(cache=True)
def _next_time(I, arrival, heap_t):
    if I[I_CLOSED]:
        return heap_t[0] if I[I_HEAP_LEN] > 0 else INF
    c = I[I_CURSOR]
    return arrival[c] if c < I[I_N] else INF


@njit(cache=True)
def _heap_less(heap_t, heap_id, a, b):
    return heap_t[a] < heap_t[b] or (heap_t[a] == heap_t[b] and heap_id[a] < heap_id[b])


@njit(cache=True)
def _heap_swap(heap_t, heap_id, a, b):
    heap_t[a], heap_t[b] = heap_t[b], heap_t[a]
    heap_id[a], heap_id[b] = heap_id[b], heap_id[a]


@njit(cache=True)
def _heap_push(I, heap_t, heap_id, t, rid):
    i = I[I_HEAP_LEN]
    heap_t[i] = t
    heap_id[i] = rid
    I[I_HEAP_LEN] = i + 1
    while i > 0:
        p = (i - 1) // 2
        if _heap_less(heap_t, heap_id, i, p):
            _heap_swap(heap_t, heap_id, i, p)
            i = p
        else:
            break


@njit(cache=True)
def _heap_pop(I, heap_t, heap_id):
    rid = heap_id[0]
    last = I[I_HEAP_LEN] - 1
    I[I_HEAP_LEN] = last
    if last > 0:
        heap_t[0] = heap_t[last]
        heap_id[0] = heap_id[last]
        i = 0
        while True:
            left = 2 * i + 1
            if left >= last:
                break
            m = left
            if left + 1 < last and _heap_less(heap_t, heap_id, left + 1, left):
                m = left + 1
            if _heap_less(heap_t, heap_id, m, i):
                _heap_swap(heap_t, heap_id, m, i)
                i = m
            else:
                break
    return rid


@njit(cache=True)
def _request_ended(I, arrival, heap_t, heap_id, think, t):
    if I[I_CLOSED] == 0 or I[I_NEXT_ID] >= I[I_N]:
        return
    rid = I[I_NEXT_ID]
    I[I_NEXT_ID] = rid + 1
    arrival[rid] = t + think[rid]
    _heap_push(I, heap_t, heap_id, t + think[rid], rid)


# ---------------------------------------------------------------------------------- clocks
@njit(cache=True)
def _settle(I, F, K, cause_now, t):
    dt = t - F[F_CLOCK_T]
    if dt > 0:
        for g in range(I[I_NCLASS]):
            K[g, cause_now[g]] += dt
    F[F_CLOCK_T] = t


@njit(cache=True)
def _clock_row_into(blocked, rid, K, cause_now, g, t, clock_t, sign):
    """blocked[rid] += sign * K_g(t), computed as the reference does (copy, bump, then add)."""
    ncause = K.shape[1]
    c_now = cause_now[g]
    for c in range(ncause):
        v = K[g, c]
        if c == c_now:
            v += t - clock_t
        blocked[rid, c] += sign * v


# --------------------------------------------------------------------------------- KV (paged)
@njit(cache=True)
def _allocate(I, computed, held, rid, n):
    bs = I[I_BS]
    need = (computed[rid] + n + bs - 1) // bs - held[rid]
    if need <= 0:
        return True
    if need > I[I_FREE]:
        return False
    held[rid] += need
    I[I_FREE] -= need
    return True


@njit(cache=True)
def _free(I, held, rid):
    I[I_FREE] += held[rid]
    held[rid] = 0


# ------------------------------------------------------------------------------- transitions
@njit(cache=True)
def _admit(I, F, rid, now, klass, t_sched, blocked, status, run, K, cause_now):
    if np.isnan(t_sched[rid]):
        t_sched[rid] = now
        _clock_row_into(blocked, rid, K, cause_now, klass[rid], now, F[F_CLOCK_T], 1.0)
    else:
        blocked[rid, C_PREEMPTED] += now
    status[rid] = RUNNING
    run[I[I_RUN_LEN]] = rid
    I[I_RUN_LEN] += 1


@njit(cache=True)
def _remove_running(I, run, rid):
    j = 0
    for i in range(I[I_RUN_LEN]):
        if run[i] != rid:
            run[j] = run[i]
            j += 1
    I[I_RUN_LEN] = j


@njit(cache=True)
def _preempt(I, rid, now, computed, held, preempt, status, blocked, run):
    _free(I, held, rid)
    computed[rid] = 0
    preempt[rid] += 1
    status[rid] = WAITING
    blocked[rid, C_PREEMPTED] -= now
    _remove_running(I, run, rid)


@njit(cache=True)
def _wq_push_front(I, wq, rid):
    cap = wq.shape[0]
    h = (I[I_WQ_HEAD] - 1) % cap
    wq[h] = rid
    I[I_WQ_HEAD] = h
    I[I_WQ_LEN] += 1


@njit(cache=True)
def _wq_push_back(I, wq, rid):
    cap = wq.shape[0]
    wq[(I[I_WQ_HEAD] + I[I_WQ_LEN]) % cap] = rid
    I[I_WQ_LEN] += 1


# -------------------------------------------------------------------------------- arrivals
@njit(cache=True)
def _pull_arrivals(I, F, t, arrival, prompt, output, klass, status, reject, t_finish, blocked,
                   wq, K, cause_now, heap_t, heap_id, think):
    if _next_time(I, arrival, heap_t) > t:
        return
    # collect ids in arrival order (open loop: a cursor range; closed loop: heap pops)
    if I[I_CLOSED]:
        ids = np.empty(I[I_HEAP_LEN], dtype=np.int64)
        m = 0
        while I[I_HEAP_LEN] > 0 and heap_t[0] <= t:
            ids[m] = _heap_pop(I, heap_t, heap_id)
            m += 1
        ids = ids[:m]
    else:
        lo = I[I_CURSOR]
        hi = np.searchsorted(arrival[: I[I_N]], t, side="right")
        if hi < lo:
            hi = lo
        I[I_CURSOR] = hi
        ids = np.arange(lo, hi)
    w = I[I_WARMUP]
    if w >= 0:
        for i in range(len(ids)):
            if ids[i] == w:
                F[F_ITL_FROM] = arrival[w]
    # rejections first (each ends its client's turn), then the rest start waiting, in order
    ok = np.ones(len(ids), dtype=np.bool_)
    for i in range(len(ids)):
        rid = ids[i]
        total = prompt[rid] + output[rid]
        reason = 0
        if total - 1 > I[I_MAXSLOTS]:
            reason = R_KV
        if total > I[I_MML]:
            reason = R_MML
        if reason == 0 and I[I_CHUNKED] == 0 and prompt[rid] > I[I_BUDGET]:
            reason = R_BUDGET
        if reason != 0:
            ok[i] = False
            status[rid] = REJECTED
            reject[rid] = reason
            t_finish[rid] = arrival[rid]
    for i in range(len(ids)):
        if not ok[i]:
            I[I_ENDED] += 1
            _request_ended(I, arrival, heap_t, heap_id, think, t)
    for i in range(len(ids)):
        if ok[i]:
            rid = ids[i]
            _clock_row_into(blocked, rid, K, cause_now, klass[rid], arrival[rid], F[F_CLOCK_T], -1.0)
            status[rid] = WAITING
            _wq_push_back(I, wq, rid)


# -------------------------------------------------------------------------------- schedule
@njit(cache=True)
def _schedule(I, now, prompt, num_output, computed, held, klass, t_sched, blocked, status, preempt,
              wq, run, b_ids, b_new, F, K, cause_now):
    """The vllm policy (servesim.sched.continuous.ContinuousBatching.schedule), compiled.
    Fills b_ids/b_new, sets I[I_B_LEN] and I[I_STABLE]; returns the waiting cause."""
    budget = I[I_BUDGET]
    nb = 0
    preempted = False
    all_decode = True
    admitted = False
    run_len = I[I_RUN_LEN]
    if run_len > 0:
        fast = run_len <= budget
        if fast:
            for i in range(run_len):
                r = run[i]
                if prompt[r] + num_output[r] - computed[r] != 1:
                    fast = False
                    break
        if fast:  # allocate_decodes: all or nothing
            bs = I[I_BS]
            total = 0
            for i in range(run_len):
                r = run[i]
                total += (computed[r] + 1 + bs - 1) // bs - held[r]
            if total > I[I_FREE]:
                fast = False
            else:
                if total:
                    for i in range(run_len):
                        r = run[i]
                        want = (computed[r] + 1 + bs - 1) // bs
                        if want > held[r]:
                            held[r] = want
                    I[I_FREE] -= total
        if fast:
            for i in range(run_len):
                b_ids[nb] = run[i]
                b_new[nb] = 1
                nb += 1
            budget -= run_len
        else:  # the slow path: prefill chunks in flight, or the pool is short
            order = run[:run_len].copy()
            victim = np.zeros(run_len, dtype=np.bool_)
            i = 0
            while i < run_len:
                rid = order[i]
                i += 1
                if victim[i - 1]:
                    continue
                need = prompt[rid] + num_output[rid] - computed[rid]
                n = need if need < budget else budget
                if n <= 0:
                    continue
                scheduled = True
                while not _allocate(I, computed, held, rid, n):
                    v = run_len - 1
                    while victim[v]:
                        v -= 1
                    victim[v] = True
                    vid = order[v]
                    _preempt(I, vid, now, computed, held, preempt, status, blocked, run)
                    _wq_push_front(I, wq, vid)
                    preempted = True
                    if vid == rid:
                        scheduled = False
                        break
                if not scheduled:
                    break
                b_ids[nb] = rid
                b_new[nb] = n
                nb += 1
                budget -= n
                if n != 1 or need != 1:
                    all_decode = False
    cause = C_ITERATION
    if preempted and (nb > 0 or I[I_RUN_LEN] > 0):
        cause = C_KV if I[I_WQ_LEN] > 0 else C_ITERATION
    else:
        cap = wq.shape[0]
        while I[I_WQ_LEN] > 0:
            if I[I_RUN_LEN] >= I[I_MAXSEQS]:
                cause = C_SLOTS
                break
            if budget <= 0:
                cause = C_BUDGET
                break
            rid = wq[I[I_WQ_HEAD]]
            n = prompt[rid] + num_output[rid] - computed[rid]
            if n > budget:
                if I[I_CHUNKED] == 0:
                    cause = C_BUDGET
                    break
                n = budget
            if not _allocate(I, computed, held, rid, n):
                cause = C_KV
                break
            I[I_WQ_HEAD] = (I[I_WQ_HEAD] + 1) % cap
            I[I_WQ_LEN] -= 1
            _admit(I, F, rid, now, klass, t_sched, blocked, status, run, K, cause_now)
            b_ids[nb] = rid
            b_new[nb] = n
            nb += 1
            budget -= n
            admitted = True
    I[I_B_LEN] = nb
    I[I_STABLE] = 1 if (all_decode and not admitted and not preempted and nb > 0) else 0
    return cause


# ------------------------------------------------------------------------------------ plan
@njit(cache=True)
def _plan(I, F, arrival, prompt, output, klass, computed, num_output, t_sched, t_finish, preempt,
          status, reject, blocked, held, wq, run, b_ids, b_new, K, cause_now, heap_t, heap_id, think,
          used):
    while True:
        now = F[F_NOW]
        _pull_arrivals(I, F, now, arrival, prompt, output, klass, status, reject, t_finish, blocked,
                       wq, K, cause_now, heap_t, heap_id, think)
        if now >= F[F_STOP]:
            return DONE
        cause = _schedule(I, now, prompt, num_output, computed, held, klass, t_sched, blocked, status,
                          preempt, wq, run, b_ids, b_new, F, K, cause_now)
        changed = False
        for g in range(I[I_NCLASS]):
            if cause_now[g] != cause:
                changed = True
        if changed:
            _settle(I, F, K, cause_now, now)
            for g in range(I[I_NCLASS]):
                cause_now[g] = cause
        nb = I[I_B_LEN]
        if nb == 0:
            t_next = _next_time(I, arrival, heap_t)
            if t_next == INF and I[I_DRAIN] and I[I_WQ_LEN] == 0 and I[I_RUN_LEN] == 0:
                return DONE  # drained (Replica.stop_when_drained)
            if F[F_STOP] < t_next:
                t_next = F[F_STOP]
            if t_next == INF:
                if I[I_WQ_LEN] > 0 or I[I_RUN_LEN] > 0:
                    I[I_ERROR] = 1
                return DONE
            F[F_NOW] = t_next
            continue
        if I[I_STABLE] == 0:
            return MIXED
        # a pure-decode batch: how many steps can run at once (the engine's fast path)
        rem_min = output[b_ids[0]] - num_output[b_ids[0]]
        s = 0
        for i in range(nb):
            r = b_ids[i]
            rem = output[r] - num_output[r]
            if rem < rem_min:
                rem_min = rem
            s += computed[r]
        k_max = 1
        if I[I_FAST]:
            k_max = rem_min if rem_min < MAX_RUN_STEPS else MAX_RUN_STEPS
        I[I_K] = _decode_run_capacity(I, computed, b_ids, nb, k_max, used)
        I[I_S] = s
        return DECODE


@njit(cache=True)
def _decode_run_capacity(I, computed, ids, nb, k_max, used):
    """servesim.kv.paged.PagedKV.decode_run: steps that fit and blocks in use during each."""
    bs = I[I_BS]
    used0 = I[I_NBLOCKS] - I[I_FREE]
    if k_max <= 1:
        for j in range(k_max):
            used[j] = used0
        return k_max
    free = I[I_FREE]
    residue = np.zeros(bs, dtype=np.int64)
    if bs > 1:
        for i in range(nb):
            residue[(1 - computed[ids[i]]) % bs] += 1
    used[0] = used0
    demand = 0
    k = k_max
    for j in range(2, k_max + 1):
        demand += nb if bs == 1 else residue[j % bs]
        if demand > free:
            k = j - 1
            break
        used[j - 1] = used0 + demand
    return k


# ----------------------------------------------------------------------------------- apply
@njit(cache=True)
def _record(I, rb_start, rb_end, rb_vals, rb_itlw, t0, ends, k, used, running, waiting, tokens,
            itl_first, itl_rest, slots_last, slots_step):
    """One step-log row per step. KV slots written during step j are ``slots_last - slots_step *
    (k - 1 - j)``; paged blocks are all touched, so internal slots = blocks * bs - written."""
    i = I[I_FILL]
    prev = t0
    bs = I[I_BS]
    for j in range(k):
        rb_start[i + j] = prev
        rb_end[i + j] = ends[j]
        prev = ends[j]
        rb_vals[0, i + j] = used[j]
        rb_vals[1, i + j] = running
        rb_vals[2, i + j] = waiting
        rb_vals[3, i + j] = tokens
        rb_vals[4, i + j] = used[j] * bs - (slots_last - slots_step * (k - 1 - j))
        rb_vals[5, i + j] = 0.0
        rb_vals[6, i + j] = 0.0
        rb_itlw[i + j] = itl_first if j == 0 else itl_rest
    I[I_FILL] = i + k


@njit(cache=True)
def _running_slots(I, run, computed):
    s = 0
    for i in range(I[I_RUN_LEN]):
        s += computed[run[i]]
    return s


@njit(cache=True)
def _finish(I, F, done, nd, t_finish, status, held, run, arrival, heap_t, heap_id, think):
    t = F[F_NOW]
    for i in range(nd):
        t_finish[done[i]] = t
        status[done[i]] = FINISHED
    for i in range(nd):
        _free(I, held, done[i])
        _request_ended(I, arrival, heap_t, heap_id, think, t)
    j = 0
    for i in range(I[I_RUN_LEN]):
        if status[run[i]] == RUNNING:
            run[j] = run[i]
            j += 1
    I[I_RUN_LEN] = j
    I[I_ENDED] += nd


@njit(cache=True)
def _apply_decode(I, F, dts, arrival, prompt, output, computed, num_output, t_first, t_finish, t_last,
                  status, held, run, b_ids, heap_t, heap_id, think, used, rb_start, rb_end, rb_vals,
                  rb_itlw, irr):
    nb = I[I_B_LEN]
    k = I[I_K]
    t0 = F[F_NOW]
    cpu = F[F_CPU_C] + F[F_CPU_P] * nb
    ends = np.empty(k)
    acc = t0
    for j in range(k):
        e = dts[j]
        if cpu:
            e = e + cpu
        acc = acc + e
        ends[j] = acc
    if k > 1:
        t_cut = _next_time(I, arrival, heap_t)
        if F[F_STOP] < t_cut:
            t_cut = F[F_STOP]
        if ends[k - 1] >= t_cut:
            k = np.searchsorted(ends, t_cut, side="left") + 1
    F[F_CPU_S] += cpu * k
    t_end = ends[k - 1]
    rem_min = output[b_ids[0]] - num_output[b_ids[0]]
    for i in range(nb):
        r = b_ids[i]
        rem = output[r] - num_output[r]
        if rem < rem_min:
            rem_min = rem
    bs = I[I_BS]
    extra = 0
    n_regular = 0
    deliver = ends[0]
    for i in range(nb):
        r = b_ids[i]
        computed[r] += k
        num_output[r] += k
        want = (computed[r] + bs - 1) // bs
        extra += want - held[r]
        held[r] = want
    I[I_FREE] -= extra
    for i in range(nb):
        r = b_ids[i]
        last = t_last[r]
        if last == t0:
            n_regular += 1
        elif np.isnan(last):
            t_first[r] = deliver
        elif deliver >= F[F_ITL_FROM]:
            irr[I[I_IRR_LEN]] = deliver - last
            I[I_IRR_LEN] += 1
        t_last[r] = t_end
    _record(I, rb_start, rb_end, rb_vals, rb_itlw, t0, ends, k, used, I[I_RUN_LEN], I[I_WQ_LEN], nb,
            n_regular, nb, _running_slots(I, run, computed), nb)
    F[F_NOW] = t_end
    if k == rem_min:
        done = np.empty(nb, dtype=np.int64)
        nd = 0
        for i in range(nb):
            r = b_ids[i]
            if num_output[r] >= output[r]:
                done[nd] = r
                nd += 1
        _finish(I, F, done, nd, t_finish, status, held, run, arrival, heap_t, heap_id, think)


@njit(cache=True)
def _apply_mixed(I, F, dt, arrival, prompt, output, computed, num_output, t_first, t_finish, t_last,
                 status, held, run, b_ids, b_new, heap_t, heap_id, think, rb_start, rb_end, rb_vals,
                 rb_itlw, irr):
    nb = I[I_B_LEN]
    t0 = F[F_NOW]
    cpu = F[F_CPU_C] + F[F_CPU_P] * nb
    t1 = t0 + dt + cpu + 0.0
    F[F_CPU_S] += cpu
    used = np.empty(1)
    used[0] = I[I_NBLOCKS] - I[I_FREE]
    tokens = 0
    n_regular = 0
    done = np.empty(nb, dtype=np.int64)
    nd = 0
    for i in range(nb):
        r = b_ids[i]
        computed[r] += b_new[i]
        tokens += b_new[i]
    for i in range(nb):
        r = b_ids[i]
        if computed[r] == prompt[r] + num_output[r]:
            num_output[r] += 1
            last = t_last[r]
            if np.isnan(last):
                t_first[r] = t1
            elif last == t0:
                n_regular += 1
            elif t1 >= F[F_ITL_FROM]:
                irr[I[I_IRR_LEN]] = t1 - last
                I[I_IRR_LEN] += 1
            t_last[r] = t1
            if num_output[r] >= output[r]:
                done[nd] = r
                nd += 1
    ends = np.empty(1)
    ends[0] = t1
    _record(I, rb_start, rb_end, rb_vals, rb_itlw, t0, ends, 1, used, I[I_RUN_LEN], I[I_WQ_LEN], tokens,
            n_regular, 0, _running_slots(I, run, computed), 0)
    F[F_NOW] = t1
    if nd:
        _finish(I, F, done, nd, t_finish, status, held, run, arrival, heap_t, heap_id, think)


@njit(cache=True)
def step(code, dts, dt, I, F, arrival, prompt, output, klass, computed, num_output, t_sched, t_first,
         t_finish, t_last, preempt, status, reject, blocked, held, wq, run, b_ids, b_new, K, cause_now,
         heap_t, heap_id, think, used, rb_start, rb_end, rb_vals, rb_itlw, irr):
    """Apply the step times of the pending batch (``code`` DECODE or MIXED), then plan the next."""
    if code == DECODE:
        _apply_decode(I, F, dts, arrival, prompt, output, computed, num_output, t_first, t_finish, t_last,
                      status, held, run, b_ids, heap_t, heap_id, think, used, rb_start, rb_end, rb_vals,
                      rb_itlw, irr)
    elif code == MIXED:
        _apply_mixed(I, F, dt, arrival, prompt, output, computed, num_output, t_first, t_finish, t_last,
                     status, held, run, b_ids, b_new, heap_t, heap_id, think, rb_start, rb_end, rb_vals,
                     rb_itlw, irr)
    return _plan(I, F, arrival, prompt, output, klass, computed, num_output, t_sched, t_finish, preempt,
                 status, reject, blocked, held, wq, run, b_ids, b_new, K, cause_now, heap_t, heap_id,
                 think, used)
