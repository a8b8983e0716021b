"""Engine presets (scenarios/engines/) and their automatic rules (servesim/config/engines.py):
every preset loads and runs, each rule decides as the engine source it cites does, the decision
is printed in the header, and a field the scenario gives is never changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesim.scenario import load_scenario, scenario_from_dict

REPO = Path(__file__).resolve().parents[1]
ENGINES = REPO / "scenarios" / "engines"
PRESETS = ["vllm-v0", "vllm-v1", "vllm", "sglang", "tensorrt-llm", "lmdeploy", "vllm-v0.4", "sglang-v0.3",
           "lmdeploy-v0.2"]


def bare(preset: str, **over) -> dict:
    eng = {"preset": preset, **over.pop("engine", {})}
    return {"hardware": {"gpu": over.pop("gpu", "a100-80g")}, "engine": eng, **over}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_file_loads_with_its_preset(name):
    sc = load_scenario(ENGINES / f"{name}.yaml")
    assert sc.engine.preset == ("vllm-v1" if name == "vllm" else name)
    assert sc.engine_notes, "every preset's rules decide something on this model and GPU"


def test_vllm_is_an_alias_of_v1():
    """scenarios/engines/vllm.yaml is vllm-v1.yaml but for its name and leading comment, and the
    preset name `vllm` applies V1's rules."""
    a = yaml.safe_load((ENGINES / "vllm.yaml").read_text())
    b = yaml.safe_load((ENGINES / "vllm-v1.yaml").read_text())
    assert a.pop("name") == "vllm" and b.pop("name") == "vllm-v1"
    a["engine"].pop("preset"), b["engine"].pop("preset")
    assert a == b
    x, y = scenario_from_dict(bare("vllm")), scenario_from_dict(bare("vllm-v1"))
    assert x.engine.model_copy(update={"preset": None}) == y.engine.model_copy(update={"preset": None})
    assert x.engine_notes[0] == "engine.preset vllm = vllm-v1 (the current version)"


def test_v0_long_context_turns_chunked_prefill_on():
    """vLLM 0.6 arg_utils: max_model_len > 32768 -> chunked prefill on, budget 512; <= 32768 off,
    budget max(max_model_len, 2048)."""
    long = {"name": "long", "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8,
            "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256, "max_model_len": 40960}
    sc = scenario_from_dict(bare("vllm-v0", model=long))
    assert sc.engine.enable_chunked_prefill is True and sc.engine.max_num_batched_tokens == 512
    assert "chunked prefill on: max_model_len 40960 > 32768 (vLLM 0.6 vllm/engine/arg_utils.py)" in sc.load_notes
    at = scenario_from_dict(bare("vllm-v0", model=dict(long, max_model_len=32768)))
    assert at.engine.enable_chunked_prefill is False and at.engine.max_num_batched_tokens == 32768
    assert "chunked prefill off: max_model_len 32768 <= 32768 (vLLM 0.6 vllm/engine/arg_utils.py)" in at.load_notes
    short = scenario_from_dict(bare("vllm-v0", model=dict(long, max_model_len=1024)))
    assert short.engine.max_num_batched_tokens == 2048
    # the user's flag wins, and the budget follows it
    off = scenario_from_dict(bare("vllm-v0", model=long, engine={"enable_chunked_prefill": False,
                                                                 "max_num_batched_tokens": 40960}))
    assert off.engine.enable_chunked_prefill is False and off.engine.max_num_batched_tokens == 40960
    assert not any(n.startswith("chunked prefill") for n in off.load_notes)
    assert off.engine.options["mix"] == "prefill_first"  # chunked prefill off: _schedule_default
    # a copy decides again from what was given (the rule's values are not frozen in as given)
    again = sc.override({"engine.max_model_len": 16384})
    assert again.engine.enable_chunked_prefill is False and again.engine.max_num_batched_tokens == 16384
    assert "mix" not in sc.engine.options and again.engine.options["mix"] == "prefill_first"


def test_v0_rule_on_shipped_long_context_models():
    """llama-3.1-8b (131,072 tokens): on, budget 512; gpt-oss-20b (131,072, a 128-token sliding
    window): off, as vLLM 0.6 leaves it for sliding-window models, budget max(len, 2048)."""
    on = scenario_from_dict(bare("vllm-v0", model="llama-3.1-8b"))
    assert on.engine.enable_chunked_prefill and on.engine.max_num_batched_tokens == 512
    off = scenario_from_dict(bare("vllm-v0", model="gpt-oss-20b"))
    assert not off.engine.enable_chunked_prefill and off.engine.max_num_batched_tokens == 131072
    assert ("chunked prefill off: max_model_len 131072 > 32768 but the model has a 128-token sliding window "
            "(vLLM 0.6 vllm/engine/arg_utils.py)") in off.load_notes


def test_v1_budget_by_gpu_class():
    a100 = scenario_from_dict(bare("vllm-v1"))
    h200 = scenario_from_dict(bare("vllm-v1", gpu="h200"))
    h100 = scenario_from_dict(bare("vllm-v1", gpu="h100-80g"))
    assert (a100.engine.max_num_batched_tokens, a100.engine.max_num_seqs) == (2048, 256)
    assert (h100.engine.max_num_batched_tokens, h100.engine.max_num_seqs) == (8192, 1024)
    assert (h200.engine.max_num_batched_tokens, h200.engine.max_num_seqs) == (8192, 1024)
    for sc in (a100, h200):
        assert sc.engine.enable_chunked_prefill and sc.engine.enable_prefix_caching
    given = scenario_from_dict(bare("vllm-v1", engine={"max_num_batched_tokens": 4096, "enable_prefix_caching": False}))
    assert given.engine.max_num_batched_tokens == 4096 and not given.engine.enable_prefix_caching


def test_sglang_memory_rules():
    """server_args.py _handle_gpu_memory_settings on an A100-80GB, tp 1: chunk 8192,
    cuda_graph_max_bs 256, reserved = 512 + 8192 x 1.5 + 256 x 2 + 128 = 13440 MiB (> 10 GiB),
    mem_fraction_static = round((81920 - 13440) / 81920, 3) = 0.836; tp 4: 512 graphs, 0.825."""
    sc = scenario_from_dict(bare("sglang", engine={"scheduler": "chunked"}))
    assert sc.engine.chunked_prefill_size == 8192 and sc.engine.enable_prefix_caching
    assert any("mem_fraction_static 0.836 = (81920 - 13440 reserved MiB)" in n for n in sc.load_notes)
    tp4 = scenario_from_dict(bare("sglang", engine={"scheduler": "chunked", "tensor_parallel_size": 4},
                                  model="qwen3-14b"))
    assert any("mem_fraction_static 0.825 = (81920 - 14336 reserved MiB)" in n for n in tp4.load_notes)
    # servesim's utilization holds the activations its memory plan reserves on top of SGLang's
    # fraction (weights + KV): the KV pool the plan gives is mem_fraction_static x memory - weights
    from servesim.memory import plan_memory
    plan = plan_memory(sc)
    assert plan.kv_bytes == pytest.approx(0.836 * plan.gpu_bytes - plan.weight_bytes, rel=1e-3)
    shipped = load_scenario(ENGINES / "sglang.yaml", ["engine.max_running_requests=512"])
    plan = plan_memory(shipped)
    assert plan.kv_bytes == pytest.approx(0.836 * plan.gpu_bytes - plan.weight_bytes, rel=1e-3)
    pinned = scenario_from_dict(bare("sglang", engine={"scheduler": "chunked", "gpu_memory_utilization": 0.88}))
    assert pinned.engine.gpu_memory_utilization == 0.88


def test_free_memory_fraction_engines():
    """TensorRT-LLM (0.9) and LMDeploy (0.8) size KV as a share of the memory left free: the
    plan's KV pool is that share of what weights, activations and the CUDA context leave."""
    from servesim.memory import plan_memory
    for preset, frac in (("tensorrt-llm", 0.9), ("lmdeploy", 0.8)):
        sc = load_scenario(ENGINES / f"{preset}.yaml")
        p = plan_memory(sc)
        free = p.gpu_bytes - p.weight_bytes - p.activation_bytes - p.non_torch_bytes
        assert p.kv_bytes == pytest.approx(frac * free, rel=1e-3), preset
    lm = scenario_from_dict(bare("lmdeploy", gpu="h200"))
    assert lm.engine.max_num_seqs == 1024
    assert scenario_from_dict(bare("lmdeploy")).engine.max_num_seqs == 384


def test_bad_preset_is_one_line():
    from servesim.errors import ScenarioError
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict(bare("vllm-v9"))
    msg = str(e.value)
    assert "engine.preset" in msg and "vllm-v9" in msg and "\n" not in msg


def test_header_names_preset_and_rules():
    from typer.testing import CliRunner
    from servesim.cli import app
    out = CliRunner().invoke(app, ["check", str(ENGINES / "vllm-v0.yaml"),
                                   "--set", "model={name: long, num_layers: 32, hidden_size: 4096, num_heads: 32, "
                                   "num_kv_heads: 8, head_dim: 128, intermediate_size: 14336, vocab_size: 128256, "
                                   "max_model_len: 40960}", "--set", "step_time={model: roofline}"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "vllm (preset vllm-v0)" in text
    assert "chunked prefill on: max_model_len 40960 > 32768 (vLLM 0.6 vllm/engine/arg_utils.py)" in text


@pytest.mark.parametrize("name", PRESETS[:2] + PRESETS[3:])
def test_preset_runs(name):
    """Each preset runs end to end (small: 60 requests; prefix caching off to stay compiled where
    it is on, the rules' other decisions kept)."""
    from servesim import simulate
    over = ["stop.requests=60", "stop.warmup_requests=0"]
    if name in ("vllm-v1", "sglang", "sglang-v0.3"):
        over.append("engine.enable_prefix_caching=false")
    res = simulate(load_scenario(ENGINES / f"{name}.yaml", over))
    assert res.summary["requests"]["completed"] == 60


def test_v1_preset_runs_with_its_prefix_cache():
    """vllm-v1 as shipped (prefix caching on, compiled like the rest: kv/pcache.py), a few requests."""
    from servesim import simulate
    sc = load_scenario(ENGINES / "vllm-v1.yaml", ["stop.requests=30", "stop.warmup_requests=0"])
    assert sc.engine.enable_prefix_caching and sc.engine.enable_chunked_prefill
    res = simulate(sc)
    assert res.summary["requests"]["completed"] == 30


@pytest.mark.parametrize("name", ["sglang", "sglang-v0.3"])
def test_sglang_presets_run_with_the_radix_cache_eviction(name):
    """The SGLang presets' rule picks the radix cache's own eviction order (kv/radix.py) where
    the cache is on, and leaves it alone where the cache is off or the eviction is given."""
    from servesim import simulate
    sc = load_scenario(ENGINES / f"{name}.yaml", ["stop.requests=30", "stop.warmup_requests=0"])
    assert sc.engine.prefix_cache_eviction == "sglang"
    assert any("prefix cache eviction sglang" in n for n in sc.engine_notes)
    assert simulate(sc).summary["requests"]["completed"] == 30
    off = load_scenario(ENGINES / f"{name}.yaml", ["engine.enable_prefix_caching=false"])
    assert off.engine.prefix_cache_eviction == "lru"
    given = load_scenario(ENGINES / f"{name}.yaml", ["engine.prefix_cache_eviction=lru"])
    assert given.engine.prefix_cache_eviction == "lru"


def test_resolved_file_reads_back_the_same_engine():
    """scenario.resolved.yaml writes every decided value out: read again (all fields given, so
    no rule decides anything), the engine is the same."""
    from servesim.resolved import resolved_yaml
    sc = load_scenario(ENGINES / "vllm-v1.yaml")
    again = scenario_from_dict(yaml.safe_load(resolved_yaml(sc)))
    par = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1}  # (resolved: both spellings)
    assert again.engine.model_dump() == {**sc.engine.model_dump(), **par}
    assert again.engine_notes == ()


# The versions the field reports name (issue 33): report A's Halo is a vLLM 0.4.2 branch, report B
# ran SGLang 0.3.2. Each value is the default read in that release's source, as the preset's
# comment cites it (file, version); None: left to the preset's rule, checked apart below.
CITED = {
    "vllm-v0.4": {  # vllm/engine/arg_utils.py, vllm/config.py, vllm/core/scheduler.py (v0.4.2)
        "scheduler": "vllm", "block_size": 16, "max_num_seqs": 256, "enable_chunked_prefill": False,
        "max_num_batched_tokens": 8192,  # rule: max(max_model_len 8192, 2048) without chunking
        "enable_prefix_caching": False, "gpu_memory_utilization": 0.9, "preemption": "recompute",
        "num_scheduler_steps": 1, "options.swap_space_gib": 4,
    },
    "sglang-v0.3": {  # python/sglang/srt/server_args.py, managers/, global_config.py (v0.3.2)
        "scheduler": "chunked", "block_size": 1, "enable_chunked_prefill": True, "chunked_prefill_size": 8192,
        "max_num_batched_tokens": 16384, "max_running_requests": None, "enable_prefix_caching": True,
        "preemption": "recompute", "options.mix": "prefill_first", "options.retract": "sglang",
        "options.admission": "sglang", "options.schedule_conservativeness": 1.0,
    },
    # the version of LMDeploy's A100 benchmark page (benchmarks/published): TurbomindModelConfig
    # (lmdeploy/turbomind/deploy/target_model/base.py), LlamaTritonModel.cc, LlamaBatch.cc,
    # SequenceManager.cc, BlockManager.cc (v0.2.0)
    "lmdeploy-v0.2": {
        "scheduler": "vllm", "block_size": 128, "max_num_seqs": 64, "enable_chunked_prefill": True,
        "max_num_batched_tokens": 4104,  # rule: session_len = llama2's 4096 + 8
        "enable_prefix_caching": False, "preemption": "recompute",
    },
}


@pytest.mark.parametrize("name,knobs", CITED.items(), ids=list(CITED))
def test_report_version_presets_carry_the_cited_defaults(name, knobs):
    sc = load_scenario(ENGINES / f"{name}.yaml")
    assert sc.engine.preset == name and sc.name == name
    for knob, want in knobs.items():
        head, _, opt = knob.partition(".")
        got = sc.engine.options.get(opt) if head == "options" else getattr(sc.engine, knob)
        assert got == want, f"{name}: {knob} = {got!r}, cited {want!r}"


def test_report_version_rules():
    """vLLM 0.4.2 has no long-context rule (chunked prefill stays off on a 131,072-token model;
    on when asked, with the 512-token budget); SGLang 0.3.2's mem_fraction_static is 0.88 at tp 1
    and 0.87 at tp 2 whatever the GPU (v0.5 derives it from the GPU's memory): the KV pool is that
    share of the GPU less the weights."""
    from servesim.memory import plan_memory
    long = scenario_from_dict(bare("vllm-v0.4", model="llama-3.1-8b"))
    assert not long.engine.enable_chunked_prefill and long.engine.max_num_batched_tokens == 131072
    on = scenario_from_dict(bare("vllm-v0.4", engine={"enable_chunked_prefill": True}))
    assert on.engine.max_num_batched_tokens == 512
    for tp, mfs, gpu in ((1, 0.88, "a100-80g"), (2, 0.87, "a100-80g"), (1, 0.88, "h200")):
        sc = load_scenario(ENGINES / "sglang-v0.3.yaml", {"engine.tensor_parallel_size": tp, "hardware.gpu": gpu,
                                                           "engine.max_running_requests": 512})
        plan = plan_memory(sc)
        assert plan.kv_bytes == pytest.approx(mfs * plan.gpu_bytes - plan.weight_bytes, rel=1e-3), (tp, gpu)
        assert any(f"mem_fraction_static {mfs} at tp {tp}" in n for n in sc.load_notes)


def test_lmdeploy_v0_2_rules():
    """TurboMind v0.2.0: the step budget is session_len (the model's context + 8), and
    cache_max_entry_count 0.5 is a share of the GPU's total memory (BlockManager.cc GetBlockCount),
    not of what the weights leave as in v0.10; a block count (>= 1) replaces it, and a given budget
    is kept."""
    from servesim.memory import plan_memory
    for gpu in ("a100-80g", "h200"):
        sc = scenario_from_dict(bare("lmdeploy-v0.2", gpu=gpu, model="llama-2-7b", engine={"block_size": 128}))
        assert sc.engine.max_num_batched_tokens == 4104
        plan = plan_memory(sc)
        assert plan.kv_bytes == pytest.approx(0.5 * plan.gpu_bytes, rel=2e-3), gpu
        assert any("KV = 0.5 of the GPU's total memory" in n for n in sc.load_notes)
    l3 = scenario_from_dict(bare("lmdeploy-v0.2", model="llama-3-8b"))
    assert l3.engine.max_num_batched_tokens == 8192 + 8
    given = scenario_from_dict(bare("lmdeploy-v0.2", engine={"max_num_batched_tokens": 2048,
                                                             "num_gpu_blocks_override": 1000}))
    assert given.engine.max_num_batched_tokens == 2048
    assert not any("gpu_memory_utilization" in n for n in given.load_notes)
    assert plan_memory(given).num_blocks == 1000
