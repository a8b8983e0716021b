"""The GPU profiler's torch-free parts (calibration/profiler/: shapes, grids, writers, combine, the
command line), here in the main suite; what needs PyTorch is in calibration/test_*_cpu.py, run by
CI in a venv of its own (.ci/run).

Why here: the profiler runs on GPU machines without servesim's dependencies, so it reads the
model library's JSON and writes packs with its own writer; these tests hold both equal to
servesim's own readers, and every command line of calibration/device_runs/*.sh to the parser,
so a change on either side fails here rather than on a lent GPU.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servesim.models import MODELS
from servesim.perf import pack as sp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from calibration.profiler import cli, combine, common, grids, shapes, writers  # noqa: E402

PROFILER = REPO / "calibration" / "profiler"


# --- shapes -------------------------------------------------------------------------------------

def test_profiled_shapes_equal_servesims_model_library():
    """The profiler reads servesim/models/library/*.json itself (no servesim on the GPU machine);
    its shapes must be the ones servesim's reader makes of the same files."""
    assert list(shapes.SHAPES) == list(shapes.PROFILED)
    for name, mine in shapes.SHAPES.items():
        ref = MODELS[name]
        for key in shapes.SHAPE_KEYS + ("max_model_len", "tie_word_embeddings"):
            assert mine[key] == getattr(ref, key), (name, key)
        assert (mine.get("num_experts", 0), mine.get("num_experts_per_tok", 0),
                mine.get("moe_intermediate_size", 0)) == (ref.num_experts, ref.num_experts_per_tok,
                                                          ref.moe_intermediate_size if ref.is_moe else 0), name
        assert not ref.is_mla and ref.num_dense_layers == 0 and ref.shared_expert_intermediate_size == 0
    assert shapes.SHAPES["llama-3.1-8b"]["max_model_len"] == 131072


def test_library_shape_refuses_what_it_does_not_profile():
    with pytest.raises(SystemExit, match="kv_lora_rank"):
        shapes.library_shape("deepseek-v3")


def test_rank_shape_slices():
    rs = shapes.RankShape.of("qwen3-14b", 2)
    assert (rs.H, rs.KVH, rs.I, rs.V, rs.h) == (20, 4, 8704, 75968, 5120)
    assert shapes.RankShape.of("llama-3-8b", 16).KVH == 1  # KV heads replicated, min 1
    rs = shapes.RankShape.of("qwen3-30b-a3b", 1)
    assert rs.moe and rs.as_dict()["num_experts"] == 128 and rs.MI == 768
    with pytest.raises(SystemExit, match="quantized experts"):
        shapes.RankShape.of("qwen3-30b-a3b", 1, "fp8")
    with pytest.raises(SystemExit, match="survey"):
        shapes.RankShape.of("llama-3-8b", 1, "int4")


def test_pack_stems_equal_servesims():
    for model in shapes.SHAPES:
        for tp in (1, 2, 8):
            for weights, quant in (("bf16", "none"), ("fp8", "fp8"), ("fp8_static", "fp8_static")):
                stem = shapes.pack_stem(model, tp, weights)
                assert stem == sp.pack_stem(model, tp, quant)
                assert shapes.stem_tp(stem) == sp.split_stem(stem)[1] == tp
                assert sp.split_stem(stem)[2] == quant  # -fp8_static is not read as -fp8


def test_every_pack_weight_format_is_a_servesim_quantization():
    """A pack measured with ``--weights W`` is read back as quantization W with W's weight dtype:
    fp8_static is a name of its own (its GEMM rows differ from fp8's), not an alias of fp8."""
    for weights in shapes.PACK_WEIGHTS:
        quant = "none" if weights == "bf16" else weights
        assert quant in sp.WEIGHT_FORMATS
        assert sp.WEIGHT_DTYPES[quant] == ("bf16" if weights == "bf16" else "fp8")
    assert sp.WEIGHT_FORMATS["fp8_static"].gemm == sp.WEIGHT_FORMATS["fp8"].gemm == "fp8"


# --- grids --------------------------------------------------------------------------------------

def test_validation_compositions():
    calib = {(0, 0, 0, b, grids.CALIB_CTX) for b in grids.CALIB_BATCHES}
    for m in shapes.SHAPES:
        comps = grids.validation_compositions(m, quick=False)
        assert 60 <= len(comps) <= 120, (m, len(comps))
        ml = shapes.SHAPES[m]["max_model_len"]
        for c in comps:
            t = (c.n_prefill, c.prefill_len, c.prefill_ctx, c.n_decode, c.decode_ctx)
            assert t not in calib
            assert c.prefill_ctx + c.prefill_len <= ml and (c.n_decode == 0 or c.decode_ctx + 1 <= ml)
        assert len(set(comps)) == len(comps)


def test_dense_grid_is_uniform_and_contains_sparse_calibration_points():
    """The dense grid: a fixed step within each span (never picked from validation sizes), and the
    overhead calibration batches/context are grid points (the overhead rows need their table sums)."""
    toks, batches = grids.DENSE_TOKENS, grids.DENSE_DECODE_BATCH
    assert len(toks) == 100 and toks[0] == 1 and toks[-1] == 16384 and toks == sorted(set(toks))
    assert all(t in toks for t in range(16, 257, 8)) and all(t in toks for t in range(256, 1025, 32))
    assert all(t in toks for t in range(1024, 2049, 64))
    assert list(range(1, 17)) == batches[:16] and batches[-1] == 512 and len(batches) == 52
    for b in grids.CALIB_BATCHES:
        assert b in batches and b in toks
    assert grids.CALIB_CTX in grids.DENSE_DECODE_CTX and set(grids.DECODE_CTX) <= set(grids.DENSE_DECODE_CTX)
    # steps never exceed 1.5x above 512 in decode context
    c = [x for x in grids.DENSE_DECODE_CTX if x >= 512]
    assert all(b / a <= 1.5 for a, b in zip(c, c[1:]))


def test_dense_prefill_grid_and_calibration_batches():
    """Dense prefill lattice: chunk rows every 64 to 1024 (FlashAttention's query tiles are 64/128
    rows), at most 12.5% apart above 512, up to 8192; calibration batches reach 512."""
    ch, cx = grids.DENSE_PREFILL_CHUNKS, grids.DENSE_PREFILL_CTX
    assert ch[0] == 16 and ch[-1] == 8192 and len(ch) == 41 and ch == sorted(set(ch))
    assert all(t in ch for t in range(64, 1025, 64)) and all(t in ch for t in range(1024, 2049, 128))
    big = [t for t in ch if t >= 512]
    assert all(b / a <= 1.125 + 1e-9 for a, b in zip(big, big[1:]))
    assert cx[0] == 0 and cx[-1] + ch[-1] <= 32768
    assert grids.CALIB_BATCHES[-1] == 512 and 384 in grids.CALIB_BATCHES


def test_long_grid_adds_only_points_beyond_the_dense_grid():
    for model in ("qwen3-8b", "llama-3.1-8b"):
        rs = shapes.RankShape.of(model, 1)
        dense = {(t, c) for t in grids.DENSE_PREFILL_CHUNKS for c in grids.DENSE_PREFILL_CTX}
        pts = grids.prefill_points(grids.GRIDS["long"], rs.max_len)
        assert pts and not set(pts) & dense
        assert all(t + c <= rs.max_len for t, c in pts)
        dec = grids.decode_points(grids.GRIDS["long"], rs.max_len, rs.KVH, rs.D, 48 << 30, quick=False)
        assert all(c + 1 <= rs.max_len and bb * (c + 1) * 4096 <= 48 << 30 for bb, c in dec)
    assert max(c for _, c in dec) == 131071 and max(t for t, _ in pts) == 32768
    # the dense grid of an 8K model: every chunk + context within it, the longest context added
    pts = grids.prefill_points(grids.GRIDS["dense"], 8192)
    assert (8192, 0) in pts and all(t + c <= 8192 for t, c in pts)
    dec = grids.decode_points(grids.GRIDS["dense"], 8192, 8, 128, 16 << 30, quick=False)
    assert (1, 8191) in dec and max(c for _, c in dec) == 8191


# --- writers ------------------------------------------------------------------------------------

def test_write_rows_refuses_bad_times(tmp_path):
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="refusing"):
            writers.write_rows(tmp_path / "x.csv", [("qkv_proj", 1, 0, 0, 0, bad, 0.0)])


def test_written_pack_rows_read_back_by_servesim(tmp_path):
    assert writers.COLUMNS == sp.COLUMNS and combine.OVERHEAD_OPS == sp.OVERHEAD_OPS
    rows = [("qkv_proj", 16, 0, 0, 0, 0.0123456789, 0.001), ("attn_decode", 8, 8, 1024, 0, 0.5, float("nan")),
            ("overhead_eager", 8, 8, 0, 0, 3.25, None)]
    path = tmp_path / "p.csv"
    writers.write_rows(path, rows)
    got = sp.read_rows(path)
    assert got["qkv_proj"].time_ms[0] == pytest.approx(0.0123457, rel=1e-9)  # 6 significant digits
    assert math.isnan(got["attn_decode"].std_ms[0]) and got["attn_decode"].context[0] == 1024
    assert [r[:6] for r in writers.read_rows(path)][1] == ("attn_decode", 8, 8, 1024, 0, 0.5)


def test_yaml_without_pyyaml_reads_back_equal():
    """The small block-style writer (used where PyYAML is missing) gives the same data back."""
    meta = {"gpu": "h200", "tp": 2, "ok": True, "none": None, "x": 0.25, "s": "a: b # c",
            "flat": {"a": 1, "b": "two"}, "empty": {}, "lst": [1, "x"], "nil": [],
            "deep": {"k": [{"a": 1, "b": [2, 3]}, {"c": "d"}], "n": {"m": {"o": 1}}}}
    text = "\n".join(writers._yaml_lines(writers._plain(meta))) + "\n"
    assert yaml.safe_load(text) == meta


def test_merge_and_combine_overheads_without_torch(tmp_path):
    """``merge`` puts the TP's all_reduce rows and send_recv into a pack; ``combine
    --overheads-from`` takes the median over processes (torch-free modes, run in-process)."""
    gpu = tmp_path / "a" / "packs" / "h200"
    base = [("qkv_proj", 8, 0, 0, 0, 0.01, 0.0), ("overhead_eager", 8, 8, 0, 0, 2.0, 0.1)]
    writers.write_rows(gpu / "tiny-tp2.csv", base)
    writers.write_yaml(gpu / "tiny-tp2.yaml", {"model": "tiny", "tp": 2, "overhead": {"points": {
        "overhead_eager batch=8": {"diff_ms": 2.0, "forward_std_ms": 0.1}}}})
    coll = tmp_path / "a" / "collectives" / "h200" / "collectives_2gpu.csv"
    writers.write_rows(coll, [("all_reduce", 0, 2, 0, 4096, 0.01, 0.0), ("all_reduce", 0, 4, 0, 4096, 0.02, 0.0),
                              ("send_recv", 0, 2, 0, 4096, 0.005, 0.0)])
    assert cli.main(["merge", "--out", str(tmp_path / "a")]) == 0
    ops = [r[:3] for r in writers.read_rows(gpu / "tiny-tp2.csv")]
    assert ("all_reduce", 0, 2) in ops and ("all_reduce", 0, 4) not in ops and ("send_recv", 0, 2) in ops
    for k, diff in (("o2", 4.0), ("o3", 3.0)):
        other = tmp_path / k / "packs" / "h200"
        other.mkdir(parents=True)
        writers.write_yaml(other / "tiny-tp2.yaml", {"overhead": {"points": {
            "overhead_eager batch=8": {"diff_ms": diff, "forward_std_ms": 0.2}}}})
    assert cli.main(["combine", "--out", str(tmp_path / "a"),
                     "--overheads-from", f"{tmp_path / 'o2'},{tmp_path / 'o3'}"]) == 0
    rows = {r[0]: r for r in writers.read_rows(gpu / "tiny-tp2.csv")}
    assert rows["overhead_eager"][5] == 3.0 and "send_recv" in rows
    meta = writers.read_yaml(gpu / "tiny-tp2.yaml")
    assert meta["overhead"]["combined"]["points"]["overhead_eager batch=8"]["diff_ms_per_process"] == [2.0, 4.0, 3.0]


def test_combine_add_from_appends_new_points_within_max_len(tmp_path):
    out = tmp_path / "out" / "packs" / "h200"
    src = tmp_path / "src"
    out.mkdir(parents=True)
    src.mkdir()
    meta = {"model": "qwen3-8b", "gpu": "h200", "tp": 1, "date": "2026-12-01",
            "combined": {"command": "combine --overheads-from o2,o3", "note": "overheads"}}
    writers.write_rows(out / "qwen3-8b.csv", [("qkv_proj", 16, 0, 0, 0, 0.01, 0.0),
                                              ("attn_prefill", 1024, 0, 0, 0, 0.1, 0.0)])
    writers.write_yaml(out / "qwen3-8b.yaml", meta)
    writers.write_rows(src / "qwen3-8b.csv", [("qkv_proj", 16, 0, 0, 0, 0.5, 0.0),      # present: kept as is
                                              ("qkv_proj", 32768, 0, 0, 0, 3.0, 0.0),   # new
                                              ("attn_prefill", 8192, 0, 32768, 0, 9.0, 0.0),  # beyond 32K
                                              ("attn_prefill", 16384, 0, 0, 0, 5.0, 0.0)])    # new
    writers.write_yaml(src / "qwen3-8b.yaml", {**meta, "date": "2026-12-05"})
    assert cli.main(["combine", "--out", str(tmp_path / "out"), "--add-from", str(src)]) == 0
    rows = {(r[0], int(r[1]), int(r[3])): float(r[5]) for r in writers.read_rows(out / "qwen3-8b.csv")}
    assert rows[("qkv_proj", 16, 0)] == 0.01 and rows[("qkv_proj", 32768, 0)] == 3.0
    assert ("attn_prefill", 16384, 0) in rows and ("attn_prefill", 8192, 32768) not in rows
    after = writers.read_yaml(out / "qwen3-8b.yaml")
    assert after["added_rows"][0]["rows_per_op"] == {"qkv_proj": 1, "attn_prefill": 1}
    assert after["combined_before"] == [meta["combined"]]  # the earlier combine's record is kept
    assert after["combined"] != meta["combined"]  # and this combine's is the current one


def test_budget_stops():
    b = common.Budget(soft=0, hard=0)
    assert b.fast()
    with pytest.raises(common.BudgetExceeded):
        b.check()


# --- the command line ---------------------------------------------------------------------------

#: loop variables of the scripts (not assigned as NAME=value) and what they stand for
_LOOP_VARS = {"m": "qwen3-14b", "a": "a0", "A": "a0", "k": "b", "i": "0", "OUT": "/tmp/out"}


def _assignments(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        line = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
        for name, raw in re.findall(r"(?<![\w$-])([A-Za-z_]\w*)=(\"[^\"]*\"|'[^']*'|\$\([^)]*\)|[^\s;]*)", line):
            raw = raw[1:-1] if raw[:1] in "\"'" else raw
            self_default = re.fullmatch(r"\$\{" + name + r":-(.*)\}", raw)
            out[name] = self_default.group(1) if self_default else raw
    return out


def _expand(text: str, env: dict, depth: int = 0) -> str:
    """Enough of bash's expansion for the scripts: $((...)) and $(...) become a number or a word,
    ${V:-d}, ${V//,/ }, ${V} and $V their values (recursively), unknown names a placeholder."""
    assert depth < 10, text
    while "$(" in text:
        s = text.index("$(")
        n, j = 0, s + 1
        while True:
            n += {"(": 1, ")": -1}.get(text[j], 0)
            if n == 0:
                break
            j += 1
        text = text[:s] + ("1000" if text[s:s + 3] == "$((" else "x") + text[j + 1:]

    def var(m):
        name, op = m.group(1) or m.group(3), m.group(2) or ""
        name = name.split("[")[0]
        value = env.get(name, _LOOP_VARS.get(name))
        if op.startswith(":-") and not value:
            value = op[2:]
        if op.startswith("//"):
            value = (value or "").replace(op[2:].split("/")[0], op[2:].split("/")[1])
        return _expand(value if value is not None else "x", env, depth + 1)
    return re.sub(r"\$\{([A-Za-z_]\w*(?:\[[^\]]*\])?)([^}]*)\}|\$([A-Za-z_]\w*)", var, text)


def _cut(cmd: str) -> str:
    """The command up to its first unquoted redirection, pipe, ``;`` or ``&``."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in ">|;&":
            return re.sub(r"\s\d$", "", cmd[:i].rstrip()).rstrip()
    return cmd


def device_run_commands() -> list[tuple[str, list[str]]]:
    """Every ``profile_gpu.py`` command line of calibration/device_runs/*.sh, expanded, as argv."""
    found = []
    for script in sorted((REPO / "calibration" / "device_runs").glob("*.sh")):
        text = script.read_text()
        env = _assignments(text)
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for m in re.finditer(r"(?:\$P|profile_gpu\.py)\s+([a-z]+\s.*)", line):
                argv = shlex.split(_cut(_expand(m.group(1), env)))
                found.append((f"{script.name}: {m.group(1)[:60]}", argv))
    return found


def test_every_device_run_command_parses():
    """The scripts that ran on lent GPUs still parse, flag for flag, ``--then`` chains included."""
    cmds = device_run_commands()
    assert len(cmds) >= 20
    parser = cli.build_parser()
    modes = set()
    for where, argv in cmds:
        parts, cur = [], []
        for a in argv:
            if a == cli.THEN:
                parts.append(cur)
                cur = []
            else:
                cur.append(a)
        for part in parts + [cur]:
            try:
                args = parser.parse_args(part)
            except SystemExit:
                pytest.fail(f"{where}: {shlex.join(part)} does not parse")
            modes.add(args.mode)
            assert args.mode in cli.MODES
    assert modes >= {"ops", "iterations", "allreduce", "merge", "combine", "survey", "backends"}


def test_script_and_parser_load_no_torch():
    """``profile_gpu.py --help`` and the torch-free modules import no torch (the main suite's
    venv has none); the script keeps ``merge_collectives_into`` for precision_moe_integrate.sh."""
    code = ("import sys; sys.path.insert(0, 'calibration'); import profile_gpu as pg; "
            "import calibration.profiler.combine, calibration.profiler.writers; "
            "pg.cli = sys.modules['calibration.profiler.cli']; pg.cli.build_parser(); "
            "assert callable(pg.merge_collectives_into); assert 'torch' not in sys.modules, 'torch'")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, str(REPO / "calibration" / "profile_gpu.py"), "ops", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--calib-batches" in r.stdout, r.stderr[-2000:]


def test_no_profiler_module_over_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PROFILER.glob("*.py")}
    assert len(sizes) >= 10 and max(sizes.values()) <= 600, sizes
    assert len((REPO / "calibration" / "profile_gpu.py").read_text().splitlines()) <= 40
