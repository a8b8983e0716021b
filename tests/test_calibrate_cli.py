"""``servesim calibrate`` verbs: predictions out, one-line errors with exit 2, validation tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.tools.calibrate_cli import BEGIN, END, app, batch_kind, read_batches
from servesim.perf.packmodel import load_pack_model

runner = CliRunner()
BATCHES = pd.DataFrame({"n_prefill": [1, 0, 2, 1], "prefill_len": [2048, 0, 512, 256],
                        "prefill_ctx": [0, 0, 1024, 512], "n_decode": [0, 64, 32, 0],
                        "decode_ctx": [0, 1000, 2000, 0]})


def write(tmp_path: Path, df: pd.DataFrame, name: str = "in.csv") -> Path:
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def assert_one_line_exit_2(result) -> str:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1 and text.startswith("error:")
    return text


def test_predict_writes_predicted_ms(tmp_path):
    out = tmp_path / "out.csv"
    res = runner.invoke(app, ["predict", "--gpu", "a100-80g", "--model", "llama-3-8b",
                              "--batches", str(write(tmp_path, BATCHES)), "--out", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    assert list(df.columns) == list(BATCHES.columns) + ["predicted_ms"]
    m = load_pack_model("a100-80g", "llama-3-8b")
    expected = m.predict(np.ones(64, np.int64), np.full(64, 1000)) * 1e3
    assert df["predicted_ms"][1] == pytest.approx(expected, rel=1e-5)
    assert (df["predicted_ms"] > 0).all()


def test_predict_cuda_graph_is_faster_for_decode(tmp_path):
    """On the H200 pack an eager decode waits for the CPU (~16 ms of launches); a graph does not."""
    outs = []
    for flag in ([], ["--cuda-graph"]):
        out = tmp_path / f"o{len(flag)}.csv"
        res = runner.invoke(app, ["predict", "--gpu", "h200", "--model", "llama-3-8b", *flag,
                                  "--batches", str(write(tmp_path, BATCHES)), "--out", str(out)])
        assert res.exit_code == 0, res.output
        outs.append(pd.read_csv(out)["predicted_ms"].to_numpy())
    assert outs[1][1] < outs[0][1]  # the decode-only batch
    assert outs[1][0] == pytest.approx(outs[0][0])  # prefill stays eager


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "h300"], "h300"),
    (["--model", "llama-9"], "llama-9"),
    (["--tp", "3"], "tp3"),
])
def test_predict_bad_pack_is_one_line(tmp_path, args, needle):
    base = {"--gpu": "a100-80g", "--model": "llama-3-8b"}
    base.update(dict(zip(args[::2], args[1::2])))
    flat = [x for kv in base.items() for x in kv]
    res = runner.invoke(app, ["predict", *flat, "--batches", str(write(tmp_path, BATCHES)),
                              "--out", str(tmp_path / "o.csv")])
    assert needle in assert_one_line_exit_2(res)


@pytest.mark.parametrize("mutate,needle", [
    (lambda df: df.drop(columns=["decode_ctx"]), "decode_ctx"),
    (lambda df: df.assign(n_decode=[0, -1, 2, 0]), "line 3"),
    (lambda df: df.assign(prefill_len=[2048, 0, 1.5, 256]), "prefill_len"),
    (lambda df: df.assign(n_prefill=[0, 0, 2, 1], n_decode=[0, 64, 32, 0]), "empty batch"),
    # issue 17: inf read as a huge integer; magnitudes that wrap or allocate billions of sequences
    (lambda df: df.assign(prefill_len=["inf", 0, 512, 256]), "prefill_len 'inf' is not allowed"),
    (lambda df: df.assign(decode_ctx=[0, 1e30, 2000, 0]), "decode_ctx '1e+30' is not allowed"),
    (lambda df: df.assign(n_decode=[0, 2_000_000_000, 32, 0]), "allowed: integers 0..65,536"),
])
def test_predict_bad_batches_are_one_line(tmp_path, mutate, needle):
    res = runner.invoke(app, ["predict", "--gpu", "a100-80g", "--model", "llama-3-8b",
                              "--batches", str(write(tmp_path, mutate(BATCHES.copy()))),
                              "--out", str(tmp_path / "o.csv")])
    assert needle in assert_one_line_exit_2(res)


def test_missing_batches_file(tmp_path):
    res = runner.invoke(app, ["predict", "--gpu", "a100-80g", "--model", "llama-3-8b",
                              "--batches", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o.csv")])
    assert "nope.csv" in assert_one_line_exit_2(res)


def test_batch_kinds():
    assert list(batch_kind(BATCHES)) == ["prefill-only", "decode-only", "mixed", "prefill-with-context"]


def validation_folder(tmp_path: Path, scale: float) -> Path:
    """Validation rows whose 'measured' times are the A100 pack's predictions times ``scale``."""
    folder = tmp_path / "val"
    folder.mkdir()
    rows = []
    for graph in (False, True):
        m = load_pack_model("a100-80g", "llama-3-8b", cuda_graph=graph)
        for r in BATCHES.itertuples(index=False):
            new = np.r_[np.full(r.n_prefill, r.prefill_len), np.ones(r.n_decode, np.int64)]
            ctx = np.r_[np.full(r.n_prefill, r.prefill_ctx), np.full(r.n_decode, r.decode_ctx)]
            rows.append({"model": "llama-3-8b", "tp": 1, "cuda_graph": graph, **r._asdict(),
                         "measured_ms": m.predict(new, ctx) * 1e3 * scale, "std_ms": 0.01})
    pd.DataFrame(rows).to_csv(folder / "llama-3-8b.csv", index=False)
    return folder


def test_validate_reports_error_per_kind_and_writes_markdown(tmp_path):
    folder = validation_folder(tmp_path, scale=1.25)  # predictions are 20% low everywhere
    md = tmp_path / "VALIDATION.md"
    md.write_text(f"# head\n\n{BEGIN}\nold\n{END}\n\ntail\n")
    res = runner.invoke(app, ["validate", "--gpu", "a100-80g", "--folder", str(folder), "--write", str(md)])
    assert res.exit_code == 0, res.output
    for kind in ("prefill-only", "prefill-with-context", "decode-only", "mixed"):
        assert kind in res.output
    assert "20.0" in res.output  # |1/1.25 - 1|
    text = md.read_text()
    assert text.startswith("# head") and text.rstrip().endswith("tail") and "old" not in text
    assert "| llama-3-8b | 1 | graph | decode-only |" in text


def test_validate_without_data_is_one_line(tmp_path):
    res = runner.invoke(app, ["validate", "--gpu", "a100-80g", "--folder", str(tmp_path)])
    assert "no validation CSV" in assert_one_line_exit_2(res)


def test_read_batches_rejects_unreadable(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"\xff\xfe\x00garbage")
    from servesim.errors import PackError

    with pytest.raises(PackError):
        read_batches(path)


def test_import_vidur_bad_source_is_one_line(tmp_path):
    res = runner.invoke(app, ["import-vidur", "--src", str(tmp_path), "--out", str(tmp_path / "o")])
    assert "mlp.csv" in assert_one_line_exit_2(res)


def test_predict_out_a_folder_is_one_line(tmp_path):
    """Issue 17: --out a directory was an IsADirectoryError traceback after the predictions."""
    folder = tmp_path / "adir"
    folder.mkdir()
    res = runner.invoke(app, ["predict", "--gpu", "a100-80g", "--model", "llama-3-8b",
                              "--batches", str(write(tmp_path, BATCHES)), "--out", str(folder)])
    assert "is a folder" in assert_one_line_exit_2(res)


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "b200"], "allowed: a100-80g, h100-80g, h200"),  # GPUs with packs and op surveys
    (["--gpu", "h100-80g", "--model", "llama-3.1-8b", "--quantization", "fp8", "--tp", "2"],
     "h100-80g has no measured all-reduce over 2 GPUs"),
    (["--model", "llama-9"], "llama-9"),
    (["--tp", "0"], "--tp 0"),
])
def test_derive_bad_args_are_one_line(tmp_path, args, needle):
    res = runner.invoke(app, ["derive", "--out", str(tmp_path / "o"), *args])
    assert needle in assert_one_line_exit_2(res)


def test_derive_bad_source_is_one_line(tmp_path):
    res = runner.invoke(app, ["derive", "--src", str(tmp_path), "--out", str(tmp_path / "o")])
    assert "mlp.csv" in assert_one_line_exit_2(res)


def test_derive_any_dense_library_model_on_the_measured_h200(tmp_path):
    """derive --gpu h200: a pack for a library model nobody measured (llama-3.1-70b tp 2), from the
    H200's measured llama-3-8b packs (held-out error of the rule: VALIDATION.md 'Derived packs')."""
    from servesim.models import MODELS
    from servesim.perf.pack import read_pack
    from servesim.perf.packmodel import PackStepModel

    res = runner.invoke(app, ["derive", "--gpu", "h200", "--model", "llama-3.1-70b", "--tp", "2", "--out",
                              str(tmp_path)])
    assert res.exit_code == 0, res.output
    pack = read_pack(tmp_path / "h200" / "llama-3.1-70b-tp2.csv")
    assert pack.meta["source"] == "derived" and "h200/llama-3-8b" in pack.meta["origin"]
    m = PackStepModel(pack, MODELS["llama-3.1-70b"], tp=2)
    small = m.predict(np.ones(8, np.int64), np.full(8, 1024))
    big = m.predict(np.ones(256, np.int64), np.full(256, 1024))
    assert 0 < small < big


def test_derive_any_shape_and_precision_on_the_h200(tmp_path):
    """derive --gpu h200 accepts MoE + MLA models (DeepSeek-V2-Lite) and another precision: the
    pack records the expert and latent shape, names its sources and surveys, and prices runs."""
    from servesim.models import MODELS, with_precision
    from servesim.perf.pack import read_pack
    from servesim.perf.packmodel import PackStepModel

    res = runner.invoke(app, ["derive", "--gpu", "h200", "--model", "deepseek-v2-lite", "--tp", "1",
                              "--kv-cache-dtype", "fp8", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    pack = read_pack(tmp_path / "h200" / "deepseek-v2-lite-kvfp8.csv")
    assert pack.is_moe and pack.is_mla and pack.meta["shape"]["num_dense_layers"] == 1
    assert "surveys h200/{mla,moe}" in pack.meta["origin"] and pack.kv_cache_dtype == "fp8"
    held = pack.meta["held_out_error"]  # each rule it used, with its error on data it never read
    assert {"dense ops", "experts", "latent attention"} <= set(held) and "% median" in held["experts"]
    m = PackStepModel(pack, with_precision(MODELS["deepseek-v2-lite"], "none", "fp8"), cuda_graph=True)
    assert "derived from h200/llama-3-8b" in m.describe()
    assert 0 < m.predict(np.ones(8, np.int64), np.full(8, 1024)) < m.predict(np.ones(256, np.int64), np.full(256, 1024))


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "a100-80g", "--model", "mixtral-8x7b"], "no op surveys"),
    (["--gpu", "h200", "--model", "llama-3-8b", "--quantization", "int8"], "--quantization int8"),
    (["--gpu", "h200", "--model", "deepseek-v3", "--tp", "8"], "no measured all-reduce over 8 GPUs"),
    (["--gpu", "h200", "--model", "llama-3.1-70b", "--tp", "4"], "allowed: 1, 2"),
])
def test_derive_refuses_what_it_has_no_measurements_for_in_one_line(tmp_path, args, needle):
    res = runner.invoke(app, ["derive", *args, "--out", str(tmp_path)])
    assert needle in assert_one_line_exit_2(res)
    assert not (tmp_path / "h200").exists() and not (tmp_path / "a100-80g").exists()
