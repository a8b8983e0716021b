"""Tensor and pipeline parallelism: step times, virtual engines, KV capacity, placement."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.errors import ScenarioError
from servesim.hardware import GPUS
from servesim.memory import plan_memory
from servesim.models import MODELS
from servesim.perf.packmodel import load_pack_model
from servesim.perf.roofline import RooflineStepModel
from servesim.simulate import build, run_built, simulate
from tests.conftest import BASE, merge

# every shipped (gpu, model) with packs for tp 1 and 2
TP_PAIRS = [("a100-80g", "llama-3-8b"), ("h200", "llama-3-8b"), ("h200", "qwen3-4b"), ("h200", "qwen3-8b"),
            ("h200", "qwen3-14b")]
LARGE = {  # batches large enough that the GEMMs, not the launches, set the time
    "prefill 4096": ([4096], [0]),
    "prefill 2 x 4096": ([4096, 4096], [0, 512]),
    "prefill 8192 chunked": ([2048] * 4, [0, 2048, 4096, 6144]),
    "decode 256 x 2048": ([1] * 256, [2048] * 256),
    "decode 512 x 1024": ([1] * 512, [1024] * 512),
}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("gpu,model", TP_PAIRS)
def test_tp2_step_time_is_between_half_and_all_of_tp1_for_large_batches(gpu, model, graph):
    """Each rank does half the GEMM and attention work, plus two all-reduces per layer (the
    pack's measured collectives): faster than one GPU, never twice as fast."""
    one = load_pack_model(gpu, model, tp=1, cuda_graph=graph)
    two = load_pack_model(gpu, model, tp=2, cuda_graph=graph)
    for name, (new, ctx) in LARGE.items():
        t1 = one.predict(np.array(new), np.array(ctx))
        t2 = two.predict(np.array(new), np.array(ctx))
        assert t1 / 2 < t2 < t1, (name, t1, t2)


def test_tp_roofline_between_half_and_all():
    shape = MODELS["llama-3-8b"]
    for gpu in GPUS.values():
        for tp in (2, 4, 8):
            a, b = RooflineStepModel(gpu, shape, 1), RooflineStepModel(gpu, shape, tp)
            for new, ctx in LARGE.values():
                t1, t2 = a.predict(np.array(new), np.array(ctx)), b.predict(np.array(new), np.array(ctx))
                assert t1 / tp < t2 < t1


def test_pp_step_adds_a_hop_per_stage_boundary_and_a_slow_link_more():
    new, ctx = np.array([1] * 64), np.array([512] * 64)
    pp1 = load_pack_model("a100-80g", "llama-3-8b", pp=1).predict(new, ctx)
    pp2 = load_pack_model("a100-80g", "llama-3-8b", pp=2).predict(new, ctx)
    pp4 = load_pack_model("a100-80g", "llama-3-8b", pp=4).predict(new, ctx)
    assert pp1 < pp2 < pp4
    # a stage boundary between servers: the link's latency plus bytes / bandwidth (64 x 8 KiB at 1 GB/s)
    far = load_pack_model("a100-80g", "llama-3-8b", pp=2, cross_hops=1, link_bytes_per_s=1e9, link_latency_s=1e-4)
    hop_near = pp2 - pp1
    assert far.predict(new, ctx) == pytest.approx(pp1 + 1e-4 + 64 * 4096 * 2 / 1e9, rel=1e-9, abs=hop_near * 1.01)
    r = RooflineStepModel(GPUS["a100-80g"], MODELS["llama-3-8b"], 1, 2)
    rx = RooflineStepModel(GPUS["a100-80g"], MODELS["llama-3-8b"], 1, 2, cross_hops=1, link_bytes_per_s=1e9,
                           link_latency_s=1e-4)
    assert rx.predict(new, ctx) > r.predict(new, ctx) + 1e-4


# ------------------------------------------------------------------ pipeline replicas run
def _pp(pp: int, workload: dict, requests: int, seed: int = 1) -> dict:
    return merge(BASE, {"seed": seed, "stop": {"requests": requests}, "engine": {"pipeline_parallel_size": pp,
                                                                                 "max_num_seqs": 64},
                        "cluster": {"groups": [{"replicas": 1}]}, "step_time": {"model": "pack"},
                        "workload": workload})


def test_pp2_has_more_throughput_at_saturation():
    """Two virtual engines keep two batches in flight: about twice the tokens per second of one
    GPU when clients always wait (a closed loop of 256), though each batch takes longer."""
    sat = {"arrival": {"process": "closed", "clients": 256, "think_s": 0.0},
           "prompt": {"dist": "uniform", "min": 100, "max": 800}, "output": {"dist": "uniform", "min": 50, "max": 300}}
    one = simulate(scenario_from_dict(_pp(1, sat, 1500))).summary
    two = simulate(scenario_from_dict(_pp(2, sat, 1500))).summary
    x1, x2 = one["throughput"]["output_tok_per_s"], two["throughput"]["output_tok_per_s"]
    assert x2 > 1.5 * x1, (x1, x2)
    assert two["cluster"]["engines"] == 2 and two["cluster"]["per_replica"][0]["pp"] == 2


def test_pp2_latency_above_pp1_at_low_load():
    """One request at a time: every token crosses the stage boundary, so each request is slower."""
    low = {"arrival": {"process": "closed", "clients": 1, "think_s": 0.5},
           "prompt": {"dist": "uniform", "min": 100, "max": 800}, "output": {"dist": "uniform", "min": 20, "max": 100}}
    a = simulate(scenario_from_dict(_pp(1, low, 100))).requests
    b = simulate(scenario_from_dict(_pp(2, low, 100))).requests
    assert (b.ttft_s > a.ttft_s).all() and (b.e2e_s > a.e2e_s).all()
    assert b.tpot_s.mean() > a.tpot_s.mean()


def test_virtual_engines_split_the_blocks_and_share_the_requests():
    raw = _pp(2, {"arrival": {"process": "poisson", "rate": 30.0}}, 200)
    b = build(scenario_from_dict(raw))
    plan = plan_memory(scenario_from_dict(raw))
    assert [e.plan.num_blocks for e in b.fleet.engines] == [plan.num_blocks // 2] * 2
    run_built(b)
    routed = [e.routed for e in b.replica.engines]
    assert sum(routed) == 200 and min(routed) > 50  # the fewest-unfinished rule spreads them


def test_a_lone_pipeline_replica_runs_its_virtual_engines():
    """Found defect: a replica with pipeline_parallel_size 2 and no cluster: section ran as one
    engine holding the whole pool, with one batch in flight (half the throughput, twice the TTFT
    of the same replica written as a group of one). It is a fleet of its virtual engines too."""
    import pandas as pd

    grouped = _pp(2, {"arrival": {"process": "poisson", "rate": 30.0}}, 200)
    lone = {k: v for k, v in grouped.items() if k != "cluster"}
    assert scenario_from_dict(lone).is_fleet
    a, b = simulate(scenario_from_dict(lone)), simulate(scenario_from_dict(grouped))
    assert a.summary["cluster"]["engines"] == 2
    pd.testing.assert_frame_equal(a.requests.drop(columns="group", errors="ignore"),
                                  b.requests.drop(columns="group", errors="ignore"))
    for key in ("latency_s", "throughput", "kv"):
        assert a.summary[key] == b.summary[key], key


def test_kv_capacity_follows_every_gpu_of_the_replica():
    def blocks_tokens(**eng):
        sc = scenario_from_dict(merge(BASE, {"engine": eng}))
        p = plan_memory(sc)
        return p.num_blocks, p.kv_bytes_per_token

    b1, t1 = blocks_tokens()
    b2, t2 = blocks_tokens(tensor_parallel_size=2)
    bp, tpp = blocks_tokens(pipeline_parallel_size=2)
    assert t2 == t1 // 2 and tpp == t1 // 2  # a GPU holds half the heads, or half the layers
    assert b2 > 2 * b1 and bp > 2 * b1  # the weights are split too: more than twice the tokens


# ---------------------------------------------------------------------------- placement
@pytest.mark.parametrize("patch,words", [
    ({"hardware": {"servers": 2, "gpus_per_server": 8}, "cluster": {"groups": [{"replicas": 17}]}},
     ["hardware.servers 2", "17 GPUs"]),
    ({"hardware": {"gpus_per_server": 4}, "engine": {"tensor_parallel_size": 8}},
     ["engine.tensor_parallel_size 8", "gpus_per_server 4"]),
    ({"hardware": {"gpus_per_server": 4}, "engine": {"tensor_parallel_size": 2, "pipeline_parallel_size": 4}},
     ["8 GPUs does not fit one server", "inter_server_link"]),
    ({"engine": {"pipeline_parallel_size": 3}}, ["engine.pipeline_parallel_size 3", "32 layers"]),
    ({"model": "qwen3-14b", "engine": {"pipeline_parallel_size": 3}}, ["pipeline_parallel_size 3", "40 layers"]),
    ({"engine": {"tensor_parallel_size": 3}}, ["engine.tensor_parallel_size 3", "attention heads"]),
    ({"cluster": {"groups": [{"replicas": 2}, {"replicas": 1, "engine": {"tensor_parallel_size": 16}}]}},
     ["cluster.groups[1]"]),
    ({"engine": {"tensor_parallel_size": 2}, "hardware": {"tp": 4, "gpus_per_replica": 4}},
     ["engine.tensor_parallel_size 2", "hardware.tp 4"]),
    ({"hardware": {"replicas": 2}, "cluster": {"groups": [{"replicas": 1}]}}, ["hardware.replicas 2"]),
    ({"cluster": {"groups": [{"replicas": 1, "gpu": "v100"}]}}, ["cluster.groups[0].gpu"]),
    ({"cluster": {"groups": [{"replicas": 0}]}}, ["cluster.groups[0].replicas"]),
    ({"cluster": {"router": "fastest"}}, ["cluster.router"]),
    ({"cluster": {"groups": [{"name": "a"}, {"name": "a"}]}}, ["cluster.groups", "'a' is used twice"]),
])
def test_impossible_placements_and_bad_fleets_fail_in_one_line(patch, words):
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(merge(BASE, patch), "f.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("f.yaml: ")
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("patch,words", [
    ({"hardware": {"gpu": "a100-80g"}, "model": "qwen3-14b",
      "engine": {"gpu_memory_utilization": 0.3, "max_model_len": 8192}}, ["does not fit"]),
    ({"cluster": {"groups": [{"replicas": 1}, {"replicas": 1, "model": "qwen3-14b",
                                               "engine": {"gpu_memory_utilization": 0.3, "max_model_len": 8192}}]}},
     ["cluster.groups[1]: model qwen3-14b does not fit"]),
    ({"hardware": {"replicas": 2}, "engine": {"pipeline_parallel_size": 4, "num_gpu_blocks_override": 3,
                                              "max_model_len": 16, "max_num_batched_tokens": 16}},
     ["3 KV blocks cannot be shared by pipeline_parallel_size 4"]),
])
def test_a_model_that_does_not_fit_fails_in_one_line_when_the_run_is_built(patch, words):
    """Whether the model fits its GPUs is planned when the run is built (servesim/memory.py):
    the same one line, naming the group."""
    sc = scenario_from_dict(merge(BASE, patch), "f.yaml")
    with pytest.raises(ScenarioError) as exc:
        build(sc)
    msg = str(exc.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_pipeline_stages_span_servers_over_the_link():
    raw = merge(BASE, {"hardware": {"gpus_per_server": 4, "servers": 3,
                                    "inter_server_link": {"bandwidth_gb_s": 25.0, "latency_s": 5e-6}},
                       "engine": {"tensor_parallel_size": 2, "pipeline_parallel_size": 4},
                       "cluster": {"groups": [{"replicas": 1}]}, "step_time": {"model": "pack"}})
    sc = scenario_from_dict(raw)
    assert sc.placement.stages == ((0, 0, 1, 1),) and sc.placement.cross_hops(0) == 1
    b = build(sc)
    assert "1 stage hop(s) between servers" in b.model.describe()
    # first fit: a 1-GPU replica after it takes the free GPU of server... none left on 0 or 1
    sc2 = scenario_from_dict(merge(raw, {"cluster": {"groups": [{"replicas": 1},
                                                                {"replicas": 2, "engine": {"tensor_parallel_size": 1,
                                                                                           "pipeline_parallel_size": 1}}]}}))
    assert sc2.placement.stages == ((0, 0, 1, 1), (2,), (2,))
