"""engine.api_server_count: the request path's arrival side as a FIFO queue of API servers
(servesim/engine/api_queue.py). The recursion against hand-computed starts and a brute-force
multi-server queue; a burst's client TTFT includes the wait for a server, and the engine sees
exactly what the latency model shows it when the requests are sent at the queue's starts; far-apart
sends give the latency model's results exactly; unset changes nothing; closed loops and
per-group values are refused; a round-robin fleet's pooled queue equals per-replica queues."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from rich.console import Console

from servesim import simulate
from servesim.engine.api_queue import ApiQueue
from servesim.errors import ScenarioError
from servesim.request import Request, Workload
from servesim.scenario import load_scenario
from tests.conftest import REPO

A = 0.003
QUICK = REPO / "scenarios" / "quickstart.yaml"
BASE = ["stop.requests=120", "stop.warmup_requests=0"]


def scenario(extra, base=BASE):
    return load_scenario(QUICK, base + extra)


def burst(sends, prompt=200, output=4):
    return Workload.from_requests([Request(float(t), prompt, output) for t in sends])


def fifo_starts(sends, c, s):
    """Brute force: c servers (a heap of free times), each request to the earliest free one."""
    free = [0.0] * c
    heapq.heapify(free)
    out = []
    for a in sends:
        f = heapq.heappop(free)
        start = max(a, f)
        out.append(start)
        heapq.heappush(free, start + s)
    return np.array(out)


def test_recursion_by_hand():
    q1 = ApiQueue(np.zeros(5), A, 1)
    assert np.allclose(q1.start, [0, A, 2 * A, 3 * A, 4 * A], rtol=0, atol=1e-15)
    assert np.allclose(q1.arrivals(np.zeros(5), A), [A, 2 * A, 3 * A, 4 * A, 5 * A], rtol=0, atol=1e-15)
    q2 = ApiQueue(np.zeros(5), A, 2)
    assert np.allclose(q2.start, [0, 0, A, A, 2 * A], rtol=0, atol=1e-15)
    # a request that finds a server free starts at its send: arrivals are the latency model's, bit for bit
    sends = np.array([0.0, 0.1, 0.1005, 0.3, np.nan])
    q = ApiQueue(sends, A, 1)
    got = q.arrivals(sends, A + 0.0007)
    assert got[0] == 0.0 + (A + 0.0007) and got[1] == 0.1 + (A + 0.0007) and got[3] == 0.3 + (A + 0.0007)
    assert got[2] == pytest.approx(0.1 + A + A + 0.0007, abs=1e-15)
    assert np.isnan(got[4])  # a closed-loop row is left alone


@pytest.mark.parametrize("c", [1, 2, 3, 7])
def test_recursion_is_the_multi_server_fifo(c):
    rng = np.random.default_rng(c)
    sends = np.sort(np.round(rng.exponential(0.002, 400).cumsum(), 4))  # (rounded: ties happen)
    q = ApiQueue(sends, A, c)
    assert np.array_equal(q.start, fifo_starts(sends, c, A))
    assert np.all(np.diff(q.start) >= 0)  # the router's inbox needs sorted arrivals


def test_burst_single_server_by_hand():
    """5 requests at t=0, 3 ms each, one server: the scheduler sees them at 3, 6, 9, 12, 15 ms; the
    engine's schedule is the latency model's for sends at 0, 3, 6, 9, 12 ms, and the client's TTFT
    adds the wait."""
    sc = scenario(["engine.api_request_s=0.003", "engine.api_server_count=1"])
    q = simulate(sc, workload=burst([0.0] * 5))
    starts, s = [], 0.0
    for _ in range(5):
        starts.append(s)
        s = s + A
    lat = simulate(scenario(["engine.api_request_s=0.003"]), workload=burst(starts))
    x, y = q.requests, lat.requests
    assert (x["arrival_s"].to_numpy() == 0.0).all()  # the client's send times
    sched = np.array(starts) + A  # what the scheduler saw
    assert np.allclose(sched, [0.003, 0.006, 0.009, 0.012, 0.015], rtol=0, atol=1e-15)
    assert (x["first_scheduled_s"].to_numpy() >= sched).all()
    for col in ("first_scheduled_s", "first_token_s", "finish_s"):
        assert np.array_equal(x[col].to_numpy(), y[col].to_numpy()), col
    assert np.allclose(x["ttft_s"].to_numpy(), y["ttft_s"].to_numpy() + np.array(starts), rtol=0, atol=1e-12)
    assert x["ttft_s"].to_numpy()[4] >= 0.015  # queued 12 ms, then 3 ms of service
    rp = q.summary["request_path"]
    assert rp["api_server_count"] == 1 and rp["servers"] == 1 and rp["queued"] == 4 and rp["requests"] == 5
    assert rp["wait_s"]["max"] == pytest.approx(0.012, abs=1e-15)
    assert rp["wait_s"]["mean"] == pytest.approx(0.006, abs=1e-15)


def test_burst_two_servers():
    q = simulate(scenario(["engine.api_request_s=0.003", "engine.api_server_count=2"]), workload=burst([0.0] * 5))
    starts = [0.0, 0.0, A, A, A + A]
    lat = simulate(scenario(["engine.api_request_s=0.003"]), workload=burst(starts))
    x, y = q.requests, lat.requests
    assert np.array_equal(x["first_token_s"].to_numpy(), y["first_token_s"].to_numpy())
    assert np.allclose(x["ttft_s"].to_numpy(), y["ttft_s"].to_numpy() + np.array(starts), rtol=0, atol=1e-12)
    assert q.summary["request_path"]["queued"] == 3


def test_far_apart_sends_are_the_latency_model():
    base = BASE + ["workload.arrival={process: constant, rate: 6.0}", "engine.api_request_s=0.003",
                   "engine.api_token_s=0.001"]
    lat = simulate(scenario([], base))
    q = simulate(scenario(["engine.api_server_count=1"], base))
    assert q.requests.equals(lat.requests)
    a, b = dict(lat.summary), dict(q.summary)
    rp = b.pop("request_path")
    assert rp["queued"] == 0 and rp["wait_s"]["max"] == 0.0 and rp["requests"] == 120
    for k in ("wall_s", "resolved_scenario"):
        a.pop(k), b.pop(k)
    assert a == b


def test_unset_is_the_latency_model():
    """No request_path block, no queue on the table, and the resolved file says null."""
    from servesim.resolved import resolved_dict

    sc = scenario(["engine.api_request_s=0.003"])
    assert sc.engine.api_server_count is None
    res = simulate(sc)
    assert "request_path" not in res.summary and res.table.api_queue is None
    assert resolved_dict(sc)["engine"]["api_server_count"] is None
    explicit = simulate(scenario(["engine.api_request_s=0.003", "engine.api_server_count=null"]))
    a, b = dict(res.summary), dict(explicit.summary)
    for k in ("wall_s",):
        a.pop(k), b.pop(k)
    assert a == b


def test_closed_loop_refused():
    with pytest.raises(ScenarioError, match=r"engine.api_server_count 2: not with a closed-loop arrival process.*allowed: null"):
        scenario(["engine.api_server_count=2", "workload.arrival={process: closed, clients: 4, think_s: 0}"])


def test_per_group_refused():
    with pytest.raises(ScenarioError, match=r"cluster.groups\[0\].engine.api_server_count"):
        load_scenario(QUICK, ["cluster.groups=[{replicas: 1, engine: {api_server_count: 2}}]"])


def test_round_robin_fleet_pooled_equals_per_replica():
    """Two replicas, round-robin, one server each: the pool of 2 gives starts 0, 0, 3, 3, 6, 6 ms,
    which is each replica's own queue of its every-other request (0, 3, 6 ms)."""
    fleet = ["hardware.replicas=2", "cluster.router=round-robin", "engine.api_request_s=0.003"]
    q = simulate(scenario(fleet + ["engine.api_server_count=1"]), workload=burst([0.0] * 6))
    starts = [0.0, 0.0, A, A, A + A, A + A]
    assert np.array_equal(ApiQueue(np.zeros(6), A, 2).start, starts)
    lat = simulate(scenario(fleet), workload=burst(starts))
    x, y = q.requests, lat.requests
    assert np.array_equal(x["replica"].to_numpy(), [0, 1, 0, 1, 0, 1])
    assert np.array_equal(x["replica"].to_numpy(), y["replica"].to_numpy())
    assert np.array_equal(x["first_token_s"].to_numpy(), y["first_token_s"].to_numpy())
    assert np.allclose(x["ttft_s"].to_numpy(), y["ttft_s"].to_numpy() + np.array(starts), rtol=0, atol=1e-12)
    rp = q.summary["request_path"]
    assert rp["servers"] == 2 and rp["pooled_over_replicas"] is True


def test_header_and_resolved_show_it():
    from servesim.report.console import print_header
    from servesim.resolved import resolved_yaml
    from servesim.simulate import build

    sc = scenario(["engine.api_request_s=0.003", "engine.api_server_count=2", "hardware.replicas=2"])
    console = Console(record=True, width=400)
    print_header(console, build(sc))
    text = console.export_text()
    assert ("request path 3 ms in as a FIFO queue of 2 API servers per replica, pooled over 2 replicas: "
            "4 servers ahead of the router, 0 ms out (engine.api_*)") in text
    assert "  api_server_count: 2\n" in resolved_yaml(sc)
    lone = scenario(["engine.api_server_count=1"])  # (no delay: a lone replica; the path line still says it)
    console = Console(record=True, width=400)
    print_header(console, build(lone))
    assert "path      request path 0 ms in as a FIFO queue of 1 API server per replica" in console.export_text()


def test_rate_change_moves_the_queue():
    """set_rate re-serves the unsent tail: a factor of 1 leaves the run as it was (to rounding), a
    faster rate makes requests queue."""
    base = BASE + ["workload.arrival={process: constant, rate: 100.0}", "engine.api_request_s=0.003",
                   "engine.api_server_count=1"]
    plain = simulate(scenario([], base))
    same = simulate(scenario(["rate_schedule={steps: [{at_s: 0.5, factor: 1.0}]}"], base))
    assert np.allclose(same.requests["arrival_s"], plain.requests["arrival_s"], rtol=0, atol=1e-9)
    assert np.allclose(same.requests["ttft_s"], plain.requests["ttft_s"], rtol=0, atol=1e-9)
    assert plain.summary["request_path"]["queued"] == 0
    fast = simulate(scenario(["rate_schedule={steps: [{at_s: 0.5, factor: 10.0}]}"], base))
    sends = fast.requests["arrival_s"].to_numpy()
    assert np.allclose(np.diff(sends[60:]), 0.001, rtol=0, atol=1e-9)  # 1,000/s after the change
    assert fast.summary["request_path"]["queued"] > 0
    assert fast.summary["request_path"]["wait_s"]["max"] > 0.05  # 3 ms of service per 1 ms of sends


def test_sharded_fleet_equals_one_process():
    """The sharded build queues the arrivals as the one-process build does."""
    fleet = BASE[:1] + ["stop.warmup_requests=0", "workload.arrival={process: poisson, rate: 400.0}",
                        "engine.api_request_s=0.003", "engine.api_server_count=1", "hardware.replicas=2",
                        "cluster.router=round-robin"]
    one = simulate(load_scenario(QUICK, fleet))
    two = simulate(load_scenario(QUICK, fleet + ["sim.workers=2"]))
    for col in ("arrival_s", "ttft_s", "e2e_s", "replica"):
        assert np.array_equal(one.requests[col].to_numpy(), two.requests[col].to_numpy()), col
    assert one.summary["request_path"] == two.summary["request_path"]
    assert one.summary["request_path"]["queued"] > 0
