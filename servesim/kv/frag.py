"""Fragmentation metrics: where the KV pool's token slots go, step by step.

Every step (iteration) the KV manager reports a :class:`StepUsage`: per step of an iteration or a
decode run, the pool's token slots split as::

    total = used + internal + reservation + external + usable free
            └────── allocated ───────────┘   └──────── free ────────┘

    allocated    slots in blocks held by (or reserved for) requests
    used         slots holding KV of a token (written, or being written this step)
    internal     unwritten slots inside blocks that hold written slots: the partly filled last
                 block of a paged request (at most block_size - 1 per request)
    reservation  reserved blocks with no written slot yet: the unused tail of a static
                 max_seq_len reservation or of an elastic base/growth chunk ("reserved but not
                 used"; at the end of a request it is what was never used)
    external     free slots that cannot hold the next allocation: free extents smaller than the
                 next reservation (static allocator; always 0 for paged and elastic, whose
                 allocations need no contiguity)

The reported metrics are shares of the whole pool (``total``), so they add up with the free share:

    utilization             = allocated / total
    internal_fragmentation  = internal / total  = (allocated - used - reservation) / total
    reservation_waste       = reservation / total
    external_fragmentation  = external / total

Each metric is a step-constant signal; the engine's recorder (servesim/metrics/collect.py) logs
the internal, reservation and external slots of every step next to the blocks in use, integrates
them exactly over time (idle time between steps counts as 0) and keeps their peaks and time bins. ``mean`` is the time average over the run
``[0, sim_time]``; ``peak`` the largest step value. Values at each step depend only on the
allocator's state, so the engine's fast path (many decode steps at once) and single stepping give
the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

@dataclass(frozen=True)
class StepUsage:
    """Token-slot accounting during each of ``k`` consecutive steps (arrays of length ``k``)."""

    total_slots: int
    allocated: np.ndarray
    used: np.ndarray
    reserved_unused: np.ndarray
    external: np.ndarray

    @property
    def internal(self) -> np.ndarray:
        return self.allocated - self.used - self.reserved_unused
