"""The autoscaler (``cluster.autoscale``): a SimPy process on the run's clock that starts and
stops replicas through the fleet handle (engine/processes.py), as Kubernetes' horizontal pod
autoscaler does::

    every interval_s:
      value  = mean of the metric over the serving replicas
      wanted = ceil(serving * value / target), within [min_replicas, slots]
      wanted > provisioned (loading ones count)  ─► start replicas (serve after scale_up_delay_s)
      wanted < serving                           ─► stop the highest-numbered (drained, then released)
      (a decision at most every cooldown_s)

Scaling up counts replicas still loading, so a slow model load does not start a replica per look
(the HPA's "unready pods" rule). The summary's ``scaling`` block has the replica count over time
and the replica-seconds and GPU-hours it cost.
"""

from __future__ import annotations

import math


def metric_value(fleet, metric: str) -> float:
    """The metric's mean over the serving replicas."""
    on = fleet.serving()
    if not on.any():
        return 0.0
    per = {"waiting": fleet.queue_lengths, "outstanding": fleet.outstanding, "running": fleet.running,
           "kv_used": fleet.kv_used}[metric]()
    return float(per[on].mean())


def autoscale_process(cfg):
    def autoscale(env, fleet):
        last = -math.inf
        while True:
            yield env.timeout(cfg.interval_s)
            if env.now - last < cfg.cooldown_s:
                continue
            serving = int(fleet.serving().sum())
            value = metric_value(fleet, cfg.metric)
            wanted = math.ceil(serving * value / cfg.target - 1e-9) if serving else cfg.min_replicas
            wanted = min(max(wanted, cfg.min_replicas), fleet.replicas)
            capacity = serving + fleet.loading()  # (replicas draining to release do not count)
            if wanted > capacity:
                free = int((~fleet.provisioned()).sum())  # (a draining replica's slot is not free yet)
                for _ in range(min(wanted - capacity, free)):
                    fleet.add_replica(cfg.scale_up_delay_s)
                last = env.now
            elif wanted < serving:
                for _ in range(serving - wanted):
                    fleet.remove_replica()
                last = env.now

    autoscale.__qualname__ = "autoscale"
    return autoscale
