"""CPU logic tests of the precision, MoE and survey parts of the profiler (calibration/profiler/:
variants.py, triton_decode.py, surveys.py), which need PyTorch (+ triton for the Triton kernels);
CI runs them in a venv of their own after the README's test command (.ci/run):

    TRITON_INTERPRET=1 python -m pytest -q calibration/test_variants_cpu.py

Why: the device time is 30 minutes a session, so every recipe is checked here against a float64
reference before a GPU runs it; CPU times are never data. Without torch every test is skipped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from calibration.profiler import cli, grids, ops, shapes  # noqa: E402
from calibration.profiler import forward as fw  # noqa: E402
from calibration.profiler import triton_decode as TD  # noqa: E402
from calibration.profiler import variants as V  # noqa: E402

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


def test_layer_ops_of_moe_and_dense_rank_shapes():
    rs = shapes.RankShape.of("qwen3-30b-a3b", 1)
    assert ops.layer_ops(rs)[6:9] == ("moe_gate", "moe_experts", "moe_combine")
    assert ops.layer_ops(shapes.RankShape.of("llama-3-8b", 1))[6:9] == ("gate_up_proj", "act", "down_proj")


def test_moe_and_fp8_forwards_run_and_match_the_op_functions():
    for model, weights in (("tiny-moe", "bf16"), ("tiny", "fp8")):
        rs = shapes.RankShape.of(model, 1, weights)
        m = fw.Model(rs, CPU, share_layers=False)
        b = fw.Batch(grids.Composition(1, 20, 10, 3, 30), rs, CPU)
        out = fw.forward(m, b)
        assert out.shape == (4, rs.V) and torch.isfinite(out.float()).all()


def test_survey_quick_on_cpu_writes_every_survey(tmp_path):
    rc = cli.main(["survey", "--device", "cpu", "--quick", "--which", "gemm,moe", "--out", str(tmp_path)])
    assert rc == 0
    for name in ("gemm", "moe"):
        rows = (tmp_path / "surveys" / "cpu" / f"{name}.csv").read_text().splitlines()
        assert rows[0].startswith("survey,variant") and len(rows) > 3
    gemm = (tmp_path / "surveys" / "cpu" / "gemm.csv").read_text()
    assert all(f",{f}," in gemm for f in V.WEIGHT_FORMATS)
