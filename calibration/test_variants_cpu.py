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
from calibration.profiler import triton_moe as TM  # noqa: E402
from calibration.profiler import variants as V  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("fmt,tol", [("bf16", 5e-3), ("fp8", 5e-2), ("fp8_static", 5e-2), ("fp8_channel", 5e-2),
                                     ("int8", 2e-2), ("int4", 1e-2)])
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


def test_fp8_static_times_the_gemm_on_a_prequantized_input():
    """fp8_static's quantization is upstream work: ``prepare`` does it once, outside the timed call,
    and the call on the prepared input is the call on the bf16 input, bit for bit; every other
    format quantizes inside the call, so its prepared input is the input itself."""
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(192, 128, generator=g) * 128 ** -0.5).to(torch.bfloat16)
    x = torch.randn(24, 128, generator=g).to(torch.bfloat16)
    lin = V.QLinear(w, "fp8_static")
    xq = lin.prepare(x)
    assert xq.dtype == V.FP8 and xq.shape == x.shape
    assert torch.equal(lin(xq), lin(x))
    # the static scale is the one the input was quantized with: x recovered to e4m3 rounding
    assert V.rel_err(xq.float() * lin.sx, x.double()) < 0.05
    assert lin.prepare(xq) is xq  # an input already in e4m3 is taken as it is
    # values beyond the static range saturate at +-448 (no NaN), as the engines' quantizers clamp
    big = torch.full((2, 128), 1e4, dtype=torch.bfloat16)
    assert torch.isfinite(lin.prepare(big).float()).all()
    assert "static activation scale" in lin.backend and V.FORMAT_DTYPE["fp8_static"] == "fp8"
    dyn = V.QLinear(w, "fp8")
    assert dyn.prepare(x) is x
    with pytest.raises(ValueError, match="only fp8_static"):
        dyn.quantize(x)


def test_fp8_static_upstream_ops_write_e4m3():
    """With static activation scales the ops before a projection write e4m3: the norm and the act
    (each then one cast), equal to the bf16 op cast; the final norm and every op of other formats
    stay bf16."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 64, generator=g).to(torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(64, generator=g)).to(torch.bfloat16)
    y8 = ops.rms_norm_op(x, w, True)
    assert y8.dtype == ops.FP8 and torch.equal(y8.float(), ops.rms_norm_op(x, w).to(ops.FP8).float())
    gu = torch.randn(8, 128, generator=g).to(torch.bfloat16)
    a8 = ops.act_op(gu, 64, True)
    assert a8.dtype == ops.FP8 and a8.shape == (8, 64)
    assert torch.equal(a8.float(), ops.act_op(gu, 64).to(ops.FP8).float())
    assert ops.act_op(gu, 64).dtype == ops.rms_norm_op(x, w).dtype == torch.bfloat16
    assert shapes.RankShape.of("tiny", 1, "fp8_static").act_fp8 and not shapes.RankShape.of("tiny", 1, "fp8").act_fp8


def test_fp8_static_pack_on_cpu(tmp_path, monkeypatch):
    """`ops --weights fp8_static` writes a pack servesim reads as quantization fp8_static (stem
    <model>-fp8_static, dtype fp8) whose GEMM backend says the input was quantized upstream.

    The token grid is cut to one point and the replays to the fewest: CPUs emulate FP8 matmuls in
    software at very different speeds (torch._scaled_mm took 0.13-0.26 s a call at 1-32 tokens on
    one CI host, so the quick grid made this test run 30 minutes there). What it checks, the pack's
    metadata and op rows, does not depend on the grid."""
    import yaml

    monkeypatch.setitem(grids.GRIDS["quick"], "tokens", [8])
    rc = cli.main(["ops", "--model", "tiny", "--weights", "fp8_static", "--stages", "token ops",
                   "--device", "cpu", "--quick", "--skip-overhead", "--soft-deadline-epoch", "1",
                   "--out", str(tmp_path)])  # a soft deadline already past: fewest timed replays
    assert rc == 0
    meta = yaml.safe_load((tmp_path / "packs" / "cpu" / "tiny-fp8_static.yaml").read_text())
    assert (meta["quantization"], meta["dtype"]) == ("fp8_static", "fp8")
    assert "quantized upstream" in meta["gemm_backend"]
    rows = (tmp_path / "packs" / "cpu" / "tiny-fp8_static.csv").read_text()
    assert all(f"\n{op}," in rows for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))


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


def _interpreter():
    if TM.triton is None:
        pytest.skip("triton not installed")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on CPU")


def _dense_moe_reference(x, w13, w2, idx, wts):
    """Per token, per chosen expert, in float64: the definition the fused kernel must meet."""
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            h1 = x[t].double() @ w13[e].double().t()
            out[t] += float(wts[t, j]) * (torch.nn.functional.silu(h1[:inter]) * h1[inter:]) @ w2[e].double().t()
    return out


@pytest.mark.parametrize("E,K,I,h,T,cfg", [
    (8, 2, 48, 64, 1, TM.Cfg(16, 32, 32)),     # decode: one token, N and K tiles uneven (2I = 96, I = 48)
    (8, 2, 48, 64, 19, TM.Cfg(16, 64, 64)),    # experts with several blocks, K of the down GEMM < BLOCK_K
    (4, 3, 32, 96, 11, TM.Cfg(32, 32, 64, group_m=2)),  # top-3, grouped program order
])
def test_fused_moe_equals_a_dense_per_token_reference(E, K, I, h, T, cfg):
    """float32 end to end, so that only the kernels' logic (align, gathers, tiles, masks, routing
    weight, sum over k) can differ from the reference."""
    _interpreter()
    g = torch.Generator().manual_seed(T)
    w13 = torch.randn(E, 2 * I, h, generator=g) * h ** -0.5
    w2 = torch.randn(E, h, I, generator=g) * I ** -0.5
    x = torch.randn(T, h, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    wts = torch.rand(T, K, generator=g)
    f = TM.FusedMoE(w13, w2, K, config=cfg)
    y = f(x, idx, wts)
    assert y.shape == (T, K, h)
    assert V.rel_err(y.sum(1), _dense_moe_reference(x, w13, w2, idx, wts)) < 1e-5
    assert int(f.align.counts.abs().sum()) == 0  # left at zero for the next call
    y2 = f(x, idx, wts)  # ... which therefore gives the same result
    assert torch.equal(y, y2)


def test_align_places_every_pair_once_in_block_padded_expert_segments():
    _interpreter()
    E, bm = 6, 16
    ids = torch.tensor([5, 0, 5, 2, 5, 0, 1, 5] * 3, dtype=torch.int32)  # expert 3, 4 unused
    al = TM.Align(E, torch.device("cpu"))
    sorted_ids, expert_ids, blocks = al(ids, bm)
    n = ids.numel()
    total = int(al.total)
    counts = torch.bincount(ids.long(), minlength=E)
    assert total == int(((counts + bm - 1) // bm * bm).sum())
    assert sorted_ids.numel() == blocks * bm >= total
    placed = sorted_ids[sorted_ids < n]
    assert sorted(placed.tolist()) == list(range(n))  # every pair exactly once
    assert bool((sorted_ids[total:] == n).all())  # padding past the total
    for b in range(total // bm):  # each block holds pairs of its expert only
        rows = sorted_ids[b * bm:(b + 1) * bm]
        rows = rows[rows < n]
        assert bool((ids[rows.long()] == expert_ids[b]).all())
    assert sorted(set(expert_ids[:total // bm].tolist())) == [0, 1, 2, 5]


def test_tile_configs_grow_with_tokens_per_expert():
    assert TM.candidates(1, 128, 8)[0].bm == 16  # decode
    assert TM.candidates(8192, 128, 8)[0].bm >= 64  # prefill: 512 tokens per expert
    assert [TM.token_bucket(t) for t in (1, 2, 3, 64, 65)] == [1, 2, 4, 64, 128]


def test_moe_triton_fused_backend_equals_float64_and_grouped():
    _interpreter()
    m = V.MoE(V.MoEShape(8, 2, 64, 128), CPU, torch.Generator().manual_seed(0), backend="triton-fused")
    assert m.kind == "triton-fused" and m.backend.startswith("Triton fused")
    x = torch.randn(21, 128).to(torch.bfloat16)
    # the interpreter truncates fp32 -> bf16 stores (GPUs round to nearest): 1.2 % here, not 0.5 %
    y = m(x)
    assert V.rel_err(y, m.reference(x)) < 2e-2
    assert V.rel_err(y, m.use("grouped_mm")(x).double()) < 2e-2


def test_moe_backend_is_checked_and_unknown_ones_are_refused():
    m = V.MoE(V.MoEShape(4, 2, 16, 32), CPU, torch.Generator().manual_seed(0), backend="loop")
    with pytest.raises(ValueError, match="moe backend 'cutlass'"):
        m.use("cutlass")
    if os.environ.get("TRITON_INTERPRET") != "1":  # plain CPU: Triton cannot run, the layer falls back
        m.use("triton-fused")
        assert m.kind != "triton-fused" and "triton-fused failed" in m.backend


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
        assert rows[0].startswith("survey,variant") and rows[0].endswith(",backend") and len(rows) > 3
    moe = (tmp_path / "surveys" / "cpu" / "moe.csv").read_text().splitlines()[1:]
    kinds = {r.split(",")[-1] for r in moe}
    assert kinds == ({"triton-fused", "grouped_mm"} if os.environ.get("TRITON_INTERPRET") == "1"
                     else {"grouped_mm"})
    assert {r.split(",")[1] for r in moe} == {"gate", "experts", "combine"}
    gemm = (tmp_path / "surveys" / "cpu" / "gemm.csv").read_text()
    assert all(f",{f}," in gemm for f in V.WEIGHT_FORMATS)
