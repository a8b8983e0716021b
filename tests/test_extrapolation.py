"""The share of a run outside the calibration pack's measured grid (issue 28, part 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import servesim
from servesim.perf.extrapolation import KINDS, WARN_SHARE
from servesim.perf.packmodel import load_pack_model

REPO = Path(__file__).resolve().parents[1]
ENDS = load_pack_model("a100-80g", "llama-3-8b", cuda_graph=True).grid_ends()  # 64 decodes, 4,096-token chunks


def _run(*more, engine="python"):
    """A closed loop of fixed requests on the A100 Llama-3-8B pack (quickstart's engine)."""
    sc = servesim.load_scenario(str(REPO / "scenarios/quickstart.yaml"), [
        "stop={requests: 60, warmup_requests: 0}", "workload.arrival={process: closed, clients: 8, think_s: 0}",
        f"sim.engine={engine}", *more])
    return servesim.simulate(sc)


def test_a_batch_inside_the_grid_is_not_extrapolated():
    s = _run("workload.prompt={dist: fixed, value: 500}", "workload.output={dist: fixed, value: 50}").summary
    ex = s["extrapolation"]
    assert ex["measured_grid"] and ex["iterations"] == s["engine"]["iterations"]
    assert ex["iterations_outside"] == 0 and ex["iterations_share"] == 0.0 and ex["warning"] is None
    assert all(v["iterations"] == 0 for v in ex["by_op"].values())
    assert ex["by_op"]["decode_batch"]["grid_end"] == ENDS["decode_batch"] == 64


def test_a_batch_outside_the_grid_is_counted_per_op_kind_and_warned():
    """96 clients decode together (> 64, the largest measured decode batch); then prompts of
    6,000 tokens (> the 4,096-token largest measured prefill chunk)."""
    res = _run("workload.arrival={process: closed, clients: 96, think_s: 0}", "stop={requests: 200, warmup_requests: 0}",
               "workload.prompt={dist: fixed, value: 100}", "workload.output={dist: fixed, value: 200}")
    ex = res.summary["extrapolation"]
    by = ex["by_op"]
    assert by["decode_batch"]["iterations"] > 0 and by["prefill_chunk"]["iterations"] == 0
    assert by["gemm_tokens"]["iterations"] == 0  # 8,192-token budget < 32,768 measured
    assert 0 < ex["iterations_share"] <= 1 and 0 < ex["step_time_share"] <= 1
    assert ex["iterations_outside"] == by["decode_batch"]["iterations"]
    assert ex["iterations_share"] > WARN_SHARE and ex["warning"].startswith(f"{ex['iterations_share']:.0%} of iterations")
    assert "decode attention batch > 64" in ex["warning"]
    from servesim.report.console import print_summary

    console = Console(record=True, width=300)
    print_summary(console, res)
    text = console.export_text()
    assert "pack grid " in text and "warning   " in text and "outside the calibration pack's measured grid" in text

    long = _run("workload.prompt={dist: fixed, value: 6000}", "workload.output={dist: fixed, value: 40}").summary
    by = long["extrapolation"]["by_op"]
    assert 60 <= by["prefill_chunk"]["iterations"] <= 61  # each prompt's one prefill iteration (no chunking)
    assert by["decode_batch"]["iterations"] == 0
    assert "prefill attention chunk tokens > 4,096" in long["extrapolation"]["warning"]


def _counts(summary):
    ex = summary["extrapolation"]
    return [ex["iterations"], ex["iterations_outside"]] + [ex["by_op"][k]["iterations"] for k, _ in KINDS], \
        ex["step_time_share"]


def test_fast_path_and_compiled_engine_count_as_single_stepping():
    more = ("workload.arrival={process: closed, clients: 80, think_s: 0}", "stop={requests: 160, warmup_requests: 0}",
            "workload.prompt={dist: lognormal, mean: 3000, sigma: 0.6, min: 1, max: 7000}",
            "workload.output={dist: fixed, value: 60}")
    ref, share = _counts(_run(*more).summary)
    single, share1 = _counts(_run(*more, "sim.fast_path=false").summary)
    compiled, share2 = _counts(_run(*more, engine="compiled").summary)
    assert ref == single == compiled and ref[1] > 0
    assert share == pytest.approx(share1, rel=1e-12) and share == pytest.approx(share2, rel=1e-12)


def test_a_roofline_run_has_no_grid():
    ex = _run("step_time={model: roofline}").summary["extrapolation"]
    assert ex == {"measured_grid": False, "note": ex["note"]} and "not a calibration pack" in ex["note"]


def test_a_fleet_counts_every_replica():
    one = _run("workload.prompt={dist: fixed, value: 6000}", "workload.output={dist: fixed, value: 20}").summary
    two = _run("workload.prompt={dist: fixed, value: 6000}", "workload.output={dist: fixed, value: 20}",
               "hardware.replicas=2").summary
    assert two["extrapolation"]["iterations"] == two["engine"]["iterations"]
    assert two["extrapolation"]["by_op"]["prefill_chunk"]["iterations"] >= 60 * 0.9
    assert one["extrapolation"]["by_op"]["prefill_chunk"]["iterations"] >= 60 * 0.9


def test_counters_start_at_zero_for_every_engine():
    """The model is cached and shared: each engine gets its own counters, so a second run of the
    same scenario reports the same counts, not twice them."""
    a = _counts(_run("workload.prompt={dist: fixed, value: 6000}").summary)
    b = _counts(_run("workload.prompt={dist: fixed, value: 6000}").summary)
    assert a == b
    m = load_pack_model("a100-80g", "llama-3-8b", cuda_graph=True)
    t1, t2 = m.tables(8192, 256), m.tables(8192, 256)
    assert not np.shares_memory(t1.pk_ex, t2.pk_ex)


def test_the_report_shows_the_coverage(tmp_path):
    from servesim.report.build import write_run_report

    res = _run("workload.arrival={process: closed, clients: 96, think_s: 0}", "stop={requests: 150, warmup_requests: 0}",
               "workload.prompt={dist: fixed, value: 100}", "workload.output={dist: fixed, value: 100}")
    res.write(tmp_path / "run")
    write_run_report(tmp_path / "run")
    html = (tmp_path / "run" / "report.html").read_text()
    assert "Calibration coverage" in html and "decode attention batch &gt; 64" in html.replace("> 64", "&gt; 64")
    assert "step time</b> pack a100-80g/llama-3-8b" in html
    from servesim.report.charts import extrapolation_figures
    from servesim.report.rundata import load_run

    (fig,) = extrapolation_figures([load_run(tmp_path / "run")])
    spec = fig.spec()  # a valid Vega-Lite spec
    values = spec["data"]["values"] if "data" in spec else spec["datasets"][next(iter(spec["datasets"]))]
    shares = {(r["op"], r["measure"]): r["share"] for r in values}
    ex = res.summary["extrapolation"]["by_op"]["decode_batch"]
    assert shares[("decode attention batch > 64", "iterations")] == pytest.approx(ex["iterations_share"])


def test_a_run_with_no_iteration_draws_no_coverage_chart(tmp_path):
    from servesim.report.charts import extrapolation_figures
    from servesim.report.rundata import load_run

    res = _run("workload.prompt={dist: fixed, value: 9000}", "stop={requests: 5, warmup_requests: 0}")
    assert res.summary["requests"]["rejected"] == 5 and res.summary["extrapolation"]["iterations"] == 0
    res.write(tmp_path / "r")
    assert extrapolation_figures([load_run(tmp_path / "r")]) == []
