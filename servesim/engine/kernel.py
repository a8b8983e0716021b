"""A replica's loop: arrivals, the policy, step times, progress -- one kernel for every policy.

::

    advance(until):
      ┌─► commit the iteration under way if it ends by ``until`` (tokens, first tokens, ITL,
      │   finishes, KV, recorder rows)
      │   pull arrivals up to now (reject what can never run), stop? drained?
      │   schedule (sched/policies.py) ─► batch, per-class waiting causes, stable?
      │     empty  ─► idle until the next arrival / the policy's horizon / the stop time
      │     stable decode batch ─► the fast path: k decode steps at once (below)
      │     otherwise ─► one iteration (its step time from perf/kernels.py)
      └── until the next iteration would end after ``until``, a buffer must be flushed, or done

The fast path: between state changes only decode contexts grow, so ``k`` consecutive decode
iterations can be advanced together. ``k`` is the largest count such that no request finishes
before step ``k``, every step's KV blocks are available, and no arrival (nor the stop time, the
policy's horizon, or ``until``) falls before the end of step ``k - 1``. Step times come from one
call, end times from a sequential sum (the same float additions single steps do), and every
per-request effect is applied in bulk. Single stepping is the same code with ``k = 1``; a
property test holds both equal.

A multi-step burst (``num_scheduler_steps`` k > 1, vLLM 0.6) is planned the same way whether the
fast path is on or not: always k steps (only the KV pool can cut it), which arrivals and finishes
do not cut; a request that finishes inside it keeps its slot and KV to the burst's end and its
tokens past the finish are discarded; every token of the burst reaches the client at its end.

Steppable: ``advance(until)`` commits exactly the iterations that end by ``until`` and leaves the
replica at its last iteration boundary (or idle), so its observable state is its state at
``until``; requests that arrive later are added to its inbox and pulled at the next boundary. A
router interleaves replicas this way (engine/cluster.py). A decode run that would straddle
``until`` is cut before the straddling step, which is planned again at that boundary (what single
stepping does); an iteration already planned (admissions made, KV allocated) stays in flight.

Arrivals, rejections at arrival and a fleet's routed inbox: engine/inbox.py.
"""

from __future__ import annotations

import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from servesim.engine.inbox import (  # noqa: F401 (the fleet driver reaches them as kernel.*)
    INFLIGHT_MIXED,
    INFLIGHT_NONE,
    INFLIGHT_RUN,
    due_arrivals,
    heap_push,
    next_arrival,
    outstanding_work,
    pull_arrivals,
    request_ended,
    route_in,
    route_in_after_plans,
    waiting_work,
    waiting_work_walk,
)
from servesim.engine.delivery import deliver_pending, itl_add, pend
from servesim.engine.kernel_checks import (  # noqa: F401 (the driver reads the codes as kernel.E_*)
    E_BUDGET,
    E_EMPTY_NEW,
    E_HORIZON,
    E_KV,
    E_QWORK,
    E_SEQS,
    E_SLOTS,
    E_STALL,
    check_batch,
)
from servesim.jit import bisect_left, kernel, struct_ref
from servesim.kv.kernels import (
    kv_commit_decodes,
    kv_decode_run,
    kv_free,
    kv_step_usage,
    kv_used_blocks,
)
from servesim.kv.pool import _unowned
from servesim.perf.kernels import count_decode_run, count_iteration, decode_seconds, iteration_seconds
from servesim.request import FINISHED, RUNNING
from servesim.sched.parts import kv_stable_steps
from servesim.sched.policies import decode_steps_done, schedule
from servesim.sched.queues import n_queued, num_waiting
from servesim.sched.state import ONE, ZERO, ReplicaState, make_state_ref, set_causes

PER_STEP = np.int64(-1)  # record(): blocks in use from st.used, step by step

DONE, UNTIL, FLUSH, PROGRESS, ERROR, ENDED, HELD = 0, 1, 2, 3, 4, 5, 6  # why advance() returned
PROGRESS_EVERY = 1 << 16  # segments between progress returns


# ------------------------------------------------------------------------------- recording
@kernel
def record(st, t0, k, used_now, tokens, prefill, itl_first, itl_rest, waiting):
    """One recorder row per step of the committed iteration or run (``ends[:k]``). ``prefill``:
    the first step's tokens that are not a running request's next decode token (prompts, chunks,
    recomputation after a preemption; later steps of a decode run have none); ``tokens - prefill``
    are decode tokens."""
    i = st.s.rows
    prev = t0
    for j in range(k):
        st.rb_start[i + j] = prev
        st.rb_end[i + j] = st.ends[j]
        prev = st.ends[j]
        st.rb_vals[0, i + j] = st.used[j] if used_now < 0 else used_now
        st.rb_vals[1, i + j] = st.s.run_len
        st.rb_vals[2, i + j] = waiting
        st.rb_vals[3, i + j] = tokens
        st.rb_vals[4, i + j] = st.frag[0, j]
        st.rb_vals[5, i + j] = st.frag[1, j]
        st.rb_vals[6, i + j] = st.frag[2, j]
        st.rb_vals[7, i + j] = prefill if j == 0 else 0
        st.rb_itlw[i + j] = itl_first if j == 0 else itl_rest
    st.s.rows = i + k


@kernel(inline=True)
def on_iteration(t0, t1, ids, new, nb):
    """Hook for an observer of every iteration (the object path binds a Python callable)."""
    return


# -------------------------------------------------------------------------------- finishing
@kernel
def finish(cfg, st, kv, done, nd):
    t = st.s.now
    for i in range(nd):
        st.t_finish[done[i]] = t
        st.status[done[i]] = FINISHED
    for i in range(nd):
        kv_free(kv, done[i])
        request_ended(cfg, st, done[i], t)
    if nd:
        st.s.latch = 0  # the running batch shrank
    j = 0
    for i in range(st.s.run_len):
        if st.status[st.run[i]] == RUNNING:
            st.run[j] = st.run[i]
            j += 1
    st.s.run_len = j


# ------------------------------------------------------------------------------ decode runs
@kernel
def plan_decode_run(cfg, st, kv, tab, until):
    """Steps of the pure-decode batch to run now, their end times in ``ends``; returns k."""
    nb = st.s.b_len
    t0 = st.s.now
    rem_min = np.int64(st.output[st.b_ids[0]]) - st.num_output[st.b_ids[0]]
    ctx_sum = np.int64(0)
    for i in range(nb):
        r = st.b_ids[i]
        rem = np.int64(st.output[r]) - st.num_output[r]
        if rem < rem_min:
            rem_min = rem
        ctx_sum += st.computed[r]
    burst = st.s.b_steps > 1  # multi-step: a fixed burst that arrivals and finishes cannot cut
    k_max = 1
    if burst:
        # vLLM 0.6 runs every burst for all its steps (LLMEngine.step skips the scheduler while
        # the batch has remaining steps, vllm/engine/llm_engine.py): a request that finishes
        # inside it keeps its slot and KV, and its tokens past the finish are discarded
        # (output_processor/multi_step.py). Only the KV pool can cut it (docs/schedulers.md).
        k_max = st.s.b_steps
    elif cfg.fast and st.s.b_stable and st.s.extra == 0.0:
        run_cap = st.ends.shape[0] - 1  # the per-step scratch arrays bound a run
        k_max = rem_min if rem_min < run_cap else run_cap
    k = kv_decode_run(kv, st.computed, st.b_ids, nb, k_max, st.used)
    if k > 1 and not burst:
        k = kv_stable_steps(kv, st.computed, st.b_ids, nb, k)
    decode_seconds(tab, nb, ctx_sum, k, st.dts)
    cpu = cfg.cpu_c + cfg.cpu_p * nb
    acc = t0
    for j in range(k):
        e = st.dts[j]
        if cpu:
            e = e + cpu
            if burst and j >= 1:  # the engine schedules and prepares inputs once per burst
                e = e - cfg.cpu_c
        if j == 0 and st.s.extra:
            e = e + st.s.extra
        acc = acc + e
        st.ends[j] = acc
    if k > 1 and not burst:
        t_cut = next_arrival(cfg, st)
        if cfg.stop_time < t_cut:
            t_cut = cfg.stop_time
        if st.s.b_horizon < t_cut:
            t_cut = st.s.b_horizon
        if until < t_cut and not cfg.routed:
            t_cut = until
        if st.ends[k - 1] >= t_cut:
            k = bisect_left(st.ends[:k], t_cut) + 1
        if k > 1 and st.ends[k - 1] > until and not cfg.routed:
            k -= 1  # the straddling step is planned again at that boundary
    return k


@kernel
def commit_decode_run(cfg, st, kv, k):
    """Apply ``k`` planned decode steps of the batch: tokens, first tokens, ITL, KV, records."""
    nb = st.s.b_len
    t0 = st.s.now
    burst = st.s.b_steps > 1
    w0 = 0  # cfg.lag: row weights of the first two steps (deliveries at ends[0] and ends[1])
    w1 = 0
    if cfg.lag and st.s.p_len:
        # a burst's first call returns once launched: the last iteration's tokens leave at its
        # start; a single step's call returns with its samples: at its end
        w0 = deliver_pending(st, t0, np.nan) if burst else deliver_pending(st, st.ends[0], t0)
    cpu = cfg.cpu_c + cfg.cpu_p * nb
    st.s.cpu_s += cpu * k - (cfg.cpu_c * (k - 1) if burst else 0.0)
    st.s.extra_s += st.s.extra
    t_end = st.ends[k - 1]
    for j in range(k):
        on_iteration(t0 if j == 0 else st.ends[j - 1], st.ends[j], st.b_ids, st.b_new, nb)
    kv_step_usage(kv, st.computed, st.run, st.s.run_len, st.b_ids, st.b_new, nb, k, st.used, st.frag)
    rem_min = np.int64(st.output[st.b_ids[0]]) - st.num_output[st.b_ids[0]]
    kept = np.int64(0)  # tokens the clients keep beyond each request's first of the run
    for i in range(nb):
        r = st.b_ids[i]
        rem = np.int64(st.output[r]) - st.num_output[r]
        if rem < rem_min:
            rem_min = rem
        got = k if k < rem else rem  # a burst's tokens past a finish are discarded
        kept += got - 1
        st.computed[r] += k  # (their KV was written all the same; freed when the burst ends)
        st.num_output[r] += got
    kv_commit_decodes(kv, st.computed, st.b_ids, nb)
    if not burst:
        decode_steps_done(cfg, st, k)
    # tokens reach clients per step, or all of a burst's at its end (vLLM 0.6 processes a burst's
    # outputs at its last step: llm_engine.py returns no outputs while steps remain, and
    # worker/multi_step_model_runner.py pythonizes the steps' tokens then)
    deliver = t_end if burst else st.ends[0]
    n_regular = 0
    n_last_chunk = 0
    for i in range(nb):
        r = st.b_ids[i]
        last = st.t_last[r]
        if cfg.lag:
            if np.isnan(last):  # (a chunked prefill whose last chunk was one token)
                n_last_chunk += 1
            if burst and np.int64(st.computed[r]) >= np.int64(st.prompt[r]) + st.num_output[r]:
                # it finished before the burst's last step: vLLM 0.6 outputs a request that
                # finishes inside a burst from within it (llm_engine.py _process_model_outputs,
                # finished_now); servesim, at the burst's end, as without the lag (below)
                pass
            elif burst or k == 1:
                pend(st, r, t_end)
                continue
            else:  # step j's token leaves at ends[j + 1]; the last step's waits
                if np.isnan(last):
                    st.t_first[r] = st.ends[1]
                elif last == st.ends[0]:
                    w1 += 1
                elif st.ends[1] >= st.s.itl_from:
                    itl_add(st, st.ends[1] - last, 1)
                st.t_last[r] = t_end
                pend(st, r, t_end)
                continue
        if last == t0:
            n_regular += 1
        elif np.isnan(last):  # a chunked prefill whose last chunk was one token
            st.t_first[r] = deliver
            if not cfg.lag:
                n_last_chunk += 1
        elif deliver >= st.s.itl_from:
            itl_add(st, deliver - last, 1)
        st.t_last[r] = t_end
    waiting = num_waiting(st)
    if cfg.lag and not burst:
        row = st.s.rows
        record(st, t0, k, PER_STEP, nb, n_last_chunk, w0, nb, waiting)
        if k > 1:
            st.rb_itlw[row + 1] = w1
    elif burst:
        record(st, t0, k, PER_STEP, nb, n_last_chunk, ZERO, ZERO, waiting)
        if t_end >= st.s.itl_from:
            if n_regular > 0:
                itl_add(st, t_end - t0, n_regular)
            if kept > 0:  # the rest of each request's tokens arrive with its first: gaps of 0
                itl_add(st, 0.0, kept)
    else:
        record(st, t0, k, PER_STEP, nb, n_last_chunk, n_regular, nb, waiting)
    st.s.now = t_end
    if k >= rem_min:
        done = np.empty(nb, dtype=np.int64)
        nd = 0
        for i in range(nb):
            r = st.b_ids[i]
            if st.num_output[r] >= st.output[r]:
                done[nd] = r
                nd += 1
        finish(cfg, st, kv, done, nd)


# -------------------------------------------------------------------------- one iteration
@kernel
def plan_iteration(cfg, st, tab):
    """End time of one iteration of the batch (prefills, chunks, decodes)."""
    nb = st.s.b_len
    for i in range(nb):
        st.b_ctx[i] = st.computed[st.b_ids[i]]
    cpu = cfg.cpu_c + cfg.cpu_p * nb
    return st.s.now + iteration_seconds(tab, st.b_new, st.b_ctx, nb) + cpu + st.s.extra


@kernel
def commit_iteration(cfg, st, kv, t1):
    nb = st.s.b_len
    t0 = st.s.now
    cpu = cfg.cpu_c + cfg.cpu_p * nb
    st.s.cpu_s += cpu
    st.s.extra_s += st.s.extra
    on_iteration(t0, t1, st.b_ids, st.b_new, nb)
    used = kv_used_blocks(kv)
    st.used[0] = used
    kv_step_usage(kv, st.computed, st.run, st.s.run_len, st.b_ids, st.b_new, nb, ONE, st.used, st.frag)
    tokens = 0
    prefill = 0
    for i in range(nb):
        r = st.b_ids[i]
        new = st.b_new[i]
        # a decode token: one new token right after the last sampled one (computed catches up
        # with prompt + outputs); anything else is prefill work (prompt, chunk, recomputation)
        if not (new == 1 and st.num_output[r] > 0
                and np.int64(st.computed[r]) + 1 == np.int64(st.prompt[r]) + st.num_output[r]):
            prefill += new
        st.computed[r] += new
        tokens += new
    n_regular = 0
    if cfg.lag and st.s.p_len:  # the call of this iteration returns with its samples: at its end
        n_regular = deliver_pending(st, t1, t0)
    done = np.empty(nb, dtype=np.int64)
    nd = 0
    for i in range(nb):
        r = st.b_ids[i]
        if np.int64(st.computed[r]) == np.int64(st.prompt[r]) + st.num_output[r]:  # it samples
            st.num_output[r] += 1
            if cfg.lag:
                pend(st, r, t1)
                if st.num_output[r] >= st.output[r]:
                    done[nd] = r
                    nd += 1
                continue
            last = st.t_last[r]
            if np.isnan(last):
                st.t_first[r] = t1
            elif last == t0:
                n_regular += 1
            elif t1 >= st.s.itl_from:
                itl_add(st, t1 - last, 1)
            st.t_last[r] = t1
            if st.num_output[r] >= st.output[r]:
                done[nd] = r
                nd += 1
    st.ends[0] = t1
    record(st, t0, ONE, used, tokens, prefill, n_regular, ZERO, num_waiting(st))
    st.s.now = t1
    if nd:
        finish(cfg, st, kv, done, nd)


# ---------------------------------------------------------------------------------- the loop
@kernel(inline=True)
def drained(cfg, st):
    """Nothing will ever happen again: every request arrived and ended."""
    if next_arrival(cfg, st) < np.inf:
        return False
    if cfg.routed and not st.s.inbox_shut:  # the router may still send requests
        return False
    return st.s.run_len == 0 and n_queued(st) == 0 and num_waiting(st) == 0


@kernel
def advance(cfg, st, kv, tab, until):
    """Run the replica up to ``until`` (see the module docstring). Returns DONE, UNTIL, FLUSH
    (the driver must drain the recorder buffers), PROGRESS, ERROR (``st.s.error``), or, routed
    with ``cfg.report_ended``, ENDED (the driver must route the ended requests' successors).
    HELD: the replica reached a boundary at or after ``st.s.hold`` (a fleet's closed loops set it
    to another engine's commit, engine/cluster.py) and left it unplanned -- committed, nothing
    pulled -- so that it plans there only after every request sent there is routed. ``hold``
    holds for this call only (read, then reset to inf: the driver sets it for the calls it bounds
    so, and never has to clear it)."""
    hold = st.s.hold
    st.s.hold = np.inf
    flush_at = st.rb_start.shape[0] - st.ends.shape[0] - 1  # room for one more run
    itl_at = st.itl_v.shape[0] - 2 * (st.b_ids.shape[0] + 1)
    while True:
        if st.s.inflight != 0:
            if st.s.t_end > until:
                return UNTIL
            if st.s.inflight == 2:  # (the pack's extrapolation tally first: servesim/perf/kernels.py)
                count_decode_run(tab, st.b_ids, st.computed, st.s.b_len, st.s.run_k, st.s.now, st.ends)
                commit_decode_run(cfg, st, kv, st.s.run_k)
            else:
                count_iteration(tab, st.b_new, st.b_ctx, st.s.b_len, st.s.t_end - st.s.now)
                commit_iteration(cfg, st, kv, st.s.t_end)
            st.s.inflight = 0
            st.s.segments += 1
            if st.s.rows > flush_at or st.s.itl_len > itl_at:
                return FLUSH
            if st.s.segments % PROGRESS_EVERY == 0:
                return PROGRESS
            if cfg.report_ended and st.s.end_head >= 0:
                return ENDED
        if not st.s.idle:  # at an iteration boundary: arrivals, stop?, the policy's batch
            now = st.s.now
            if now >= hold:
                return HELD
            pull_arrivals(cfg, st, now)
            if now >= cfg.stop_time or (cfg.stop_when_drained and drained(cfg, st)):
                if cfg.lag and st.s.p_len:  # the run ends: what the last iteration sampled leaves now
                    deliver_pending(st, now, np.nan)
                # a closed loop's successor of a request rejected in that pull arrives now too:
                # it is in the system when the run ends (waiting, or rejected), as the summary
                # counts it, not left unseen
                while next_arrival(cfg, st) <= now:
                    pull_arrivals(cfg, st, now)
                return DONE
            schedule(cfg, st, kv, now)
            if st.s.error:  # (a request preempted past MAX_PREEMPTIONS: a livelock)
                return ERROR
            set_causes(st, now)
            if cfg.check:
                code = check_batch(cfg, st, kv)
                if code != 0:
                    st.s.error = code
                    return ERROR
            if st.s.b_len > 0:
                if st.s.b_pure:
                    k = plan_decode_run(cfg, st, kv, tab, until)
                    st.s.run_k = k
                    st.s.t_end = st.ends[k - 1]
                    st.s.inflight = 2
                else:
                    st.s.t_end = plan_iteration(cfg, st, tab)
                    st.s.inflight = 1
                if cfg.report_ended and st.s.end_head >= 0:
                    return ENDED
                continue
            if cfg.lag and st.s.p_len:  # nothing scheduled: vLLM processes the pending outputs
                deliver_pending(st, now, np.nan)  # at once (llm_engine.py step, empty schedule)
            st.s.idle = 1
            if cfg.report_ended and st.s.end_head >= 0:
                return ENDED
        elif cfg.routed and cfg.stop_when_drained and drained(cfg, st):
            return DONE  # (resumed idle: the router has sent its last request meanwhile)
        # idle until an arrival, the stop time, or the policy's horizon (a call that returned
        # here resumes here: the boundary's pull and schedule are not run twice)
        t_next = next_arrival(cfg, st)
        if cfg.stop_time < t_next:
            t_next = cfg.stop_time
        if st.s.b_horizon < t_next:
            t_next = st.s.b_horizon
            if t_next <= st.s.now:  # the policy's horizon is not ahead: it would wake to this state again
                st.s.error = E_HORIZON
                return ERROR
        if t_next == np.inf:
            if num_waiting(st) or st.s.run_len:
                st.s.error = E_STALL
                return ERROR
            if cfg.routed and not st.s.inbox_shut:
                st.s.wake = t_next
                return UNTIL
            return DONE
        if t_next > until:
            st.s.wake = t_next
            return UNTIL
        st.s.idle = 0
        st.s.now = t_next


# ------------------------------------------------------------------- one engine, one pointer
# A fleet calls each replica's kernels from Python once per event. Passed separately, the
# configuration, KV state and step tables are NamedTuples numba unboxes field by field at every
# call (~15 us for ~40 arrays); held in one StructRef, a call passes one pointer (engine/cluster.py).
# The configuration and step tables sit in a StructRef of their own (``conf``), one for every
# engine built with equal ones (:func:`shared_conf`): inline in each EngineRef they were ~1.8 KB
# read at every call, each engine's copy cold by its next one (a 1,024-replica fleet).
# (fields not named "st": numba's generated constructor names its instance so)
ConfRefType, ConfRef, make_conf_ref = struct_ref("ConfRefType", "ConfRef", ["cfg", "tab", "keep"], "make_conf_ref",
                                                 __name__, __file__)
EngineRefType, EngineRef, make_engine_ref = struct_ref("EngineRefType", "EngineRef", ["conf", "state", "kv"],
                                                       "make_engine_ref", __name__, __file__)

# The state's and the step tables' arrays are held *unowned* (no meminfo: numba's reference count
# updates on them test a null pointer), as the KV pool's are (kv/pool.py ``_unowned``). Owned,
# every ``st.field`` a kernel reads across a branch, and each step table at every call, was an
# atomic increment and decrement of that array's own meminfo -- one cache line per array *and per
# engine* (each engine unboxes its own meminfos, even of the arrays all share), cold by the
# engine's next call in a large fleet: 24 % of a 1,024-replica run (benchmarks/RESULTS.md). One
# field stays owned -- the state's ``OWNER``, the conf's ``keep`` -- through a view whose base
# holds the NamedTuple (:class:`_Owner`), so the arrays live as long as their StructRef; a kernel
# that replaces a field gives it an owned array, as before.
OWNER = "g_hi"  # (a closed loop's group bounds: no kernel reads them per iteration)


@intrinsic
def _unowned_members(typingctx, tup):
    """``tup`` (a tuple or NamedTuple) with each array member unowned (``_unowned``)."""
    def codegen(context, builder, sig, args):
        val = args[0]
        for i, ty in enumerate(sig.args[0].types):
            if isinstance(ty, types.Array):
                ary = context.make_array(ty)(context, builder, value=builder.extract_value(val, i))
                ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
                ary.parent = cgutils.get_null_value(ary.parent.type)
                val = builder.insert_value(val, ary._getvalue(), i)
        return val

    return tup(tup), codegen


def _borrowing_state_constructor():
    """``make_state_borrowed(st)``: the state's StructRef with every array but ``OWNER``'s unowned.
    Compiled from source naming each field (as kv/pool.py's ``make_kv_ref``)."""
    args = ", ".join(f"st.{f}" if f == OWNER else f"_unowned(st.{f})" for f in ReplicaState._fields)
    ns: dict = {"make_state_ref": make_state_ref, "_unowned": _unowned, "__name__": __name__}
    exec(compile(f"def make_state_borrowed(st):\n    return make_state_ref({args})\n", __file__, "exec"), ns)
    return kernel(ns["make_state_borrowed"])


make_state_borrowed = _borrowing_state_constructor()


@kernel
def make_conf_borrowed(cfg, tab, keep):
    return make_conf_ref(cfg, _unowned_members(tab), keep)


class _Owner:
    """Exports ``a``'s memory (``__array_interface__``) and holds ``keep``: ``np.asarray`` of it is
    ``a``'s data with this as its base, so numba's meminfo of that view keeps ``keep`` alive."""

    def __init__(self, a: np.ndarray, keep) -> None:
        self.__array_interface__ = a.__array_interface__
        self.keep = (a, keep)


def borrowed_state(st):
    """The compiled state of ``st`` (sched/state.py ``ReplicaState``): its arrays unowned, ``st``
    kept alive by the StructRef itself."""
    return make_state_borrowed(st._replace(**{OWNER: np.asarray(_Owner(getattr(st, OWNER), st))}))


_LAST_CONF: list = [None]  # (cfg, tab, ConfRef) of the last engine built


def shared_conf(cfg, tab):
    """The ConfRef of ``cfg`` and ``tab`` (arrays unowned, ``tab`` kept): the last one built when
    the configuration is equal and the tables the same object -- every replica of a group but
    the first, built one after another (engine/fleet_build.py)."""
    last = _LAST_CONF[0]
    if last is not None and last[1] is tab and last[0] == cfg:
        return last[2]
    conf = make_conf_borrowed(cfg, tab, np.asarray(_Owner(np.zeros(0, dtype=np.uint8), tab)))
    _LAST_CONF[0] = (cfg, tab, conf)
    return conf


@kernel
def advance_ref(e, until):
    c = e.conf
    return advance(c.cfg, e.state, e.kv, c.tab, until)


@kernel
def route_in_ref(e, rid):
    route_in(e.conf.cfg, e.state, rid)


@kernel
def route_in_after_plans_ref(e, rid):
    route_in_after_plans(e.conf.cfg, e.state, rid)


@kernel
def outstanding_work_ref(e, t):
    return outstanding_work(e.conf.cfg, e.state, t)


@kernel
def fleet_work(refs, t, out):
    """:func:`outstanding_work` of every engine of a fleet (a typed list of EngineRefs) at ``t``."""
    for i in range(len(refs)):
        out[i] = outstanding_work_ref(refs[i], t)
