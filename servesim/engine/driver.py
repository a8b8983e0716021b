"""Drive one replica's kernel from Python: compiled, or the same source as plain Python.

:class:`Replica` owns a replica's arrays (sched/state.py), its KV manager and its step-time
tables, and calls :func:`servesim.engine.kernel.advance` -- compiled by numba when every piece is
built in, else the same source uncompiled (``servesim.jit.pure``) with object-level pieces bound
in: a prefix-cache / tiered KV manager, a user's step-time model, an iteration hook. Either way
the kernel writes into the request table's columns and the recorder's buffers, so everything
downstream (metrics, parquet, tests) is shared. The driver drains the recorder buffers, reports
progress, turns invariant failures into errors, and is a SimPy process for the cluster.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servesim.engine import kernel as K
from servesim.engine.warm import mark_ready
from servesim.jit import pure
from servesim.kv import kernels as kvk
from servesim.perf import kernels as pk
from servesim.sched import parts
from servesim.sched.state import ScalarsMirror, compiled_state

INF = float("inf")
ERRORS = {
    K.E_BUDGET: "token budget exceeded: {arg} tokens scheduled > max_num_batched_tokens",
    K.E_SEQS: "max_num_seqs exceeded: {arg} running",
    K.E_EMPTY_NEW: "a scheduled request computes no token",
    K.E_STALL: "scheduler returned an empty batch with work pending and nothing left to wait for (a policy bug)",
}


def object_kv_overrides(kv_obj) -> dict:
    """Bind the kernels' KV calls to a Python KV manager (servesim/kv/base.py's contract)."""

    def decode_run(kv, computed, ids, nb, k_max, used):
        k, u = kv_obj.decode_run(ids[:nb], int(k_max))
        used[:k] = u[:k]
        return k

    def step_usage(kv, computed, holders, nh, ids, new, nb, k, used, out):
        u = kv_obj.step_usage(ids[:nb], new[:nb], int(k), used[:k])
        out[0, :k] = u.allocated - u.used - u.reserved_unused
        out[1, :k] = u.reserved_unused
        out[2, :k] = u.external

    def check(kv, computed, holders, nh):
        kv_obj.check()  # raises AssertionError with its own message
        return 0

    def lookup(kv, computed, rid, now):
        hit = kv_obj.reuse_prefix(int(rid), now)
        return hit.tokens, hit.ready_at

    stable = getattr(kv_obj, "stable_steps", None)
    return {
        parts.kv_stable_steps: (lambda kv, computed, ids, nb, k: stable(ids[:nb], int(k))) if stable else
        (lambda kv, computed, ids, nb, k: k),
        kvk.kv_allocate: lambda kv, computed, rid, n: kv_obj.allocate(int(rid), int(n)),
        kvk.kv_allocate_decodes: lambda kv, computed, ids, nb: kv_obj.allocate_decodes(ids[:nb]),
        kvk.kv_free: lambda kv, rid: kv_obj.free(int(rid)),
        kvk.kv_free_blocks: lambda kv: kv_obj.free_blocks,
        kvk.kv_used_blocks: lambda kv: kv_obj.used_blocks,
        kvk.kv_decode_run: decode_run,
        kvk.kv_commit_decodes: lambda kv, computed, ids, nb: kv_obj.commit_decodes(ids[:nb]),
        kvk.kv_step_usage: step_usage,
        kvk.kv_check: check,
        parts.kv_prefix_lookup: lookup,
        parts.kv_holds: lambda kv, rid: kv_obj.held[rid] > 0,
    }


def object_model_overrides(model) -> dict:
    """Bind the kernels' step-time calls to a Python StepTimeModel (servesim/perf/base.py)."""

    def decode(tab, num_seqs, context_sum, steps, out):
        out[:steps] = model.predict_decode_run(int(num_seqs), int(context_sum), int(steps))

    return {
        pk.iteration_seconds: lambda tab, new, ctx, nb: float(model.predict(new[:nb], ctx[:nb])),
        pk.decode_seconds: decode,
    }


def hook_overrides(hook) -> dict:
    def on_iteration(t0, t1, ids, new, nb):
        hook(float(t0), float(t1), ids[:nb].copy(), new[:nb].copy())

    return {K.on_iteration: on_iteration}


class Replica:
    """One replica's state and its kernel. ``path`` says which engine runs it and why."""

    def __init__(self, cfg, st, kv, tab, recorder, *, kv_object=None, model_object=None,
                 on_iteration: Callable | None = None, progress: Callable[[int], None] | None = None,
                 user_parts: dict | None = None, force_python: str | None = None):
        self.cfg, self.kv, self.tab, self.rec, self.progress = cfg, kv, tab, recorder, progress
        self.kv_object = kv_object
        overrides: dict = {}
        why = []
        if kv_object is not None:
            overrides.update(object_kv_overrides(kv_object))
            why.append(f"KV manager {type(kv_object).__name__}")
        if model_object is not None:
            overrides.update(object_model_overrides(model_object))
            why.append(f"step-time model {type(model_object).__name__}")
        if on_iteration is not None:
            overrides.update(hook_overrides(on_iteration))
            why.append("an iteration hook")
        if user_parts:
            overrides.update(user_parts)
            why.append("user policy parts")
        if force_python:
            why.append(force_python)
        self.record = st.s
        if why:
            self.path = "python"
            self.why = ", ".join(why)
            self._advance = pure(K.advance, overrides)
            st = st._replace(s=ScalarsMirror(st.s))
        else:
            self.path = "compiled"
            self.why = ""
            self._advance = K.advance
        self.st = st  # the arrays, as Python sees them
        self.kst = compiled_state(st) if self.path == "compiled" else st  # as the kernel sees them
        recorder.itl_from = float(st.s.itl_from)

    @property
    def now(self) -> float:
        return float(self.st.s.now)

    @property
    def ended(self) -> int:
        return int(self.st.s.ended)

    def advance(self, until: float = INF) -> bool:
        """Run up to ``until``; True once the replica has nothing left to do."""
        st = self.st
        while True:
            code = self._advance(self.cfg, self.kst, self.kv, self.tab, until)
            self._drain()
            if code == K.DONE:
                self._finish()
                return True
            if code == K.UNTIL:
                return False
            if code == K.ERROR:
                self._finish()
                self.raise_error()
            if code == K.PROGRESS and self.progress is not None:
                self.progress(self.ended)

    def raise_error(self) -> None:
        """The invariant failure the kernel reported (``st.s.error``), as an exception."""
        st = self.st
        err = int(st.s.error)
        if err == K.E_KV:
            msg = kvk.check_message(self.kv, int(st.s.error_arg)) if self.kv_object is None else \
                f"KV invariant violated (code {int(st.s.error_arg)})"
            raise AssertionError(msg)
        msg = ERRORS.get(err, f"engine error {err}").format(arg=int(st.s.error_arg))
        if err == K.E_STALL:
            raise RuntimeError(msg)
        raise AssertionError(msg)

    def _drain(self) -> None:
        st, rec, s = self.st, self.rec, self.st.s
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
        s = self.st.s
        self.rec.itl_from = float(s.itl_from)
        self.rec.cpu_s += float(s.cpu_s)
        self.rec.extra_s += float(s.extra_s)
        s.cpu_s = 0.0
        s.extra_s = 0.0
        if isinstance(s, ScalarsMirror):
            s.sync(self.record)
        else:
            mark_ready()  # the compiled engine ran: it is in the disk cache
        if self.progress is not None:
            self.progress(self.ended)

    def process(self, env):
        """SimPy process: run to the end, then let the clock catch up."""
        self.advance(INF)
        yield env.timeout(max(0.0, self.now - env.now))
