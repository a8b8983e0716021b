"""Physical floors of the shipped packs (servesim/perf/efficiency.py): the kernels a pack timed
must be of the class serving engines run. Decode attention at batch >= 64 reads the KV cache; its
achieved bandwidth (bytes from the model shape / measured time) must reach 70% of the GPU's HBM
peak -- the first H200 packs timed FlashAttention-2, which reads at ~52%, and would fail here."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.hardware import GPUS
from servesim.models import MODELS, weight_format
from servesim.perf.efficiency import (BOUND_US, DECODE_FLOOR, DECODE_MIN_BATCH, decode_bandwidth,
                                      decode_floor_points, pack_efficiency)
from servesim.perf.pack import available_packs, load_pack

PACKS = available_packs()


@pytest.mark.parametrize("gpu,model,tp", PACKS, ids=[f"{g}/{m}-tp{t}" for g, m, t in PACKS])
def test_decode_attention_reaches_the_hbm_floor(gpu, model, tp):
    pack = load_pack(gpu, model, tp)
    shares = decode_floor_points(pack)
    top = int(pack.rows("attn_decode").batch.max())
    if top < DECODE_MIN_BATCH:
        # an imported pack whose decode grid stops short (Vidur's legacy llama-2-7b: batch 16): the
        # floor cannot be checked; runs beyond the grid are reported as extrapolated (summary.extrapolation)
        assert shares.size == 0
        pytest.skip(f"{gpu}/{model} tp{tp}: decode attention measured only to batch {top} < {DECODE_MIN_BATCH}")
    assert shares.size >= 10, f"too few bandwidth-bound decode points at batch >= {DECODE_MIN_BATCH}"
    med = float(np.median(shares))
    assert med >= DECODE_FLOOR, (f"{gpu}/{model} tp{tp}: decode attention at batch >= {DECODE_MIN_BATCH} "
                                 f"reads KV at a median {med:.0%} of HBM peak (< {DECODE_FLOOR:.0%})")
    assert shares.max() <= 1.0, "faster than the HBM peak: the byte count or the time is wrong"


def test_decode_bandwidth_counts_kv_bytes():
    """One row by hand: batch * (context + 1) tokens of K and V, per-rank kv heads, bf16."""
    pack = load_pack("h200", "qwen3-14b", 2)
    d = decode_bandwidth(pack)
    rows = pack.rows("attn_decode")
    i = int(np.flatnonzero((rows.batch == 128) & (rows.context == 4096))[0])
    shape = MODELS["qwen3-14b"]
    kv_bytes = 128 * 4097 * 2 * (shape.num_kv_heads // 2) * shape.head_dim * 2
    assert d["bytes"][i] == kv_bytes
    assert d["share"][i] == pytest.approx(kv_bytes / (rows.time_ms[i] * 1e-3) / GPUS["h200"].hbm_bytes_per_s)
    assert d["bound"][i] == (kv_bytes / GPUS["h200"].hbm_bytes_per_s * 1e6 >= BOUND_US)
    small = (rows.batch == 1) & (rows.context == 16)
    assert not d["bound"][small].any()  # a 16-token read is launch-bound, never counted


def test_pack_efficiency_summary_is_physical():
    for gpu, model, tp in PACKS:
        e = pack_efficiency(load_pack(gpu, model, tp))
        dec = e["attn_decode_share_of_hbm_peak"]
        # a pack whose decode grid stops below batch 64 has no bandwidth-bound points (said so)
        assert dec == {"points": 0} if int(load_pack(gpu, model, tp).rows("attn_decode").batch.max()) < 64 \
            else 0 < dec["median"] <= 1, (gpu, model, tp, dec)
        gemm = e["gemm_tokens_ge_4096_TFLOPps"]
        # the ceiling of the pack's GEMMs: the tensor rate of its weight format (FP8: twice bf16's)
        pack = load_pack(gpu, model, tp)
        ceiling = GPUS[gpu].gemm_rate(weight_format(pack.quantization).gemm) / 1e12
        assert 0 < gemm["max"] <= max(ceiling, e["peaks"]["bf16_TFLOPps"]), (gpu, model, tp, gemm)
        assert 0 < e["gemm_tokens_le_16_TBps"]["max"] <= e["peaks"]["hbm_TBps"] * 1.01


@pytest.mark.parametrize("gpu,model,tp", PACKS, ids=[f"{g}/{m}-tp{t}" for g, m, t in PACKS])
def test_recorded_efficiency_is_current(gpu, model, tp):
    """Each pack YAML records its efficiency summary (`servesim calibrate efficiency --write`);
    it must equal what the pack's rows give now."""
    pack = load_pack(gpu, model, tp)
    assert pack.meta.get("efficiency") == pack_efficiency(pack), \
        f"{gpu}/{model} tp{tp}: stale 'efficiency' in the YAML; run servesim calibrate efficiency --write"
