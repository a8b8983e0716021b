"""Scheduling policies behind one small protocol (see :mod:`servesim.sched.base`)."""

from servesim.sched.base import (
    CAUSE_LABELS,
    CAUSE_NAMES,
    NUM_CAUSES,
    Batch,
    Cause,
    Policy,
    build_policy,
    policy_names,
    register_policy,
    resolve_policy,
)

__all__ = [
    "Batch", "Cause", "CAUSE_LABELS", "CAUSE_NAMES", "NUM_CAUSES", "Policy", "build_policy",
    "policy_names", "register_policy", "resolve_policy",
]
