"""Pack loading and validation: every defect is one PackError line naming file, line/op and value.

Also the built-in packs: every pack shipped under calibration/packs must load and build a model.
``synthetic_pack`` (used by the model tests too) writes a tiny pack whose ops follow closed forms,
so interpolation and extrapolation can be checked exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from servesim.errors import PackError
from servesim.models import MODELS
from servesim.perf.pack import (COLUMNS, LAYER_TOKEN_OPS, MOE_OPS, OPS, available_packs, load_pack, pack_path,
                                pack_root, read_pack, required_ops, write_pack)

SHAPE = MODELS["llama-3-8b"]
TOKENS = [1, 16, 64, 256, 1024, 4096]
CHUNKS = [16, 64, 256, 1024]
PREFILL_CTX = [0, 256, 1024, 4096]
DEC_BATCH = [1, 2, 4, 8, 16, 32]
DEC_CTX = [16, 256, 1024, 4096]
AR_BYTES = [8192, 2**20, 2**24, 2**26]


def token_time(op: str, t: float) -> float:
    """Affine in tokens; a different intercept per op so ops are distinguishable."""
    k = OPS.index(op) + 1
    return 0.001 * k + 1e-6 * k * t


def prefill_time(t: float, c: float) -> float:
    return 0.01 + 1e-8 * t * (c + (t + 1) / 2)


def decode_time(b: float, c: float) -> float:
    return 0.01 + 0.0005 * b + 2e-7 * b * c


def synthetic_rows(drop: tuple[str, ...] = ()) -> list[tuple]:
    rows: list[tuple] = []
    for op in LAYER_TOKEN_OPS + ("embed", "final_norm", "lm_head"):
        rows += [(op, t, 0, 0, 0, token_time(op, t), 0.0) for t in TOKENS]
    rows += [("attn_prefill", t, 0, c, 0, prefill_time(t, c), 0.0) for t in CHUNKS for c in PREFILL_CTX]
    rows += [("attn_decode", 0, b, c, 0, decode_time(b, c), 0.0) for b in DEC_BATCH for c in DEC_CTX]
    rows += [("overhead_eager", 0, b, 0, 0, 1.0 + 0.001 * b, 0.0) for b in (1, 64, 256)]
    rows += [("overhead_cuda_graph", 0, b, 0, 0, 0.1 + 0.0001 * b, 0.0) for b in (1, 64, 256)]
    rows += [("all_reduce", 0, 2, 0, n, 0.01 + n * 1e-8, 0.0) for n in AR_BYTES]
    rows += [("send_recv", 0, 2, 0, n, 0.02 + n * 1e-8, 0.0) for n in AR_BYTES]
    return [r for r in rows if r[0] not in drop]


def synthetic_meta(**over) -> dict:
    meta = {"gpu": "h200", "model": "llama-3-8b", "tp": 1, "dtype": "bf16",
            "shape": {k: getattr(SHAPE, k) for k in ("num_layers", "hidden_size", "num_heads",
                                                      "num_kv_heads", "head_dim", "intermediate_size",
                                                      "vocab_size")},
            "source": "measured", "origin": "test"}
    meta.update(over)
    return meta


def synthetic_pack(tmp_path: Path, drop: tuple[str, ...] = (), **meta) -> Path:
    path = tmp_path / "h200" / "llama-3-8b.csv"
    write_pack(synthetic_rows(drop), synthetic_meta(**meta), path)
    return path


def one_line_error(fn, *args, **kw) -> str:
    with pytest.raises(PackError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert "\n" not in msg and msg
    return msg


def edit_csv(path: Path, line: int, col: str, value: str) -> None:
    lines = path.read_text().splitlines()
    cells = lines[line - 1].split(",")
    cells[COLUMNS.index(col)] = value
    lines[line - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


# --- loading --------------------------------------------------------------------------------------

def test_synthetic_pack_round_trips(tmp_path):
    pack = read_pack(synthetic_pack(tmp_path))
    assert (pack.gpu, pack.model, pack.tp) == ("h200", "llama-3-8b", 1)
    assert set(pack.ops) == set(OPS) - set(MOE_OPS)  # a dense pack: every op but the experts'
    rows = pack.rows("qkv_proj")
    assert list(rows.tokens) == TOKENS
    assert np.allclose(rows.time_ms, [token_time("qkv_proj", t) for t in TOKENS], rtol=1e-5)
    assert rows.line[0] >= 2


def test_missing_op_needed_by_model_names_the_op(tmp_path):
    pack = read_pack(synthetic_pack(tmp_path, drop=("kv_write",)))
    msg = one_line_error(pack.require, required_ops(tp=1))
    assert "kv_write" in msg and "llama-3-8b.csv" in msg


def test_all_reduce_only_required_under_tp(tmp_path):
    pack = read_pack(synthetic_pack(tmp_path, drop=("all_reduce", "send_recv", "overhead_cuda_graph")))
    pack.require(required_ops(tp=1, pp=1, cuda_graph=False))  # fine without them
    assert "all_reduce" in one_line_error(pack.require, required_ops(tp=2))
    assert "send_recv" in one_line_error(pack.require, required_ops(pp=2))
    assert "overhead_cuda_graph" in one_line_error(pack.require, required_ops(cuda_graph=True))


@pytest.mark.parametrize("value", ["-0.5", "0", "nan", "inf", "abc"])
def test_bad_time_names_file_line_and_value(tmp_path, value):
    path = synthetic_pack(tmp_path)
    edit_csv(path, 5, "time_ms", value)
    msg = one_line_error(read_pack, path)
    assert f"{path} line 5" in msg and value in msg and "time_ms" in msg


def test_negative_std_and_bad_integer(tmp_path):
    path = synthetic_pack(tmp_path)
    edit_csv(path, 3, "std_ms", "-1")
    assert "line 3" in one_line_error(read_pack, path)
    path = synthetic_pack(tmp_path)
    edit_csv(path, 4, "tokens", "12.5")
    msg = one_line_error(read_pack, path)
    assert "line 4" in msg and "12.5" in msg


def test_unknown_op_lists_allowed(tmp_path):
    path = synthetic_pack(tmp_path)
    edit_csv(path, 2, "op", "flash_magic")
    msg = one_line_error(read_pack, path)
    assert "flash_magic" in msg and "qkv_proj" in msg and "line 2" in msg


def test_wrong_columns(tmp_path):
    path = synthetic_pack(tmp_path)
    text = path.read_text().replace("time_ms", "median_ms", 1)
    path.write_text(text)
    msg = one_line_error(read_pack, path)
    assert "time_ms" in msg and "line 1" in msg


def test_token_op_needs_tokens(tmp_path):
    path = synthetic_pack(tmp_path)
    edit_csv(path, 2, "tokens", "0")
    assert "tokens >= 1" in one_line_error(read_pack, path)


def test_unknown_gpu_and_model_one_line():
    msg = one_line_error(load_pack, "h300", "llama-3-8b")
    assert "h300" in msg and "h200" in msg and "a100-80g" in msg
    msg = one_line_error(load_pack, "h200", "llama-9")
    assert "llama-9" in msg and "llama-3-8b" in msg


def test_missing_pack_file_names_path_and_what_exists():
    msg = one_line_error(load_pack, "h100-80g", "qwen3-14b", 8)
    assert "qwen3-14b-tp8.csv" in msg and "available" in msg


def test_missing_or_bad_yaml(tmp_path):
    path = synthetic_pack(tmp_path)
    path.with_suffix(".yaml").unlink()
    assert "metadata" in one_line_error(read_pack, path)
    path = synthetic_pack(tmp_path, gpu="tpu-v5")
    assert "tpu-v5" in one_line_error(read_pack, path)
    path = synthetic_pack(tmp_path)
    meta = yaml.safe_load(path.with_suffix(".yaml").read_text())
    del meta["source"]
    path.with_suffix(".yaml").write_text(yaml.safe_dump(meta))
    assert "source" in one_line_error(read_pack, path)


def test_shape_mismatch_is_an_error(tmp_path):
    from servesim.perf.packmodel import PackStepModel

    meta_shape = synthetic_meta()["shape"] | {"num_layers": 40}
    pack = read_pack(synthetic_pack(tmp_path, shape=meta_shape))
    msg = one_line_error(PackStepModel, pack, SHAPE)
    assert "num_layers" in msg and "40" in msg


def test_pack_path_and_root():
    assert pack_path("a100-80g", "llama-3-8b", 2).name == "llama-3-8b-tp2.csv"
    assert pack_root().is_dir()


# --- the packs that ship ---------------------------------------------------------------------------

SHIPPED = available_packs()


def test_required_builtin_packs_exist():
    have = {(g, m) for g, m, _ in SHIPPED}
    assert ("a100-80g", "llama-3-8b") in have
    assert ("h200", "llama-3-8b") in have


@pytest.mark.parametrize("gpu,model,tp", SHIPPED, ids=[f"{g}/{m}-tp{t}" for g, m, t in SHIPPED])
def test_every_shipped_pack_loads_and_predicts(gpu, model, tp):
    from servesim.perf.packmodel import load_pack_model

    pack = load_pack(gpu, model, tp)
    assert pack.meta.get("origin") and pack.meta["source"] in ("measured", "imported", "derived")
    graph = pack.has("overhead_cuda_graph")
    m = load_pack_model(gpu, model, tp=tp, cuda_graph=graph)
    decode = m.predict(np.ones(32, np.int64), np.full(32, 1000))
    prefill = m.predict(np.array([2048]), np.array([0]))
    assert 0 < decode < prefill < 10.0  # seconds
