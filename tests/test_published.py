"""The public validation set (benchmarks/published): it loads, cites its sources, replays, and the
table it writes is consistent. No error is pinned: the errors are reported, not tested."""

from __future__ import annotations

import math
import statistics

import pytest

from benchmarks.published.replay import (METRICS, SECTION, Scored, arm_row, lengths_trace, load_rows, read_lengths,
                                         replay, scenario_of, table, unexplained, write_results)

DATA = load_rows()


def test_every_row_cites_a_source_with_title_url_and_table():
    assert len(DATA["rows"]) >= 15 and len(DATA["sources"]) >= 3
    for key, src in DATA["sources"].items():
        assert src["title"] and src["url"].startswith("https://") and src["where"], key
        text = " ".join(str(v) for v in src.values()).lower()
        # the two sources kept aside for an independent check are never used
        assert "benchmark_vllm_060" not in text and "sarathi" not in text, key
    for row in DATA["rows"]:
        assert row["measured"] and all(v > 0 for v in row["measured"].values()), row["id"]
        lengths = ({"lengths"} if "lengths" in row["setup"] else {"sglang_random", "requests", "rate"}
                   if "sglang_random" in row["setup"] else {"prompt", "output"})
        assert set(row["setup"]) >= {"gpu", "model", "batch"} | lengths, row["id"]


@pytest.mark.parametrize("row", DATA["rows"], ids=[r["id"] for r in DATA["rows"]])
def test_every_row_is_a_valid_scenario(row):
    sc = scenario_of(row, DATA["sources"][row["source"]])
    assert sc.hardware.gpu == row["setup"]["gpu"] and sc.model_shape.name == row["setup"]["model"]
    assert sc.engine.max_num_seqs == row["setup"]["batch"]
    rounds = int(DATA["sources"][row["source"]].get("rounds", 1))
    rate = row["setup"].get("rate")
    if "lengths" in row["setup"]:  # every listed request at time 0 with its own lengths
        pairs = read_lengths(row["setup"]["lengths"])
        assert sc.stop.requests == len(pairs) and sc.workload.trace is not None and str(rate) == "inf"
    elif "sglang_random" in row["setup"]:  # SGLang's random dataset rebuilt from its seed
        assert sc.stop.requests == row["setup"]["requests"] and sc.workload.trace is not None
    else:
        assert sc.stop.requests == row["setup"].get("requests", row["setup"]["batch"] * rounds)
    if "lengths" in row["setup"] or "sglang_random" in row["setup"]:
        pass
    elif rate is None:  # `batch` clients back to back
        assert sc.workload.arrival.clients == row["setup"]["batch"]
    elif str(rate) == "inf":  # every request at time 0
        assert sc.workload.arrival.process == "closed" and sc.workload.arrival.clients == sc.stop.requests
    else:
        assert sc.workload.arrival.process == "poisson" and sc.workload.arrival.rate == float(rate)
    assert sc.model_shape.quantization == row["setup"].get("quantization", "none")
    assert sc.tp == row["setup"].get("tp", 1)
    for key, value in (row.get("set") or {}).items():  # the row's own settings reach the engine
        assert getattr(sc.engine, key.split(".", 1)[1]) == value, (row["id"], key)


def test_a_cheap_subset_replays_into_a_consistent_table(tmp_path):
    rows = [r for r in DATA["rows"] if r["id"] in ("trt-b1-p128-ttft", "vllm-ci-h200-b8")]
    scored = replay(rows, DATA)
    assert [(x.row, x.metric) for x in scored] == [("trt-b1-p128-ttft", "ttft_mean_s"), ("vllm-ci-h200-b8", "e2e_mean_s")]
    for x in scored:
        assert math.isfinite(x.simulated) and x.simulated > 0
        assert x.error == pytest.approx(x.simulated / x.measured - 1)
        assert x.step_model.startswith("pack ")  # both have packs: a100-80g/llama-2-7b, h200/llama-3-8b
    text = table(scored, DATA)
    med = statistics.median(abs(x.error) for x in scored)
    assert f"median |error| {100 * med:.1f}%" in text and "2 published values from 2 configurations of 2 sources" in text
    for x in scored:
        assert f"| {x.row} | {METRICS[x.metric][0]} |" in text and f"{100 * x.error:+.1f}%" in text
    results = tmp_path / "RESULTS.md"
    results.write_text("# results\n\n## other\nkept\n")
    write_results(text, results)
    write_results(text, results)  # replaces its own section, keeps the rest
    body = results.read_text()
    assert body.count(SECTION) == 1 and "## other\nkept" in body


def test_a_miss_without_a_why_is_named_not_hidden():
    """The headline claims every miss over 25% is explained only when each has a why-text; a miss
    without one is named in the headline."""
    def sc(row, sim, why=""):
        return Scored(row, "lmdeploy-a100", "out_tok_s", 100.0, sim, "pack x", 0.0, why)
    fine = [sc("a", 105), sc("b", 140, why="because")]
    assert unexplained(fine) == []
    assert "every value off by more than 25% says why" in table(fine, DATA)
    bad = fine + [sc("c", 60)]
    assert [x.row for x in unexplained(bad)] == ["c"]
    text = table(bad, DATA)
    assert "NOT explained (no why in rows.yaml): c output tok/s." in text and "every value off" not in text


def test_an_online_source_keeps_the_request_path_and_an_offline_one_drops_it():
    """A serving benchmark's client goes through the engine's server (the preset's api_* times
    stay); an offline one does not (they are zeroed). The quantization reaches the model."""
    row = {"id": "t", "source": "s", "setup": {"gpu": "h200", "model": "llama-3.1-8b", "quantization": "fp8",
                                               "batch": 64, "prompt": 100, "output": 10, "requests": 20, "rate": 4},
           "set": {"engine.max_model_len": 4096}}
    online = scenario_of(row, {"engine": "tensorrt-llm", "online": True})
    offline = scenario_of(row, {"engine": "tensorrt-llm"})
    assert online.engine.api_request_s > 0 and online.engine.api_token_s > 0
    assert offline.engine.api_request_s == 0 and offline.engine.api_token_s == 0
    assert online.model_shape.quantization == "fp8" and online.workload.arrival.rate == 4.0


def test_the_modern_rows_run_on_the_step_models_their_sources_name():
    """The H200 serving row runs on the measured bf16 pack and scores the mean ITL; the FP8 rows on
    the measured fp8_static pack of each GPU, and their arm on
    the derived (dynamic-recipe) fp8 pack (trtllm-v10-fp8's 'where')."""
    ids = ("trt14s-h200-p467-o16-q2", "trt10-h200-p2048-o128", "trt10-h100-p2048-o128")
    scored = replay([r for r in DATA["rows"] if r["id"] in ids], DATA)
    by = {(x.row, x.metric, x.arm): x for x in scored}
    assert set(by) == {(ids[0], "ttft_mean_s", ""), (ids[0], "itl_mean_s", ""), (ids[1], "out_tok_s", ""),
                       (ids[2], "out_tok_s", ""), (ids[1], "out_tok_s", "fp8-dynamic-derived"),
                       (ids[2], "out_tok_s", "fp8-dynamic-derived"), (ids[1], "out_tok_s", "fp8-kv"),
                       (ids[2], "out_tok_s", "fp8-kv")}
    assert all(math.isfinite(x.simulated) and x.simulated > 0 for x in scored)
    assert by[ids[0], "itl_mean_s", ""].step_model == "pack h200/llama-3.1-8b"
    # the H200's own fp8_static pack since device call 28 (the H100's transferred before)
    assert by[ids[1], "out_tok_s", ""].step_model == "pack h200/llama-3.1-8b-fp8_static"
    assert by[ids[2], "out_tok_s", ""].step_model == "pack h100-80g/llama-3.1-8b-fp8_static"
    arm = "fp8-dynamic-derived"
    # each GPU's own dynamic-FP8 pack, measured since the eighth session (device calls 30 and 33)
    assert by[ids[1], "out_tok_s", arm].step_model == "pack h200/llama-3.1-8b-fp8"
    # the H100's own dynamic-FP8 pack: derived (its GEMM survey, device call 26) in the seventh session,
    # measured (device call 30) since the eighth -- the arm keeps its name, the step-model column says which
    assert by[ids[2], "out_tok_s", arm].step_model == "pack h100-80g/llama-3.1-8b-fp8"
    # arm fp8-kv: the row's own pack with the FP8 KV rule (servesim/perf/kvfp8.py), each GPU's own
    # decode_kv survey's ratio
    rule = "with an FP8 KV cache by rule (decode attention x H200 survey fp8/bf16"
    assert by[ids[1], "out_tok_s", "fp8-kv"].step_model.startswith("pack h200/llama-3.1-8b-fp8_static")
    assert by[ids[1], "out_tok_s", "fp8-kv"].step_model.endswith(rule + ")")
    assert by[ids[2], "out_tok_s", "fp8-kv"].step_model == (
        "pack h100-80g/llama-3.1-8b-fp8_static with an FP8 KV cache by rule (decode attention x H100-80G "
        "survey fp8/bf16)")


def test_the_fp8_kv_arm_takes_the_limits_trtllm_bench_derives_at_one_byte_per_kv_value():
    """trtllm-v10-fp8's 'where' rule (trtllm-bench get_settings / calc_engine_setting /
    finetune_setting) reproduces every row's max_batch_size and token budget at 2 bytes per KV
    value, and the fp8-kv arm's per_row limits at 1 byte (rows left out: nothing changes)."""
    from benchmarks.published.replay import arm_row
    from servesim.models import MODELS

    src = DATA["sources"]["trtllm-v10-fp8"]
    arm = src["arms"]["fp8-kv"]
    mib = {"h200": 143771, "h100-80g": 81559}  # nvidia-smi, as the 'where' says

    def up(x, q):
        return q * math.ceil(x / q)

    def limits(row, kv_bytes):
        s = row["setup"]
        m, tp, isl, osl = MODELS[s["model"]], s.get("tp", 1), s["prompt"], s["output"]
        gib = mib[s["gpu"]] / 1024 - m.num_params() / 2 ** 30 / tp
        per_tok = m.num_layers * 2 * m.num_kv_heads * m.head_dim * kv_bytes / tp / 2 ** 30
        bs = min(0.90 * gib / (per_tok * (isl + osl)), 4096)
        tok = min(bs * (1 + isl / osl), 32768)
        bs = max(64, up(bs, 32)) if bs < 256 else up(bs, 128) if bs < 1024 else up(bs, 256)
        tok = max(2048, up(tok, 256)) if tok < 4096 else up(tok, 512) if tok < 8192 else up(tok, 1024)
        return bs, max(tok, isl + bs, isl + osl)

    rows = [r for r in DATA["rows"] if r["source"] == "trtllm-v10-fp8"]
    assert len(rows) == 30 and arm["set"] == {"engine.kv_cache_dtype": "fp8"}
    for row in rows:
        assert limits(row, 2) == (row["setup"]["batch"], row["set"]["engine.max_num_batched_tokens"]), row["id"]
        r8 = arm_row(row, arm)
        assert limits(row, 1) == (r8["setup"]["batch"], r8["set"]["engine.max_num_batched_tokens"]), row["id"]



def test_the_h100_bf16_rows_run_on_the_h100s_own_packs_by_the_default_rule():
    """Since the measured H100 packs of llama-3-8b and llama-3.1-8b (2026-12-05), TensorRT-LLM's H100
    bf16 rows run on them without any row naming a step model: the v0.14 serving row on
    h100-80g/llama-3.1-8b (it ran the H200 pack transferred before), the v0.13 FP16 H100 column on
    each model's own pack."""
    ids = ("trt14s-h100-p467-o16-q2", "trt13h-l31-p5000-o500", "trt13h-l3-p5000-o500")
    rows = [r for r in DATA["rows"] if r["id"] in ids]
    assert len(rows) == 3 and not any("step_time" in str(r) for r in rows)
    by = {x.row: x.step_model for x in replay(rows, DATA)}
    assert by == {ids[0]: "pack h100-80g/llama-3.1-8b", ids[1]: "pack h100-80g/llama-3.1-8b",
                  ids[2]: "pack h100-80g/llama-3-8b"}


def test_the_v013_h100_rows_take_the_a100_rows_limits():
    """trtllm-bench build's derivation gives the same max_batch_size and token budget on both 80 GB
    GPUs (trtllm-v013-h100's 'where'), and the requests are the file's per ISL/OSL: each H100 row
    matches the A100 row of the same lengths (20000/2000's A100 row, added later, runs as llama-3.1-8b:
    llama-3-8b's context is 8,192)."""
    a100 = {(r["setup"]["prompt"], r["setup"]["output"], r["setup"]["model"]): r for r in DATA["rows"]
            if r["source"] == "trtllm-v013-a100"}
    h100 = [r for r in DATA["rows"] if r["source"] == "trtllm-v013-h100"]
    assert len(h100) == 23 and {r["setup"]["gpu"] for r in h100} == {"h100-80g"}
    matched = 0
    for r in h100:
        s = r["setup"]
        # LLaMA v2 7B (rows added once the H100 llama-2-7b pack existed) against its own A100 rows
        twin = a100.get((s["prompt"], s["output"], "llama-2-7b" if s["model"] == "llama-2-7b" else "llama-3-8b"))
        if twin is None:
            assert (s["prompt"], s["output"], s["model"]) == (20000, 2000, "llama-3.1-8b")
            twin = a100[20000, 2000, "llama-3.1-8b"]
            assert (s["batch"], s["requests"], r["set"]) == (twin["setup"]["batch"], twin["setup"]["requests"], twin["set"])
            continue
        matched += 1
        assert (s["batch"], s["requests"], r["set"]) == (twin["setup"]["batch"], twin["setup"]["requests"], twin["set"])
    assert matched == 22

def test_a_source_finding_is_printed_with_its_source_and_only_there():
    """A source's `finding` (what its errors say, written after the replay) follows its entry in
    the Sources list; a source without one prints none."""
    def sc(source):
        return Scored("r", source, "out_tok_s", 100.0, 50.0, "pack x", 0.0, "why")
    text = table([sc("trtllm-v10-fp8"), sc("trtllm-a100")], DATA)
    entry = {line.split("`")[1]: line for line in text.splitlines() if line.startswith("- `")}
    assert "**What it says:** " + DATA["sources"]["trtllm-v10-fp8"]["finding"].strip() in entry["trtllm-v10-fp8"]
    assert "What it says" not in entry["trtllm-a100"]


def test_an_arm_replays_the_same_rows_with_its_change_and_stays_out_of_the_headline(tmp_path):
    """A source's arm (one stated change, e.g. another weight recipe) is replayed next to the rows
    as stated, tabled on its own with the stated rows' errors beside it, and never enters the
    headline or the unexplained-miss list; an arm without 'what' or matching no row is refused."""
    import copy

    import yaml

    data = copy.deepcopy(DATA)
    data["sources"]["vllm-ci"]["arms"] = {
        "fp8": {"what": "FP8 weights instead of the checkpoint's bf16.", "rows": ["vllm-ci-h200"],
                "setup": {"quantization": "fp8"}}}
    rows = [r for r in data["rows"] if r["id"] in ("vllm-ci-h200-b8", "vllm-ci-a100-b8")]
    scored = replay(rows, data)
    arm = [x for x in scored if x.arm]
    assert [(x.row, x.arm) for x in arm] == [("vllm-ci-h200-b8", "fp8")]
    stated = next(x for x in scored if x.row == "vllm-ci-h200-b8" and not x.arm)
    assert arm[0].step_model.startswith("pack h200/llama-3.1-8b-fp8") and stated.step_model == "pack h200/llama-3.1-8b"
    assert arm[0].simulated != stated.simulated and arm[0].why == ""
    assert unexplained([Scored("c", "vllm-ci", "e2e_mean_s", 1.0, 2.0, "pack x", 0.0, "", "fp8")]) == []
    text = table(scored, data)
    assert "2 published values from 2 configurations" in text  # the headline: the stated rows only
    assert "`vllm-ci` arm `fp8`: FP8 weights instead of the checkpoint's bf16. **1 values" in text
    assert "| vllm-ci-h200-b8 | fp8 | E2E mean (s) |" in text and f"{100 * stated.error:+.1f}%" in text
    per = arm_row(rows[0], {"setup": {"batch": 4}, "per_row": {rows[0]["id"]: {"setup": {"batch": 2},
                                                                                "set": {"engine.max_model_len": 512}}}})
    assert per["setup"]["batch"] == 2 and per["set"]["engine.max_model_len"] == 512 and rows[0]["setup"]["batch"] == 8
    for bad, match in (({"rows": ["vllm-ci"]}, "'what'"), ({"what": "x", "rows": ["nope"]}, "match no row"),
                       ({"what": "x", "model": "y"}, "key 'model'"),
                       ({"what": "x", "rows": ["vllm-ci-h200"], "per_row": {"vllm-ci-a100-b8": {}}}, "per_row names")):
        d = copy.deepcopy(DATA)
        d["sources"]["vllm-ci"]["arms"] = {"a": bad}
        p = tmp_path / "rows.yaml"
        p.write_text(yaml.safe_dump(d))
        with pytest.raises(ValueError, match=match):
            load_rows(p)


def test_the_later_trtllm_bench_fp16_columns_take_the_v013_rows_setup():
    """TensorRT-LLM v0.14 / v0.15 / v0.17's FP16 ('Mixed') LLaMA v3.1 8B columns are expressed by
    trtllm-v013's rules (their 'where'): every ISL/OSL of the file, model llama-3.1-8b, the v0.13 row's
    limits and request count for the same lengths, every iteration priced as a CUDA-graph replay."""
    v13 = {(r["setup"]["prompt"], r["setup"]["output"]): r for r in DATA["rows"] if r["source"] == "trtllm-v013-h100"
           and r["setup"]["model"] == "llama-3.1-8b"}
    assert len(v13) == 9
    want = {"trtllm-v014-fp16": {"h100-80g", "a100-80g"}, "trtllm-v015-mixed": {"h100-80g", "a100-80g"},
            "trtllm-v017-a100": {"a100-80g"}}
    for src, gpus in want.items():
        rows = [r for r in DATA["rows"] if r["source"] == src]
        assert {r["setup"]["gpu"] for r in rows} == gpus and len(rows) == 9 * len(gpus), src
        assert DATA["sources"][src]["set"] == {"step_time.cuda_graph_max_batch": 2048,
                                               "step_time.cuda_graph_max_tokens": 22000}, src
        for gpu in gpus:
            mine = {(r["setup"]["prompt"], r["setup"]["output"]): r for r in rows if r["setup"]["gpu"] == gpu}
            assert set(mine) == set(v13), (src, gpu)
            for key, r in mine.items():
                twin = v13[key]
                assert r["setup"]["model"] == "llama-3.1-8b" and list(r["measured"]) == ["out_tok_s"], r["id"]
                assert (r["setup"]["batch"], r["setup"]["requests"], r["set"]) == (
                    twin["setup"]["batch"], twin["setup"]["requests"], twin["set"]), r["id"]


def test_the_v011_and_v012_rows_take_the_limits_their_files_state():
    """TensorRT-LLM v0.11's engines use the file's per-model tables and v0.12's trtllm-bench the
    hlapi-era benchmark_config.yml: max_batch_size 2048 (Meta-Llama-3-8B) / 4096 (Llama-2-7b-hf),
    8,192 tokens, chunked context on; requests are the file's per ISL/OSL; LLaMA v2 7B never above its
    4,096-token context, on the H100 (rows added once its own llama-2-7b pack existed) with the A100
    rows' setup (their 'where')."""
    req = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (2048, 128): 3000, (2048, 2048): 1500}
    for src, n in (("trtllm-v011-fp16", 16), ("trtllm-v012-mixed", 18)):
        rows = [r for r in DATA["rows"] if r["source"] == src]
        assert len(rows) == n, src
        sset = DATA["sources"][src]["set"]
        assert sset["engine.max_num_batched_tokens"] == 8192 and sset["engine.enable_chunked_prefill"] is True
        for r in rows:
            s = r["setup"]
            assert s["batch"] == {"llama-3-8b": 2048, "llama-2-7b": 4096}[s["model"]], r["id"]
            assert s["requests"] == req[s["prompt"], s["output"]], r["id"]
            assert s["model"] == "llama-3-8b" or s["prompt"] + s["output"] <= 4096, r["id"]
            mml = sset.get("engine.max_model_len") or r["set"]["engine.max_model_len"]
            assert mml >= s["prompt"] + s["output"], r["id"]
        l2 = {gpu: {(r["setup"]["prompt"], r["setup"]["output"]): (r["setup"], r.get("set")) for r in rows
                    if r["setup"]["model"] == "llama-2-7b" and r["setup"]["gpu"] == gpu}
              for gpu in ("a100-80g", "h100-80g")}
        a100 = {k: ({**v[0], "gpu": "h100-80g"}, v[1]) for k, v in l2["a100-80g"].items()}
        assert len(a100) == 4 and l2["h100-80g"] == a100, src


def test_the_gpustack_rows_keep_each_engines_own_batch_defaults():
    """GPUStack's runs used every engine flag at its default but those it names, so each row's
    batch (which the replay sets as engine.max_num_seqs) is the preset's own default for that GPU
    (vLLM V1: 256 on an A100, 1,024 on an H100; trtllm-serve: 2,048); online; all requests at once."""
    import servesim

    rows = [r for r in DATA["rows"] if r["source"].startswith("gpustack-")]
    assert len(rows) == 12
    for r in rows:
        src = DATA["sources"][r["source"]]
        s = r["setup"]
        assert src["online"] is True and str(s["rate"]) == "inf" and s["model"] == "qwen3-14b", r["id"]
        preset = servesim.load_scenario(f"scenarios/engines/{src['engine']}.yaml", [f"hardware.gpu={s['gpu']}",
                                                                                    "model=qwen3-14b",
                                                                                    "engine.enable_chunked_prefill=true"])
        assert s["batch"] == preset.engine.max_num_seqs, r["id"]


def test_a_lengths_row_replays_every_listed_request_at_time_0_with_its_lengths(tmp_path, monkeypatch):
    """setup.lengths: the file's requests, in order, all at time 0, each with its own prompt and
    output (a source's 0-token output as 1); a bad header or a finite rate is refused."""
    from benchmarks.published import replay as rp
    from servesim.simulate import scenario_workload

    monkeypatch.setattr(rp, "HERE", tmp_path)
    (tmp_path / "l.csv").write_text("prompt,output\n13,120\n700,0\n5,3\n")
    row = {"id": "t-len", "source": "s", "setup": {"gpu": "h100-80g", "model": "llama-3-8b", "batch": 256,
                                                   "lengths": "l.csv", "rate": "inf"}}
    trace, n = lengths_trace(row)
    assert n == 3 and trace.read_text().splitlines()[1:] == [
        "0.000000,published,13,120,133,Conversation log", "0.000000,published,700,1,701,Conversation log",
        "0.000000,published,5,3,8,Conversation log"]
    sc = scenario_of(row, {"engine": "vllm-v0", "online": True})
    w = scenario_workload(sc)
    assert list(w.prompt_tokens) == [13, 700, 5] and list(w.output_tokens) == [120, 1, 3]
    assert list(w.arrival_s) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="setup.lengths needs rate inf"):
        scenario_of({**row, "setup": {**row["setup"], "rate": 2}}, {"engine": "vllm-v0"})
    (tmp_path / "bad.csv").write_text("in,out\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        read_lengths("bad.csv")


def test_the_chunk_itl_leaves_out_the_zero_gaps_of_a_burst():
    """itl_chunk_mean_s: the mean of the non-zero gaps, each weighted by its count; with every
    token arriving alone it is the per-token mean."""
    from types import SimpleNamespace

    from benchmarks.published.replay import itl_chunk_mean

    def res(parts):
        itl = SimpleNamespace(parts=lambda: parts)
        return SimpleNamespace(recorder=SimpleNamespace(flush=lambda: None, itl=itl))

    burst = [([0.0, 0.07], [9, 1]), ([0.0, 0.08], [18, 2])]  # two bursts of 10 tokens, 1 and 2 requests
    assert itl_chunk_mean(res(burst)) == pytest.approx((0.07 + 2 * 0.08) / 3)
    alone = [([0.01, 0.02], [3, 1])]
    assert itl_chunk_mean(res(alone)) == pytest.approx((3 * 0.01 + 0.02) / 4)
    assert math.isnan(itl_chunk_mean(res([([0.0], [5])])))


def test_sglang_random_rebuilds_the_published_token_totals():
    """sglang_random draws SGLang bench_serving's random dataset from its seed: the rebuilt
    prompt / output token totals of the attention-backend file's three Llama-3.1-8B cases (200
    prompts, seed 1, range ratio 0) give the ratio of its printed input to output token throughput
    (one run's two totals over the same duration), to the printed digits; sends are Poisson at the
    row's rate, the first at time 0."""
    from benchmarks.published.replay import sglang_random

    printed = {(1024, 1024): (5232.96, 5355.04), (8192, 1024): (17652.56, 2275.40), (8192, 8192): (2419.37, 2588.25)}
    for (i_len, o_len), (in_tok_s, out_tok_s) in printed.items():
        reqs = sglang_random({"input_len": i_len, "output_len": o_len, "range_ratio": 0.0, "seed": 1}, 200, 16)
        prompt, output = sum(r[1] for r in reqs), sum(r[2] for r in reqs)
        assert prompt / output == pytest.approx(in_tok_s / out_tok_s, rel=2e-5), (i_len, o_len)
        assert all(1 <= r[1] <= i_len and 0 <= r[2] <= o_len for r in reqs)
        gaps = [b[0] - a[0] for a, b in zip(reqs, reqs[1:])]
        assert reqs[0][0] == 0.0 and min(gaps) > 0 and statistics.mean(gaps) == pytest.approx(1 / 16, rel=0.2)
    with pytest.raises(ValueError, match="sglang_random: key 'seeds'"):
        sglang_random({"input_len": 8, "output_len": 8, "range_ratio": 0.0, "seeds": 1}, 2, 1)
