"""Scheduling policies, written once as kernels (numba-compiled, or run as Python).

A policy is a composition of parts -- a queue discipline (``queues``), an admission rule and a
victim rule (``parts``), a batch rule (``policies``) -- over the replica's arrays (``state``).
``compose`` builds a policy's configuration from the catalog (``servesim.policy_catalog``);
``custom`` loads a user's policy (a built-in with some parts replaced). See docs/schedulers.md.
"""

__all__ = ["parts"]  # the built-in parts, for a policy of yours that calls one (docs/testing.md)
