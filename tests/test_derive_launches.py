"""The eager CPU floor of derived MoE/MLA packs: launches per forward (servesim/tools/derive_launches.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim.models import MODELS, with_precision
from servesim.perf.pack import load_pack
from servesim.tools.derive_launches import (ENGINE, forward_kernels_ms, launch_floor, launch_ratio,
                                            launch_rule_check)

PACKS = Path(__file__).resolve().parents[1] / "calibration" / "packs" / "h200"


def test_engine_counts_by_hand():
    """vLLM v0.6.4: a Llama layer 10 launches; DeepSeek-V2-Lite's first (dense-MLP) layer 2 + 27 + 3
    and its 26 MoE layers 2 + 27 + (7 + 13 + 4); +3 fixed per forward."""
    assert ENGINE.per_forward(MODELS["llama-3-8b"], 1) == 32 * 10 + 3
    assert ENGINE.per_forward(MODELS["deepseek-v2-lite"], 1) == 32 + 26 * 53 + 3
    assert ENGINE.per_forward(MODELS["llama-3-8b"], 2) == 32 * 12 + 3  # two all-reduces per layer
    assert launch_ratio(MODELS["qwen3-8b"], 1, MODELS["qwen3-8b"]) == 1.0


def test_launch_floor_keeps_cpu_bound_walls_and_continues_their_line():
    b = np.array([1, 8, 32, 128, 256, 512])
    k = np.array([5.0, 6.0, 7.0, 10.0, 17.0, 30.0])
    over = np.array([7.0, 6.8, 5.5, 2.6, 1.0, 2.0])  # CPU-bound up to 128 (over >= 0.25 k), then GPU-bound
    f = launch_floor(b, k, over)
    assert np.allclose(f[:4], (k + over)[:4])
    # beyond 128 the CPU-bound walls' line (slope >= 0), never above the GPU-bound wall
    assert f[4] <= (k + over)[4] and f[5] < (k + over)[5] and f[5] >= f[3]
    assert np.allclose(launch_floor(b, k, 0.1 * k), 1.1 * k)  # no CPU-bound row: the walls


def test_derived_mla_moe_pack_floor_is_the_launch_ratio_times_the_base():
    """C(b) of derived deepseek-v2-lite = (launch ratio) x llama-3-8b's launch time where the
    target is CPU-bound (its kernels are far below), and never below the rule before (layer
    ratio); a precision variant of a dense model keeps its base's rows."""
    from servesim.perf.packmodel import PackStepModel
    from servesim.tools.derive_variants import derive_any

    base = load_pack("h200", "llama-3-8b", 1)
    shape = MODELS["deepseek-v2-lite"]
    rows, meta = derive_any("h200", shape, 1, [base, load_pack("h200", "llama-3-8b", 2)])
    assert "launch rule" in meta["derived"]["overhead_eager"]
    ov = {r[2]: r[5] for r in rows if r[0] == "overhead_eager"}
    r = base.rows("overhead_eager")
    floor = PackStepModel(base, base.shape()).curves["cpu_floor"]  # the base's launch time
    s = launch_ratio(shape, 1, base.shape())
    assert 4.0 < s < 5.0
    # batch 1: both CPU-bound; the derived C(1) = kernels_t + over_t = s x the base's wall at 1
    import tempfile

    from servesim.perf.pack import read_pack, write_pack
    with tempfile.TemporaryDirectory() as d:
        write_pack(rows, meta, Path(d) / "p.csv")
        kt = forward_kernels_ms(PackStepModel(read_pack(Path(d) / "p.csv"), shape), [1], 1024)[0]
    assert kt + ov[1] == pytest.approx(s * float(floor(np.array([1.0]))[0]), rel=1e-6)
    old = {b: t * shape.num_layers / 32 for b, t in zip(r.batch, r.time_ms)}
    assert all(ov[b] >= old[b] - 1e-9 for b in ov)
    fp8 = derive_any("h200", with_precision(MODELS["llama-3.1-8b"], "fp8"), 1, [load_pack("h200", "llama-3.1-8b")])
    assert "overhead_eager" not in fp8[1]["derived"]


def test_launch_rule_held_out_on_the_profilers_own_forwards():
    """llama-3-8b's CPU-bound eager walls x the profiler's launch ratio predict qwen3-4b's and
    qwen3-14b's (same layer, more layers) within 10 % median (recorded in VALIDATION.md)."""
    res = launch_rule_check(PACKS / "llama-3-8b.yaml", [PACKS / "qwen3-4b.yaml", PACKS / "qwen3-14b.yaml"])
    assert (res["rows"] >= 3).all()
    assert (res["median"] < 0.10).all(), res
