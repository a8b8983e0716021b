"""The compiled pack-model lookups equal their numpy formulations bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.perf.packmodel import load_pack_model

PACKS = [("a100-80g", "llama-3-8b"), ("h200", "qwen3-14b"), ("h200", "qwen3-4b")]


@pytest.mark.parametrize("gpu,model", PACKS)
@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 1200), contexts=st.lists(st.floats(0, 200_000), min_size=1, max_size=40))
def test_decode_lookup_equals_numpy(gpu, model, batch, contexts):
    da = load_pack_model(gpu, model, cuda_graph=True).decode_attn
    kv = np.asarray(contexts) * batch
    np.testing.assert_array_equal(da(batch, kv), da.reference(batch, kv))


@pytest.mark.parametrize("gpu,model", PACKS)
@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(2, 40_000), st.integers(0, 100_000)), min_size=1, max_size=8))
def test_prefill_lookup_equals_numpy(gpu, model, rows):
    pa = load_pack_model(gpu, model, cuda_graph=True).prefill_attn
    t = np.array([r[0] for r in rows], dtype=float)
    c = np.array([r[1] for r in rows], dtype=float)
    np.testing.assert_array_equal(pa._lattice(t, c), pa._lattice_reference(t, c))
