"""Which server's GPUs each replica runs on, or why the fleet cannot be placed.

Servers hold ``gpus_per_server`` GPUs each (``servers`` of them, or as many as the fleet needs).
A replica of ``tp x pp`` GPUs is one pipeline of ``pp`` stages, each stage a tensor-parallel
group of ``tp`` GPUs. Rules (what a real deployment needs):

* a tensor-parallel group never spans servers (its all-reduces run over NVLink);
* a replica sits on one server when some server has room for all of it (first fit, replicas in
  group order); otherwise, with ``pp > 1`` and an inter-server link given, its stages are placed
  one by one (first fit), and each stage boundary between two servers sends its activations over
  that link (the step-time models price those hops: servesim/perf);
* otherwise the placement fails, naming the field to change.

::

    server 0: [r0 r0 r1 r1 r2 r2 r3 r3]     2-GPU replicas, first fit
    server 1: [r4 r4 r4 r4 .. .. .. ..]     r4 tp 2 x pp 2 fits whole on server 1
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaShape:
    """One replica to place: its group's index and label, tensor x pipeline degrees."""

    group: int
    label: str  # how errors name the group ("cluster.groups[1]", or "the scenario's engine")
    field: str  # where its parallelism fields live ("engine", "cluster.groups[1].engine")
    tp: int
    pp: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Placement:
    """Per replica: the server of each pipeline stage; the number of servers used."""

    stages: tuple[tuple[int, ...], ...]
    servers_used: int
    gpus_per_server: int

    def cross_hops(self, replica: int) -> int:
        """Stage boundaries of ``replica`` that cross servers."""
        s = self.stages[replica]
        return sum(1 for a, b in zip(s, s[1:]) if a != b)


def place(replicas: list[ReplicaShape], *, servers: int | None, gpus_per_server: int,
          link: bool) -> Placement:
    """Place ``replicas`` in order; ValueError (one line naming the field) when impossible."""
    free: list[int] = []  # free GPUs per server opened so far
    limit = servers if servers is not None else None

    def first_fit(need: int) -> int:
        for i, f in enumerate(free):
            if f >= need:
                return i
        if limit is None or len(free) < limit:
            free.append(gpus_per_server)
            return len(free) - 1
        return -1

    stages: list[tuple[int, ...]] = []
    for r in replicas:
        if r.tp > gpus_per_server:
            raise ValueError(f"{r.field}.tensor_parallel_size {r.tp} > hardware.gpus_per_server "
                             f"{gpus_per_server}: a tensor-parallel group never spans servers")
        whole = r.gpus <= gpus_per_server
        at = first_fit(r.gpus) if whole else -1
        if at >= 0:
            free[at] -= r.gpus
            stages.append((at,) * r.pp)
            continue
        if r.pp > 1 and link:
            row = []
            for _ in range(r.pp):
                s = first_fit(r.tp)
                if s < 0:
                    break
                free[s] -= r.tp
                row.append(s)
            if len(row) == r.pp:
                stages.append(tuple(row))
                continue
        total = sum(x.gpus for x in replicas)
        if not whole and not (r.pp > 1 and link):
            why = (f"a replica of {r.tp} x {r.pp} = {r.gpus} GPUs does not fit one server of "
                   f"hardware.gpus_per_server {gpus_per_server}, and a replica spans servers only "
                   f"through pipeline stages with hardware.inter_server_link given")
            raise ValueError(f"{r.field}: {why}")
        raise ValueError(
            f"hardware.servers {servers} x gpus_per_server {gpus_per_server} = {servers * gpus_per_server} GPUs "
            f"cannot hold the fleet ({total} GPUs in all; replica #{len(stages)} ({r.label}) does not fit "
            f"what is left); add servers or remove replicas")
    return Placement(tuple(stages), len(free), gpus_per_server)
