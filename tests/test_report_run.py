"""Run reports and comparisons: what the page holds, that its numbers are the run's, static
charts, the cluster and tier blocks, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from servesim.cli import app
from servesim.report import curves
from servesim.report.build import write_compare_report, write_run_report
from servesim.report.charts import run_figures
from servesim.report.rundata import from_result, load_run
from servesim.report.tables import delta_rows
from tests.report_fixtures import TIERS, TWO_CLASSES, inject_cluster, write_run

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    a = write_run(TWO_CLASSES, root / "a")
    b = write_run({**TWO_CLASSES, "engine": {**TWO_CLASSES["engine"], "max_num_seqs": 12}}, root / "b")
    return root, a, b


def _specs(html: str) -> list[dict]:
    m = re.search(r'<script type="application/json" id="report-specs">(.*?)</script>', html, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


def _values(spec: dict) -> list[dict]:
    """Every inline data row of a (layered / faceted) Vega-Lite spec."""
    out = list(spec.get("data", {}).get("values", []) or [])
    for ds in (spec.get("datasets") or {}).values():
        out += ds
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for sub in spec.get(key, []):
            out += _values(sub)
    if "spec" in spec:
        out += _values(spec["spec"])
    return out


def test_run_report_is_self_contained_and_holds_every_chart(runs):
    root, res, _ = runs
    paths = write_run_report(root / "a")
    html = paths[0].read_text()
    assert paths == [root / "a" / "report.html"]
    # nothing is fetched: no external scripts, stylesheets, images or frames in the markup (the
    # inlined bundle's own code is checked by the browser test, which watches every request)
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", html, flags=re.S)
    assert html.count("<script") == markup.count("<script") == 3  # the bundle, the specs, the embedding
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", markup)
    assert "vegaEmbed" in html and "Content-Security-Policy" in html
    specs = _specs(html)
    slugs = [s["slug"] for s in specs]
    assert slugs == ["latency-ttft", "latency-tpot", "latency-itl", "latency-e2e", "kv-usage", "queue-batch",
                     "batch-composition", "wait-attribution"]
    assert all(_values(s["spec"]) for s in specs)  # every chart carries data
    assert html.count('<figure class=') == len(specs)
    # the header: resolved scenario, summary table, per-class table, no pack (constant step time)
    assert res.resolved_yaml.splitlines()[0] in html.replace("&#x27;", "'")
    assert "P99.9" in html and "TTFT P99 (ms)" in html
    assert "none: the step-time model is analytical" in html


def test_curves_carry_the_summary_percentiles_per_class(runs):
    root, res, _ = runs
    run = load_run(root / "a")
    cv = curves.latency_curves([run])
    marks = curves.latency_marks(cv)
    s = res.summary
    for metric in ("ttft", "tpot", "e2e"):
        for series, want in [("all", s["latency_s"][metric]), ("P0", s["by_class"]["P0"]["latency_s"][metric]),
                             ("P1", s["by_class"]["P1"]["latency_s"][metric])]:
            m = marks[(marks["metric"] == metric) & (marks["series"] == series)].set_index("mark")
            for mark, key in (("P50", "p50"), ("P90", "p90"), ("P99", "p99"), ("P99.9", "p999")):
                assert m.loc[mark, "latency_s"] == pytest.approx(want[key], rel=1e-12)
                # 220 measured requests reach P99, not P99.9; a class of fewer than 100 not P99
                assert m.loc[mark, "reached"] == (want["count"] * (1 - float(curves.MARKS[mark]) / 100) >= 1 - 1e-9)
    assert s["by_class"]["P0"]["latency_s"]["ttft"]["count"] < 100  # (so both cases occur)
    itl = marks[(marks["metric"] == "itl")].set_index("mark")["latency_s"]
    assert marks[marks["metric"] == "itl"]["reached"].all()
    for key, mark in (("p50", "P50"), ("p99", "P99")):
        assert itl[mark] == pytest.approx(s["latency_s"]["itl"][key], rel=0.0101)  # the sketch's error
    assert set(cv.loc[cv["metric"] == "itl", "series"]) == {"all"}


def test_from_result_draws_what_the_folder_draws(runs):
    root, res, _ = runs
    a = curves.latency_curves([load_run(root / "a")])
    b = curves.latency_curves([from_result(res, label="a")])
    assert a.equals(b)
    wa = curves.wait_attribution([load_run(root / "a")])
    wb = curves.wait_attribution([from_result(res, label="a")])
    assert wa.equals(wb)


def test_wait_shares_are_the_summary_blockage(runs):
    root, res, _ = runs
    w = curves.wait_attribution([load_run(root / "a")])
    from servesim.request import CAUSE_LABELS, CAUSE_NAMES, Cause

    for klass, key in (("all", "all"), ("P0", "P0"), ("P1", "P1")):
        share = w[w["class"] == klass].set_index("cause")["share"]
        for i, c in enumerate(CAUSE_NAMES):
            assert share[CAUSE_LABELS[Cause(i)]] == pytest.approx(res.summary["blockage"][key]["share"][c], abs=1e-12)
    req = res.requests.iloc[20:]
    assert w[w["class"] == "all"]["mean_s"].sum() == pytest.approx(req.filter(like="blocked_").sum().sum() / len(req))


def test_batch_composition_comes_from_the_time_series(runs):
    root, res, _ = runs
    run = load_run(root / "a")
    b = curves.long_series([run], {"prefill_tokens_mean": "prefill", "decode_tokens_mean": "decode"})
    ts = res.timeseries
    assert np.allclose(b[b["signal"] == "prefill"]["value"], ts["prefill_tokens_mean"], equal_nan=True)
    assert (ts["prefill_tokens_mean"] > 0).any() and (ts["decode_tokens_mean"] > 0).any()


def test_static_charts_are_real_files(runs, tmp_path):
    root, _, _ = runs
    shutil.copytree(root / "a", tmp_path / "a")
    (tmp_path / "a" / "report.html").unlink(missing_ok=True)
    paths = write_run_report(tmp_path / "a", ["png", "svg"])
    assert not (tmp_path / "a" / "report.html").exists()  # only what was asked for
    png = [p for p in paths if p.suffix == ".png"]
    svg = [p for p in paths if p.suffix == ".svg"]
    assert len(png) == len(svg) == 8
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in png)
    for p in svg:
        text = p.read_text()
        assert text.startswith("<svg") and text.count("<path") > 3
    assert [p.name for p in png][0] == "01-latency-ttft.png"


def test_compare_overlays_runs_with_deltas(runs, tmp_path):
    root, a, b = runs
    paths = write_compare_report([root / "a", root / "b"], tmp_path / "cmp", labels=["six", "twelve"])
    html = paths[0].read_text()
    specs = _specs(html)
    ttft = next(s for s in specs if s["slug"] == "latency-ttft")
    series = {r["series"] for r in _values(ttft["spec"]) if "series" in r}
    assert {"six · all", "six · P0", "twelve · all", "twelve · P1"} <= series
    rows = {r["metric"]: r for r in delta_rows([load_run(root / "a", "six"), load_run(root / "b", "twelve")])}
    p99a, p99b = a.summary["latency_s"]["ttft"]["p99"], b.summary["latency_s"]["ttft"]["p99"]
    assert rows["TTFT P99 (ms)"]["delta"][1] == pytest.approx(p99b / p99a - 1)
    assert rows["TTFT P99 (ms) @P1"]["values"] == [a.summary["by_class"]["P1"]["latency_s"]["ttft"]["p99"],
                                                   b.summary["by_class"]["P1"]["latency_s"]["ttft"]["p99"]]
    assert "six (baseline)" in html and "twelve" in html
    # twelve slots queue less: its row is marked better (lower TTFT)
    assert p99b < p99a and re.search(r'<span class="better">-\d', html)


def test_compare_labels_are_made_distinct(runs, tmp_path):
    root, _, _ = runs
    shutil.copytree(root / "a", tmp_path / "x" / "a")
    paths = write_compare_report([root / "a", tmp_path / "x" / "a"], tmp_path / "cmp")
    assert "a (2)" in paths[0].read_text()


def test_cluster_block_draws_per_replica_load(runs, tmp_path):
    root, _, _ = runs
    shutil.copytree(root / "a", tmp_path / "a")
    inject_cluster(tmp_path / "a",
                   [{"id": 0, "requests": 120, "busy_fraction": 0.9, "mean_batch": 5.5, "kv_peak_usage": 0.7},
                    {"id": 1, "requests": 80, "busy_fraction": 0.6, "mean_batch": 3.5, "kv_peak_usage": 0.4}],
                   {"router": "least_outstanding_tokens", "load_imbalance": 1.2})
    figs = dict(run_figures([load_run(tmp_path / "a")]))
    rep = figs["Replicas"][0]
    vals = _values(rep.spec())
    assert {(v["replica"], v["field"], v["value"]) for v in vals} >= {("0", "requests", 120.0),
                                                                      ("1", "kv_peak_usage", 0.4)}
    html = write_run_report(tmp_path / "a")[0].read_text()
    assert "load_imbalance" in html and "least_outstanding_tokens" in html


def test_tiers_draw_hit_rates_and_link_traffic(tmp_path):
    res = write_run(TIERS, tmp_path / "t")
    figs = dict(run_figures([load_run(tmp_path / "t")]))
    slugs = [f.slug for f in figs["Prefix cache and KV tiers"]]
    assert slugs == ["tier-hits", "tier-traffic"]
    hits = {(v["tier"], v["class"]): v["hit_rate"] for v in _values(figs["Prefix cache and KV tiers"][0].spec())}
    tiers = res.summary["kv"]["tiers"]
    assert hits[("L1", "all")] == pytest.approx(tiers["L1"]["hit_rate"])
    assert hits[("L2", "all")] == pytest.approx(tiers["L2"]["hit_rate"]) and tiers["L2"]["hit_rate"] > 0
    gb = {(v["tier"], v["direction"]): v["GB"] for v in _values(figs["Prefix cache and KV tiers"][1].spec())}
    assert gb[("L2", "stored (down)")] == pytest.approx(tiers["L2"]["bytes_stored"] / 1e9)


def test_a_run_with_nothing_measured_still_reports(tmp_path):
    from tests.conftest import BASE, merge

    raw = merge(BASE, {"workload": {"prompt": {"dist": "fixed", "value": 9000}}, "stop": {"requests": 5}})
    res = write_run(raw, tmp_path / "r")
    assert res.summary["requests"]["rejected"] == 5
    assert run_figures([load_run(tmp_path / "r")]) == []
    html = write_run_report(tmp_path / "r")[0].read_text()
    assert _specs(html) == [] and "Nothing to chart" in html and "exceeds_max_model_len" in html


def test_no_tier_or_replica_sections_when_off(runs):
    root, _, _ = runs
    names = [n for n, _ in run_figures([load_run(root / "a")])]
    assert names == ["Latency", "Over time", "Why requests waited"]


# ------------------------------------------------------------------------------------ CLI
def test_cli_run_with_report(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TWO_CLASSES))
    r = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "o"), "--report", "--format", "html,svg"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "o" / "report.html").is_file() and len(list((tmp_path / "o" / "charts").glob("*.svg"))) == 8
    assert "wrote" in r.output and "report.html" in r.output
    r = runner.invoke(app, ["report", str(tmp_path / "o")])
    assert r.exit_code == 0 and "report.html" in r.output


def test_rerun_removes_a_stale_report(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TWO_CLASSES))
    assert runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "o"), "--report", "--format",
                               "html,png"]).exit_code == 0
    r = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "o"), "--force", "-q"])
    assert r.exit_code == 0
    assert not (tmp_path / "o" / "report.html").exists()
    assert not list((tmp_path / "o" / "charts").glob("*.png"))


def _one_line_error(r, *needles):
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert "Traceback" not in r.output
    for n in needles:
        assert n in lines[0], lines[0]


def test_cli_bad_input(runs, tmp_path):
    root, _, _ = runs
    _one_line_error(runner.invoke(app, ["report", str(tmp_path / "nothing")]), "no such run folder")
    (tmp_path / "half").mkdir()
    shutil.copy(root / "a" / "summary.json", tmp_path / "half" / "summary.json")
    _one_line_error(runner.invoke(app, ["report", str(tmp_path / "half")]), "requests.parquet", "missing")
    (tmp_path / "junk").mkdir()
    for name in ("summary.json", "requests.parquet", "timeseries.parquet"):
        (tmp_path / "junk" / name).write_text("{}" if name.endswith("json") else "not parquet")
    _one_line_error(runner.invoke(app, ["report", str(tmp_path / "junk")]), "not a run summary")
    _one_line_error(runner.invoke(app, ["report", str(root / "a"), "--format", "pdf"]), "'pdf'", "html, png, svg")
    _one_line_error(runner.invoke(app, ["report", str(root / "a"), "--metric", "ttft_p99"]), "--metric", "one run")
    _one_line_error(runner.invoke(app, ["compare", str(root / "a"), "--out", str(tmp_path / "c")]), "at least two")
    _one_line_error(runner.invoke(app, ["compare", str(root / "a"), str(root / "b"), "--label", "x",
                                        "--out", str(tmp_path / "c")]), "--label", "1 labels for 2 runs")
    _one_line_error(runner.invoke(app, ["compare", str(root / "a"), str(tmp_path / "half"),
                                        "--out", str(tmp_path / "c")]), "half")
    _one_line_error(runner.invoke(app, ["run", "scenarios/quickstart.yaml", "--format", "png"]), "--report")
    (tmp_path / "rep" / "seeds" / "seed-1").mkdir(parents=True)
    shutil.copy(root / "a" / "summary.json", tmp_path / "rep" / "summary.json")
    _one_line_error(runner.invoke(app, ["report", str(tmp_path / "rep")]), "seeds")
