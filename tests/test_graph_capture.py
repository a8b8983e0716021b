"""Which iterations replay a CUDA graph (servesim/perf/packmodel.py, kernels.pack_in_graph) and
the engine versions' capture rules that set it (servesim/config/engines.py GRAPH_RULES).

A replayed iteration costs its kernels K; an eager one max(K, C(n)), C the CPU launch floor. On
the synthetic pack C exceeds K for small batches, so every test below can tell the two apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim import jit
from servesim.errors import PackError
from servesim.perf import kernels as K
from servesim.perf.pack import read_pack
from servesim.perf.packmodel import PackStepModel
from servesim.scenario import ScenarioError, load_scenario, scenario_from_dict
from test_pack import SHAPE, synthetic_pack

ENGINES = Path(__file__).resolve().parents[1] / "scenarios" / "engines"


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return read_pack(synthetic_pack(tmp_path_factory.mktemp("pack")))


def decode(n: int, ctx: int = 256):
    return np.ones(n, np.int64), np.full(n, ctx, np.int64)


def test_decode_batch_above_the_cap_pays_the_eager_floor(pack):
    eager = PackStepModel(pack, SHAPE, cuda_graph=False)
    free = PackStepModel(pack, SHAPE, cuda_graph=True)  # no cap: today's rule
    capped = PackStepModel(pack, SHAPE, cuda_graph=True, graph_max_batch=4)
    for n in (4, 5, 8):
        assert eager.predict(*decode(n)) > free.predict(*decode(n))  # the floor binds here
    assert capped.predict(*decode(4)) == free.predict(*decode(4))
    for n in (5, 8):
        assert capped.predict(*decode(n)) == eager.predict(*decode(n))
        # a decode run prices each step as the single iteration does
        assert capped.predict_decode_run(n, n * 256, 3)[0] == capped.predict(*decode(n))
    assert capped.predict_decode_run(4, 4 * 256, 2)[0] == free.predict(*decode(4))


def test_piecewise_mixed_step_under_the_token_cap_is_a_graph(pack):
    """vLLM V1: a step of at most graph_max_tokens tokens replays, prefill or not; above, eager."""
    new = np.array([16, 1, 1])
    ctx = np.array([0, 256, 256])  # 18 tokens
    eager = PackStepModel(pack, SHAPE, cuda_graph=False)
    classic = PackStepModel(pack, SHAPE, cuda_graph=True)  # decode-only capture
    allg = PackStepModel(pack, SHAPE, cuda_graph=True, graph_scope="all")
    under = PackStepModel(pack, SHAPE, cuda_graph=True, graph_max_batch=18, graph_max_tokens=18)
    over = PackStepModel(pack, SHAPE, cuda_graph=True, graph_max_batch=17, graph_max_tokens=17)
    assert eager.predict(new, ctx) > allg.predict(new, ctx)
    assert classic.predict(new, ctx) == eager.predict(new, ctx)
    assert under.predict(new, ctx) == allg.predict(new, ctx)
    assert over.predict(new, ctx) == eager.predict(new, ctx)
    # a pure decode above the token cap and the batch cap runs eager too (V1: no graph above 512)
    assert over.predict(*decode(18)) == eager.predict(*decode(18))
    assert under.predict(*decode(18)) == classic.predict(*decode(18))
    assert under.breakdown_ms(new, ctx)["cpu_wait"] == 0.0 < over.breakdown_ms(new, ctx)["cpu_wait"]


def test_capped_kernels_compiled_equal_pure_python(pack):
    m = PackStepModel(pack, SHAPE, cuda_graph=True, graph_max_batch=6, graph_max_tokens=40)
    tab = m._tables()
    pure_iter, pure_dec = jit.pure(K.iteration_seconds), jit.pure(K.decode_seconds)
    rng = np.random.default_rng(5)
    for _ in range(60):
        n = int(rng.integers(1, 12))
        new = np.where(rng.random(n) < 0.3, rng.integers(2, 64, n), 1).astype(np.int64)
        ctx = rng.integers(0, 3000, n).astype(np.int64)
        assert K.iteration_seconds(tab, new, ctx, n) == pure_iter(tab, new, ctx, n)
        a, b = np.empty(4), np.empty(4)
        K.decode_seconds(tab, n, int(ctx.sum()), 4, a)
        pure_dec(tab, n, int(ctx.sum()), 4, b)
        assert (a == b).all()


def test_bad_caps_are_one_line(pack):
    for kw in ({"graph_max_batch": -1}, {"graph_max_tokens": 2.5}):
        with pytest.raises(PackError, match="must be an integer >= 0"):
            PackStepModel(pack, SHAPE, cuda_graph=True, **kw)
    with pytest.raises(PackError, match="needs cuda_graph on"):
        PackStepModel(pack, SHAPE, cuda_graph=False, graph_max_batch=8)
    for st in ({"model": "pack", "cuda_graph": False, "cuda_graph_max_tokens": 512},
               {"model": "auto", "cuda_graph_max_batch": 0}):
        with pytest.raises(ScenarioError) as e:
            scenario_from_dict({"step_time": st})
        assert "cuda_graph_max" in str(e.value) and "\n" not in str(e.value)


def bare(preset: str | None, gpu: str = "a100-80g", **over) -> dict:
    eng = {**({"preset": preset} if preset else {}), **over.pop("engine", {})}
    return {"hardware": {"gpu": gpu, **over.pop("hardware", {})}, "engine": eng, **over}


@pytest.mark.parametrize("preset, gpu, batch, tokens, words", [
    ("vllm-v1", "a100-80g", 512, 512, "piecewise for every step of <= 512 tokens"),
    ("vllm", "h100-80g", 512, 512, "piecewise for every step of <= 512 tokens"),
    ("vllm-v0", "a100-80g", 256, None, "decode-only, batches of <= 256 sequences"),
    ("vllm-v0.4", "a100-80g", 256, None, "vLLM 0.4.2 vllm/worker/model_runner.py"),
    ("sglang", "a100-80g", 256, None, "batches of <= 256 sequences: cuda_graph_max_bs"),
    ("sglang", "a100-40g", 32, None, "batches of <= 32 sequences"),
    ("sglang", "b200", 512, None, "batches of <= 512 sequences"),
    ("sglang-v0.3", "a100-80g", 160, None, "batches of <= 160 sequences"),
    ("tensorrt-llm", "a100-80g", 128, None, "batches of <= 128 sequences"),
])
def test_presets_set_their_capture_rule(preset, gpu, batch, tokens, words):
    sc = scenario_from_dict(bare(preset, gpu))
    assert (sc.step_time.cuda_graph_max_batch, sc.step_time.cuda_graph_max_tokens) == (batch, tokens)
    assert any(n.startswith("cuda graphs: ") and words in n for n in sc.engine_notes), sc.engine_notes


def test_rule_follows_the_engine_and_yields_to_given_fields():
    # V1's capture size is min(2 x max_num_seqs, 512, budget), on the capture list 1, 2, 4, 8k
    sc = scenario_from_dict(bare("vllm-v1", engine={"max_num_seqs": 10}))
    assert sc.step_time.cuda_graph_max_tokens == 16
    sc = scenario_from_dict(bare("vllm-v1", engine={"max_num_batched_tokens": 300}))
    assert sc.step_time.cuda_graph_max_tokens == 296
    # sglang at tp 4 on an 80 GiB GPU: 512
    sc = scenario_from_dict(bare("sglang", hardware={"gpus_per_replica": 4, "tp": 4}))
    assert sc.step_time.cuda_graph_max_batch == 512
    sc = scenario_from_dict(bare("vllm-v1", step_time={"model": "pack", "cuda_graph_max_tokens": 64}))
    assert (sc.step_time.cuda_graph_max_batch, sc.step_time.cuda_graph_max_tokens) == (512, 64)
    # an override re-decides from the given fields: a smaller max_num_seqs lowers the V1 cap
    again = sc.override({"engine.max_num_seqs": 8})
    assert (again.step_time.cuda_graph_max_batch, again.step_time.cuda_graph_max_tokens) == (16, 64)


def test_no_preset_or_eager_keeps_todays_rule():
    sc = scenario_from_dict(bare(None))
    assert sc.step_time.cuda_graph_max_batch is None and sc.step_time.cuda_graph_max_tokens is None
    assert not any(n.startswith("cuda graphs") for n in sc.engine_notes)
    sc = scenario_from_dict(bare("vllm-v1", step_time={"model": "pack", "cuda_graph": False}))
    assert sc.step_time.cuda_graph_max_tokens is None
    sc = scenario_from_dict(bare("lmdeploy"))  # TurboMind: no rule, said so
    assert sc.step_time.cuda_graph_max_batch is None
    assert any("no capture rule for lmdeploy" in n for n in sc.engine_notes)


def test_header_and_model_name_the_rule():
    from typer.testing import CliRunner

    from servesim.cli import app
    from servesim.perf.build import build_step_model

    out = CliRunner().invoke(app, ["check", str(ENGINES / "vllm-v1.yaml")])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "cuda graphs: piecewise for every step of <= 512 tokens" in text
    m = build_step_model(load_scenario(ENGINES / "vllm-v0.yaml"))
    assert "cuda graph for decode up to 256 seqs" in m.describe()
    m = build_step_model(load_scenario(ENGINES / "vllm-v1.yaml"))
    assert "piecewise for any iteration up to 512 tokens" in m.describe()


def test_header_says_the_rule_is_unused_when_auto_falls_back_to_the_roofline():
    """quickstart leaves step_time to auto; on a GPU without a pack auto takes the roofline, which
    prices no graphs, so the preset's capture note must not read as if it applied."""
    from typer.testing import CliRunner

    from servesim.cli import app

    root = ENGINES.parents[1] / "scenarios" / "quickstart.yaml"
    out = CliRunner().invoke(app, ["check", str(root), "--set", "hardware.gpu=l40s", "--set", "engine.preset=vllm-v1"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "roofline (uncalibrated)" in text
    assert "cuda graphs: piecewise" in text and "not used: the roofline step model prices no CUDA graphs" in text
    out = CliRunner().invoke(app, ["check", str(ENGINES / "vllm-v1.yaml")])  # a pack: no such words
    assert "not used" not in " ".join(out.output.split()), out.output


def test_sglang_memory_reserve_uses_the_same_graph_cap():
    """server_args.py (v0.5.x) reserves cuda_graph_max_bs x 2 MiB: on a 40 GiB A100 at tp 1 that
    is 32 x 2 (not 256 x 2): reserved = 512 + 4096 x 1.5 + 64 + 128 = 6848 MiB."""
    sc = scenario_from_dict(bare("sglang", "a100-40g", engine={"scheduler": "chunked"}))
    assert sc.step_time.cuda_graph_max_batch == 32
    assert any("(40960 - 6848 reserved MiB)" in n for n in sc.engine_notes), sc.engine_notes
