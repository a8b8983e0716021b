"""Capacity searches: the search logic on synthetic probes with known answers, then the whole
thing on a queue whose answer is known in closed form (M/D/1, Pollaczek-Khinchine)."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from typer.testing import CliRunner

from servesim.cli import app
from servesim.errors import ScenarioError
from servesim.scenario import scenario_from_dict
from servesim.metrics.intervals import Interval
from servesim.sweep.capacity import (SLO, Budget, CapacityError, Probe, find_max_rate, find_min_replicas,
                                     parse_slo, search_max_rate, search_min_replicas)
from servesim.sweep.ratescale import base_rate, scale_rate
from servesim.scenario import load_scenario
from servesim.sweep.spec import scenario_key
from tests.conftest import BASE, REPO, scenario


# ---------------------------------------------------------------------------------------- SLOs
def test_parse_slo():
    assert parse_slo("ttft_p99=0.8") == SLO("ttft_p99", 0.8, True)
    assert parse_slo("tpot_p99 <= 0.1") == SLO("tpot_p99", 0.1, True)
    assert parse_slo("slo_attainment>=0.99") == SLO("slo_attainment", 0.99, False)
    for bad, needle in (("ttft_p99", "METRIC=VALUE"), ("ttft_p98=1", "not a metric"), ("ttft_p99=fast", "not a number"),
                        ("ttft_p99=inf", "finite")):
        with pytest.raises(CapacityError, match=needle):
            parse_slo(bad)


def test_slo_judges_the_whole_interval():
    s = SLO("ttft_p99", 1.0)
    assert s.judge(Interval(0.8, 0.1, 5)) == "pass"
    assert s.judge(Interval(1.2, 0.1, 5)) == "fail"
    assert s.judge(Interval(0.95, 0.1, 5)) == "open"
    assert s.judge(Interval(math.nan, math.nan, 0)) == "fail"  # nothing measured
    assert s.judge(Interval(0.5, math.nan, 1)) == "open"  # one run: no interval yet
    at_least = SLO("slo_attainment", 0.9, upper=False)
    assert at_least.judge(Interval(0.95, 0.01, 5)) == "pass" and at_least.judge(Interval(0.85, 0.01, 5)) == "fail"
    assert s.headroom(Interval(0.8, 0.1, 5)) == pytest.approx(0.1)


# ------------------------------------------------------------------------- synthetic probes
def fake(metric, half_width=lambda x: 0.001, slo=SLO("m", 0.5)):
    """A probe whose SLO metric at x is metric(x) +/- half_width(x), with a count of calls."""
    calls = []

    def probe(x):
        calls.append(x)
        iv = Interval(metric(x), half_width(x), 5)
        return Probe(x, None, 5, [(slo, iv, slo.judge(iv))])

    return probe, calls


def test_max_rate_brackets_then_bisects_to_the_known_answer():
    probe, calls = fake(lambda x: 0.1 * x)  # metric <= 0.5 until x = 5
    s = search_max_rate(probe, [SLO("m", 0.5)], tol=0.02)
    assert s.answered and calls[:4] == [1, 2, 4, 8]
    assert s.best.x <= 5.0 * (1 - 0.001 / 0.5) and s.bound.x > 5.0  # the interval's width counts
    assert s.bound.x / s.best.x - 1 <= 0.02
    assert all(p.verdict == ("pass" if p.x < 5 else "fail") for p in s.path)


def test_max_rate_halves_when_the_base_rate_fails():
    slo = SLO("m", 0.045)  # answer x = 0.45
    probe, calls = fake(lambda x: 0.1 * x, half_width=lambda x: 1e-5, slo=slo)
    s = search_max_rate(probe, [slo], tol=0.05)
    assert calls[:4] == [1, 0.001, 0.5, 0.25]  # the zero-load probe, then halving from the failure
    assert s.best.x <= 0.45 < s.bound.x and s.bound.x / s.best.x - 1 <= 0.05


def test_max_rate_answers_with_the_crossing_when_the_interval_straddles_at_its_budget():
    # undecidable for 4.2 < x < 5.8 (0.1 x within 0.08 of 0.5): a 38 % wide zone, tol 1 %. No pass
    # and failure fit in 1 %, so the answer is the crossing through the undecided probes, said so
    probe, _ = fake(lambda x: 0.1 * x, half_width=lambda x: 0.08)
    s = search_max_rate(probe, [SLO("m", 0.5)], tol=0.01)
    assert s.answered and "straddles the SLO m <= 0.5" in s.note and "stays within the noise" in s.note
    assert "raise --max-seeds" in s.note and "wider than --tol 1.0%" in s.note
    opens = [p.x for p in s.path if p.verdict == "open"]
    assert all(4.2 < x < 5.8 for x in opens)
    # it stopped as soon as the open probes alone spanned more than tol
    assert max(opens) / min(opens) >= 1.01 and s.path[-1].verdict == "open"
    assert max(opens[:-1], default=0) / min(opens[:-1], default=1) < 1.01
    c = s.crossing
    assert c.estimate == pytest.approx(5.0, rel=0.01) and c.lo < 5.0 < c.hi
    assert c.hi / c.lo - 1 > 0.01  # as wide as the noise, not the --tol asked


def test_max_rate_narrow_open_zone_that_leaves_no_room_is_noted():
    # open for 4.89 < x < 5.11 (4.5 % wide) with tol 5 %: the search narrows the gaps on both
    # sides to a quarter of tol, finds no pass and fail within 5 %, answers with the crossing
    probe, _ = fake(lambda x: 0.1 * x, half_width=lambda x: 0.011)
    s = search_max_rate(probe, [SLO("m", 0.5)], tol=0.05)
    assert s.answered and "wider than --tol 5.0%" in s.note
    assert s.best.x < 4.89 and s.bound.x > 5.11
    assert 4.89 / s.best.x <= 1.05 ** 0.25 and s.bound.x / 5.11 <= 1.05 ** 0.25
    assert s.crossing.estimate == pytest.approx(5.0, rel=0.01)


def test_max_rate_answers_around_a_narrow_open_zone():
    # open for 4.95 < x < 5.05 (2 % wide), tol 5 %: a pass below and a fail above fit in 5 %
    probe, _ = fake(lambda x: 0.1 * x, half_width=lambda x: 0.005)
    s = search_max_rate(probe, [SLO("m", 0.5)], tol=0.05)
    assert s.answered, s.refused
    assert s.best.x <= 4.95 and s.bound.x >= 5.05 and s.bound.x / s.best.x - 1 <= 0.05
    assert [round(p.x, 3) for p in s.path if p.verdict == "open"] == [4.967]  # bisection landed in the zone


def test_max_rate_refuses_when_nothing_binds_or_nothing_passes():
    probe, _ = fake(lambda x: 0.0)
    s = search_max_rate(probe, [SLO("m", 0.5)], max_doublings=5)
    assert not s.answered and "met even at" in s.refused and s.path[-1].x == 32
    probe, _ = fake(lambda x: 1.0)
    s = search_max_rate(probe, [SLO("m", 0.5)], max_doublings=5)
    assert not s.answered and "not met even at" in s.refused


def test_min_replicas_integer_search():
    slo = SLO("m", 1.3)
    probe, calls = fake(lambda n: 10.0 / n, slo=slo)  # 10/8 = 1.25 passes, 10/7 = 1.43 fails
    s = search_min_replicas(probe, [slo])
    assert s.answered and s.best.x == 8 and s.bound.x == 7
    assert calls == [1, 2, 4, 8, 6, 7]


# ------------------------------------------------------------------------------ rate scaling
def test_scale_rate_per_workload_kind():
    sc = scenario()
    assert scale_rate(sc, 2.5).workload.rate_scale == 2.5 and base_rate(sc) == 10.0
    assert scale_rate(sc, 2.5).workload.arrival.rate == 10.0  # the knob is workload.rate_scale
    assert scale_rate(scale_rate(sc, 2.0), 1.5).workload.rate_scale == 3.0
    tr = scenario_from_dict({**BASE, "workload": {"trace": {"file": "x.csv", "format": "azure", "rate_scale": 2.0}}})
    assert scale_rate(tr, 3.0).workload.rate_scale == 3.0 and base_rate(tr) is None
    closed = scenario_from_dict({**BASE, "workload": {"arrival": {"process": "closed", "clients": 4}}})
    with pytest.raises(ScenarioError, match="no rate to scale"):
        scale_rate(closed, 2.0)
    with pytest.raises(ScenarioError, match="must be a finite number > 0"):
        scale_rate(sc, 0.0)


def test_scale_rate_keeps_the_warmup_time_of_a_duration_run():
    """A duration-stopped run's warm-up count scales with the rate (the same stretch of time);
    without it, a capacity search halving the rate soon measured nothing and 'failed' every SLO."""
    from servesim.simulate import scenario_workload

    sc = scenario_from_dict({**BASE, "stop": {"duration_s": 100.0, "warmup_requests": 200}})  # 10 req/s
    for factor in (0.25, 4.0):
        scaled = scale_rate(sc, factor)
        assert scaled.stop.warmup_requests == round(200 * factor)
        wl = scenario_workload(scaled)
        # the last warm-up request arrives ~20 s in at every rate (Poisson: 20 s +- 3 sd at 0.25x)
        assert 11.0 < wl.arrival_s[scaled.stop.warmup_requests - 1] < 29.0
    counted = scenario_from_dict({**BASE, "stop": {"requests": 1000, "warmup_requests": 200}})
    assert scale_rate(counted, 0.25).stop.warmup_requests == 200  # a run of N requests keeps its counts
    assert scale_rate(sc, 1e-4).stop.warmup_requests == 0


# --------------------------------------------------------------------------------- M/D/1
S = 0.01  # service time: one 10 ms iteration per request (1-token prompt and output, one slot)
W = 0.01  # SLO on the mean wait in queue


def md1(n: int, rate: float = 40.0):
    return scenario(stop={"requests": n, "warmup_requests": n // 10}, engine={"max_num_seqs": 1},
                    step_time={"model": "constant", "seconds": S},
                    workload={"arrival": {"process": "poisson", "rate": rate},
                              "prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}})


def pk_max_rate(s: float, w: float) -> float:
    """Largest rate with Wq = rate s^2 / (2 (1 - rate s)) <= w."""
    return 2 * w / (s * (s + 2 * w))


def test_md1_max_rate_matches_pollaczek_khinchine():
    """λ* = 2W / (s (s + 2W)) = 66.7 req/s. The search's verified pass and fail rates must
    bracket it (a few % of slack: finite runs and the interval's own error), within --tol."""
    truth = pk_max_rate(S, W)
    sc = load_scenario(REPO / "scenarios/examples/md1_queue.yaml")  # the example docs/sweeps.md shows
    assert scenario_key(sc) == scenario_key(md1(1500).override({"name": "md1_queue"}))
    s = find_max_rate(sc, [SLO("queue_mean", W)], Budget(seeds=4, max_seeds=12), tol=0.08)
    assert s.answered, s.refused
    lo, hi = s.rate(s.best), s.rate(s.bound)
    assert hi / lo - 1 <= 0.08
    assert lo <= truth * 1.03 and hi >= truth * 0.97, (lo, truth, hi)
    assert [p.verdict for p in s.path][:2] == ["pass", "fail"]  # 40 passes, 80 fails (rho 0.8: Wq 20 ms)


@pytest.mark.slow
@pytest.mark.parametrize("w", [0.005, 0.02])
def test_md1_max_rate_other_slos(w):
    truth = pk_max_rate(S, w)
    s = find_max_rate(md1(20000), [SLO("queue_mean", w)], Budget(seeds=5, max_seeds=30), tol=0.03)
    assert s.answered, s.refused
    assert s.rate(s.best) <= truth * 1.02 and s.rate(s.bound) >= truth * 0.98


def _write(tmp_path, sc) -> str:
    f = tmp_path / "md1.yaml"
    f.write_text(yaml.safe_dump(sc.model_dump(mode="json", exclude={"base_dir"})))
    return str(f)


def test_capacity_cli_answers_and_writes_the_path(tmp_path):
    res = CliRunner().invoke(app, ["capacity", _write(tmp_path, md1(1500)), "--slo", "queue_mean=0.01",
                                   "--seeds", "3", "--max-seeds", "9", "--tol", "0.1", "--workers", "1",
                                   "--out", str(tmp_path / "cap.json")])
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "largest rate verified to meet every SLO" in res.stdout and "headroom" in res.stdout
    assert "capacity:" in res.stdout and "crosses its bound" in res.stdout
    d = json.loads((tmp_path / "cap.json").read_text())
    assert d["answered"] and d["path"][0]["rate_req_per_s"] == 40.0
    assert d["answer"]["verdict"] == "pass" and d["first_failure"]["verdict"] == "fail"


def test_capacity_cli_answers_through_the_noise_when_the_budget_cannot_decide(tmp_path):
    # a 0.5 % precision with 3 runs of 600 requests: the bisection ends up inside the noise; the
    # answer is the crossing, with a note saying the bracket is wider than --tol and why
    res = CliRunner().invoke(app, ["capacity", _write(tmp_path, md1(600)), "--slo", "queue_mean=0.01",
                                   "--seeds", "3", "--max-seeds", "3", "--tol", "0.005", "--workers", "1",
                                   "--out", str(tmp_path / "cap.json")])
    assert res.exit_code == 0, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert "straddles the SLO queue_mean <= 0.01 after 3 replications" in text and "wider than --tol 0.5%" in text
    d = json.loads((tmp_path / "cap.json").read_text())
    assert d["precision_note"] and d["crossing"]["rate_lo"] < d["crossing"]["rate_req_per_s"] < d["crossing"]["rate_hi"]


def md1_fleet(n: int, rate: float):
    """A fleet of M/D/1 replicas: Poisson arrivals split at random (each replica sees Poisson at
    rate / replicas), one slot and 10 ms per request in each."""
    return md1(n, rate).override({"cluster": {"router": "random"}})


def test_min_replicas_matches_pollaczek_khinchine_per_replica():
    """180 req/s, mean wait <= 10 ms: a replica meets it up to 66.7 req/s, so 3 replicas
    (60 req/s each: Wq 7.5 ms) and not 2 (90 req/s each: rho 0.9, Wq 45 ms)."""
    assert math.ceil(180 / pk_max_rate(S, W)) == 3
    sc = load_scenario(REPO / "scenarios/examples/md1_fleet.yaml")  # the example docs/sweeps.md shows
    assert scenario_key(sc) == scenario_key(md1_fleet(3000, 180.0).override({"name": "md1_fleet"}))
    s = find_min_replicas(sc, [SLO("queue_mean", W)], Budget(seeds=3, max_seeds=9))
    assert s.answered, s.refused
    assert s.best.x == 3 and s.bound.x == 2
    assert [int(p.x) for p in s.path] == [1, 2, 4, 3]
    assert s.best.scenario.hardware.replicas == 3


def test_min_replicas_from_a_start_above_the_answer_looks_lower_first():
    """Starting at 8 (a pass with no failure known below) halves to 4, 2 (a failure), then
    bisects: the same answer as from 1; a bad start is one line."""
    sc = load_scenario(REPO / "scenarios/examples/md1_fleet.yaml")
    s = find_min_replicas(sc, [SLO("queue_mean", W)], Budget(seeds=3, max_seeds=9), start=8)
    assert s.answered and s.best.x == 3 and s.bound.x == 2
    assert [int(p.x) for p in s.path] == [8, 4, 2, 3]
    for bad in (0, 2.5, True):
        with pytest.raises(CapacityError, match="give a whole number of replicas"):
            find_min_replicas(sc, [SLO("queue_mean", W)], Budget(), start=bad)


def test_capacity_cli_min_replicas(tmp_path):
    res = CliRunner().invoke(app, ["capacity", _write(tmp_path, md1_fleet(1500, 180.0)), "--slo", "queue_mean=0.01",
                                   "--find", "min-replicas", "--seeds", "3", "--max-seeds", "6", "--workers", "1",
                                   "--out", str(tmp_path / "cap.json")])
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "fewest replicas meeting every SLO: 3 replicas; 2 fail" in " ".join(res.stdout.split())
    d = json.loads((tmp_path / "cap.json").read_text())
    assert d["find"] == "min-replicas" and d["answer"]["x"] == 3


def test_min_replicas_refuses_fleets_of_groups_and_fleets_that_do_not_fit(tmp_path):
    grouped = md1(200).override({"cluster": {"groups": [{"replicas": 2}]}})
    with pytest.raises(CapacityError, match="cluster.groups"):
        find_min_replicas(grouped, [SLO("queue_mean", 0.01)], Budget())
    res = CliRunner().invoke(app, ["capacity", _write(tmp_path, grouped), "--slo", "queue_mean=0.01",
                                   "--find", "min-replicas", "--workers", "1"])
    assert res.exit_code == 2 and res.stderr.startswith("error:") and "Traceback" not in res.stderr
    assert "cluster.groups" in res.stderr and res.stdout == ""  # refused before any probe
    # a replica that cannot be built at all: refused before any run, exit 2
    res = CliRunner().invoke(app, ["capacity", _write(tmp_path, md1_fleet(300, 30.0)), "--slo", "queue_mean=0.01",
                                   "--find", "min-replicas", "--set", "engine.gpu_memory_utilization=0.05"])
    assert res.exit_code == 2 and "one replica of this scenario cannot be simulated" in " ".join(res.stderr.split())
    # 2 servers of 1 GPU hold 2 replicas: the search reaches 4 and says why it stops
    small = md1_fleet(3000, 180.0).override({"hardware.servers": 2, "hardware.gpus_per_server": 1})
    s = find_min_replicas(small, [SLO("queue_mean", W)], Budget(seeds=3, max_seeds=9))
    assert not s.answered and "4 replicas cannot be simulated" in s.refused and "hardware.servers" in s.refused
    assert [int(p.x) for p in s.path] == [1, 2]
    # one server of 1 GPU holds one replica: enough at 30 req/s (Wq 2.1 ms), so the answer stands
    one = md1_fleet(1000, 30.0).override({"hardware.servers": 1, "hardware.gpus_per_server": 1})
    s = find_min_replicas(one, [SLO("queue_mean", W)], Budget(seeds=3, max_seeds=9))
    assert s.answered and s.best.x == 1 and s.bound is None


@pytest.mark.parametrize("args,needle", [
    (["--slo", "ttft_p98=1"], "not a metric"),
    (["--slo", "ttft_p99=1", "--find", "min-rate"], "allowed: max-rate, min-replicas"),
    (["--slo", "ttft_p99=1", "--seeds", "1"], "at least 2 replications"),
    (["--slo", "ttft_p99=1", "--tol", "2"], "--tol 2.0"),
])
def test_capacity_bad_input_one_line(tmp_path, args, needle):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(BASE))
    res = CliRunner().invoke(app, ["capacity", str(f), *args])
    assert res.exit_code == 2 and needle in res.stderr and "Traceback" not in res.stderr, res.stderr


# ------------------------------------------------------------------------------ per class
def two_stream_md1(n: int, rate_a: float = 16.0, rate_b: float = 24.0, slo_a=None):
    """Two Poisson streams into one FCFS slot with 10 ms service: their superposition is M/D/1 at
    the total rate, and each class waits like the whole (PASTA)."""
    a = {"name": "a", "class": "A", "priority": "P0", "arrival": {"process": "poisson", "rate": rate_a},
         "prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}
    if slo_a:
        a["slo"] = slo_a
    b = {"name": "b", "class": "B", "priority": "P0", "arrival": {"process": "poisson", "rate": rate_b},
         "prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}
    raw = {**BASE, "stop": {"requests": n, "warmup_requests": 0}, "engine": {"max_num_seqs": 1},
           "step_time": {"model": "constant", "seconds": S}, "workload": {"streams": [a, b]}}
    return scenario_from_dict(raw, "two")


def test_scenario_slos_are_per_class():
    from servesim.sweep.capacity import merge_slos, scenario_slos

    sc = two_stream_md1(100, slo_a={"ttft_p99": 0.5, "e2e_p99": 2.0})
    assert scenario_slos(sc) == [SLO("ttft_p99@A", 0.5), SLO("e2e_p99@A", 2.0)]
    assert merge_slos([SLO("ttft_p99@A", 0.3)], scenario_slos(sc)) == [SLO("ttft_p99@A", 0.3), SLO("e2e_p99@A", 2.0)]
    assert scenario_slos(md1(100)) == []


def test_per_class_slo_on_two_streams_matches_pollaczek_khinchine():
    """The SLO bounds class A's mean wait; the answer is a total rate, which PK gives. The search
    scales both streams at once (workload.rate_scale)."""
    truth = pk_max_rate(S, W)
    s = find_max_rate(two_stream_md1(1500), [SLO("queue_mean@A", W)], Budget(seeds=4, max_seeds=12), tol=0.1)
    assert s.answered, s.refused
    assert s.base_rate == 40.0 and s.best.scenario.workload.rate_scale == s.best.x
    assert s.rate(s.best) <= truth * 1.03 and s.rate(s.bound) >= truth * 0.97, (s.rate(s.best), truth)


def test_closed_loop_only_workload_has_no_rate_to_scale():
    sc = scenario_from_dict({**BASE, "workload": {"arrival": {"process": "closed", "clients": 4},
                                                   "prompt": {"dist": "fixed", "value": 4},
                                                   "output": {"dist": "fixed", "value": 4}}})
    with pytest.raises(ScenarioError, match="closed loop, which has no rate to scale"):
        find_max_rate(sc, [SLO("ttft_p99", 1.0)], Budget())
