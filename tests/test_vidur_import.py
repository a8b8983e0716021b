"""Vidur import: the A100 packs reproduce Vidur's medians, carry provenance, and are reproducible.

Reads ../shared/calibration/vidur_profiles (skipped when absent). The transfer rule itself is
tested on tiny synthetic tables, which need no shared data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim.errors import PackError
from servesim.models import MODELS
from servesim.perf.pack import pack_root, read_pack
from servesim.perf.packmodel import PackStepModel
from servesim.tools.vidur import (SOURCE_HEADS, TOKEN_OPS, HeadShape, import_vidur, source_files,
                                 transfer_attention)

SHARED = Path(__file__).resolve().parents[2] / "shared"
VIDUR = SHARED / "calibration" / "vidur_profiles"
MLP = VIDUR / "profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    if not VIDUR.is_dir():
        pytest.skip("../shared is not present")
    out = tmp_path_factory.mktemp("packs")
    return {read_pack(p).tp: p for p in import_vidur(VIDUR, out)}


@pytest.mark.needs_shared
@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared is not present")
def test_imports_every_tp_in_the_data(imported):
    assert sorted(imported) == [1, 2, 4, 8]


@pytest.mark.needs_shared
@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared is not present")
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_token_ops_reproduce_vidur_medians(imported, tp):
    """Within 3% at every measured token count (exact except where Vidur repeated a size)."""
    vidur = pd.read_csv(MLP)
    vidur = vidur[vidur["num_tensor_parallel_workers"] == tp]
    model = PackStepModel(read_pack(imported[tp]), MODELS["llama-3-8b"], tp=tp)
    for theirs, ours in TOKEN_OPS.items():
        med = vidur.groupby("num_tokens")[f"time_stats.{theirs}.median"]
        pred = model.curves[ours](med.median().index.to_numpy(np.float64))
        lo, hi = med.min().to_numpy(), med.max().to_numpy()
        assert np.all(pred >= lo * 0.97) and np.all(pred <= hi * 1.03), ours


@pytest.mark.needs_shared
@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared is not present")
def test_provenance_license_and_hashes(imported):
    meta = read_pack(imported[1]).meta
    assert "MIT" in meta["license"] and "Microsoft" in meta["license"]
    sums = dict(reversed(line.split()) for line in (VIDUR / "SHA256SUMS").read_text().splitlines())
    for f in meta["files"]:
        assert sums["./" + f["path"]] == f["sha256"]
    assert set(meta["derived"]) >= {"final_norm", "kv_write", "lm_head", "attn_decode", "attn_prefill",
                                    "overhead_eager"}
    assert meta["source"] == "imported"


@pytest.mark.needs_shared
@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared is not present")
def test_shipped_packs_equal_a_fresh_import(imported):
    for tp, path in imported.items():
        shipped = pack_root() / "a100-80g" / path.name
        assert shipped.read_text() == path.read_text(), f"{shipped} is stale: rerun import-vidur"


@pytest.mark.needs_shared
@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared is not present")
def test_only_llama_3_8b_is_mapped():
    with pytest.raises(PackError) as info:
        source_files(VIDUR, "qwen3-4b")
    assert "qwen3-4b" in str(info.value) and "\n" not in str(info.value)


def test_missing_source_is_one_line(tmp_path):
    with pytest.raises(PackError) as info:
        source_files(tmp_path, "llama-3-8b")
    assert "mlp.csv" in str(info.value) and "\n" not in str(info.value)


# --- the attention transfer on synthetic tables ------------------------------------------------

def _tables():
    batches, ctx = [1, 2, 4, 8], [32, 64, 128]
    dec = pd.Series({(b, c): 0.01 + 1e-5 * b * c + 0.001 * b for b in batches for c in ctx})
    dec.index.names = ["batch_size", "kv_cache_size"]
    pre = pd.Series({(t, c): 0.01 + 1e-6 * t * (c + t / 2) for t in (64, 128) for c in (0, 64)})
    pre.index.names = ["prefill_chunk_size", "kv_cache_size"]
    return dec, pre


def test_transfer_is_identity_for_the_same_heads():
    dec, pre = _tables()
    d, p = transfer_attention(dec, pre, SOURCE_HEADS, SOURCE_HEADS)
    got = d.set_index(["batch", "context"])["time_ms"]
    for (b, c), t in dec.items():
        assert got[(b, c)] == pytest.approx(t)
    assert np.allclose(p["time_ms"].to_numpy(), pre.to_numpy())


def test_transfer_decode_maps_kv_heads_to_sequences():
    dec, pre = _tables()
    # twice the kv heads: b target sequences = 2b source sequences, same context
    d, _ = transfer_attention(dec, pre, SOURCE_HEADS, HeadShape(32, 8, 128))
    got = d.set_index(["batch", "context"])["time_ms"]
    assert sorted(d["batch"].unique()) == [1, 2, 4]
    assert got[(2, 64)] == pytest.approx(dec[(4, 64)])
    # half the kv heads: 1 target sequence is half a source sequence -> one source sequence of c/2
    d, _ = transfer_attention(dec, pre, SOURCE_HEADS, HeadShape(16, 2, 128))
    got = d.set_index(["batch", "context"])["time_ms"]
    assert got[(4, 128)] == pytest.approx(dec[(2, 128)])
    assert got[(1, 128)] == pytest.approx(dec[(1, 64)])


def test_transfer_prefill_scales_work_above_the_floor():
    dec, pre = _tables()
    _, p = transfer_attention(dec, pre, SOURCE_HEADS, HeadShape(8, 1, 128))  # rho = 1/4
    floor = pre.min()
    assert np.allclose(p["time_ms"].to_numpy(), floor + 0.25 * (pre.to_numpy() - floor))
