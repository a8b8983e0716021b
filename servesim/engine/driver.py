"""A replica's kernel from Python: compiled, or the same source as plain Python.

:class:`Engine` owns one kernel instance's arrays (sched/state.py), its KV pool and its
step-time tables, and calls :func:`servesim.engine.kernel.advance` -- compiled by numba when every piece is
built in, else the same source uncompiled (``servesim.jit.pure``) with object-level pieces bound
in: a user's step-time model, an iteration hook, the reference prefix-cache object of the tests. Either way
the kernel writes into the request table's columns and the recorder's buffers, so everything
downstream (metrics, parquet, tests) is shared. It drains the recorder buffers, reports
progress and turns invariant failures into errors; the fleet (engine/cluster.py) -- a lone
replica is a fleet of one -- calls the kernel and is the run's SimPy process.

Ctrl-C: a KeyboardInterrupt raised in the middle of a kernel run as Python (the reference
engine) could leave a request between two places (out of a queue, not yet running). While the
fleet's loop runs, SIGINT is therefore only noted (:class:`HeldInterrupt`); the loop acts on it
when the kernel returns at an iteration boundary -- every ``PROGRESS_EVERY`` segments and at each
buffer flush -- with every committed iteration drained into the recorder. Then it raises
KeyboardInterrupt from that consistent state, or, when ``stop_on_interrupt`` is set (the CLI's
choice), ends the run there with ``interrupted`` set, so the caller can report the partial run.
A second Ctrl-C interrupts at once (the default handler is back after the first).

So that a Ctrl-C is acted on within a fraction of a second on the Python engine too, its kernel
returns every ``PY_RETURN_EVERY`` segments instead of ``PROGRESS_EVERY`` (a return changes no
result: the loop resumes where it stopped). The recorder buffers are drained only where both
engines return at the same points (buffer flushes, the end, ``until``), never at progress
returns, so their float sums group identically and compiled = Python stays bit for bit (a fleet
likewise drains at flushes only).
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

import numpy as np

from servesim.engine import kernel as K
from servesim.errors import NoProgress, PolicyBug
from servesim.jit import pure
from servesim.kv import kernels as kvk
from servesim.perf import kernels as pk
from servesim.sched.state import E_LIVELOCK, SCALARS, ScalarsMirror

PY_RETURN_EVERY = 1 << 8  # the Python engine's segments between returns (Ctrl-C latency)
ERRORS = {
    K.E_BUDGET: "token budget exceeded: {arg} tokens scheduled > max_num_batched_tokens",
    K.E_SEQS: "max_num_seqs exceeded: {arg} running",
    K.E_EMPTY_NEW: "a scheduled request computes no token",
    K.E_SLOTS: "request {arg} computes past the KV slots it holds (a policy bug)",  # (Engine._slots_message)
    K.E_QWORK: "the waiting requests' running token count (st.s.q_work) is {arg} off a walk of the queues and the "
               "inbox (an engine bug: a request entered or left a queue, or its computed changed while it "
               "waited, without the count)",
    K.E_STALL: "scheduler returned an empty batch with work pending and nothing left to wait for (a policy bug)",
    K.E_HORIZON: "the policy asked to be woken at an instant the idle engine has already reached, so it would "
                 "wait for it forever (a policy bug: a horizon must lie ahead of the current time)",
}


def object_model_overrides(model) -> dict:
    """Bind the kernels' step-time calls to a Python StepTimeModel (servesim/perf/base.py)."""

    def decode(tab, num_seqs, context_sum, steps, out):
        out[:steps] = model.predict_decode_run(int(num_seqs), int(context_sum), int(steps))

    return {
        pk.iteration_seconds: lambda tab, new, ctx, nb: float(model.predict(new[:nb], ctx[:nb])),
        pk.decode_seconds: decode,
        pk.count_iteration: lambda tab, new, ctx, nb, seconds: None,  # no pack grid to leave
        pk.count_decode_run: lambda tab, ids, computed, nb, k, t0, ends: None,
    }


def hook_overrides(hook) -> dict:
    def on_iteration(t0, t1, ids, new, nb):
        hook(float(t0), float(t1), ids[:nb].copy(), new[:nb].copy())

    return {K.on_iteration: on_iteration}


class HeldInterrupt:
    """Within ``with HeldInterrupt() as held``, the first SIGINT sets ``held.hit`` instead of
    raising, and restores the previous handler (a second SIGINT raises at once). Only where
    Python's default handler is installed and in the main thread (elsewhere nothing changes)."""

    def __init__(self) -> None:
        self.hit = False
        self._old = None

    def __enter__(self) -> "HeldInterrupt":
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._old = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum, frame) -> None:
        self.hit = True
        signal.signal(signal.SIGINT, self._old)

    def __exit__(self, *exc) -> None:
        if self._old is not None and signal.getsignal(signal.SIGINT) is not self._old:
            signal.signal(signal.SIGINT, self._old)


SCALAR_INDEX = {name: i for i, name in enumerate(SCALARS.names)}


def entry_point(dispatcher, *args):
    """The compiled machine-code entry of ``dispatcher`` for these arguments' types: calls skip
    numba's per-call typing of the NamedTuple arguments (~20 us of an advance call)."""
    from numba import typeof

    sig = tuple(typeof(a) for a in args)
    done = dispatcher.overloads.get(sig)  # (compile() of a compiled signature still costs ~75 us: a
    if done is None:                      # fleet's build asked it 3 times an engine)
        dispatcher.compile(sig)
        done = dispatcher.overloads[sig]
    return done.entry_point


class Scalars:
    """Fast reads and writes of an engine's scalars: views of the record array (compiled), or
    the Python mirror's attributes (uncompiled)."""

    def __init__(self, st, array: np.ndarray | None):
        self.mirror = st.s if isinstance(st.s, ScalarsMirror) else None
        if self.mirror is None:  # (a plain ndarray view: a recarray's indexing is ~1 us)
            plain = array.view(np.ndarray)
            self.f = plain.view(np.float64)
            self.i = plain.view(np.int64)

    def get_f(self, name: str) -> float:
        return getattr(self.mirror, name) if self.mirror is not None else float(self.f[SCALAR_INDEX[name]])

    def get_i(self, name: str) -> int:
        return getattr(self.mirror, name) if self.mirror is not None else int(self.i[SCALAR_INDEX[name]])

    def set_f(self, name: str, v: float) -> None:
        if self.mirror is not None:
            setattr(self.mirror, name, float(v))
        else:
            self.f[SCALAR_INDEX[name]] = v

    def set_i(self, name: str, v: int) -> None:
        if self.mirror is not None:
            setattr(self.mirror, name, int(v))
        else:
            self.i[SCALAR_INDEX[name]] = v


class Engine:
    """One kernel instance -- a replica, or a virtual engine of a pipeline replica -- as the
    fleet's loop (engine/cluster.py) calls it: advance to a bound, take a routed request in,
    read its load and the requests it ended. It owns the instance's arrays (sched/state.py,
    ``st``; ``scalars``: ``st.s`` as a record array), the KV its kernels see (``kstate``: the
    pool's state, or a Python manager) and the pool or manager ``build_kv`` made (``kv``: its
    counters feed the summary), its step-time tables and its recorder. ``path`` says which
    engine runs it (compiled, or the same source as Python) and ``why``.

    Compiled, a call passes one pointer (kernel.EngineRef); ``direct`` (a solo fleet's engine,
    called a few times a run): the kernel itself, whose arguments numba unboxes at each call."""

    def __init__(self, cfg, st, kstate, tab, recorder, *, scalars: np.ndarray, index: int = 0, plan=None,
                 pool=None, kv_object=None, model_object=None, on_iteration: Callable | None = None,
                 progress: Callable[[int], None] | None = None, user_parts: dict | None = None,
                 force_python: str | None = None, direct: bool = False):
        self.cfg, self.kstate, self.tab, self.recorder, self.progress = cfg, kstate, tab, recorder, progress
        self.kv = pool if pool is not None else kstate
        self.index, self.plan, self.scalars = index, plan, scalars
        self.kv_object = kv_object
        overrides: dict = {**(kv_object.kernel_overrides() if kv_object is not None else {}),
                           **(object_model_overrides(model_object) if model_object is not None else {}),
                           **(hook_overrides(on_iteration) if on_iteration is not None else {}), **(user_parts or {})}
        if user_parts:  # Python parts may link and unlink queue entries past the waiting-work count:
            overrides[K.waiting_work] = pure(K.waiting_work_walk)  # read it by the walk (engine/inbox.py)
        why = [force_python] if force_python else []  # (the builder names every Python piece: simulate.engine_reasons)
        assert why or not overrides, "Python pieces bound without a reason for the Python engine"
        self.record = st.s
        if why:
            self.path = "python"
            self.why = ", ".join(why)
            kernel = pure(K.advance, overrides)
            if K.advance not in overrides:  # (the rebuilt loop's own globals: see the module docstring)
                kernel.__globals__["PROGRESS_EVERY"] = PY_RETURN_EVERY
            st = st._replace(s=ScalarsMirror(st.s))
        else:
            self.path = "compiled"
            self.why = ""
        self.st = st  # the arrays, as Python sees them
        compiled = self.path == "compiled"
        self.kst = kst = K.borrowed_state(st) if compiled else st  # as the kernel sees them (arrays unowned)
        self.kkv = kkv = kvk.compiled_kv(kstate) if compiled else kstate
        recorder.itl_from = float(st.s.itl_from)
        self.s = Scalars(st, scalars)
        if compiled and direct:  # (numba's dispatcher types the arguments in C: ~1 ms less than entry_point's)
            adv = K.advance
            self._advance = lambda until: adv(cfg, kst, kkv, tab, until)
            self._route = self._work = None
        elif compiled:  # one pointer per call (kernel.EngineRef)
            self._conf = K.shared_conf(cfg, tab)
            self._bind(st, kst)
        else:
            route, work = pure(K.route_in), pure(K.outstanding_work, overrides)
            self._advance = lambda until: kernel(cfg, kst, kkv, tab, until)
            self._route = lambda rid: route(cfg, kst, rid)
            after_plans = pure(K.route_in_after_plans)
            self._route_after = lambda rid: after_plans(cfg, kst, rid)
            self._work = lambda t: work(cfg, kst, t)
        self.in_next = st.in_next
        self.table_arrival = st.arrival  # the request table's arrival column (request ids)
        self.routed = 0

    def _bind(self, st, kst=None) -> None:
        """(Compiled, not direct) the kernel's view of ``st`` and the EngineRef over it; again when
        ``st`` is replaced by per-replica request slots (engine/slots.py)."""
        cfg = self.cfg
        self.st = st
        self.kst = kst = K.borrowed_state(st) if kst is None else kst
        ref = K.make_engine_ref(self._conf, kst, self.kkv)
        adv = entry_point(K.advance_ref, ref, 0.0)
        route = entry_point(K.route_in_ref, ref, 0)
        work = entry_point(K.outstanding_work_ref, ref, 0.0)
        self._advance = lambda until: adv(ref, until)
        self._route = lambda rid: route(ref, rid)
        if cfg.report_ended:  # (a fleet's closed loops: engine/cluster.py routes some after the plans)
            after = entry_point(K.route_in_after_plans_ref, ref, 0)
            self._route_after = lambda rid: after(ref, rid)
        self._work = lambda t: work(ref, t)
        self._ref = ref
        self.in_next = st.in_next

    slots = None  # per-replica request slots (engine/slots.py Slots), once the fleet gives them

    def advance(self, until: float) -> int:
        """Run up to ``until`` (engine/kernel.py ``advance``); returns its code."""
        code = self._advance(until)
        if code == K.FLUSH:  # (not at PROGRESS: the Python engine returns it more often -- Ctrl-C,
            self._drain()    # above -- and draining groups the recorder's float sums)
        elif code == K.ERROR:
            self._drain()
            self.raise_error()
        return code

    _route_after = None

    def route_in(self, rid: int, after_plans: bool = False) -> None:
        """Send ``rid`` here; ``after_plans``: it was sent after every engine with a boundary at
        its arrival planned there (kernel ``route_in_after_plans``; a fleet's closed loops)."""
        if self.slots is not None:  # (its own slot first: engine/slots.py)
            # slots are never given with closed loops (slots.applies), the only sender after plans
            assert not after_plans, "a request sent after the plans to an engine with request slots"
            self.slots.route_in(self, rid)
        else:
            (self._route_after if after_plans else self._route)(rid)
        self.routed += 1
        self.recorder.note_arrivals(self.table_arrival[rid])  # waits during a step count (metrics/collect.py)

    def append_inbox(self, ids: np.ndarray) -> None:
        """Send ``ids`` (in arrival order) to an engine that has not started: its inbox list."""
        if not len(ids):
            return
        assert not self.s.get_i("inflight") and self.s.get_i("in_head") < 0
        nxt = self.in_next
        nxt[ids[:-1]] = ids[1:]
        nxt[ids[-1]] = -1
        self.s.set_i("in_head", int(ids[0]))
        self.s.set_i("in_tail", int(ids[-1]))
        st = self.st  # their tokens join the waiting-work count, as kernel inbox_append adds them
        work = st.prompt[ids].astype(np.int64) + st.output[ids] - st.computed[ids]
        self.s.set_i("q_work", self.s.get_i("q_work") + int(work.sum()))
        self.routed += len(ids)
        self.recorder.note_arrivals(self.st.arrival[ids])

    def last_arrival_by(self, t: float) -> float | None:
        """The latest arrival at or before ``t`` among the requests routed here and not pulled yet
        (None: none)."""
        r = self.s.get_i("in_head")
        arrival = self.st.arrival
        last = None
        while r >= 0 and arrival[r] <= t:
            last = float(arrival[r])
            r = int(self.in_next[r])
        return last

    def work(self, t: float) -> int:
        return int(self._work(t))

    def outstanding(self) -> int:
        return self.routed - self.s.get_i("ended")

    def take_ended(self) -> list[int]:
        """Requests ended since the last look (routed with report_ended), in the order they ended."""
        s = self.s
        r = s.get_i("end_head")
        if r < 0:
            return []
        out = []
        nxt = self.in_next
        while r >= 0:
            out.append(r)
            r = int(nxt[r])
        s.set_i("end_head", -1)
        s.set_i("end_tail", -1)
        return out

    def next_key(self, code: int) -> float:
        """When this engine next needs a call: its iteration's end, its idle wake-up, or now
        (a boundary it has not planned yet)."""
        s = self.s
        if s.get_i("inflight"):
            return s.get_f("t_end")
        if code == K.UNTIL:
            return s.get_f("wake")
        return s.get_f("now")

    def finish(self) -> None:
        self._drain()
        self._finish()

    def raise_error(self) -> None:
        """The invariant failure the kernel reported (``st.s.error``), as an exception."""
        st = self.st
        err = int(st.s.error)
        if err == K.E_KV:
            msg = kvk.check_message(self.kstate, int(st.s.error_arg)) if self.kv_object is None else \
                f"KV invariant violated (code {int(st.s.error_arg)})"
            raise AssertionError(msg)
        if err == K.E_SLOTS:
            raise PolicyBug(self._slots_message(int(st.s.error_arg)))
        if err == E_LIVELOCK:
            raise NoProgress(self._livelock_message(int(st.s.error_arg)))
        msg = ERRORS.get(err, f"engine error {err}").format(arg=int(st.s.error_arg))
        if err in (K.E_STALL, K.E_HORIZON):
            raise RuntimeError(msg)
        raise AssertionError(msg)

    def _livelock_message(self, r: int) -> str:
        """E_LIVELOCK in one line: who, when, the pool, and the knobs that give it room."""
        st = self.st
        rid = int(st.gid[r]) if len(st.gid) else r  # (a slot: engine/slots.py)
        pool = self.kv_object if self.kv_object is not None else self.kstate
        blocks, bs = int(getattr(pool, "num_blocks", -1)), int(getattr(pool, "block_size", -1))
        return (f"no progress: request {rid} was preempted {int(st.preempt[r]):,} times by t = {float(st.s.now):.3f} s "
                f"(it needs {int(st.prompt[r]) + int(st.num_output[r]):,} tokens of KV, computed again after each "
                f"preemption; the pool holds {blocks:,} blocks of {bs} tokens): the KV pool cannot keep it running "
                f"beside the other requests. Give it room: engine.num_gpu_blocks_override or "
                f"engine.gpu_memory_utilization higher, or engine.max_num_seqs / engine.max_model_len lower")

    def _slots_message(self, r: int) -> str:
        """E_SLOTS in one line: the request, the tokens it computes up to (what it computed plus
        this step's), the slots it holds (the state is as the check left it: the step did not run)."""
        st = self.st
        nb = int(st.s.b_len)
        new = int(st.b_new[:nb][st.b_ids[:nb] == r].sum())
        bs = int(self.kstate.block_size)
        blocks = int(pure(kvk.held_of)(self.kstate, r))
        rid = int(st.gid[r]) if len(st.gid) else r  # (a slot: engine/slots.py)
        return (f"request {rid} computes up to token {int(st.computed[r]) + new} ({int(st.computed[r])} computed + "
                f"{new} this step) but holds {blocks * bs} KV slots ({blocks} blocks of {bs}): the policy "
                f"admitted it past the KV pool (a policy bug; sim.check_invariants)")

    def _drain(self) -> None:
        st, rec, s = self.st, self.recorder, self.st.s
        m = int(s.itl_len)
        if m:
            rec.itl.add(st.itl_v[:m].copy(), st.itl_w[:m].copy())
            s.itl_len = 0
        f = int(s.rows)
        if f:
            rec.itl_from = float(s.itl_from)
            rec._fold(st.rb_start[:f], st.rb_end[:f], st.rb_vals[:, :f], st.rb_itlw[:f])
            s.rows = 0

    def _finish(self) -> None:
        if self.slots is not None:  # the results into the request table
            self.slots.scatter(self)
        s = self.st.s
        rec = self.recorder
        rec.itl_from = float(s.itl_from)
        rec.cpu_s += float(s.cpu_s)
        rec.extra_s += float(s.extra_s)
        rec.swap_outs += int(s.swap_outs)
        s.cpu_s = 0.0
        s.extra_s = 0.0
        s.swap_outs = 0
        if isinstance(s, ScalarsMirror):
            s.sync(self.record)
        if self.progress is not None:
            self.progress(int(s.ended))
