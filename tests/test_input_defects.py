"""Issue 26's crashes, silent acceptances and misleading messages on bad input (docs/reliability.md,
"Bad input"): each test failed before its fix (a traceback, exit 0, or a line blaming the wrong
thing). The same inputs are in the fuzzing corpus (tests/fuzz_inputs.py, ``known_inputs()``)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.conftest import BASE, merge
from tests.fuzz_inputs import run_cli

BIG = "1" * 5000  # over Python's 4,300-digit limit on int <-> str


def _write(path, raw: dict) -> str:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def refused(argv: list[str], *needles: str) -> str:
    """``servesim ARGV`` exits 2 with one ``error:`` line holding every needle."""
    code, crash, out, err = run_cli(argv)
    assert crash is None, f"crashed: {crash!r}"
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (code, out, err)
    line = lines[0]
    for n in needles:
        assert n in line, (n, line)
    assert len(line) < 400, line
    return line


def ran(argv: list[str]) -> tuple[str, str]:
    code, crash, out, err = run_cli(argv)
    assert crash is None and code == 0, (code, crash, out, err)
    return out, err


# ------------------------------------------------------------ crashes: 4,300-digit integers
def test_huge_integer_in_scenario_is_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(BASE, sort_keys=False).replace("seed: 1", f"seed: {BIG}"))
    refused(["check", str(f)], "line 2", "5,000 digits")


def test_huge_integer_in_set_is_one_line(tmp_path):
    f = _write(tmp_path / "s.yaml", BASE)
    line = refused(["check", f, "--set", f"seed={BIG}"], "--set seed", "5,000 digits")
    assert BIG not in line  # the value is shown cut, not 5,000 characters


def test_huge_integer_in_sweep_spec_is_one_line(tmp_path):
    _write(tmp_path / "s.yaml", BASE)
    (tmp_path / "sw.yaml").write_text(f"name: sw\nbase: s.yaml\naxes:\n  seed: [{BIG}]\n")
    refused(["sweep", str(tmp_path / "sw.yaml"), "--out", str(tmp_path / "o"), "--workers", "1"], "5,000 digits")


def test_huge_integer_in_jsonl_trace_is_one_line(tmp_path):
    (tmp_path / "t.jsonl").write_text(
        json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}) + "\n"
        + '{"timestamp": 50, "input_length": %s, "output_length": 5, "hash_ids": [0]}\n' % BIG)
    raw = merge(BASE, {})
    raw["workload"] = {"trace": {"file": "t.jsonl", "format": "mooncake"}}
    f = _write(tmp_path / "s.yaml", raw)
    refused(["check", f], "t.jsonl:2", "4,300 digits")


def test_huge_integer_in_csv_trace_is_named_a_count_too_large(tmp_path):
    (tmp_path / "t.csv").write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:01.5,{BIG},5\n")
    raw = merge(BASE, {})
    raw["workload"] = {"trace": {"file": "t.csv", "format": "azure"}}
    f = _write(tmp_path / "s.yaml", raw)
    refused(["check", f], "t.csv:2", "ContextTokens", "more than the 1,000,000,000")


# ------------------------------------------------------------ crashes: output places
def _sweep(tmp_path, points=(4, 8)) -> str:
    _write(tmp_path / "s.yaml", merge(BASE, {"stop": {"requests": 10}}))
    (tmp_path / "sw.yaml").write_text(f"name: sw\nbase: s.yaml\naxes:\n  engine.max_num_seqs: {list(points)}\n")
    return str(tmp_path / "sw.yaml")


def test_sweep_out_a_file_is_refused(tmp_path):
    spec = _sweep(tmp_path)
    (tmp_path / "afile").write_text("x")
    refused(["sweep", spec, "--out", str(tmp_path / "afile"), "--workers", "1"], "is a file, not a folder")


def test_capacity_out_a_folder_is_refused_before_the_search(tmp_path, monkeypatch):
    f = _write(tmp_path / "s.yaml", BASE)
    (tmp_path / "d").mkdir()
    import servesim.sweep.capacity as cap

    def no_search(*a, **k):  # the check must come before any probe runs
        raise AssertionError("the search ran before --out was checked")

    monkeypatch.setattr(cap, "find_max_rate", no_search)
    refused(["capacity", f, "--slo", "ttft_p99=0.5", "--out", str(tmp_path / "d")], "is a folder", "capacity.json")


@pytest.mark.parametrize("command", ["run", "sweep", "capacity", "compare", "report"])
def test_empty_out_is_refused(tmp_path, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = _write(tmp_path / "s.yaml", BASE)
    import servesim.sweep.capacity as cap

    monkeypatch.setattr(cap, "find_max_rate", lambda *a, **k: pytest.fail("the search ran"))
    argv = {"run": ["run", f], "sweep": ["sweep", _sweep(tmp_path)], "capacity": ["capacity", f, "--slo", "ttft_p99=1"],
            "compare": ["compare", "a", "b"], "report": ["report", "a"]}[command]
    refused([*argv, "--out", ""], "--out ''", "empty")
    assert {p.name for p in tmp_path.iterdir()} <= {"s.yaml", "sw.yaml"}  # nothing written into the working folder


def test_run_and_sweep_never_share_a_folder(tmp_path):
    f = _write(tmp_path / "q.yaml", merge(BASE, {"stop": {"requests": 10}}))
    ran(["run", f, "--out", str(tmp_path / "r"), "-q"])
    spec = _sweep(tmp_path)
    refused(["sweep", spec, "--out", str(tmp_path / "r"), "--workers", "1"], "holds a run", "folder of its own")
    ran(["sweep", spec, "--out", str(tmp_path / "w"), "--workers", "1", "-q"])
    refused(["run", f, "--out", str(tmp_path / "w"), "-q", "--force"], "holds a sweep", "folder of its own")
    assert not (tmp_path / "w" / "summary.json").exists()


# ------------------------------------------------------------ crashes: damaged run folders
@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    f = _write(d / "q.yaml", merge(BASE, {"stop": {"requests": 20}}))
    ran(["run", f, "--out", str(d / "r"), "-q"])
    return d / "r"


DAMAGES = {
    "no throughput": lambda s: s.pop("throughput"),
    "empty throughput": lambda s: s.update(throughput={}),
    "empty requests": lambda s: s.update(requests={}),
    "engine a number": lambda s: s.update(engine=3),
    "ttft null": lambda s: s["latency_s"].update(ttft=None),
    "by_class a list": lambda s: s.update(by_class=[]),
    "slo a list": lambda s: s.update(slo=[]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_report_and_compare_on_a_damaged_run_folder(tmp_path, run_folder, damage):
    d = tmp_path / "d"
    shutil.copytree(run_folder, d)
    s = json.loads((d / "summary.json").read_text())
    DAMAGES[damage](s)
    (d / "summary.json").write_text(json.dumps(s))
    refused(["report", str(d)], str(d), "re-run")
    code, crash, out, err = run_cli(["compare", str(run_folder), str(d), "--out", str(tmp_path / "c")])
    assert crash is None, f"crashed: {crash!r}"  # compare reads less: it may draw what is there, or refuse
    assert code == 0 or (code == 2 and str(d) in err and len(err.strip().splitlines()) == 1), (code, out, err)


def test_report_on_a_request_table_without_status(tmp_path, run_folder):
    import pandas as pd

    d = tmp_path / "d"
    shutil.copytree(run_folder, d)
    pd.read_parquet(d / "requests.parquet").drop(columns=["status"]).to_parquet(d / "requests.parquet")
    refused(["report", str(d)], "requests.parquet", "'status'")


# ------------------------------------------------------------ messages
def test_all_invalid_sweep_says_so(tmp_path):
    _write(tmp_path / "s.yaml", merge(BASE, {"stop": {"requests": 10}}))
    (tmp_path / "sw.yaml").write_text("name: sw\nbase: s.yaml\ninvalid: skip\naxes:\n  engine.max_num_seqs: [-1, 0]\n")
    line = refused(["sweep", str(tmp_path / "sw.yaml"), "--out", str(tmp_path / "o"), "--workers", "1"],
                   "all 2 points", "invalid", "max_num_seqs")
    assert "stored already" not in line


# ------------------------------------------------------------ silent acceptances
@pytest.mark.parametrize("slo,needle", [("ttft_p99=0", "never met"), ("ttft_p99<=-1", "never met"),
                                        ("req_per_s>=0", "always met"), ("slo_attainment>=1.5", "never met"),
                                        ("kv_peak_usage<=2", "always met")])
def test_capacity_slo_bounds_that_no_run_can_decide(tmp_path, slo, needle, monkeypatch):
    f = _write(tmp_path / "s.yaml", BASE)
    import servesim.sweep.capacity as cap

    monkeypatch.setattr(cap, "find_max_rate", lambda *a, **k: pytest.fail("a probe ran"))
    refused(["capacity", f, "--slo", slo, "--workers", "1"], needle, "allowed")


def test_capacity_slo_on_an_unknown_class_is_refused_before_any_run(tmp_path, monkeypatch):
    f = _write(tmp_path / "s.yaml", BASE)
    import servesim.sweep.capacity as cap

    monkeypatch.setattr(cap, "find_max_rate", lambda *a, **k: pytest.fail("a probe ran"))
    refused(["capacity", f, "--slo", "ttft_p99@chat=0.5", "--workers", "1"], "'chat'", "P0")
    # the library refuses it too (a search ran 26 runs and blamed the warm-up)
    import servesim
    from servesim.sweep.capacity import SLO, Budget, CapacityError, check_slos

    sc = servesim.load_scenario(f)
    with pytest.raises(CapacityError, match="not a class"):
        check_slos(sc, [SLO("ttft_p99@chat", 0.5)])
    check_slos(sc, [SLO("ttft_p99@P3", 0.5)])  # an SLA class of the single-stream form is a class
    assert Budget  # (imported for the library's refusal path)


def test_sweep_metric_on_an_unknown_class_is_refused(tmp_path):
    _write(tmp_path / "s.yaml", merge(BASE, {"stop": {"requests": 10}}))
    (tmp_path / "sw.yaml").write_text("name: sw\nbase: s.yaml\nmetrics: [ttft_p99, ttft_p99@chat]\n"
                                      "axes:\n  engine.max_num_seqs: [2, 4]\n")
    refused(["sweep", str(tmp_path / "sw.yaml"), "--out", str(tmp_path / "o"), "--workers", "1"],
            "metrics", "'chat'", "not a class")


def test_report_with_seeds_draws_the_seeds(tmp_path):
    f = _write(tmp_path / "s.yaml", merge(BASE, {"stop": {"requests": 10}}))
    out, _ = ran(["run", f, "--seeds", "2", "--workers", "1", "--out", str(tmp_path / "r"), "--report"])
    assert (tmp_path / "r" / "report.html").is_file()  # before: no report, no word
    html = (tmp_path / "r" / "report.html").read_text()
    assert "seed 1" in html and "seed 2" in html
    assert "report.html" in " ".join(out.split())


def test_single_stream_contaminate_into_default_is_refused(tmp_path):
    raw = merge(BASE, {"workload": {"contaminate": {"fraction": 0.5, "prompt": {"dist": "fixed", "value": 100},
                                                    "stream": "default"}}})
    refused(["check", _write(tmp_path / "s.yaml", raw)], "contaminate.stream", "'default'")


def test_static_batch_larger_than_the_slots_is_refused(tmp_path):
    raw = merge(BASE, {"engine": {"scheduler": "static-fifo", "max_batch_size": 32, "max_num_seqs": 8}})
    refused(["check", _write(tmp_path / "s.yaml", raw)], "max_batch_size 32", "max_num_seqs 8", "allowed")
    raw["engine"].pop("max_batch_size")  # the default 16 too
    refused(["check", _write(tmp_path / "s.yaml", raw)], "max_batch_size 16 (the default)", "max_num_seqs 8")


def test_zero_output_tokens_are_refused(tmp_path):
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:01.5,10,0\n"
                                    "2023-11-16 18:17:02.5,10,5\n")
    raw = merge(BASE, {})
    raw["workload"] = {"trace": {"file": "t.csv", "format": "azure", "min_output": 0}}
    refused(["check", _write(tmp_path / "s.yaml", raw)], "min_output", "0 tokens", ">= 1")
    import numpy as np

    from servesim.errors import WorkloadError
    from servesim.request import Workload

    with pytest.raises(WorkloadError, match="output_tokens = 0"):  # a handed-in workload too
        Workload(arrival_s=np.array([0.0, 1.0]), prompt_tokens=np.array([5, 5]), output_tokens=np.array([3, 0]),
                 klass=np.zeros(2, dtype=np.int8))


def test_duplicated_trace_column_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                                    "2023-11-16 18:17:01.5,10,5,900\n")
    raw = merge(BASE, {})
    raw["workload"] = {"trace": {"file": "t.csv", "format": "azure"}}
    refused(["check", _write(tmp_path / "s.yaml", raw)], "t.csv:1", "'ContextTokens' appears twice")
    (tmp_path / "l.csv").write_text("num_prefill_tokens,num_decode_tokens,num_decode_tokens\n10,5,7\n")
    raw["workload"] = {"lengths": {"file": "l.csv"}}
    refused(["check", _write(tmp_path / "s.yaml", raw)], "l.csv:1", "'num_decode_tokens' appears twice")


def test_seeds_are_bounded_as_stop_replications(tmp_path):
    f = _write(tmp_path / "s.yaml", BASE)
    refused(["run", f, "--seeds", "10001", "--out", str(tmp_path / "o")], "--seeds 10001", "10,000")
    assert not (tmp_path / "o").exists()


def test_gamma_cv_far_above_one_warns_with_the_realised_rate():
    import servesim
    from tests.conftest import scenario

    sc = scenario(stop={"requests": 400}, workload={"arrival": {"process": "gamma", "rate": 10.0, "cv": 1000.0}})
    res = servesim.simulate(sc)
    notes = [n for n in res.workload_notes if "gamma cv 1000" in n]
    assert notes and "against rate 10 req/s" in notes[0], res.workload_notes
    calm = scenario(stop={"requests": 400}, workload={"arrival": {"process": "gamma", "rate": 10.0, "cv": 2.0}})
    assert not [n for n in servesim.simulate(calm).workload_notes if "gamma cv" in n]  # 2/sqrt(400) = 0.1


def test_a_tier_of_no_block_is_refused(tmp_path):
    raw = merge(BASE, {"engine": {"enable_prefix_caching": True}, "kv_tiers": [{"kind": "cpu", "capacity_gib": 1e-5}]})
    refused(["check", _write(tmp_path / "s.yaml", raw)], "kv_tiers[0]", "capacity_gib 1e-05", "allowed")


def test_protect_shares_above_one_in_sum_warn(tmp_path):
    raw = merge(BASE, {"engine": {"enable_prefix_caching": True, "prefix_cache_eviction": "priority",
                                  "kv": {"protect_share": [0.8, 0.5]}}})
    out, _ = ran(["check", _write(tmp_path / "s.yaml", raw)])
    text = " ".join(out.split())
    assert "warning: engine.kv.protect_share [0.8, 0.5] sums to 1.3" in text  # before: no word
    import servesim

    assert any("sums to 1.3" in n for n in servesim.scenario_from_dict(raw).load_notes)
    raw["engine"]["kv"]["protect_share"] = [0.5, 0.5]
    assert not any("protect_share" in n for n in servesim.scenario_from_dict(raw).load_notes)


# ------------------------------------------------------------ messages
def test_set_on_a_list_item_says_lists_are_replaced_whole(tmp_path):
    f = _write(tmp_path / "s.yaml", BASE)
    refused(["check", f, "--set", "workload.streams[0].arrival.rate=2"], "lists are replaced whole",
            "'workload.streams=[...]'")
    raw = merge(BASE, {})
    raw["workload"] = {"streams": [{"name": "a", "arrival": {"process": "poisson", "rate": 1.0}}]}
    f = _write(tmp_path / "m.yaml", raw)
    refused(["check", f, "--set", "workload.streams.arrival.rate=2"], "workload.streams is a list",
            "replaced whole")


def test_a_sweep_set_mistake_is_blamed_on_the_spec(tmp_path):
    _write(tmp_path / "s.yaml", BASE)
    (tmp_path / "sw.yaml").write_text("name: sw\nbase: s.yaml\nset: {engine.max_num_seqs: -3}\n"
                                      "axes:\n  engine.block_size: [16, 32]\n")
    line = refused(["sweep", str(tmp_path / "sw.yaml"), "--out", str(tmp_path / "o"), "--workers", "1"],
                   "sw.yaml: set: engine.max_num_seqs = -3")
    assert "s.yaml:" not in line.replace("sw.yaml:", "")


def test_set_tensor_parallel_size_on_the_quickstart_works(tmp_path):
    from tests.conftest import REPO

    out, _ = ran(["check", str(REPO / "scenarios" / "quickstart.yaml"), "--set", "engine.tensor_parallel_size=2"])
    text = " ".join(out.split())
    assert "2 x a100-80g (tp 2, pp 1)" in text and "gpus_per_replica: dropped" in text
    # a file that itself disagrees is still refused
    raw = merge(BASE, {"hardware": {"gpus_per_replica": 1}, "engine": {"tensor_parallel_size": 2}})
    refused(["check", _write(tmp_path / "s.yaml", raw)], "gpus_per_replica 1 differs")


# ------------------------------------------------------------ output without a terminal; notebooks
def test_tables_are_not_cut_at_80_columns_without_a_terminal(tmp_path):
    """Before: rich wrapped and cut every line at 80 columns in a pipe or a log file."""
    f = _write(tmp_path / "s.yaml", merge(BASE, {"stop": {"requests": 10}}))
    out, _ = ran(["run", f, "--out", str(tmp_path / "r")])
    wrote = [x for x in out.splitlines() if x.startswith("wrote ")]
    assert len(wrote) == 1 and wrote[0].endswith("scenario.resolved.yaml"), out  # one whole line
    assert max(len(x) for x in out.splitlines()) > 80


def test_sweep_progress_prints_as_it_goes_without_a_terminal(tmp_path):
    import io

    from rich.console import Console

    from servesim.report.progress import PointsProgress

    buf = io.StringIO()
    with PointsProgress(Console(file=buf, width=400), "sweep", "runs") as bar:
        bar(0, 3)
        assert "sweep: 0/3 runs" in buf.getvalue()  # before: nothing until the bar stopped
        bar(1, 3)  # within PLAIN_EVERY_S of the last line: quiet
        assert "1/3" not in buf.getvalue()
        bar(3, 3)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("sweep: 0/3 runs") and lines[-1].startswith("sweep: 3/3 runs"), lines
    assert len(lines) == 2 and "runs/min" in lines[-1]


def test_notebook_charts_draw_offline():
    import altair as alt
    import pandas as pd

    from servesim.report import notebook as nb

    nb.offline_charts()
    try:
        chart = alt.Chart(pd.DataFrame({"a": [1, 2]})).mark_point().encode(x="a:Q")
        html = chart._repr_mimebundle_()[0]["text/html"] if isinstance(chart._repr_mimebundle_(), tuple) \
            else chart._repr_mimebundle_()["text/html"]
    finally:
        alt.renderers.enable("default")
    assert "vegaEmbed" in html and "cdn.jsdelivr" not in html and "<script src" not in html
    assert len(html) > 100_000 or "servesim-chart" in html  # the bundle is inlined (once per page)


def test_dotted_column_names_are_escaped_for_charts():
    import pandas as pd

    from servesim.report.notebook import field, plain_columns

    assert field("workload.arrival.rate") == "workload\\.arrival\\.rate"
    df = plain_columns(pd.DataFrame({"workload.arrival.rate": [1.0], "ttft_p99": [0.2]}))
    assert list(df.columns) == ["workload_arrival_rate", "ttft_p99"]
    import altair as alt

    spec = alt.Chart(pd.DataFrame({"workload.arrival.rate": [1.0, 2.0], "y": [1, 2]})).mark_line().encode(
        x=alt.X(field("workload.arrival.rate"), type="quantitative"), y="y:Q").to_dict()
    assert spec["encoding"]["x"]["field"] == "workload\\.arrival\\.rate"
