"""Reports a planner reads at a glance (issue 32): SLO lines on latency charts, numeric panels in
numeric order, sampled designs without one-point panels, intervals that never go below zero, and
a report for a capacity search. Each test renders the chart specs and reads them."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.cli import app
from servesim.report.sweepcharts import heatmap_figures, line_figures
from servesim.report.sweepdata import point_stats, read_sweep
from tests.report_fixtures import write_sweep


def walk(spec):
    """Every sub-dict of a Vega-Lite spec."""
    if isinstance(spec, dict):
        yield spec
        for v in spec.values():
            yield from walk(v)
    elif isinstance(spec, list):
        for v in spec:
            yield from walk(v)


def datasets(spec) -> list[list[dict]]:
    return [d["values"] for d in walk(spec) if isinstance(d.get("values"), list)] + \
        [v for d in walk(spec) if isinstance(d.get("datasets"), dict) for v in d["datasets"].values()]


def rule_values(spec) -> list[float]:
    return [row["slo"] for vals in datasets(spec) for row in vals if isinstance(row, dict) and "slo" in row]


def grid_sweep(root, axes: dict, metric) -> None:
    """A sweep folder over the full grid of ``axes``, three seeds, ``metric(values, seed)``."""
    import itertools

    (root / "rows").mkdir(parents=True)
    names = list(axes)
    points, rows = [], []
    for i, combo in enumerate(itertools.product(*axes.values())):
        v = dict(zip(names, combo))
        points.append({"point": i, "key": f"k{i}", **v})
        for rep, seed in enumerate((1, 2, 3)):
            rows.append({"point": i, "key": f"k{i}", "seed": seed, "replication": rep, **v,
                         "ttft_p99": metric(v, seed), "req_per_s": 1.0, "wall_s": 0.1})
    pd.DataFrame(points).to_parquet(root / "points.parquet", index=False)
    pd.DataFrame(rows).to_parquet(root / "rows" / "part-1.parquet", index=False)


def test_latency_lines_draw_the_slo(tmp_path):
    write_sweep(tmp_path / "sw")
    (tmp_path / "sw" / "slos.json").write_text(json.dumps({"targets": {"ttft_p99": 0.5},
                                                           "per_request": {"ttft": 1.0, "tpot": 0.1}}))
    sd = read_sweep(tmp_path / "sw")
    figs = line_figures(sd, ["ttft_p99", "req_per_s"], ["workload.arrival.rate"])
    by = {f.slug: f.spec() for f in figs}
    assert rule_values(by["line-ttft_p99-rate"]) == [0.5]
    assert rule_values(by["line-req_per_s-rate"]) == []  # no SLO on a throughput
    # without a stream target, a TTFT statistic gets the per-request threshold
    (tmp_path / "sw" / "slos.json").write_text(json.dumps({"targets": {}, "per_request": {"ttft": 1.0}}))
    spec = line_figures(read_sweep(tmp_path / "sw"), ["ttft_p99"], ["workload.arrival.rate"])[0].spec()
    assert rule_values(spec) == [1.0] and "per-request slo.ttft_s" in json.dumps(spec)


def test_a_sweep_run_keeps_its_slo_lines(tmp_path):
    from servesim.sweep.slo import slo_lines
    from servesim import load_scenario
    from tests.conftest import REPO

    sc = load_scenario(REPO / "scenarios/examples/three_streams.yaml")
    lines = slo_lines(sc)
    assert lines["targets"]["ttft_p99@P0"] == 0.8 and lines["targets"]["e2e_p99@P3"] == 5.0
    assert lines["per_request"] == {"ttft": 1.0, "tpot": 0.1}


def test_panels_and_legends_sort_numbers_as_numbers(tmp_path):
    grid_sweep(tmp_path / "sw", {"workload.arrival.rate": [1.0, 2.0], "engine.enable_chunked_prefill": [False, True],
                                 "engine.max_num_seqs": [1024, 2048, 256, 512]},
               lambda v, s: 0.1 * v["workload.arrival.rate"] + 1e-3 * s)
    sd = read_sweep(tmp_path / "sw")
    spec = heatmap_figures(sd, ["ttft_p99"], "workload.arrival.rate", "engine.enable_chunked_prefill")[0].spec()
    facet = next(d["facet"] for d in walk(spec) if "facet" in d and isinstance(d["facet"], dict))
    assert facet["sort"] == [f"max_num_seqs={n}" for n in (256, 512, 1024, 2048)]
    line = line_figures(sd, ["ttft_p99"], ["workload.arrival.rate"])[0].spec()
    color = next(d["color"] for d in walk(line) if isinstance(d.get("color"), dict) and "sort" in d["color"])
    assert color["sort"][0].startswith("enable_chunked_prefill=False, max_num_seqs=256")
    assert color["sort"][1].startswith("enable_chunked_prefill=False, max_num_seqs=512")


def test_a_sampled_design_is_one_scatter_and_partial_dependence_not_100_panels(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "lhs"
    (root / "rows").mkdir(parents=True)
    pts = [{"point": i, "key": f"k{i}", "workload.arrival.rate": float(rng.uniform(1, 10)),
            "engine.max_num_seqs": int(rng.integers(8, 512)), "engine.max_num_batched_tokens": int(rng.integers(512, 8192))}
           for i in range(100)]
    rows = [{**p, "seed": 1, "replication": 0, "ttft_p99": 0.05 * p["workload.arrival.rate"], "req_per_s": 1.0,
             "wall_s": 0.1} for p in pts]
    pd.DataFrame(pts).to_parquet(root / "points.parquet", index=False)
    pd.DataFrame(rows).to_parquet(root / "rows" / "part-1.parquet", index=False)
    sd = read_sweep(root)
    heat = heatmap_figures(sd, ["ttft_p99"], "workload.arrival.rate", "engine.max_num_seqs")[0]
    spec = heat.spec()
    assert not any("facet" in d for d in walk(spec))
    assert {d.get("type") for d in walk(spec) if "type" in d and d.get("type") in ("circle", "rect")} == {"circle"}
    enc = next(d["encoding"] for d in walk(spec) if "encoding" in d and "x" in d["encoding"])
    assert enc["x"]["type"] == "quantitative" and enc["y"]["type"] == "quantitative"
    line = line_figures(sd, ["ttft_p99"], ["workload.arrival.rate"])[0]
    assert "partial dependence" in line.caption and "bin_x" in json.dumps(line.spec())


def test_intervals_never_go_below_zero_nor_a_share_above_one(tmp_path):
    grid_sweep(tmp_path / "sw", {"workload.arrival.rate": [1.0, 2.0]}, lambda v, s: [0.01, 2.0, 0.02][s - 1])
    st = point_stats(read_sweep(tmp_path / "sw"), "ttft_p99")
    assert (st["lo"] >= 0).all() and math.isclose(st["lo"].iloc[0], 0.0)
    assert (st["hi"] > st["mean"]).all()


def test_capacity_search_gets_a_report(tmp_path):
    import yaml
    from tests.test_capacity_answers import md1

    f = tmp_path / "md1.yaml"
    f.write_text(yaml.safe_dump(md1(600).model_dump(mode="json", exclude={"base_dir"})))
    cap = tmp_path / "cap.json"
    res = CliRunner().invoke(app, ["capacity", str(f), "--slo", "queue_mean=0.01", "--seeds", "3", "--max-seeds", "6",
                                   "--tol", "0.15", "--workers", "1", "--out", str(cap)])
    assert res.exit_code == 0, res.stdout
    res = CliRunner().invoke(app, ["report", str(cap)])
    assert res.exit_code == 0, res.stdout
    html = (tmp_path / "cap-report" / "report.html").read_text()
    specs = json.loads(html.split('<script type="application/json" id="report-specs">')[1].split("</script>")[0])
    spec = specs[0]["spec"]
    assert rule_values(spec) == [0.01]
    d = json.loads(cap.read_text())
    assert any(isinstance(r, dict) and r.get("x") == pytest.approx(d["crossing"]["rate_req_per_s"])
               for vals in datasets(spec) for r in vals)
    assert "Capacity:" in html


def test_a_seeds_folder_gets_a_report(tmp_path):
    from tests.conftest import REPO

    out = tmp_path / "rep"
    res = CliRunner().invoke(app, ["run", str(REPO / "scenarios/examples/md1_queue.yaml"), "--seeds", "3",
                                   "--set", "stop.requests=300", "--out", str(out), "-q", "--workers", "1"])
    assert res.exit_code == 0, res.stdout
    assert not (out / "report.html").exists()
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.stdout
    html = (out / "report.html").read_text()
    assert "comparing 3 runs" in html and "seed 1" in html and "seed 3" in html
