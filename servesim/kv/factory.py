"""Build the KV manager a scenario asks for (one name -> class mapping, no registry boilerplate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.kv.paged import PagedKV

if TYPE_CHECKING:
    import simpy

    from servesim.engine.state import RequestTable
    from servesim.kv.base import KVManager
    from servesim.memory import MemoryPlan
    from servesim.request import Workload
    from servesim.scenario import Scenario


def build_kv(sc: "Scenario", plan: "MemoryPlan", table: "RequestTable", workload: "Workload",
             env: "simpy.Environment") -> "KVManager":
    return PagedKV(plan.num_blocks, sc.engine.block_size, table.computed)
