"""The request path's arrival side as a queue of API servers (``engine.api_server_count``).

By default the request path (``engine.api_request_s``: parsing, chat template, tokenization) is
a latency: every request reaches the scheduler that long after its send, whatever the load -- a
pipeline that keeps pace. A real API server is a process on one CPU (vLLM's is one Python
process per replica unless ``--api-server-count N``), so a burst queues in front of it. With
``api_server_count`` set, the path is a FIFO queue of ``servers`` identical servers, each busy
``api_request_s`` per request, over the open-loop send times in send order::

    start_i = max(sent_i, start_{i-servers} + api_request_s)     (start_i = sent_i for i < servers)
    the scheduler (router) sees request i at start_i + delay_in  (delay_in: api_request_s + the cluster's)

With one service time for every request, FIFO over ``c`` servers needs no server bookkeeping:
the server request ``i`` takes is the one request ``i - c`` freed (departures keep the send order),
so the recursion is exact. A request that finds a server free starts at its send time, so its
arrival is ``sent + delay_in`` bit for bit, as the latency model computes it: far-apart arrivals
give the latency model's results exactly. The starts never decrease in send order, so the shifted
arrivals stay sorted (the fleet inbox's cursor needs that).

Why a transform of the send times, not a process on the clock: the open-loop send times are known
before the run, and the queue depends on nothing the engines do, so it is computed once, ahead of
routing -- in the same places the latency shift is applied (engine/fleet_build.py, the sharded
build in simulate.py) -- and leaves the compiled kernels alone. A closed loop sends from inside
the engine (scenario.py refuses the option with one). A fleet's pool is ``api_server_count`` x
replicas servers ahead of the router (the replicas' API servers pooled): exact for one replica,
and for round-robin routing (request ``k`` in send order goes to replica ``k mod R``, so a
replica's ``c`` servers see every ``R``-th request: the same recursion at lag ``c R``); for
``random`` and the routers that read load it is an approximation: a request may take any replica's
free server, in one FIFO order over the fleet, where separate queues would hold a replica the router
sends more to longer. The pool is sized once, from the replicas at the start (autoscaling and
failures do not resize it).
"""

from __future__ import annotations

import numpy as np


class ApiQueue:
    """Starts of service of the open-loop rows of a run (NaN send time: a closed-loop row, left
    alone). ``sent``: client send times by row (a copy is kept: results are restored to them)."""

    def __init__(self, sent: np.ndarray, service_s: float, servers: int):
        self.service_s = float(service_s)
        self.servers = int(servers)
        self.sent = np.array(sent, dtype=np.float64)
        open_rows = np.flatnonzero(np.isfinite(self.sent))
        self.order = open_rows[np.argsort(self.sent[open_rows], kind="stable")]  # send order (ties: row order)
        self.start = np.full(len(self.sent), np.nan)
        self._serve(0)

    def _serve(self, k0: int) -> None:
        """The recursion from send position ``k0`` on (earlier starts are kept)."""
        c, s = self.servers, self.service_s
        order = self.order
        sent = self.sent[order].tolist()
        start = self.start[order].tolist()
        for k in range(k0, len(order)):  # (a float loop: ~0.3 s per million requests)
            a = sent[k]
            if k >= c:
                free = start[k - c] + s
                start[k] = a if a >= free else free
            else:
                start[k] = a
        self.start[order] = start

    def arrivals(self, arrival: np.ndarray, delay_in: float) -> np.ndarray:
        """``arrival`` with each open row at ``start + delay_in`` (what the router sees)."""
        out = np.array(arrival, dtype=np.float64)
        rows = self.order
        out[rows] = self.start[rows] + delay_in
        return out

    def resend(self, rows: np.ndarray, sent: np.ndarray, arrival: np.ndarray, delay_in: float) -> None:
        """Rows not yet sent get new send times (``FleetHandle.set_rate``: a time warp, so the
        send order stays): the queue is served again from the first of them, every start before it
        kept, and ``arrival`` (the table's column) is updated in place from there on."""
        if not len(rows):
            return
        self.sent[rows] = sent
        pos = np.empty(len(self.sent), dtype=np.int64)
        pos[self.order] = np.arange(len(self.order))
        k0 = int(pos[rows].min())
        tail = self.order[k0:]
        if not np.array_equal(np.sort(tail), np.sort(rows)) or np.any(np.diff(self.sent[tail]) < 0):
            raise ValueError("set_rate: the requests moved are not the queue's unsent tail in send order (a bug)")
        self._serve(k0)
        arrival[tail] = self.start[tail] + delay_in

    def client_arrivals(self, arrival: np.ndarray, delay_in: float) -> np.ndarray:
        """After the run: every row ``delay_in`` earlier, as the latency model restores it (so a
        request that found a server free reads as it does there, to the last bit), and a request
        that waited back to its send time."""
        out = np.asarray(arrival, dtype=np.float64) - delay_in if delay_in else np.array(arrival, dtype=np.float64)
        rows = self.order
        waited = rows[self.start[rows] != self.sent[rows]]
        out[waited] = self.sent[waited]
        return out

    def waits(self) -> np.ndarray:
        """Seconds each open row waited for a server (send order)."""
        return self.start[self.order] - self.sent[self.order]


def queue_arrivals(sc, table) -> None:
    """``table.arrival`` as the router sees the requests: the open-loop rows ``sc.delay_in_s``
    after their send (the latency model), or, with ``engine.api_server_count``, after their wait
    for an API server too; the queue is kept on the table (``table.api_queue``) so the results
    are restored to the client's send times (metrics/cluster.py ``restore_client_times``)."""
    d = sc.delay_in_s
    n = sc.engine.api_server_count
    if n is None:
        if d:
            table.arrival = np.where(np.isfinite(table.arrival), table.arrival + d, table.arrival)
        return
    q = ApiQueue(table.arrival, sc.engine.api_request_s, n * sc.num_replicas)
    table.api_queue = q
    if d:
        table.arrival = q.arrivals(table.arrival, d)


def queue_summary(sc, table, end_s: float) -> dict | None:
    """The summary's ``request_path`` block (only with ``engine.api_server_count``): the path's
    values, the pool, and the waits for a server of the requests sent by the end of the run."""
    e = sc.engine
    if e.api_server_count is None:
        return None
    q = getattr(table, "api_queue", None)
    waits = np.zeros(0)
    if q is not None:
        sent = q.sent[q.order]
        waits = q.waits()[sent <= end_s]
    stats = {"mean": float(waits.mean()) if len(waits) else 0.0,
             "p50": float(np.percentile(waits, 50)) if len(waits) else 0.0,
             "p99": float(np.percentile(waits, 99)) if len(waits) else 0.0,
             "max": float(waits.max()) if len(waits) else 0.0}
    return {"api_request_s": e.api_request_s, "api_token_s": e.api_token_s, "api_server_count": e.api_server_count,
            "servers": e.api_server_count * sc.num_replicas,
            "pooled_over_replicas": sc.num_replicas > 1,
            "requests": int(len(waits)), "queued": int(np.count_nonzero(waits > 0)), "wait_s": stats}
