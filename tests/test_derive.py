"""Derived packs (servesim/tools/derive.py, derived_packs.py) and the roofline fitted to a pack
(servesim/perf/rooflinefit.py): exactness where the target equals a source, the rules' held-out
errors within the bounds VALIDATION.md reports, shipped derived packs that load and say what they
are derived from, and the fitted roofline as a scenario's step time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim.errors import PackError
from servesim.models import MODELS
from servesim.tools.derive import GEMM_OPS, OpTransfer, RankDims, sources_from_pack
from servesim.tools.derived_packs import compare_with_pack, from_measured_pack, leave_one_out
from servesim.perf.pack import available_packs, load_pack
from servesim.perf.packmodel import load_pack_model
from servesim.perf.rooflinefit import fit_roofline, parse_pack_ref

VIDUR = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "vidur_profiles"


def test_rank_dims_gemm_shapes():
    d = RankDims.of_shape(MODELS["qwen3-14b"], 2)
    assert d.gemm("qkv_proj") == (5120, (20 + 2 * 4) * 128)
    assert d.gemm("o_proj") == (20 * 128, 5120) and d.gemm("down_proj") == (8704, 5120)
    assert d.gemm("gate_up_proj") == (5120, 2 * 8704) and d.gemm("lm_head") == (5120, 75968)
    assert RankDims.of_shape(MODELS["llama-3-8b"], 16).kv_heads == 1  # replicated, min 1


def test_transfer_is_exact_on_a_source_shape():
    """A target with a source's (K, N) / width gets that source's measurement back."""
    p = load_pack("h200", "llama-3-8b", 1)
    src = sources_from_pack(p)
    tr = OpTransfer([src, sources_from_pack(load_pack("h200", "llama-3-8b", 2))], "h200")
    for op in GEMM_OPS + ("input_norm", "act", "rope", "kv_write"):
        x, y = src.curves[op]
        np.testing.assert_allclose(tr.op_ms(op, src.dims, x), y, rtol=1e-12)


def test_h200_qwen_from_llama_within_reported_bounds():
    """qwen3-8b / -14b ops predicted from llama-3-8b's packs alone, against their measured packs."""
    srcs = [load_pack("h200", "llama-3-8b", tp) for tp in (1, 2)]
    for model in ("qwen3-8b", "qwen3-14b"):
        rows, meta = from_measured_pack(srcs, model, 1)
        assert meta["source"] == "derived" and "llama-3-8b" in meta["origin"]
        errs = compare_with_pack(rows, load_pack("h200", model, 1)).set_index("op")
        assert (errs["median"] < 0.11).all(), errs
        assert errs.loc["attn_decode", "median"] < 0.01  # same kv heads: the same work


@pytest.mark.needs_shared
@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared is not present")
def test_a100_leave_one_model_out():
    df = leave_one_out(VIDUR)
    s = df[df.op == "layer token-op sum"].set_index("left out")
    assert len(s) == 4 and (s["median"] < 0.05).all() and (s["max"] < 0.25).all(), s


def test_shipped_derived_packs_load_and_say_so():
    derived = [(g, m, t) for g, m, t in available_packs() if load_pack(g, m, t).meta["source"] == "derived"]
    assert {(g, m) for g, m, _ in derived} >= {("a100-80g", x) for x in ("qwen3-4b", "qwen3-8b", "qwen3-14b")}
    for g, m, t in derived:
        model = load_pack_model(g, m, tp=t, cuda_graph=True)
        # each derived pack names its own GPU's measurements (the A100's Vidur import; the H200's or,
        # since its surveys of device call 26, the H100's measured packs)
        assert ("derived from Vidur A100 profiles" if g == "a100-80g" else f"derived from {g}/") in model.describe()
        small = model.predict(np.ones(8, np.int64), np.full(8, 1000, np.int64))
        big = model.predict(np.ones(64, np.int64), np.full(64, 1000, np.int64))
        assert 0 < small < big


def test_derived_a100_packs_order_by_model_size():
    t = [load_pack_model("a100-80g", m, cuda_graph=True).predict(np.array([2048]), np.array([0]))
         for m in ("qwen3-4b", "qwen3-8b", "qwen3-14b")]
    assert t[0] < t[1] < t[2]


def test_parse_pack_ref():
    assert parse_pack_ref("a100-80g/qwen3-14b-tp4") == ("a100-80g", "qwen3-14b", 4)
    assert parse_pack_ref("h200/llama-3-8b") == ("h200", "llama-3-8b", 1)
    for bad, word in (("h200", "<gpu>/<model>"), ("tpu/llama-3-8b", "unknown GPU"),
                      ("h200/llama-9", "unknown model")):
        with pytest.raises(PackError, match=word):
            parse_pack_ref(bad)


def test_roofline_fit_matches_its_pack():
    f = fit_roofline("h200/llama-3-8b")
    assert 0.05 <= f.mfu <= 1 and 0.05 <= f.mbu <= 1 and 0 <= f.overhead_s < 0.02
    assert f.median_abs_err < 0.06 and f.points >= 20


def test_roofline_fit_as_step_time(tmp_path):
    from servesim.perf.build import build_step_model
    from servesim.scenario import Scenario
    from tests.conftest import BASE, merge

    sc = Scenario.model_validate(merge(BASE, {"model": "qwen3-14b", "hardware": {"gpu": "a100-80g"},
                                              "engine": {"max_model_len": 8192},
                                              "step_time": {"model": "roofline", "fit": "a100-80g/llama-3-8b"}}))
    m = build_step_model(sc)
    f = fit_roofline("a100-80g/llama-3-8b")
    assert (m.mfu, m.mbu, m.overhead_s) == (f.mfu, f.mbu, f.overhead_s)
    assert "fitted to pack a100-80g/llama-3-8b" in m.describe()


@pytest.mark.needs_shared
@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared is not present")
def test_shipped_derived_packs_equal_a_fresh_derivation(tmp_path):
    from servesim.tools.derived_packs import write_a100_packs
    from servesim.perf.pack import pack_root

    for path in write_a100_packs(VIDUR, tmp_path, ["qwen3-4b", "qwen3-14b"], [1, 8]):
        shipped = pack_root() / "a100-80g" / path.name
        assert shipped.read_text() == path.read_text(), f"{shipped} is stale: rerun servesim calibrate derive"
