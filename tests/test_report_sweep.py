"""The sweep report on a sweep folder in the documented format (docs/sweeps.md): reading
(deduplication, failed rows, the design join), per-point statistics, heatmaps, lines, the Pareto
front, and bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.cli import app
from servesim.errors import ReportError
from servesim.report.curves import pareto_front, t_interval
from servesim.report.sweepcharts import pareto_frame
from servesim.report.sweepdata import default_pareto, derived_columns, point_stats, read_sweep
from servesim.report.sweepreport import write_sweep_report
from tests.report_fixtures import write_sweep

runner = CliRunner()


@pytest.fixture
def sweep(tmp_path):
    expect = write_sweep(tmp_path / "sw")
    return tmp_path / "sw", expect


def test_reading_dedupes_tasks_and_sets_failures_aside(sweep):
    root, expect = sweep
    sd = read_sweep(root)
    assert sd.axes == ["workload.arrival.rate", "engine.max_num_seqs", "engine.enable_chunked_prefill"]
    assert {"ttft_p99", "req_per_s", "goodput_req_per_s"} <= set(sd.metrics)
    assert "wall_s" not in sd.metrics and "seed" not in sd.metrics
    assert len(sd.rows) == 25 * 3  # rows 40..49 were stored twice: kept once; point 24 shares point 0's
    assert sd.failed_rows == 1 and sd.invalid_points == 1
    assert sd.seeds_per_point == (3, 3)
    assert sd.rows.groupby("point")["seed"].apply(list).tolist() == [[1, 2, 3]] * 25
    first = sd.rows[sd.rows["point"] == 0]["ttft_p99"].tolist()
    assert sd.rows[sd.rows["point"] == 24]["ttft_p99"].tolist() == first


def test_point_statistics_are_t_intervals_over_seeds(sweep):
    root, expect = sweep
    st = point_stats(read_sweep(root), "ttft_p99")
    assert len(st) == 25
    for r in st.itertuples():
        m, lo, hi, n = t_interval(np.array(expect[r.point]))
        assert (r.mean, r.lo, r.hi, r.n) == (pytest.approx(m), pytest.approx(lo), pytest.approx(hi), 3)


def test_pareto_front_of_the_sweep(sweep):
    root, _ = sweep
    sd = read_sweep(root)
    assert default_pareto(sd) == ("ttft_p99", "goodput_req_per_s")
    st = pareto_frame(sd, "ttft_p99", "goodput_req_per_s")
    want = pareto_front(st["x"], st["y"], "min", "max")
    assert st["front"].tolist() == want.tolist() and 1 <= want.sum() < len(st)
    # no point off the front beats a front point on both
    for f in st[st["front"]].itertuples():
        assert not ((st["x"] <= f.x) & (st["y"] >= f.y) & ((st["x"] < f.x) | (st["y"] > f.y))).any()


def _specs(html):
    m = re.search(r'<script type="application/json" id="report-specs">(.*?)</script>', html, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_sweep_report_page(sweep):
    root, _ = sweep
    paths = write_sweep_report(root)
    assert paths == [root / "report.html"]
    html = paths[0].read_text()
    slugs = [s["slug"] for s in _specs(html)]
    assert slugs[:3] == ["heatmap-ttft_p99", "heatmap-req_per_s", "heatmap-goodput_req_per_s"]
    assert "line-ttft_p99-rate" in slugs and "line-goodput_req_per_s-max_num_seqs" in slugs
    assert slugs[-1] == "pareto-ttft_p99-goodput_req_per_s"
    assert "25 points x 3 seeds = 75 runs" in html and "1 rows record a failed run" in html
    assert "Points on the front" in html


def test_chosen_axes_metrics_and_pairs(sweep, tmp_path):
    root, _ = sweep
    paths = write_sweep_report(root, ["html"], metrics=["req_per_s"], x="engine.max_num_seqs",
                               y="workload.arrival.rate", pareto="ttft_p99,req_per_s", out=tmp_path / "o")
    slugs = [s["slug"] for s in _specs(paths[0].read_text())]
    assert slugs == ["heatmap-req_per_s", "line-req_per_s-max_num_seqs", "pareto-ttft_p99-req_per_s"]


def test_single_parquet_file_of_rows(sweep, tmp_path):
    root, _ = sweep
    rows = read_sweep(root).rows.drop_duplicates(["key", "seed"]).drop(columns=["point", "key"])
    rows.to_parquet(tmp_path / "many.parquet", index=False)  # what simulate_many returns, saved
    sd = read_sweep(tmp_path / "many.parquet")
    assert sorted(sd.axes) == sorted(["workload.arrival.rate", "engine.max_num_seqs", "engine.enable_chunked_prefill"])
    assert sd.rows["point"].nunique() == 24 and len(sd.rows) == 72
    assert write_sweep_report(tmp_path / "many.parquet")[0] == tmp_path / "report.html"


def test_text_axes_and_constant_axes(tmp_path):
    """Axis values that are mappings are stored as JSON text (docs/sweeps.md); an axis that does
    not move (the scenario's seed) is drawn over nothing."""
    rows = []
    for i, (rate, prompt) in enumerate([(r, p) for r in (1.0, 2.0, 4.0) for p in (512, 1024)]):
        for seed in (1, 2):
            rows.append({"point": i, "key": f"k{i}", "seed": seed, "replication": seed - 1,
                         "workload.arrival.rate": rate,
                         "workload.prompt": json.dumps({"dist": "fixed", "value": prompt}, sort_keys=True),
                         "scenario.seed": 5, "ttft_p99": rate * prompt / 1000 + seed * 0.01, "req_per_s": rate})
    frame = pd.DataFrame(rows).astype({"workload.prompt": "string"})
    (tmp_path / "sw" / "rows").mkdir(parents=True)
    frame.to_parquet(tmp_path / "sw" / "rows" / "part-1.parquet", index=False)
    frame.drop_duplicates("point")[["point", "key", "workload.arrival.rate", "workload.prompt", "scenario.seed"]] \
        .to_parquet(tmp_path / "sw" / "points.parquet", index=False)
    sd = read_sweep(tmp_path / "sw")
    assert sd.axes == ["workload.arrival.rate", "workload.prompt", "scenario.seed"]
    assert sd.metrics == ["ttft_p99", "req_per_s"]
    html = write_sweep_report(tmp_path / "sw")[0].read_text()
    slugs = [s["slug"] for s in _specs(html)]
    assert slugs[0] == "heatmap-ttft_p99" and "line-ttft_p99-prompt" in slugs
    assert not any(s.endswith("-seed") for s in slugs)  # the constant axis gets no line chart


def test_gpus_derived_from_replica_axes(tmp_path):
    rows = pd.DataFrame({"hardware.replicas": [1, 2, 4, 1, 2, 4], "hardware.gpus_per_replica": [1, 1, 1, 2, 2, 2],
                         "seed": 1, "goodput_req_per_s": [3.0, 6.0, 11.0, 5.0, 9.0, 15.0], "ttft_p99": 0.5})
    rows.to_parquet(tmp_path / "g.parquet", index=False)
    sd = read_sweep(tmp_path / "g.parquet")
    assert derived_columns(sd)["gpus"].tolist() == [1, 2, 4, 2, 4, 8]
    assert default_pareto(sd) == ("gpus", "goodput_req_per_s")
    st = pareto_frame(sd, "gpus", "goodput_req_per_s")
    # fewer GPUs for more goodput: 1 GPU 3/s, 2 GPUs 6/s, 4 GPUs 11/s, 8 GPUs 15/s; (2 x 1, 5/s) loses to (1 x 2, 6/s)
    assert sorted(zip(st.loc[st["front"], "x"], st.loc[st["front"], "y"])) == [(1, 3.0), (2, 6.0), (4, 11.0), (8, 15.0)]


def test_bad_sweep_input(sweep, tmp_path):
    root, _ = sweep
    with pytest.raises(ReportError, match="not a metric of this sweep"):
        write_sweep_report(root, metrics=["ttft_p42"])
    with pytest.raises(ReportError, match="not an axis"):
        write_sweep_report(root, x="engine.block_size")
    with pytest.raises(ReportError, match="X,Y"):
        write_sweep_report(root, pareto="ttft_p99")
    (tmp_path / "empty" / "rows").mkdir(parents=True)
    r = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no result rows" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["report", str(root), "--pareto", "ttft_p99,nope"])
    assert r.exit_code == 2 and "'nope' is not a metric" in r.output
    r = runner.invoke(app, ["report", str(root), "--format", "svg"])
    assert r.exit_code == 0 and len(list((root / "charts").glob("*.svg"))) == 13


def test_report_of_a_real_sweep_folder(tmp_path):
    """End to end: `servesim sweep` writes a folder, `servesim report` draws it (the fixture above
    is hand-made in the documented format; this one is what the sweep code really writes)."""
    import yaml
    from typer.testing import CliRunner

    from servesim.cli import app
    from tests.conftest import BASE

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"base": BASE, "axes": {"engine.max_num_seqs": [1, 4],
                                                           "workload.arrival.rate": [5.0, 20.0]},
                                    "seeds": 2, "metrics": ["ttft_p99", "req_per_s"]}, sort_keys=False))
    res = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert res.exit_code == 0, res.stdout + res.stderr
    res = CliRunner().invoke(app, ["report", str(tmp_path / "o"), "--x", "workload.arrival.rate",
                                   "--y", "engine.max_num_seqs", "--metric", "ttft_p99"])
    assert res.exit_code == 0, res.stdout + res.stderr
    page = (tmp_path / "o" / "report.html").read_text()
    assert "ttft_p99" in page and "engine.max_num_seqs" in page and "workload.arrival.rate" in page
    sd = read_sweep(tmp_path / "o")
    assert len(sd.rows.drop_duplicates(["key", "seed"])) == 8  # 4 points x 2 seeds, none lost
