"""CPU logic tests of the precision, MoE, long-grid and survey parts of the profiler
(calibration/variants.py, surveys.py, profile_gpu.py), run by hand like test_profile_gpu_cpu.py
(torch is not a servesim dependency):

    python -m pytest -q calibration/test_variants_cpu.py      # a Python with torch (+ triton)

Why: the device time is 30 minutes a session, so every recipe is checked here against a float64
reference before a GPU runs it; CPU times are never data.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import profile_gpu as pg  # noqa: E402
import triton_decode as TD  # noqa: E402
import variants as V  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("fmt,tol", [("bf16", 5e-3), ("fp8", 5e-2), ("fp8_channel", 5e-2), ("int8", 2e-2),
                                     ("int4", 1e-2)])
def test_quantized_linear_multiplies_by_its_dequantized_weight(fmt, tol):
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(384, 256, generator=g) * 256 ** -0.5).to(torch.bfloat16)
    x = torch.randn(40, 256, generator=g).to(torch.bfloat16)
    lin = V.QLinear(w, fmt)
    y = lin(x)
    assert y.shape == (40, 384) and y.dtype == torch.bfloat16
    assert V.rel_err(y, x.double() @ lin.dequantized().double().t()) < tol
    # and the dequantized weight is the weight, up to the format's rounding
    assert V.rel_err(lin.dequantized(), w.double()) < {"int4": 0.15}.get(fmt, 0.05)


def test_int8_small_batches_are_padded_not_refused():
    w = torch.randn(64, 64).to(torch.bfloat16)
    lin = V.QLinear(w, "int8")
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert lin(x).shape == (3, 64)


def test_unknown_weight_format_is_refused():
    with pytest.raises(ValueError, match="weight format"):
        V.QLinear(torch.zeros(4, 4), "int3")


@pytest.mark.parametrize("grouped", [True, False])
def test_moe_layer_equals_its_float64_reference(grouped):
    m = V.MoE(V.MoEShape(8, 2, 64, 128), CPU, torch.Generator().manual_seed(0), grouped=grouped)
    x = torch.randn(33, 128).to(torch.bfloat16)
    assert V.rel_err(m(x), m.reference(x)) < 2e-2


def test_moe_routes_top_k_with_renormalized_weights():
    m = V.MoE(V.MoEShape(16, 4, 32, 64), CPU, torch.Generator().manual_seed(0))
    w, idx = m.gate(torch.randn(50, 64).to(torch.bfloat16))
    assert idx.shape == (50, 4) and int(idx.max()) < 16
    assert torch.allclose(w.sum(-1), torch.ones(50), atol=1e-5)
    assert all(len(set(r.tolist())) == 4 for r in idx)  # k distinct experts per token


@pytest.mark.skipif(TD.triton is None, reason="triton not installed")
@pytest.mark.parametrize("H,KVH,D,DPE,B,L", [(8, 2, 64, 0, 3, 100), (16, 1, 64, 16, 2, 40)])
def test_triton_decode_equals_float64_in_the_interpreter(H, KVH, D, DPE, B, L):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on CPU")
    q = torch.randn(B, H, D + DPE)
    k = torch.randn(B * L, KVH, D + DPE)
    v = k[..., :D] if DPE else torch.randn(B * L, KVH, D)
    out = torch.empty(B, H, D)
    TD.TritonDecode(H, KVH, D, D, DPE)(q, k, v, out, B, L, k_scale=0.5, v_scale=2.0)
    assert V.rel_err(out, TD.decode_reference(q, k, v, B, L, D, DPE, 0.5, 2.0)) < 1e-5


def test_new_shapes_match_the_model_library():
    lib = REPO / "servesim" / "models" / "library"
    for name in ("qwen3-30b-a3b", "llama-3.1-8b"):
        cfg = json.loads((lib / f"{name}.json").read_text())["config"]
        s = pg.SHAPES[name]
        assert s["num_layers"] == cfg["num_hidden_layers"] and s["hidden_size"] == cfg["hidden_size"]
        assert s["num_heads"] == cfg["num_attention_heads"] and s["num_kv_heads"] == cfg["num_key_value_heads"]
        assert s["vocab_size"] == cfg["vocab_size"]
        for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            assert s.get(k, 0) == cfg.get(k, 0), (name, k)
    assert pg.SHAPES["llama-3.1-8b"]["max_model_len"] == 131072


def test_pack_stems_and_rank_shapes_of_variants():
    assert pg.pack_stem("llama-3-8b", 1, "fp8") == "llama-3-8b-fp8"
    assert pg.pack_stem("llama-3-8b", 2, "fp8") == "llama-3-8b-fp8-tp2"
    assert pg.pack_stem("qwen3-30b-a3b", 1) == "qwen3-30b-a3b"
    rs = pg.RankShape.of("qwen3-30b-a3b", 1)
    assert rs.moe and rs.as_dict()["num_experts"] == 128 and rs.MI == 768
    assert pg.layer_ops(rs)[6:9] == ("moe_gate", "moe_experts", "moe_combine")
    assert pg.layer_ops(pg.RankShape.of("llama-3-8b", 1))[6:9] == ("gate_up_proj", "act", "down_proj")
    with pytest.raises(SystemExit, match="quantized experts"):
        pg.RankShape.of("qwen3-30b-a3b", 1, "fp8")
    with pytest.raises(SystemExit, match="survey"):
        pg.RankShape.of("llama-3-8b", 1, "int4")


def test_moe_and_fp8_forwards_run_and_match_the_op_functions():
    for model, weights in (("tiny-moe", "bf16"), ("tiny", "fp8")):
        rs = pg.RankShape.of(model, 1, weights)
        m = pg.Model(rs, CPU, share_layers=False)
        b = pg.Batch(pg.Composition(1, 20, 10, 3, 30), rs, CPU)
        out = pg.forward(m, b)
        assert out.shape == (4, rs.V) and torch.isfinite(out.float()).all()


def test_long_grid_adds_only_points_beyond_the_dense_grid():
    for model in ("qwen3-8b", "llama-3.1-8b"):
        b = pg.OpBench.__new__(pg.OpBench)
        b.rs, b.grid, b.quick, b.kv_cap = pg.RankShape.of(model, 1), pg.GRIDS["long"], False, 48 << 30
        dense = {(t, c) for t in pg.DENSE_PREFILL_CHUNKS for c in pg.DENSE_PREFILL_CTX}
        pts = b.prefill_grid()
        assert pts and not set(pts) & dense
        assert all(t + c <= b.rs.max_len for t, c in pts)
        dec = b.decode_grid()
        assert all(c + 1 <= b.rs.max_len and bb * (c + 1) * 4096 <= 48 << 30 for bb, c in dec)
    assert max(c for _, c in dec) == 131071 and max(t for t, _ in pts) == 32768


def test_combine_add_from_appends_new_points_within_max_len(tmp_path):
    out = tmp_path / "out" / "packs" / "h200"
    src = tmp_path / "src"
    out.mkdir(parents=True)
    src.mkdir()
    meta = {"model": "qwen3-8b", "gpu": "h200", "tp": 1, "date": "2026-12-01"}
    pg.write_rows(out / "qwen3-8b.csv", [("qkv_proj", 16, 0, 0, 0, 0.01, 0.0),
                                         ("attn_prefill", 1024, 0, 0, 0, 0.1, 0.0)])
    pg.write_yaml(out / "qwen3-8b.yaml", meta)
    pg.write_rows(src / "qwen3-8b.csv", [("qkv_proj", 16, 0, 0, 0, 0.5, 0.0),      # present: kept as is
                                         ("qkv_proj", 32768, 0, 0, 0, 3.0, 0.0),   # new
                                         ("attn_prefill", 8192, 0, 32768, 0, 9.0, 0.0),  # beyond 32K
                                         ("attn_prefill", 16384, 0, 0, 0, 5.0, 0.0)])    # new
    pg.write_yaml(src / "qwen3-8b.yaml", {**meta, "date": "2026-12-05"})
    assert pg.main(["combine", "--out", str(tmp_path / "out"), "--add-from", str(src)]) == 0
    rows = {(r[0], int(r[1]), int(r[3])): float(r[5]) for r in pg.read_rows(out / "qwen3-8b.csv")}
    assert rows[("qkv_proj", 16, 0)] == 0.01 and rows[("qkv_proj", 32768, 0)] == 3.0
    assert ("attn_prefill", 16384, 0) in rows and ("attn_prefill", 8192, 32768) not in rows
    assert pg.read_yaml(out / "qwen3-8b.yaml")["added_rows"][0]["rows_per_op"] == {"qkv_proj": 1, "attn_prefill": 1}


def test_survey_quick_on_cpu_writes_every_survey(tmp_path):
    rc = pg.main(["survey", "--device", "cpu", "--quick", "--which", "gemm,moe", "--out", str(tmp_path)])
    assert rc == 0
    for name in ("gemm", "moe"):
        rows = (tmp_path / "surveys" / "cpu" / f"{name}.csv").read_text().splitlines()
        assert rows[0].startswith("survey,variant") and len(rows) > 3
    gemm = (tmp_path / "surveys" / "cpu" / "gemm.csv").read_text()
    assert all(f",{f}," in gemm for f in V.WEIGHT_FORMATS)
