"""An invariant checker that attaches to any run: built-in policies, a user's policy parts, any
KV manager, kernels bound to Python callables.

How it watches. On the uncompiled engine every kernel can be bound to a Python callable
(``servesim.simulate.build(kernel_overrides=...)``). The checker binds the policy's ``schedule``
kernel to a wrapper around *the schedule the run would have used* -- the built-in source with the
run's own bindings (a Python KV manager, a step-time model, the user's parts), or the user's own
``schedule`` part -- and the iteration hook to a recorder. So every scheduling decision is seen
before and after, every iteration as it is committed, and the run is otherwise the one it would
have been (a test holds attaching the checker to leave every result unchanged)::

    engine loop:  pull arrivals ─► schedule ───────────────► plan ─► commit ─► ...
                                     │ wrapper: snapshot,       │ on_iteration: batch, t0, t1
                                     │ inner schedule, then     │ (time, causality records)
                                     │ check the state
    end of run:   causality per request, counts, KV returned, percentiles, fragmentation

Per decision: requests_conserved, arrivals_accounted, causality (who is scheduled), batch_limits,
kv_conserved, kv_capacity, time_monotone, fifo / priority_order (what the policy promises: the
built-in FCFS policies FIFO overall, ``priority`` class order with aging; a user policy that
replaces ``head`` or ``schedule`` promises nothing unless told). The first violation raises
:class:`~servesim.testing.invariants.InvariantViolation` naming the invariant.

The checks read the state's arrays directly (not the engine's own ``sim.check_invariants``
kernels), so a bug in those kernels does not hide a violation. Cost: O(requests) numpy work per
decision -- meant for test-sized runs (hundreds to a few thousand requests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from servesim.request import FINISHED, PENDING, REJECTED, RUNNING, WAITING
from servesim.testing.invariants import InvariantViolation
# the checks of a finished run (and of a tier stack), shared with check_run; importable from here too
from servesim.testing.result_checks import check_counts, check_fragmentation, check_percentiles, check_tiers

ORDERS = ("auto", "fifo", "classes", "class_fifo", None)


@dataclass
class CheckStats:
    """How much was checked (a test can assert the checker actually watched something)."""

    decisions: int = 0
    iterations: int = 0
    admissions: int = 0
    order_checked: str | None = None


class Checker:
    """Attach to a run with :meth:`build` (or :func:`servesim.testing.check_run`), run it with
    ``servesim.simulate.run_built``, then call :meth:`finish` with the Result.

    ``order``: the admission order the policy promises -- ``"auto"`` (from the policy: FIFO for
    the built-in FCFS policies, ``"classes"`` for ``priority``; none for a user policy that
    replaces ``head`` or ``schedule``), ``"fifo"`` (first admissions in arrival order),
    ``"classes"`` (by effective class, then arrival: FIFO within a class and no priority
    inversion), ``"class_fifo"`` (FIFO within each class only), or None (no promise)."""

    def __init__(self, order: str | None = "auto"):
        if order not in ORDERS:
            raise ValueError(f"order {order!r}: allowed {', '.join(map(repr, ORDERS))}")
        self.order_arg = order
        self.order: str | None = None
        self.stats = CheckStats()
        self._inner: Callable | None = None
        self._table = None
        self._last_decision = -math.inf
        self._last_end = -math.inf
        self._aside: set[int] = set()
        self._first_t0: np.ndarray | None = None
        self._last_t1: np.ndarray | None = None
        self._token_iters: dict[int, list[tuple[float, float]]] = {}
        self._lag = False

    # ------------------------------------------------------------------------ attaching
    def build(self, scenario, seed: int | None = None, *, kernel_overrides: dict | None = None,
              on_iteration: Callable | None = None, **build_kwargs):
        """``servesim.simulate.build`` with the checker attached (any ``kernel_overrides`` of
        yours are kept: the checker watches the schedule they make)."""
        from servesim.sched.policies import schedule
        from servesim.simulate import build

        hook = self.on_iteration
        if on_iteration is not None:
            def hook(t0, t1, ids, new, _mine=self.on_iteration, _theirs=on_iteration):
                _mine(t0, t1, ids, new)
                _theirs(t0, t1, ids, new)
        overrides = {**(kernel_overrides or {}), schedule: self.schedule}
        b = build(scenario, seed, on_iteration=hook, kernel_overrides=overrides, **build_kwargs)
        self.attach(b, kernel_overrides)
        return b

    def attach(self, built, kernel_overrides: dict | None = None) -> None:
        """Resolve what the watched ``schedule`` calls: the run's own bindings, composed as the
        engine's driver composes them (servesim/engine/driver.py)."""
        from servesim.engine.driver import object_model_overrides
        from servesim.jit import pure
        from servesim.policy_catalog import POLICIES
        from servesim.sched import policies
        from servesim.sched.custom import load_user_policy

        sc = built.scenario
        # vLLM 0.6's asynchronous output processing (engine/delivery.py): tokens reach the client
        # when the engine's next call returns, so a first token or a finish may come after the
        # iteration that computed it (never before)
        self._lag = bool((sc.engine.options or {}).get("async_output", False))
        if getattr(built, "fleet", None) is not None:
            raise ValueError(
                f"the checker watches one replica; this scenario is a fleet of {len(built.fleet.replicas)} "
                f"replicas (cluster:): check one replica's configuration with the checker, and the "
                f"fleet with the run-pair checks (check_fast_path, check_reproducible, check_compiled, "
                f"check_worker_independent)")
        bound: dict[Any, Callable] = {}
        kv_obj = built.replica.kv_object
        if kv_obj is not None:
            bound.update(kv_obj.kernel_overrides())
        if getattr(built.model, "tables", None) is None:
            bound.update(object_model_overrides(built.model))
        user = None if sc.engine.scheduler in POLICIES else load_user_policy(sc.engine.scheduler)
        if user is not None:
            bound.update(user.overrides)
        bound.update(kernel_overrides or {})
        inner = bound.pop(policies.schedule, None)
        self._inner = inner if inner is not None else pure(policies.schedule, bound)
        self.order = self._resolve_order(sc, user, kernel_overrides or {})
        self.stats.order_checked = self.order
        t = built.table
        self._table = t
        self._kv = built.kv
        self._first_t0 = np.full(t.n, np.nan)
        self._last_t1 = np.full(t.n, np.nan)

    def _resolve_order(self, sc, user, extra: dict) -> str | None:
        from servesim.policy_catalog import POLICIES
        from servesim.sched import policies, queues

        if self.order_arg != "auto":
            return self.order_arg
        replaced = set(extra) | set(user.overrides if user is not None else ())
        if policies.schedule in replaced or queues.head in replaced:
            return None  # a queue discipline of its own: it promises what its author says
        base = user.spec if user is not None else POLICIES[sc.engine.scheduler]
        return "classes" if base.queue == "classes" else "fifo"

    # ------------------------------------------------------------------------ decisions
    def schedule(self, cfg, st, kv, now):
        """The watched policy decision (bound in place of the ``schedule`` kernel)."""
        if self._inner is None:
            raise RuntimeError("Checker.schedule called before attach(built)")
        waiting_before = np.flatnonzero(st.status == WAITING)
        never_before = np.isnan(st.t_sched[waiting_before])
        if st.fetching.shape[0]:
            self._aside.update(int(r) for r in st.fetching[: st.s.n_fetching])
        self._inner(cfg, st, kv, now)
        if st.fetching.shape[0]:
            self._aside.update(int(r) for r in st.fetching[: st.s.n_fetching])
        self.stats.decisions += 1
        self._check_time(st, now)
        self._check_requests(cfg, st, now)
        self._check_accounting(st, now)
        self._check_batch_causality(st, now)
        self._check_batch(cfg, st, now)
        self._check_kv(cfg, st, kv, now)
        self.stats.admissions += int(np.count_nonzero(never_before & (st.t_sched[waiting_before] == now)))
        if self.order is not None:
            self._check_order(cfg, st, now, waiting_before, never_before)

    def _fail(self, name: str, detail: str, now: float | None = None):
        raise InvariantViolation(name, detail, now)

    def _check_time(self, st, now):
        now = float(now)
        if now < self._last_decision:
            self._fail("time_monotone", f"a decision at {now!r} after one at {self._last_decision!r}", now)
        if now < self._last_end:
            self._fail("time_monotone", f"a decision at {now!r} before the last iteration ended "
                                        f"({self._last_end!r})", now)
        if float(st.s.now) != now:
            self._fail("time_monotone", f"the policy was called at {now!r} but the replica's clock says "
                                        f"{float(st.s.now)!r}", now)
        self._last_decision = now

    def _check_requests(self, cfg, st, now):
        """Walk every waiting queue (linked lists over q_next), the running set and the requests
        set aside for a tier transfer: each request in at most one place, with the status its
        place says, and every waiting / running request somewhere."""
        name = "requests_conserved"
        where: dict[int, str] = {}
        for q in range(st.q_head.shape[0]):
            n = int(st.q_len[q])
            rid = int(st.q_head[q])
            seen = 0
            last = -1
            while rid >= 0 and seen <= n:
                if rid in where:
                    self._fail(name, f"request {rid} is in queue {q} and in {where[rid]}", now)
                where[rid] = f"queue {q}"
                if int(st.status[rid]) != WAITING:
                    self._fail(name, f"request {rid} is in queue {q} but its status is "
                                     f"{_status(st.status[rid])}", now)
                seen += 1
                last = rid
                rid = int(st.q_next[rid])
            if seen != n:
                self._fail(name, f"queue {q} says it holds {n} requests but links {seen}", now)
            if n and int(st.q_tail[q]) != last:
                self._fail(name, f"queue {q}'s tail is {int(st.q_tail[q])}, its last link {last}", now)
        for i in range(int(st.s.run_len)):
            rid = int(st.run[i])
            if rid in where:
                self._fail(name, f"request {rid} is running and in {where[rid]}", now)
            where[rid] = "the running set"
            if int(st.status[rid]) != RUNNING:
                self._fail(name, f"request {rid} is in the running set with status {_status(st.status[rid])}", now)
        for i in range(int(st.s.n_fetching)):
            rid = int(st.fetching[i])
            if rid in where:
                self._fail(name, f"request {rid} is set aside for a tier transfer and in {where[rid]}", now)
            where[rid] = "the tier-transfer set"
            if int(st.status[rid]) != WAITING:
                self._fail(name, f"request {rid} is set aside for a tier transfer with status "
                                 f"{_status(st.status[rid])}", now)
        n_wait = int(np.count_nonzero(st.status == WAITING))
        n_run = int(np.count_nonzero(st.status == RUNNING))
        placed_wait = sum(1 for v in where.values() if v != "the running set")
        if n_wait != placed_wait:
            lost = [int(r) for r in np.flatnonzero(st.status == WAITING) if int(r) not in where][:5]
            self._fail(name, f"{n_wait} requests are waiting but {placed_wait} are in a queue or transfer"
                             + (f" (not anywhere: {lost})" if lost else ""), now)
        if n_run != int(st.s.run_len):
            self._fail(name, f"{n_run} requests have status running but the running set holds "
                             f"{int(st.s.run_len)}", now)

    def _check_accounting(self, st, now):
        counts = np.bincount(st.status, minlength=5)
        arrived = int(counts[WAITING] + counts[RUNNING] + counts[FINISHED] + counts[REJECTED])
        if arrived != int(st.s.arrived):
            self._fail("arrivals_accounted", f"the inbox counted {int(st.s.arrived)} arrivals but "
                       f"{int(counts[FINISHED])} finished + {int(counts[REJECTED])} rejected + "
                       f"{int(counts[WAITING])} waiting + {int(counts[RUNNING])} running = {arrived}", now)
        ended = int(counts[FINISHED] + counts[REJECTED])
        if ended != int(st.s.ended):
            self._fail("arrivals_accounted", f"the engine counted {int(st.s.ended)} ended requests but "
                       f"{int(counts[FINISHED])} finished + {int(counts[REJECTED])} rejected = {ended}", now)

    def _check_batch_causality(self, st, now):
        ids = st.b_ids[: st.s.b_len]
        arr = st.arrival[ids]
        late = ~(arr <= now)  # NaN (never arrived) too
        if late.any():
            r = int(ids[np.argmax(late)])
            self._fail("causality", f"request {r} is scheduled at {now!r} but arrives at "
                                    f"{float(st.arrival[r])!r}", now)

    def _check_batch(self, cfg, st, now):
        from servesim.sched.state import B_STATIC, MEMBERS

        name = "batch_limits"
        nb = int(st.s.b_len)
        ids, new = st.b_ids[:nb], st.b_new[:nb]
        if len(np.unique(ids)) != nb:
            self._fail(name, f"the batch lists a request twice: {ids.tolist()}", now)
        if nb and (new < 1).any():
            r = int(ids[np.argmax(new < 1)])
            self._fail(name, f"request {r} is scheduled for {int(new[np.argmax(new < 1)])} tokens (at least 1)", now)
        if nb:
            need = st.prompt[ids].astype(np.int64) + st.num_output[ids] - st.computed[ids]
            over = new > need
            if over.any():
                i = int(np.argmax(over))
                self._fail(name, f"request {int(ids[i])} is scheduled for {int(new[i])} tokens but needs "
                                 f"{int(need[i])} (prompt + outputs so far - computed)", now)
        total = int(new.sum())
        if total > cfg.budget:
            self._fail(name, f"the batch computes {total} tokens > max_num_batched_tokens {cfg.budget}", now)
        run_len = int(st.s.run_len)
        if run_len > cfg.max_seqs:
            self._fail(name, f"{run_len} requests run > the cap of {cfg.max_seqs} (max_num_seqs / "
                             f"max_running_requests)", now)
        if cfg.batch_rule == B_STATIC and run_len + int(st.q_len[MEMBERS]) > cfg.batch_cap:
            self._fail(name, f"the static batch has {run_len} running + {int(st.q_len[MEMBERS])} forming "
                             f"> max_batch_size {cfg.batch_cap}", now)
        for r in ids:
            if int(st.status[r]) != RUNNING:
                self._fail(name, f"request {int(r)} is in the batch with status {_status(st.status[r])}", now)

    def _check_kv(self, cfg, st, kv, now):
        from servesim.kv.kernels import KVState

        if isinstance(kv, KVState) and kv.prefix:
            kv = self._kv  # a prefix cache: its counters and check, as the object's were
        if isinstance(kv, KVState):
            held, free, total = kv.held, int(kv.s[0].free), int(kv.num_blocks)
            held_total = int(held.astype(np.int64).sum())
            if (held < 0).any() or free < 0 or free > total:
                self._fail("kv_capacity", f"block counts out of range: free {free} of {total}, "
                                          f"min held {int(held.min(initial=0))}", now)
            if held_total + free != total:
                self._fail("kv_conserved", f"blocks held {held_total} + free {free} != pool {total}", now)
            holding = np.flatnonzero(held > 0)
            stray = holding[st.status[holding] != RUNNING]
            if len(stray):
                r = int(stray[0])
                self._fail("kv_conserved", f"request {r} ({_status(st.status[r])}) still holds "
                                           f"{int(held[r])} blocks", now)
            bs = int(kv.block_size)
        else:
            self._check_object_kv(st, kv, now)
            held = getattr(kv, "held", None)
            bs = int(kv.block_size)
        if held is not None:
            self._check_slots(st, held, bs, now)
        swap = int(st.s.swap_used)
        if swap < 0 or (cfg.swap and swap > cfg.swap_capacity):
            self._fail("kv_capacity", f"{swap} token slots swapped out; the host swap space holds "
                                      f"{cfg.swap_capacity}", now)

    def _check_slots(self, st, held, bs, now):
        """Every running request holds slots for what it computed plus what it computes now."""
        run = st.run[: st.s.run_len]
        need = st.computed[run].astype(np.int64)
        nb = int(st.s.b_len)
        if nb:
            pos = {int(r): i for i, r in enumerate(run)}
            for r, n in zip(st.b_ids[:nb], st.b_new[:nb]):
                i = pos.get(int(r))
                if i is not None:
                    need[i] += int(n)
        short = held[run].astype(np.int64) * bs < need
        if short.any():
            i = int(np.argmax(short))
            r = int(run[i])
            self._fail("kv_capacity", f"request {r} computes up to token {int(need[i])} with "
                                      f"{int(held[r])} blocks of {bs} slots", now)

    def _check_object_kv(self, st, kv, now):
        """A Python KV manager (prefix caching, tiers): pool counts, then its own check (ref counts
        against block tables), then each lower tier's conservation and capacity, recomputed."""
        total, free, used = int(kv.num_blocks), int(kv.free_blocks), int(kv.used_blocks)
        if free < 0 or used < 0 or free > total:
            self._fail("kv_capacity", f"block counts out of range: free {free}, used {used}, pool {total}", now)
        if free + used != total:
            self._fail("kv_conserved", f"blocks used {used} + free or cached {free} != pool {total}", now)
        held = getattr(kv, "held", None)
        if held is not None:
            holding = np.flatnonzero(held > 0)
            stray = holding[(st.status[holding] != RUNNING) & (st.status[holding] != WAITING)]
            if len(stray):
                r = int(stray[0])
                self._fail("kv_conserved", f"request {r} ({_status(st.status[r])}) still holds "
                                           f"{int(held[r])} blocks", now)
        stack = getattr(kv, "tiers", None)
        if stack is not None:
            check_tiers(stack, now)
        try:
            kv.check()
        except AssertionError as exc:
            self._fail("kv_conserved", f"the KV manager's own check: {exc}", now)

    def _check_order(self, cfg, st, now, waiting_before, never_before):
        """fifo / priority_order over this decision's first admissions and who it left waiting:
        FIFO against the requests never admitted (a preempted one may be re-queued at the back,
        as SGLang's retraction does); class order against every request left waiting (the
        priority policy re-queues a preempted request at the front of its class)."""
        if len(waiting_before) == 0:
            return
        wb = waiting_before
        fresh_mask = never_before & (st.t_sched[wb] == now)
        left_mask = (st.status[wb] == WAITING) & ~fresh_mask
        if self._aside:
            keep = np.array([int(r) not in self._aside for r in wb], dtype=bool)
            fresh_mask &= keep
            left_mask &= keep
        fresh, left = wb[fresh_mask], wb[left_mask]
        never = wb[left_mask & never_before]  # FIFO is about first admissions: never-admitted ones
        if len(fresh) == 0 or len(left) == 0:
            return
        arr = st.arrival
        if self.order == "fifo":
            if len(never):
                _ordered_or_fail("fifo", fresh, never, lambda r: (arr[r], r), now, "arrived earlier")
            return
        kl = st.klass
        for g in np.unique(kl[fresh]):
            f, w = fresh[kl[fresh] == g], never[kl[never] == g]
            if len(w):
                _ordered_or_fail("fifo", f, w, lambda r: (arr[r], r), now, f"of class P{int(g)} arrived earlier")
        if self.order == "classes":
            aging = float(cfg.aging_s)

            def key(r):
                g = int(kl[r])
                if aging > 0.0 and g > 0:
                    g = max(0, g - int((now - float(arr[r])) // aging))
                return (g, float(arr[r]), int(r))

            _ordered_or_fail("priority_order", fresh, left, key, now,
                             "ranks ahead (effective class, arrival, id)")

    # ------------------------------------------------------------------------ iterations
    def on_iteration(self, t0, t1, ids, new) -> None:
        """The iteration hook: time order, and what causality needs at the end."""
        self.stats.iterations += 1
        t0, t1 = float(t0), float(t1)
        if t0 < self._last_end:
            self._fail("time_monotone", f"an iteration starts at {t0!r} before the previous one ended "
                                        f"({self._last_end!r})", t0)
        if t1 < t0:
            self._fail("time_monotone", f"an iteration ends at {t1!r} before it starts ({t0!r})", t0)
        self._last_end = t1
        t = self._table
        if t is None:
            return
        arr = t.arrival[ids]
        if (~(arr <= t0)).any():
            r = int(ids[np.argmax(~(arr <= t0))])
            self._fail("causality", f"request {r} computes in an iteration starting at {t0!r} but arrives "
                                    f"at {float(t.arrival[r])!r}", t0)
        first = self._first_t0
        fresh = np.isnan(first[ids])
        if fresh.any():
            first[ids[fresh]] = t0
        self._last_t1[ids] = t1
        no_token = np.isnan(t.t_first_token[ids])
        for r in ids[no_token]:
            self._token_iters.setdefault(int(r), []).append((t0, t1))

    # ------------------------------------------------------------------------ end of run
    def finish(self, result) -> CheckStats:
        """End-of-run checks on the Result of the watched run; returns what was checked."""
        if self._table is None:
            raise RuntimeError("Checker.finish called before attach(built)")
        self._check_causality_end()
        self._check_kv_returned()
        check_counts(result)
        check_percentiles(result.summary)
        check_fragmentation(result)
        return self.stats

    def _check_kv_returned(self):
        """kv_conserved at the end: when every request has ended, every block is back (the prefix
        cache keeps them as cached-free); otherwise, only requests still in flight hold blocks."""
        from servesim.kv.kernels import KVState

        t, kv = self._table, self._kv
        if isinstance(kv, KVState):  # the count and extent allocators
            held, free, total = kv.held, int(kv.s[0].free), int(kv.num_blocks)
            if int(held.astype(np.int64).sum()) + free != total:
                self._fail("kv_conserved", f"at the end: blocks held {int(held.sum())} + free {free} != pool {total}")
        else:
            held, free, total = getattr(kv, "held", None), int(kv.free_blocks), int(kv.num_blocks)
            if free + int(kv.used_blocks) != total:
                self._fail("kv_conserved", f"at the end: blocks used {int(kv.used_blocks)} + free {free} != "
                                           f"pool {total}")
            if getattr(kv, "tiers", None) is not None:
                check_tiers(kv.tiers)
            try:
                kv.check()
            except AssertionError as exc:
                self._fail("kv_conserved", f"at the end, the KV manager's own check: {exc}")
        if held is not None:
            ended = (t.status == FINISHED) | (t.status == REJECTED) | (t.status == PENDING)
            stray = np.flatnonzero(ended & (held > 0))
            if len(stray):
                r = int(stray[0])
                self._fail("kv_conserved", f"at the end, request {r} ({_status(t.status[r])}) still holds "
                                           f"{int(held[r])} blocks")
        if not ((t.status == WAITING) | (t.status == RUNNING)).any() and free != total:
            self._fail("kv_conserved", f"every request ended but only {free} of {total} blocks are free")

    def _check_causality_end(self):
        t = self._table
        name = "causality"
        rej = np.flatnonzero(t.status == REJECTED)
        for r in rej:
            scheduled = not np.isnan(t.t_first_sched[r]) or not np.isnan(self._first_t0[r])
            if not (t.t_finish[r] == t.arrival[r]) or scheduled:
                self._fail(name, f"rejected request {int(r)} was scheduled, or ended at {float(t.t_finish[r])!r} "
                                 f"instead of its arrival {float(t.arrival[r])!r}")
        sched = np.flatnonzero(~np.isnan(t.t_first_sched))
        for r in sched:
            r = int(r)
            a, s = float(t.arrival[r]), float(t.t_first_sched[r])
            if not a <= s:
                self._fail(name, f"request {r} was first scheduled at {s!r} before it arrived at {a!r}")
            f0 = float(self._first_t0[r])
            if not math.isnan(f0) and f0 < s:
                self._fail(name, f"request {r} computed at {f0!r}, before its first scheduling at {s!r}")
        tokened = np.flatnonzero(~np.isnan(t.t_first_token))
        for r in tokened:
            r = int(r)
            ft = float(t.t_first_token[r])
            iters = [(t0, t1) for (t0, t1) in self._token_iters.get(r, ()) if t1 == ft or (self._lag and t1 <= ft)]
            if not iters:
                self._fail(name, f"request {r}'s first token at {ft!r} is not the end of an iteration that "
                                 f"computed it")
            t0 = min(x[0] for x in iters)
            a = float(t.arrival[r])
            if not t0 >= a:
                self._fail(name, f"request {r}'s first token at {ft!r} comes from a step starting at {t0!r}, "
                                 f"before its arrival at {a!r}")
        done = np.flatnonzero(t.status == FINISHED)
        for r in done:
            r = int(r)
            fin, ft, last = float(t.t_finish[r]), float(t.t_first_token[r]), float(self._last_t1[r])
            if not fin >= ft:
                self._fail(name, f"request {r} finished at {fin!r} before its first token at {ft!r}")
            if fin != last and not (self._lag and fin > last):
                self._fail(name, f"request {r} finished at {fin!r} but its last iteration ended at {last!r}")
            if not float(t.t_last_token[r]) <= fin:
                self._fail(name, f"request {r}'s last token at {float(t.t_last_token[r])!r} is after its "
                                 f"finish at {fin!r}")
            if int(t.num_output[r]) != int(t.output[r]):
                self._fail(name, f"request {r} finished with {int(t.num_output[r])} of {int(t.output[r])} "
                                 f"output tokens")
        pending_done = np.flatnonzero((t.status == PENDING) & ~np.isnan(self._first_t0))
        if len(pending_done):
            self._fail(name, f"request {int(pending_done[0])} computed but never arrived")


def _ordered_or_fail(name, fresh, left, key, now, what):
    """No request left waiting may rank before a request admitted now."""
    best_left = min(left, key=key)
    last_fresh = max(fresh, key=key)
    if key(best_left) < key(last_fresh):
        raise InvariantViolation(name, f"request {int(last_fresh)} was first admitted while request "
                                       f"{int(best_left)}, which {what}, still waits", now)


_STATUS = {0: "pending", 1: "waiting", 2: "running", 3: "finished", 4: "rejected"}


def _status(code) -> str:
    return _STATUS.get(int(code), f"status {int(code)}")
