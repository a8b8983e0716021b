"""The reference experiments of issue 15 (scenarios/reference/, python -m benchmarks.reference,
docs/reference-experiments.md): every arm loads and builds, arms of one experiment differ only
where they say they do, the runner runs end to end on tiny sizes and fills the document."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from servesim import load_scenario
from servesim.simulate import build
from tests.conftest import REPO

REF = REPO / "scenarios" / "reference"
ARMS = sorted(REF.glob("*.yaml"))
SPECS = sorted((REF / "sweeps").glob("*.yaml"))
DOC = REPO / "docs" / "reference-experiments.md"


def _raw(name: str) -> dict:
    return yaml.safe_load((REF / name).read_text())


def _without(d: dict, *paths: str) -> dict:
    out = json.loads(json.dumps(d))
    for p in paths:
        *head, last = p.split(".")
        node = out
        for k in head:
            node = node.get(k, {})
        node.pop(last, None)
    out.pop("name", None)
    return out


@pytest.mark.parametrize("path", ARMS, ids=[p.name for p in ARMS])
def test_every_arm_loads_and_builds(path):
    sc = load_scenario(path)
    b = build(sc, cold="python")  # workload, memory plan, KV, step-time tables: what a run needs
    assert len(b.workload) > 0
    assert sc.name == path.stem  # outputs land in out/<file name>


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_sweep_spec_loads_on_an_arm(path):
    from servesim.sweep.spec import load_spec

    spec = load_spec(path)  # validates every point's scenario
    base = yaml.safe_load(path.read_text())["base"]
    assert (REF / Path(base).name).is_file() and spec.points


def test_fleet_arms_share_workload_router_and_duration():
    spark, halo = _raw("a_fleet_spark.yaml"), _raw("a_fleet_halo.yaml")
    differ = ("engine", "hardware.replicas", "kv_tiers")
    assert _without(spark, *differ) == _without(halo, *differ)
    assert spark["hardware"]["replicas"] * 1 == 24 and halo["hardware"]["replicas"] * 4 == 24  # 24 GPUs each


@pytest.mark.parametrize("group,differ", [
    (["a_sessions_paged.yaml", "a_sessions_paged_nocache.yaml", "a_sessions_elastic.yaml", "a_sessions_static.yaml"],
     ("engine.kv_allocator", "engine.kv", "engine.enable_prefix_caching")),
    (["a_tiers_none.yaml", "a_tiers_l2.yaml", "a_tiers_l2_64g.yaml", "a_tiers_l2_l3.yaml",
      "a_tiers_l2_l3_preload.yaml"],
     ("kv_tiers", "engine.kv")),
    (["b1_closed_vllm.yaml", "b1_closed_sglang.yaml"], ("engine",)),
    (["b2_mix_vllm.yaml", "b2_mix_sglang.yaml"], ("engine",)),
    (["b3_abnormal_vllm.yaml", "b3_abnormal_sglang.yaml"], ("engine",)),
])
def test_arms_differ_only_where_they_say(group, differ):
    first = _without(_raw(group[0]), *differ)
    for other in group[1:]:
        assert _without(_raw(other), *differ) == first, other


@pytest.mark.parametrize("engine", ["vllm-v0", "sglang-v0.3"])
def test_engine_arms_are_the_presets(engine):
    """Experiment B runs the versions report B names (claim B20): vLLM 0.6.3 (vllm-v0.yaml, the V0
    engine: `vllm` is now V1) and SGLang 0.3.2 (sglang-v0.3.yaml). The vLLM arms write out what
    the V0 preset leaves to its start-up rules (Qwen3's 32K context: chunked prefill off, budget
    max(max_model_len, 2048) = 32,768; with it off, V0's batch order: options.mix prefill_first;
    the open-loop arms b2 and b3, 0.6's asynchronous output processing: options.async_output) and
    carry no preset; the SGLang arms keep the preset, whose rule sets the memory fraction, with the
    radix cache off (nothing to reuse in B's prompts). No arm carries the request path
    (engine.api_*), which the arms predate."""
    preset = yaml.safe_load((REPO / "scenarios" / "engines" / f"{engine}.yaml").read_text())["engine"]
    for key in ("api_request_s", "api_token_s"):
        preset.pop(key)
    if engine == "vllm-v0":
        preset.pop("preset")
        preset.update(enable_chunked_prefill=False, max_num_batched_tokens=32768,
                      options={**preset["options"], "mix": "prefill_first"})
    else:
        preset.update(enable_prefix_caching=False)
    stem = engine.split("-")[0]
    for name in (f"b1_closed_{stem}.yaml", f"b2_mix_{stem}.yaml", f"b3_abnormal_{stem}.yaml"):
        want = preset
        if engine == "vllm-v0" and not name.startswith("b1"):  # open loops: asynchronous output too
            want = {**preset, "options": {**preset["options"], "async_output": True}}
        assert _raw(name)["engine"] == want, name


@pytest.mark.parametrize("name", ["b1_closed_vllm.yaml", "b2_mix_vllm.yaml", "b3_abnormal_vllm.yaml"])
def test_vllm_arms_are_what_the_v0_rules_decide(name):
    """The fields the vLLM arms write out (chunked prefill, token budget, batch order) are what
    the vllm-v0 preset's start-up rules decide for the arm's model: given the preset and none of
    them, the resolved engine is the arm's (V0's prefill-first steps included)."""
    from servesim import scenario_from_dict

    raw = _raw(name)
    engine = {k: v for k, v in raw["engine"].items() if k not in ("enable_chunked_prefill", "max_num_batched_tokens")}
    engine["options"] = {k: v for k, v in engine["options"].items() if k != "mix"}
    ruled = scenario_from_dict({**raw, "engine": {**engine, "preset": "vllm-v0"}}).engine.model_dump()
    arm = load_scenario(REF / name).engine.model_dump()
    assert ruled.pop("preset") == "vllm-v0" and arm.pop("preset") is None
    assert ruled == arm and arm["options"]["mix"] == "prefill_first"


def test_b4_vllm_batch_order_follows_chunked_prefill():
    """V0 runs _schedule_default (prefill-first steps) with chunked prefill off and
    _schedule_chunked_prefill (decodes first: running_first) with it on; the option does not follow
    the toggle by itself, so every point of the knob sweep sets it."""
    from servesim.sweep.spec import load_spec

    points = load_spec(REF / "sweeps" / "b4_knobs_vllm.yaml").points
    assert {p.scenario.engine.enable_chunked_prefill for p in points} == {False, True}
    for p in points:
        e = p.scenario.engine
        assert e.options["mix"] == ("running_first" if e.enable_chunked_prefill else "prefill_first"), p.values


def test_ranges_turn_vllm_chunked_prefill_on_with_its_order():
    """The range settings that turn vLLM's chunked prefill on also switch to V0's chunked order."""
    from benchmarks.reference import ranges

    for h in ranges.HEADLINES:
        for _, a, _b in ranges.pairs(h):
            e = a.scenario.engine
            if e.scheduler == "vllm":
                assert e.options["mix"] == ("running_first" if e.enable_chunked_prefill else "prefill_first"), a.label


def test_abnormal_arm_is_the_mix_plus_contamination():
    for e in ("vllm", "sglang"):
        assert _without(_raw(f"b3_abnormal_{e}.yaml"), "workload.contaminate") == _without(_raw(f"b2_mix_{e}.yaml"))
        c = _raw(f"b3_abnormal_{e}.yaml")["workload"]["contaminate"]
        assert c["fraction"] == 0.1 and c["prompt"]["min"] >= 16 * 1024


def test_every_arm_file_is_run_by_the_runner():
    from benchmarks.reference.plan import experiments

    runs = [r for e in experiments() for r in e.runs]
    used = {r.source.split()[0] for r in runs}
    specs_used = {s for s in used if "/sweeps/" in s}
    arms_used = {s for s in used if "/sweeps/" not in s}
    bases = {"scenarios/reference/" + Path(yaml.safe_load(Path(REPO, s).read_text())["base"]).name for s in specs_used}
    for p in ARMS:
        rel = str(p.relative_to(REPO))
        if p.name.startswith(("a_", "b")):
            assert rel in arms_used | bases, f"{rel} is not run by python -m benchmarks.reference"
    assert {str(p.relative_to(REPO)) for p in SPECS} == specs_used


def test_doc_fill_replaces_blocks_and_names_missing_markers():
    from benchmarks.reference.doc import DocError, blocks_in, fill

    text = "a\n<!-- generated: t1 -->\nold\n<!-- end: t1 -->\nb\n<!-- generated: t2 -->\nkeep\n<!-- end: t2 -->\n"
    out = fill(text, {"t1": "| new |"})
    assert "| new |" in out and "old" not in out and "keep" in out and blocks_in(out) == ["t1", "t2"]
    assert fill(out, {"t1": "| new |"}) == out  # idempotent
    with pytest.raises(DocError, match="no block 'nope'"):
        fill(text, {"nope": "x"})


def test_the_document_has_every_block_and_chart():
    from benchmarks.reference.doc import blocks_in

    text = DOC.read_text()
    names = set(blocks_in(text))
    for need in ("A-load", "A-prefill", "A-fleet", "A-fleet-kv", "A-capacity", "A-sessions", "A-rounds", "A-tiers",
                 "B1-latency", "B1-throughput", "B2-ttft", "B2-e2e", "B2-run", "B2-waits", "B2-capacity", "B3",
                 "B3-waits", "B3-run",
                 "B4", "chart-a_fleet", "chart-a_sessions", "chart-a_tiers", "chart-b1_closed", "chart-b2_b3_mix",
                 "chart-b4_knobs"):
        assert need in names, need
    for link in __import__("re").findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text):
        assert (DOC.parent / link).is_file(), link
    assert "quick smoke run" not in text  # the checked-in tables come from a full run


def test_runner_smoke(tmp_path, capsys):
    """The one command, on tiny sizes: runs, records, tables, charts, the document's blocks; a
    second call finds every run stored."""
    from benchmarks.reference.__main__ import main

    doc = tmp_path / "doc.md"
    shutil.copy(DOC, doc)
    args = ["--quick", "--only", "A-sessions,B1", "--capacity", "none", "--out", str(tmp_path / "out"),
            "--doc", str(doc), "--charts", str(tmp_path / "charts")]
    assert main(args) == 0
    text = doc.read_text()
    assert text.count("quick smoke run") == 4  # A-sessions, A-rounds, B1-latency, B1-throughput
    assert (tmp_path / "charts" / "a_sessions.png").stat().st_size > 1000
    assert (tmp_path / "charts" / "b1_closed.png").stat().st_size > 1000
    rec = json.loads((tmp_path / "out" / "records" / "A-sessions" / "paged.json").read_text())
    rounds = rec["rounds"]
    assert sum(d["requests"] for d in rounds) == rec["summary"]["requests"]["measured"]
    assert [d["round"] for d in rounds] == sorted(d["round"] for d in rounds)
    assert all(0 <= d["reuse_share"] <= 1 and 0 <= d["waste_share"] < 1 for d in rounds)
    static = json.loads((tmp_path / "out" / "records" / "A-sessions" / "static.json").read_text())
    assert all(d["waste_share"] > 0.9 for d in static["rounds"])  # 32,768 slots held for < 1,500 tokens
    assert (tmp_path / "out" / "runs" / "B1" / "vllm-qwen3-8b-c32" / "requests.parquet").is_file()
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count(" stored ") == 28  # 4 + 24 runs, none run again


def test_runner_refuses_bad_input(tmp_path, capsys):
    from benchmarks.reference.__main__ import main

    assert main(["--only", "B9", "--doc", str(tmp_path / "x.md")]) == 2
    assert "not an experiment" in capsys.readouterr().err
    assert main(["--only", "B1", "--doc", str(tmp_path / "missing.md"), "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_runner_smoke_with_fleets_and_capacity(tmp_path):
    from benchmarks.reference.__main__ import main

    doc = tmp_path / "doc.md"
    shutil.copy(DOC, doc)
    assert main(["--quick", "--only", "A-fleet", "--capacity", "all", "--out", str(tmp_path / "out"), "--doc", str(doc),
                 "--charts", str(tmp_path / "charts")]) == 0
    cap = json.loads((tmp_path / "out" / "capacity" / "A-fleet" / "spark-qwen3-8b-max-rate.json").read_text())
    assert cap["find"] == "max-rate" and cap["path"]
    assert (tmp_path / "out" / "capacity" / "A-fleet" / "spark-qwen3-8b-fleet-size.json").is_file()


# ------------------------------------------------------------------------ the shipped examples
MOONCAKE = [REPO / "scenarios" / "traces" / f"mooncake_{n}.yaml" for n in ("conversation", "synthetic")]


@pytest.mark.parametrize("path", MOONCAKE, ids=lambda p: p.stem)
def test_mooncake_examples_cache_prefixes(path):
    """They say prefix caching matters: it is on, with a tier large enough to hold the prefixes."""
    sc = load_scenario(path)
    assert sc.engine.enable_prefix_caching and sc.kv_tiers and sc.kv_tiers[0].capacity_gib >= 256


@pytest.mark.slow
@pytest.mark.needs_shared
def test_mooncake_conversation_caching_is_what_keeps_the_queue_bounded(shared_dir):
    """At the example's rate, without the cache the A100 preempts and recomputes long prompts
    and the queue grows for the whole run; with it, TTFT stays within seconds (measured on 1,500
    requests: ~4 s mean against minutes)."""
    from servesim import simulate

    path = MOONCAKE[0]
    on = simulate(load_scenario(path, {"stop.requests": 1500})).summary
    off = simulate(load_scenario(path, {"stop.requests": 1500, "kv_tiers": [],
                                        "engine.enable_prefix_caching": False})).summary
    assert on["kv"]["prefix_hit_rate"]["tokens"] > 0.15
    assert on["latency_s"]["ttft"]["mean"] < 10.0
    assert off["latency_s"]["ttft"]["mean"] > 10 * on["latency_s"]["ttft"]["mean"]


# ------------------------------------------------------------------------ the capacity tables
def _counts(verdict_of):
    calls = []

    def probe(n):
        calls.append(n)
        return verdict_of(n)

    return probe, calls


def test_fleet_size_search_doubles_then_bisects_to_the_tolerance():
    from benchmarks.reference.capacity import search_count

    probe, calls = _counts(lambda n: "pass" if n >= 700 else "fail")
    lo, hi, opens, refused = search_count(probe, 24, 0.15, 4096)
    assert refused is None and opens == [] and hi >= 700 > lo and hi / lo - 1 <= 0.15
    assert calls[:6] == [24, 48, 96, 192, 384, 768]


def test_fleet_size_search_stops_at_the_noise_and_reports_the_bracket():
    from benchmarks.reference.capacity import search_count

    probe, calls = _counts(lambda n: "pass" if n >= 90 else "open" if n >= 85 else "fail")
    lo, hi, opens, refused = search_count(probe, 6, 0.05, 4096)
    assert refused is None and lo < 85 and hi >= 90 and opens and all(85 <= o < 90 for o in opens)
    probe, _ = _counts(lambda n: "fail")
    assert search_count(probe, 6, 0.15, 48)[3] == "no count up to 48 replicas meets every SLO"
    probe, _ = _counts(lambda n: "pass")
    assert "already meets every SLO" in search_count(probe, 6, 0.15, 48)[3]


def test_a_refused_rate_search_still_shows_its_verified_bracket():
    from benchmarks.reference.tables import _bracket

    def p(x, verdict):
        return {"x": x, "rate_req_per_s": 350 * x, "replications": 6, "verdict": verdict,
                "slos": {"e2e_p99@P3 <= 5": {"verdict": verdict}}}

    refused = {"answered": False, "refused": "no answer: ...", "first_failure": None,
               "path": [p(1.0, "fail"), p(0.05, "pass"), p(0.06, "open"), p(0.07, "fail"), p(0.057, "pass")]}
    ok, fail = _bracket(refused, lambda q: f"x{q['x']:g}")
    assert ok == "at least x0.057; between, e2e_p99@P3 <= 5 stays within the noise of 6 replications"
    assert fail == "x0.07 (e2e_p99@P3 <= 5)"
    answered = {"answered": True, "answer": p(0.057, "pass"), "first_failure": p(0.06, "fail"), "path": []}
    assert _bracket(answered, lambda q: f"x{q['x']:g}") == ("x0.057", "x0.06 (e2e_p99@P3 <= 5)")


# ------------------------------------------------------- the reports' claims and the headline ranges
SEEDS = ("000_4867c6823a7f3107.txt", "003_04a25ae2cdc721c5.txt")  # report A, report B (../shared/seeds)


def _block(text: str, name: str) -> str:
    import re

    m = re.search(rf"<!-- generated: {re.escape(name)} -->\n(.*?)<!-- end: {re.escape(name)} -->", text, re.S)
    assert m, f"no block {name}"
    return m.group(1)


@pytest.mark.needs_shared
def test_every_claim_quotes_its_report(shared_dir):
    """Each claim's quote is verbatim in its report (A: Spark vs Halo; B: vLLM vs SGLang)."""
    from benchmarks.reference.claims import CLAIMS

    text = {"A": (shared_dir / "seeds" / SEEDS[0]).read_text(), "B": (shared_dir / "seeds" / SEEDS[1]).read_text()}
    assert "Spark" in text["A"] and "SGLang" in text["B"]
    missing = [c.id for c in CLAIMS if c.quote not in text[c.report]]
    assert not missing, missing


def test_every_claim_is_in_the_table_with_a_verdict():
    from benchmarks.reference.claims import CLAIMS, VERDICTS

    block = _block(DOC.read_text(), "claims")
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| # ")]
    ids = [r.split("|")[1].strip() for r in rows]
    assert ids == [c.id for c in CLAIMS]
    assert {c.report for c in CLAIMS} == {"A", "B"} and len(CLAIMS) >= 50
    for r in rows:
        verdict = r.split("|")[7].strip().strip("*")
        assert verdict in VERDICTS, r
    assert f"{len(CLAIMS)} claims:" in block


def test_claims_physics():
    """The figures the 'implausible' verdicts rest on, from the model shapes and the GPU registry:
    one 4K request of Qwen3-14B holds 0.67 GB of KV (report B says > 3.2 GB); 4,120 output tok/s
    of 2,048-in / 512-out requests needs the A100's whole peak FLOP/s for AWQ-8B (prefill + decode:
    (8.05 x 2,048 + 4,120) x 2 x 7.57e9 / 312e12 = 1.0); the summaries of report A need more than
    the 24 GPUs' peak bf16 FLOP/s even for 8B."""
    from benchmarks.reference.claims import physics

    p = physics()
    assert p["kv14_4k_gb"] == pytest.approx(4096 * 40 * 8 * 128 * 2 * 2 / 1e9)
    assert 4120 < p["ceiling64"] < 6000  # the HBM bound alone would allow it
    assert p["share4120"] == pytest.approx((4120 / 512 * 2048 + 4120) * 2 * 7.57e9 / 312e12, rel=0.01)
    assert p["share4120"] > 0.95 and p["share3680"] > 0.85
    assert p["flops8_share"] > 1.0
    assert p["pool_need64_gb"] < 0.5 * p["vllm_0p9_gb"]


def test_claims_verdict_follows_the_range():
    from benchmarks.reference.claims import _within

    assert _within({"spans": {"H-B1": (-5.0, 20.0)}}, "H-B1", 12.0) == "agrees"
    assert _within({"spans": {"H-B1": (-5.0, 5.0)}}, "H-B1", 12.0) == "disagrees"
    assert _within({"spans": {}}, "H-B1", 12.0) == "not expressible"


def test_range_rows_in_the_doc_match_a_fresh_run(tmp_path):
    """The cheapest headline (H-B1, 384 requests a run): its base pair and its first setting,
    run afresh, give the rows the document shows (byte for byte)."""
    from benchmarks.reference import ranges
    from benchmarks.reference.execute import execute

    h = next(x for x in ranges.HEADLINES if x.id == "H-B1")
    recs = {}
    for s, a, b in ranges.pairs(h)[:2]:
        for r in (a, b):
            recs[(r.exp, r.label)] = execute(r, tmp_path)
    rows = [ranges.row_line(h, ranges.row_of(h, s, recs[(a.exp, a.label)], recs[(b.exp, b.label)]))
            for s, a, b in ranges.pairs(h)[:2]]
    block = _block(DOC.read_text(), "range-H-B1")
    for row in rows:
        assert row in block, row


@pytest.mark.slow
def test_range_and_claims_blocks_regenerate_exactly(tmp_path):
    """`python -m benchmarks.reference --only ranges` into a copy of the document rewrites the
    claims table, the ranges and the tornado charts exactly as checked in (50 short runs)."""
    from benchmarks.reference.__main__ import main

    doc = tmp_path / "doc.md"
    shutil.copy(DOC, doc)
    assert main(["--only", "ranges", "--out", str(tmp_path / "out"), "--doc", str(doc),
                 "--charts", str(tmp_path / "charts")]) == 0
    new, old = doc.read_text(), DOC.read_text()
    for name in ("claims", "range-H-B1", "range-H-B3", "range-H-A"):
        assert _block(new, name) == _block(old, name), name
    for c in ("tornado_h_b1", "tornado_h_b3", "tornado_h_a"):
        assert (tmp_path / "charts" / f"{c}.png").stat().st_size > 1000
