"""The scheduler contract: what a policy sees, what it returns, and why requests wait.

A policy is called at every iteration boundary. It may admit waiting requests, preempt running
ones and allocate KV slots (through the KV manager, never by touching blocks), and returns the
:class:`Batch` of the next iteration: which requests compute how many tokens. It also says, per
SLA class, what currently blocks a waiting request of that class (a :class:`Cause`): the engine
integrates those causes over time into per-request "blocked seconds by cause".

The engine's fast path relies on one promise, :attr:`Batch.stable`: if nothing happens (no arrival,
no completion, no failed KV allocation, no ``horizon_s`` reached), the policy's next decisions would
be the same decode batch again. Then the engine advances many decode iterations in one step instead
of calling the policy each time. A policy that cannot promise it returns ``stable=False`` and is
called every iteration; results are identical either way, only slower.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from servesim.request import CAUSE_LABELS, CAUSE_NAMES, NUM_CAUSES, NUM_CLASSES, Cause  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from servesim.engine.state import ReplicaState
    from servesim.scenario import EngineConfig


def uniform_causes(cause: Cause) -> np.ndarray:
    return np.full(NUM_CLASSES, int(cause), dtype=np.int64)


@dataclass
class Batch:
    """One iteration's work: request ``ids[i]`` computes ``num_new[i]`` tokens."""

    ids: np.ndarray  # int64 request ids, in the policy's order
    num_new: np.ndarray  # int64 tokens per request, >= 1
    waiting_cause: np.ndarray  # int64 [NUM_CLASSES]: what blocks a waiting request of each class
    pure_decode: bool = False  # every request computes 1 token and samples one
    stable: bool = False  # see module docstring
    horizon_s: float = float("inf")  # the decision may change at this time without an event
    # multi-step: run this decode batch for up to ``steps`` iterations before asking the policy
    # again (arrivals wait for the boundary; a completion or a KV shortage ends the burst early);
    # its tokens reach clients at the end of the burst
    steps: int = 1
    # seconds added to this iteration besides compute (e.g. a swap over PCIe that blocks it)
    extra_s: float = 0.0
    notes: dict = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return len(self.ids) == 0


class Policy(Protocol):
    """A scheduling policy. Built once per replica with the engine config and the replica state."""

    name: str

    def enqueue(self, rid: int, now: float) -> None:
        """A request arrived (or was preempted back): put it in the waiting structure."""

    def schedule(self, now: float) -> Batch:
        """Admit, preempt, allocate; return the next iteration's batch."""

    def num_waiting(self) -> int: ...

    def on_finished(self, rid: int) -> None:
        """A running request finished (its blocks are already freed)."""


_POLICIES: dict[str, str] = {
    # name -> "module:Class"; resolved lazily so importing the registry stays cheap
    "vllm": "servesim.sched.continuous:ContinuousBatching",
    "static-fifo": "servesim.sched.static_fifo:StaticFIFO",
    "chunked": "servesim.sched.chunked:ChunkedPrefill",
    "priority": "servesim.sched.priority:PriorityScheduling",
}


def register_policy(name: str, target: str) -> None:
    _POLICIES[name] = target


def policy_names() -> list[str]:
    return sorted(_POLICIES)


POLICY_METHODS = ("enqueue", "schedule", "num_waiting", "on_finished")


class UnknownPolicy(KeyError):
    """``engine.scheduler`` names no policy; ``why`` says what was found instead (or '')."""

    def __init__(self, name: str, why: str = ""):
        super().__init__(name)
        self.why = why


def resolve_policy(name: str):
    """Name from the registry, or an import path ``package.module:Class`` for user policies.

    Only a class with the policy methods (:data:`POLICY_METHODS`) is returned: the scheduler
    field names a class to build, never an arbitrary object to call (``os:system``). Raises
    :class:`UnknownPolicy` (a KeyError)."""
    import importlib
    import inspect

    target = _POLICIES.get(name, name if ":" in name else None)
    if target is None:
        raise UnknownPolicy(name)
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise UnknownPolicy(name, "an import path is 'package.module:Class'")
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise UnknownPolicy(name, f"cannot import {module!r} ({exc})") from None
    except Exception as exc:  # the user's module failed while importing
        raise UnknownPolicy(name, f"importing {module!r} failed: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise UnknownPolicy(name, f"{module!r} has no {attr!r}")
    missing = [m for m in POLICY_METHODS if not callable(getattr(obj, m, None))]
    if not inspect.isclass(obj) or missing:
        what = (f"a class without {', '.join(missing)}" if inspect.isclass(obj)
                else f"a {type(obj).__name__}, not a class")
        raise UnknownPolicy(name, f"{target!r} is {what}; a policy is a class with methods "
                                  f"{', '.join(POLICY_METHODS)} (docs/schedulers.md)")
    return obj


def build_policy(cfg: "EngineConfig", state: "ReplicaState") -> Policy:
    return resolve_policy(cfg.scheduler)(cfg, state)
