"""Build one kernel instance of a fleet (a replica, or a virtual engine of one): the policy's
configuration, its arrays over the request table, its closed loops when it holds its own
arrivals, and the :class:`~servesim.engine.driver.Engine` that runs it."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Callable

import numpy as np

from servesim.engine.driver import Engine
from servesim.hardware import GPUS
from servesim.jit import pure
from servesim.kv.kernels import KVState, kv_max_slots
from servesim.request import RequestTable, Workload
from servesim.sched.compose import compose, policy_spec
from servesim.sched.state import new_scalars, new_state
from servesim.workload.streams import stream

ITL_CAP = 1 << 14  # new_state's ITL buffer (a lone replica's); a fleet engine's is at most half its recorder rows

if TYPE_CHECKING:
    from servesim.metrics.collect import Recorder

INF = float("inf")


@cache
def _pure(k):
    """``pure(k)``, built once per process (it walks the kernel's module globals: ~0.5 ms a call,
    a sixth of a small run's build)."""
    return pure(k)


def kernel_tables(model, max_tokens: int, max_seqs: int):
    """The kernels' step-time tables of a built-in model, or None (a Python model)."""
    from servesim.perf.base import KernelModel

    return model.tables(max_tokens, max_seqs) if isinstance(model, KernelModel) else None


def closed_groups(sc, table: RequestTable, workload: Workload, seed: int) -> tuple:
    """The closed loops of a run: the workload's groups (ramped or per-stream loops), or the
    scenario's one closed loop over every row (think times drawn from the "think" stream)."""
    from servesim.request import ClosedGroup
    from servesim.scenario import ClosedArrival

    if workload.closed_groups:
        if np.shares_memory(table.arrival, workload.arrival_s):
            table.arrival = table.arrival.copy()  # closed-loop arrivals are written during the run
        return tuple(workload.closed_groups)
    arr = sc.workload.arrival
    if not (isinstance(arr, ClosedArrival) and sc.workload.streams is None and sc.workload.trace is None):
        return ()
    n = table.n
    think = np.full(n, float(arr.think_s))
    if arr.think_dist == "exponential" and arr.think_s > 0:
        think = stream(seed, "think").exponential(arr.think_s, n)
    clients = min(arr.clients, n)
    return (ClosedGroup(0, n, clients, np.zeros(clients), think),)


def client_columns(groups: tuple, n: int) -> dict:
    """The closed loops' per-request columns for ``new_state`` (think time, group of each row, each
    group's row range) and the arrival heap's size (one pending arrival per client at most)."""
    think = np.zeros(n if groups else 0)
    group_of = np.full(n if groups else 0, -1, dtype=np.int16)
    for gi, g in enumerate(groups):
        think[g.lo:g.hi] = g.think_s
        group_of[g.lo:g.hi] = gi
    return {"think": think, "group_of": group_of, "heap_cap": sum(g.clients for g in groups) + 1,
            "g_next": np.array([g.lo for g in groups], dtype=np.int64),
            "g_hi": np.array([g.hi for g in groups], dtype=np.int64)}


def build_replica(sc, table: RequestTable, kv_obj, model, recorder: "Recorder", seed: int, *,
                  workload: Workload,
                  on_iteration: Callable | None = None, progress: Callable[[int], None] | None = None,
                  kv_bytes_per_token: int = 0, force_python: str | None = None, spec=None,
                  user_parts: dict | None = None, buffers: tuple[int, int] | None = None,
                  stop_when_drained: bool = True, routed: bool = False, report_ended: bool = False,
                  shared=None, scalars: np.ndarray | None = None, groups: tuple | None = None,
                  index: int = 0, plan=None, direct: bool = False) -> Engine:
    """One replica (a kernel instance, the fleet's engine ``index``; ``plan``: its memory plan)
    over ``table``; ``direct``: see :class:`~servesim.engine.driver.Engine`. ``routed``: a fleet's replica (its requests come from the
    router, closed loops are the fleet's; ``report_ended`` lists ended requests for them), else
    its inbox holds the arrivals and ``groups`` the closed loops (:func:`closed_groups`, drawn
    here if None), ``shared``: the fleet's per-request working arrays
    (servesim.sched.state.request_arrays)."""
    e = sc.engine
    n = table.n
    if groups is None:
        groups = () if routed else closed_groups(sc, table, workload, seed)
    closed = bool(groups)
    warmup = sc.stop.warmup_requests
    warmup_id = warmup if 0 < warmup < n else -1  # ITL counts from that request's arrival on
    # a built-in pool's state (count allocators, or a prefix cache's PrefixPool), else a Python object
    kv_state = kv_obj if isinstance(kv_obj, KVState) else getattr(kv_obj, "state", None)
    if kv_state is None and force_python is None:
        force_python = "the Python reference prefix cache (tests/reference_kv/prefix.py)"
    max_slots = int(_pure(kv_max_slots)(kv_state)) if kv_state is not None else int(kv_obj.max_slots())
    cfg, class_slots = compose(
        e, spec if spec is not None else policy_spec(e.scheduler), max_model_len=sc.max_model_len, max_slots=max_slots,
        block_size=kv_obj.block_size, kv_bytes_per_token=kv_bytes_per_token,
        host_bw=GPUS[sc.hardware.gpu].pcie_bytes_per_s, fast=sc.sim.fast_path, closed=closed,
        max_arrivals=arrival_cap(sc, workload, n) if not routed else n,
        warmup_id=warmup_id, stop_time=sc.stop.duration_s if sc.stop.duration_s is not None else INF,
        check=sc.sim.check_invariants, n=n, stop_when_drained=stop_when_drained,
        kv_tokens=int(kv_obj.num_blocks) * int(kv_obj.block_size), routed=routed, report_ended=report_ended)
    s = new_scalars() if scalars is None else scalars  # (a fleet: this engine's row of the fleet's array)
    tab = kernel_tables(model, e.max_num_batched_tokens, e.max_num_seqs)
    # the tier-fetch bookkeeping (per-request arrays) only where a Python piece may start fetches
    fetches = kv_state is None or bool(kv_state.prefix) or force_python is not None or bool(user_parts)
    st = new_state(table, s=s[0], run_cap=cfg.max_seqs + 1, object_kv=fetches, **client_columns(groups, n),
                   class_slots=class_slots,
                   **({"run_steps": buffers[0], "step_buffer": buffers[1],
                      "itl_cap": min(ITL_CAP, buffers[1] // 2)} if buffers else {}),
                   **({"shared": shared} if shared is not None else {}))
    rec0 = s[0]
    rec0.ratio = cfg.ratio_init
    if warmup_id >= 0 or (warmup > 0 and warmup >= n):  # (warm-up covering every request: no ITL)
        rec0.itl_from = INF
    send_first_requests(st, rec0, table, groups)
    return Engine(cfg, st, kv_state if kv_state is not None else kv_obj, tab if tab is not None else np.zeros(1),
                  recorder, scalars=s, index=index, plan=plan, pool=kv_obj,
                  kv_object=None if kv_state is not None else kv_obj,
                  model_object=None if tab is not None else model, on_iteration=on_iteration,
                  progress=progress, user_parts=user_parts, force_python=force_python, direct=direct)


def arrival_cap(sc, workload: Workload, n: int) -> int:
    """The arrival cap: ``stop.requests`` over closed loops that could send more, else none (n)."""
    return min(sc.stop.requests, n) if workload.closed_groups and sc.stop.requests else n


def send_first_requests(st, rec0, table: RequestTable, groups: tuple, delay_s: float = 0.0) -> None:
    """Each closed loop's clients send their first requests (into the inbox's heap); the open-loop
    cursor starts after the closed-loop rows. ``delay_s``: from the client to the replica."""
    if not groups:
        return
    from servesim.engine.kernel import heap_push

    push = _pure(heap_push)
    for gi, g in enumerate(groups):
        first = min(g.clients, g.hi - g.lo)
        for c in range(first):
            t = float(g.start_s[c]) + delay_s if delay_s else float(g.start_s[c])
            table.arrival[g.lo + c] = t
            push(st, t, g.lo + c)
        st.g_next[gi] = g.lo + first
    rec0.cursor = max(g.hi for g in groups)
