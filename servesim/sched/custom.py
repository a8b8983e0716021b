"""Your own policy: a built-in composition with some parts replaced by your Python functions.

``engine.scheduler: mypackage.mymodule:MyPolicy`` names a class like::

    class ShortestPromptFirst:
        '''FCFS continuous batching, but the shortest waiting prompt is admitted first.'''
        base = "vllm"                      # the built-in policy it starts from
        parts = {"head": shortest_prompt}  # parts replaced by your functions
        options = {}                       # extra engine.options: name -> (default, check, allowed)

A part is a function with the signature of the kernel it replaces (servesim/sched/):

``head(cfg, st, now) -> (rid, queue, effective_class)``
    queue discipline: which waiting request is considered next (rid -1 if none); the default
    takes the head of the oldest queue (FIFO) or of the most urgent class (CLASSES).
``victim(cfg, st, rid) -> victim_rid``
    whom to preempt when running requests run out of KV (``rid`` is the request asking).
``admit_head(cfg, st, kv, rid, queue, now, cap, hybrid) -> tokens or a NO_* code``
    the admission rule for the request ``head`` chose.
``schedule(cfg, st, kv, now)``
    the whole batch rule (fill ``st.b_ids``/``st.b_new``, ``st.cause_next``, the batch flags).

``cfg`` is the frozen :class:`~servesim.sched.state.EngineCfg`, ``st`` the replica's arrays
(:class:`~servesim.sched.state.ReplicaState`: request columns, queues as linked lists over
``q_next`` with ``q_head``/``q_tail``/``q_len``, the running set ``run[:st.s.run_len]``...). Your
parts run on the uncompiled engine (the run's header says so); the rest of the policy is the same
source the compiled engine runs. docs/schedulers.md has a worked example and how to test a part.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from servesim.errors import ScenarioError
from servesim.policy_catalog import POLICIES, PolicySpec
from servesim.sched import parts, policies, queues

PARTS: dict[str, Any] = {
    "head": queues.head,
    "victim": parts.victim,
    "admit_head": parts.admit_head,
    "schedule": policies.schedule,
}


@dataclasses.dataclass(frozen=True)
class UserPolicy:
    spec: PolicySpec
    overrides: dict  # kernel -> the user's function
    path: str


def load_user_policy(path: str) -> UserPolicy:
    """Import ``module:Class`` (a path the user wrote) and check it describes a policy. Raises
    ValueError with one line naming what is wrong."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"engine.scheduler {path!r}: a user policy is named 'package.module:Class'")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"engine.scheduler {path!r}: cannot import it ({exc})") from None
    if not isinstance(obj, type):
        raise ValueError(f"engine.scheduler {path!r} is a {type(obj).__name__}, not a policy class "
                         f"(a class with 'base' and 'parts'; see docs/schedulers.md)")
    base = getattr(obj, "base", None)
    if base not in POLICIES:
        raise ValueError(f"engine.scheduler {path!r}: its 'base' = {base!r} must name a built-in policy "
                         f"({', '.join(sorted(POLICIES))})")
    given = getattr(obj, "parts", None)
    if not isinstance(given, dict) or not given:
        raise ValueError(f"engine.scheduler {path!r}: 'parts' must be a non-empty dict of part name -> "
                         f"function (parts: {', '.join(PARTS)})")
    overrides: dict[Any, Callable] = {}
    for key, fn in given.items():
        if key not in PARTS:
            raise ValueError(f"engine.scheduler {path!r}: unknown part {key!r} (parts: {', '.join(PARTS)})")
        if not callable(fn):
            raise ValueError(f"engine.scheduler {path!r}: part {key!r} is not a function")
        overrides[PARTS[key]] = fn
    extra = getattr(obj, "options", {}) or {}
    spec = dataclasses.replace(POLICIES[base], name=path, options={**POLICIES[base].options, **extra})
    return UserPolicy(spec, overrides, path)


def user_policy_loader() -> Callable[[Any], UserPolicy | None]:
    """``user(gsc)``: the user policy a replica group's ``engine.scheduler`` names (None for a
    built-in one), each imported once per run. One function, so a run in one process
    (servesim/simulate.py) and a sharded one (its coordinator and each worker,
    servesim/engine/shard_worker.py) refuse a bad policy with the same one line: ScenarioError
    (exit 2 through the CLI), where :func:`load_user_policy` raises ValueError."""
    loaded: dict[str, UserPolicy] = {}

    def user(gsc) -> UserPolicy | None:
        name = gsc.engine.scheduler
        if name in POLICIES:
            return None
        if name not in loaded:
            try:
                loaded[name] = load_user_policy(name)
            except ValueError as exc:
                raise ScenarioError(str(exc)) from None
        return loaded[name]

    return user
