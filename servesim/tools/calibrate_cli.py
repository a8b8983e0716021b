"""``servesim calibrate ...``: predict iteration times from a pack, validate packs, import Vidur.

The verbs are thin: batch files in, the pack model's predictions or error tables out. The
validation helpers (:func:`read_batches`, :func:`predict_frame`, :func:`error_table`) are also what
``benchmarks/calibration_fidelity.py`` uses, so the CLI and the benchmark report the same numbers.
Whole-iteration validation files (``calibration/validation/<gpu>/*.csv``) are only ever compared
against predictions here; the pack model never reads them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np
import typer


class _Pandas:
    """pandas, imported on first use: this module is mounted on the CLI at start-up, and a
    ``servesim run`` should not pay pandas' import time (~0.3 s) for calibration verbs."""

    def __getattr__(self, name: str):
        import pandas

        return getattr(pandas, name)


pd = _Pandas()

from servesim.errors import PackError, ServesimError
from servesim.fields import MAX_TOKENS

MAX_BATCH_SEQS = 65536  # sequences of one kind in a batch (engine.max_num_seqs' bound)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Calibration packs: predict iteration times, validate, import Vidur profiles.")

BATCH_COLUMNS = ("n_prefill", "prefill_len", "prefill_ctx", "n_decode", "decode_ctx")
VALIDATION_COLUMNS = ("model", "tp", "cuda_graph") + BATCH_COLUMNS + ("measured_ms", "std_ms")
#: optional validation columns, with the value a file without them means (the model's precision)
PRECISION_COLUMNS = {"quantization": "none", "kv_cache_dtype": "auto"}
KINDS = ("prefill-only", "prefill-with-context", "decode-only", "mixed")
REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


# --- library helpers --------------------------------------------------------------------------

def read_batches(path: Path, columns: tuple[str, ...] = BATCH_COLUMNS) -> pd.DataFrame:
    """Read a batch CSV and check its columns and values (non-negative integers)."""
    path = Path(path)
    if not path.is_file():
        raise PackError(f"{path}: file not found")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PackError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise PackError(f"{path}: missing column '{missing[0]}'; expected columns {','.join(columns)}")
    for col in BATCH_COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce")
        hi = MAX_BATCH_SEQS if col.startswith("n_") else MAX_TOKENS
        bad = ~np.isfinite(values) | (values < 0) | (values != np.floor(values)) | (values > hi)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise PackError(f"{path} line {i + 2}: {col} '{df[col].iloc[i]}' is not allowed; "
                            f"allowed: integers 0..{hi:,}")
        df[col] = values.astype(np.int64)
    empty = (df["n_prefill"] + df["n_decode"]) == 0
    if empty.any():
        raise PackError(f"{path} line {int(np.flatnonzero(empty.to_numpy())[0]) + 2}: empty batch "
                        f"(n_prefill + n_decode must be >= 1)")
    zero = (df["n_prefill"] > 0) & (df["prefill_len"] < 1)
    if zero.any():
        raise PackError(f"{path} line {int(np.flatnonzero(zero.to_numpy())[0]) + 2}: prefill_len must "
                        f"be >= 1 when n_prefill > 0")
    return df


def composition(row) -> tuple[np.ndarray, np.ndarray]:
    """(new_tokens, context) arrays of one batch row."""
    new = np.concatenate([np.full(int(row.n_prefill), int(row.prefill_len), np.int64),
                          np.ones(int(row.n_decode), np.int64)])
    ctx = np.concatenate([np.full(int(row.n_prefill), int(row.prefill_ctx), np.int64),
                          np.full(int(row.n_decode), int(row.decode_ctx), np.int64)])
    return new, ctx


def batch_kind(df: pd.DataFrame) -> pd.Series:
    kind = np.where(df["n_prefill"] == 0, "decode-only",
                    np.where(df["n_decode"] > 0, "mixed",
                             np.where(df["prefill_ctx"] > 0, "prefill-with-context", "prefill-only")))
    return pd.Series(kind, index=df.index)


def predict_frame(df: pd.DataFrame, model) -> np.ndarray:
    """Predicted ms for every batch row."""
    return np.array([model.predict(*composition(r)) * 1e3 for r in df.itertuples(index=False)])


def _bool_col(s: pd.Series) -> pd.Series:
    return s.astype(str).str.strip().str.lower().isin(("1", "true", "yes"))


def read_validation(folder: Path, model: str | None = None) -> pd.DataFrame:
    """All whole-iteration measurements under ``folder`` (optionally one model: a model or pack
    name). Optional columns ``quantization`` (default none) and ``kv_cache_dtype`` (default auto)
    say which precision each row ran; ``pack`` is the pack name that prices it
    (``<model>[-<quantization>][-kv<dtype>]``, servesim/perf/pack.py)."""
    from servesim.models import KV_CACHE_DTYPES, WEIGHT_FORMATS
    from servesim.perf.pack import pack_name

    files = sorted(Path(folder).glob("*.csv"))
    if not files:
        raise PackError(f"{folder}: no validation CSV files (expected columns {','.join(VALIDATION_COLUMNS)})")
    frames = []
    for f in files:
        df = read_batches(f, VALIDATION_COLUMNS)
        df["cuda_graph"] = _bool_col(df["cuda_graph"])
        for col, default in PRECISION_COLUMNS.items():
            allowed = WEIGHT_FORMATS if col == "quantization" else KV_CACHE_DTYPES
            df[col] = (df[col].fillna(default).astype(str).str.strip().replace("", default)
                       if col in df.columns else default)
            bad = ~df[col].isin(list(allowed))
            if bad.any():
                i = int(np.flatnonzero(bad.to_numpy())[0])
                raise PackError(f"{f} line {i + 2}: {col} '{df[col].iloc[i]}' is unknown; allowed: "
                                f"{', '.join(allowed)}")
        df["pack"] = [pack_name(str(m), q, kv) for m, q, kv in
                      zip(df["model"], df["quantization"], df["kv_cache_dtype"])]
        df["file"] = f.name
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    if model is not None:
        out = out[(out["model"] == model) | (out["pack"] == model)]
        if out.empty:
            raise PackError(f"{folder}: no validation rows for model '{model}'")
    return out.reset_index(drop=True)


def validate_frame(gpu: str, df: pd.DataFrame, graph_scope: str = "all") -> pd.DataFrame:
    """Add ``predicted_ms``, ``error`` (predicted/measured - 1) and ``kind`` to validation rows.

    ``graph_scope="all"``: the profiler's graph-mode rows replay the whole forward of every
    composition (prefills too) as one CUDA graph, so the model is asked the same.
    """
    from servesim.perf.packmodel import load_pack_model

    out = df.copy()
    if "pack" not in out.columns:  # rows not from read_validation: the models' own precision
        out["pack"] = out["model"]
    out["predicted_ms"] = np.nan
    for (name, tp, graph), idx in out.groupby(["pack", "tp", "cuda_graph"]).groups.items():
        # the pack name carries the precision: the model is built in it and finds its pack
        m = load_pack_model(gpu, str(name), tp=int(tp), cuda_graph=bool(graph), graph_scope=graph_scope)
        out.loc[idx, "predicted_ms"] = predict_frame(out.loc[idx], m)
    out["error"] = out["predicted_ms"] / out["measured_ms"] - 1
    out["kind"] = batch_kind(out)
    return out


def error_table(res: pd.DataFrame) -> pd.DataFrame:
    """Median and max |error| by (model, tp, mode, batch kind), plus an 'all' row per mode; the
    model column names the pack (``llama-3-8b-fp8``: the model in another precision)."""
    res = res.assign(mode=np.where(res["cuda_graph"], "graph", "eager"), abs_err=res["error"].abs())
    if "pack" in res.columns:
        res = res.assign(model=res["pack"])
    rows = []
    for (model, tp, mode), g in res.groupby(["model", "tp", "mode"]):
        for kind in KINDS + ("all",):
            sel = g if kind == "all" else g[g["kind"] == kind]
            if sel.empty:
                continue
            rows.append({"model": model, "tp": tp, "mode": mode, "kind": kind, "n": len(sel),
                         "median_abs_err_%": 100 * sel["abs_err"].median(),
                         "max_abs_err_%": 100 * sel["abs_err"].max(),
                         "mean_signed_err_%": 100 * sel["error"].mean()})
    return pd.DataFrame(rows)


def markdown_table(df: pd.DataFrame, floatfmt: str = ".1f") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        cells = [format(v, floatfmt) if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_validation_block(md_path: Path, block: str) -> None:
    """Replace the generated block between the markers (append it if the markers are absent)."""
    text = md_path.read_text() if md_path.is_file() else "# Calibration validation\n"
    new = f"{BEGIN}\n{block}\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: new, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + new + "\n"
    md_path.write_text(text)


# --- verbs ------------------------------------------------------------------------------------

@app.command()
def predict(
    gpu: str = typer.Option(..., "--gpu", help="GPU key, e.g. h200, a100-80g"),
    model: str = typer.Option(..., "--model", help="model key, e.g. llama-3-8b"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel degree"),
    pp: int = typer.Option(1, "--pp", help="pipeline-parallel degree"),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="replay iterations as CUDA graphs (see --graph-scope)"),
    graph_scope: str = typer.Option("decode", "--graph-scope", help="with --cuda-graph: 'decode' (pure-decode "
                                    "iterations only, vLLM's capture) or 'all' iterations"),
    batches: Path = typer.Option(..., "--batches", help="CSV with n_prefill,prefill_len,prefill_ctx,n_decode,decode_ctx"),
    out: Path = typer.Option(..., "--out", help="output CSV (input columns + predicted_ms)"),
) -> None:
    """Predict the iteration time of every batch in a CSV."""
    from servesim.perf.packmodel import load_pack_model

    if out.is_dir():
        _fail(f"--out {out}: is a folder; give the output CSV file's path")
    if out.parent.exists() and not out.parent.is_dir():
        _fail(f"--out {out}: {out.parent} is a file, not a folder")
    try:
        df = read_batches(batches)
        m = load_pack_model(gpu, model, tp=tp, pp=pp, cuda_graph=cuda_graph, graph_scope=graph_scope)
        df["predicted_ms"] = predict_frame(df, m)
    except ServesimError as exc:
        _fail(str(exc))
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False, float_format="%.6g")
    except OSError as exc:
        _fail(f"--out {out}: cannot write it ({exc.strerror or exc})")
    typer.echo(f"wrote {len(df)} predictions to {out} ({m.describe()})")


@app.command()
def validate(
    gpu: str = typer.Option("h200", "--gpu", help="GPU key; reads calibration/validation/<gpu>/*.csv"),
    model: Optional[str] = typer.Option(None, "--model", help="only this model"),
    folder: Optional[Path] = typer.Option(None, "--folder", help="validation folder (default: calibration/validation/<gpu>)"),
    write: Optional[Path] = typer.Option(None, "--write", help="also write the table into this markdown file "
                                         "(e.g. calibration/VALIDATION.md, between its generated-table markers)"),
    graph_scope: str = typer.Option("all", "--graph-scope", help="what graph-mode rows replayed: 'all' "
                                    "(the profiler's whole-forward graphs) or 'decode'"),
) -> None:
    """Whole-iteration error of the pack model against measured iterations, per batch kind."""
    folder = folder or REPO / "calibration" / "validation" / gpu
    try:
        res = validate_frame(gpu, read_validation(folder, model), graph_scope)
    except ServesimError as exc:
        _fail(str(exc))
        return
    table = error_table(res)
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    if write is not None:
        block = (f"Whole-iteration error, {gpu} (`servesim calibrate validate --gpu {gpu}`; error = "
                 f"predicted / measured - 1; {len(res)} batches):\n\n" + markdown_table(table))
        write_validation_block(write, block)
        typer.echo(f"wrote the table into {write}")


@app.command("import-vidur")
def import_vidur_cmd(
    src: Path = typer.Option(REPO.parent / "shared" / "calibration" / "vidur_profiles", "--src",
                             help="Vidur profile folder (layout of shared/calibration/vidur_profiles)"),
    out: Path = typer.Option(REPO / "calibration" / "packs", "--out", help="pack folder"),
    model: str = typer.Option("llama-3-8b", "--model", help="model key"),
    tp: Optional[list[int]] = typer.Option(None, "--tp", help="TP degrees (default: all in the data)"),
) -> None:
    """Convert Vidur's A100 profiles into packs <out>/a100-80g/<model>[-tp<N>].csv + .yaml."""
    from servesim.tools.vidur import import_vidur

    try:
        written = import_vidur(src, out, model=model, tps=tp or None)
    except ServesimError as exc:
        _fail(str(exc))
        return
    for p in written:
        typer.echo(f"wrote {p} (+ .yaml)")


def derivable_gpus() -> list[str]:
    """GPUs ``derive`` can write packs for: the A100 (from Vidur's profiles) and every GPU with
    measured packs and op surveys (``calibration/surveys/<gpu>/``: the H200 since call 9, the H100
    since call 26 of calibration/COMMANDS.md)."""
    from servesim.perf.kvfp8 import survey_root
    from servesim.perf.pack import available_packs, load_pack

    root = survey_root()
    surveyed = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name != "a100-80g") if root.is_dir() else []
    packs = available_packs()

    def has_measured(gpu: str) -> bool:  # (stops at the first: loading every pack took ~5 s)
        return any(load_pack(g, m, t).meta.get("source") == "measured" for g, m, t in packs if g == gpu)
    return ["a100-80g", *(g for g in surveyed if has_measured(g))]


@app.command("derive")
def derive_cmd(
    gpu: str = typer.Option("a100-80g", "--gpu", help="GPU key; a100-80g derives from Vidur's A100 profiles, "
                            "h200 and h100-80g from their measured packs and op surveys"),
    model: list[str] = typer.Option(["qwen3-4b", "qwen3-8b", "qwen3-14b"], "--model",
                                    help="library model(s) (docs/models.md); on a GPU with surveys any kind: dense, MoE, MLA"),
    tp: Optional[list[int]] = typer.Option(None, "--tp", help="TP degrees (those that divide the heads); "
                                           "default: a100-80g 1, 2, 4, 8; a GPU with surveys: those with measured "
                                           "all-reduce rows (h200 1, 2; h100-80g 1)"),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="GPUs with surveys (h200, h100-80g): weight format (none, fp8, "
                                               "awq, gptq); default: the checkpoint's"),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="GPUs with surveys: auto or fp8"),
    moe_imbalance: float = typer.Option(1.0, "--moe-imbalance", help="GPUs with surveys, MoE: tokens of the busiest "
                                        "expert over the mean (1: uniform routing)"),
    src: Path = typer.Option(REPO.parent / "shared" / "calibration" / "vidur_profiles", "--src",
                             help="Vidur profile folder (layout of shared/calibration/vidur_profiles)"),
    out: Path = typer.Option(REPO / "calibration" / "packs", "--out", help="pack folder"),
) -> None:
    """Derive packs for models nobody measured on the GPU from other models' op timings there
    (rules: servesim/tools/derive.py, derive_variants.py; errors: calibration/VALIDATION.md)."""
    from servesim.models import KV_CACHE_DTYPES, MODELS
    from servesim.tools.derive_variants import SURVEY_VARIANT, write_derived
    from servesim.tools.derived_packs import write_a100_packs, write_measured_gpu_packs

    allowed = derivable_gpus()
    if gpu not in allowed:
        _fail(f"--gpu {gpu}: derivation needs measured op curves of that GPU (its packs and op surveys); "
              f"allowed: {', '.join(allowed)}")
    bad = [m for m in model if m not in MODELS]
    if bad:
        _fail(f"--model {bad[0]}: unknown; allowed: {', '.join(sorted(MODELS))}")
    if not tp:
        from servesim.tools.derive_variants import collective_tps

        tp = [1, 2, 4, 8] if gpu == "a100-80g" else collective_tps(gpu)
    badtp = [t for t in tp if t < 1 or t > 64]
    if badtp:
        _fail(f"--tp {badtp[0]}: not allowed; allowed: integers 1..64")
    if quantization is not None and quantization not in ("none",) + tuple(SURVEY_VARIANT):
        _fail(f"--quantization {quantization}: cannot be derived; allowed: none, {', '.join(SURVEY_VARIANT)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        _fail(f"--kv-cache-dtype {kv_cache_dtype}: unknown; allowed: {', '.join(KV_CACHE_DTYPES)}")
    odd = [m for m in model if MODELS[m].is_moe or MODELS[m].is_mla]
    variant = (quantization not in (None, "none") or kv_cache_dtype != "auto"
               or any(MODELS[m].quantization != "none" for m in model))
    if gpu == "a100-80g" and (odd or variant):
        what = f"--model {odd[0]} ({MODELS[odd[0]].kind})" if odd else "another precision"
        _fail(f"{what}: a100-80g has no op surveys (experts, latent attention, weight formats) to derive "
              f"from; allowed there: dense bf16 models; use --gpu h200")
    try:
        if gpu == "a100-80g":
            written = write_a100_packs(src, out, list(model), list(tp))
        elif odd or variant:
            written = write_derived(gpu, out, list(model), list(tp), quantization, kv_cache_dtype, moe_imbalance)
        else:
            written = write_measured_gpu_packs(gpu, out, list(model), list(tp))
    except ServesimError as exc:
        _fail(str(exc))
        return
    for p in written:
        typer.echo(f"wrote {p} (+ .yaml)")


@app.command("efficiency")
def efficiency_cmd(
    gpu: Optional[str] = typer.Option(None, "--gpu", help="only this GPU's packs"),
    write: bool = typer.Option(False, "--write", help="also record the summary in each pack's YAML "
                               "(key 'efficiency')"),
) -> None:
    """Achieved HBM bandwidth and TFLOP/s of every pack's kernels against its GPU's peaks."""
    import yaml

    from servesim.hardware import GPUS
    from servesim.perf.efficiency import pack_efficiency
    from servesim.perf.pack import available_packs, load_pack

    if gpu is not None and gpu not in GPUS:
        _fail(f"--gpu {gpu}: unknown; allowed: {', '.join(sorted(GPUS))}")
    for g, m, t in available_packs():
        if gpu is not None and g != gpu:
            continue
        try:
            pack = load_pack(g, m, t)
        except ServesimError as exc:
            _fail(str(exc))
            return
        e = pack_efficiency(pack)
        d = e.get("attn_decode_share_of_hbm_peak", {})
        typer.echo(f"{g}/{pack.csv_path.stem}: decode attention (batch >= 64) median "
                   f"{100 * d.get('median', float('nan')):.0f}% of HBM peak; "
                   f"GEMMs >= 4096 tokens {e.get('gemm_tokens_ge_4096_TFLOPps', {}).get('median')} TFLOP/s")
        if write:
            path = pack.csv_path.with_suffix(".yaml")
            meta = yaml.safe_load(path.read_text())
            meta["efficiency"] = e
            path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
