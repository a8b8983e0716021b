"""Logic tests of the profiler (calibration/profiler/, run as calibration/profile_gpu.py) on CPU
that need PyTorch: the op functions, SDPA backend checks, whole forwards and the modes end to
end on tiny shapes. Its torch-free parts (shapes, grids, writers, combine, the command line) are
tested in the main suite (tests/test_calibration_profiler.py). CI runs these in a venv of their
own after the README's test command (.ci/run):

    TRITON_INTERPRET=1 python -m pytest -q calibration/     # a Python with torch (+ triton)

Why: GPU time is scarce, so the profiler's semantics (attention masks, KV slot layout, batch
composition, pack format, never writing a non-positive time) are checked here first, on CPU.
Without torch every test here is skipped.
"""

from __future__ import annotations

import csv
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from calibration.profiler import attn_backends as ab  # noqa: E402
from calibration.profiler import cli, common, grids, ops, opbench, shapes, timing, writers  # noqa: E402
from calibration.profiler import forward as fw  # noqa: E402

CPU = torch.device("cpu")


def _rand(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def test_attention_ops_match_reference():
    """attn_prefill_op (bottom-right causal over cached context) and attn_decode_op on the flat,
    sequence-major cache layout agree with a float64 reference."""
    H, KVH, D = 8, 2, 32
    for tq, ctx in ((1, 0), (7, 0), (5, 11), (16, 40)):
        qk = _rand(tq, H + KVH, D)
        kc, vc = _rand(ctx + tq, KVH, D), _rand(ctx + tq, KVH, D)
        out = torch.empty(tq, H, D, dtype=torch.bfloat16)
        ops.attn_prefill_op(qk[:, :H], kc, vc, out)
        ref = ab.Sdpa.reference(qk[:, :H].unsqueeze(0).transpose(1, 2), kc.unsqueeze(0).transpose(1, 2),
                                vc.unsqueeze(0).transpose(1, 2))[0].transpose(0, 1)
        rel = float((out.double() - ref).norm() / ref.norm())
        assert rel < 2e-2, (tq, ctx, rel)
        # the bottom-right rule by hand: the last query sees every key, the first ctx+1 keys
        s = (qk[0, :1].double() @ kc[:ctx + 1, 0].double().T)
        assert s.shape[-1] == ctx + 1
    B, ctx = 5, 13
    L = ctx + 1
    qk = _rand(B, H + KVH, D)
    kc, vc = _rand(B * L, KVH, D), _rand(B * L, KVH, D)
    out = torch.empty(B, H, D, dtype=torch.bfloat16)
    ops.attn_decode_op(qk[:, :H], kc, vc, out, B, L)
    for b in range(B):
        kb, vb = kc[b * L:(b + 1) * L], vc[b * L:(b + 1) * L]
        ref = ab.Sdpa.reference(qk[b:b + 1, :H].unsqueeze(2), kb.unsqueeze(0).transpose(1, 2),
                                vb.unsqueeze(0).transpose(1, 2))[0, :, 0]
        rel = float((out[b].double() - ref).norm() / ref.norm())
        assert rel < 2e-2, (b, rel)


def test_sdpa_check_cpu():
    """Every backend is checked per kind; on CPU flash and math compute attention, cuDNN and
    memory-efficient cannot (the reason is recorded, nothing falls back silently)."""
    s = ab.Sdpa(CPU)
    rs = shapes.RankShape.of("tiny", 1)
    passing = s.check(rs.H, rs.KVH, rs.D)
    for kind in ab.KINDS:
        assert passing[kind] == ["flash", "math"], (kind, passing)
        for b in ("flash", "math"):
            assert 0 <= s.checks[b][kind] < 2e-2
        for b in ("cudnn", "efficient"):
            assert isinstance(s.checks[b][kind], str) and "RuntimeError" in s.checks[b][kind]
    forced = ab.Sdpa(CPU)
    assert forced.check(rs.H, rs.KVH, rs.D, "math")["decode"] == ["math"] and forced.mode == "forced math"
    try:
        ab.Sdpa(CPU).check(rs.H, rs.KVH, rs.D, "cudnn")
    except SystemExit as exc:
        assert "no SDPA backend passed" in str(exc)
    else:
        raise AssertionError("cudnn passed on CPU")


def test_only_and_switch_restore_flags():
    before = ab._flags()
    with ab.only("math"):
        assert ab._flags() == (False, False, True, False)
    assert ab._flags() == before
    with ab.BackendSwitch() as sw:
        sw.use("flash")
        assert ab._flags()[0] and not ab._flags()[2]
        sw.use(None)  # None leaves the current backend
        assert ab._flags()[0]
        sw.use("math")
        assert ab._flags() == (False, False, True, False)
    assert ab._flags() == before


def test_survey_stable_and_contenders():
    pts = [(1, 128), (1, 4096), (64, 128), (64, 4096)]
    # flash within 5% of cudnn everywhere -> stable flash? No: cudnn is fastest everywhere, flash
    # is 4% slower at one point and 30% at another -> cudnn is the only stable backend
    sv = ab.KindSurvey("decode", pts, {"flash": [1.0, 2.0, 1.04, 13.0], "cudnn": [1.0, 2.0, 1.0, 10.0]})
    assert sv.stable == "cudnn" and sv.contenders(7, 999) == ["cudnn"]
    # a crossover: flash wins small batches, cudnn large ones
    sv = ab.KindSurvey("decode", pts, {"flash": [1.0, 2.0, 3.0, 13.0], "cudnn": [1.5, 3.0, 2.0, 8.0]})
    assert sv.stable is None
    assert sv.winners_at_survey() == {"flash": 2, "cudnn": 2}
    assert set(sv.contenders(8, 1000)) == {"flash", "cudnn"}  # the four corners disagree
    sv = ab.KindSurvey("decode", pts + [(4, 128), (4, 4096), (16, 128), (16, 4096)],
                       {"flash": [1.0, 2.0, 3.0, 13.0, 1.0, 2.0, 1.1, 2.2],
                        "cudnn": [1.5, 3.0, 2.0, 8.0, 1.5, 3.0, 1.5, 3.0]})
    assert sv.contenders(1, 128) == ["flash"]       # only flash within 10% at the nearest points
    assert sv.contenders(64, 4096) == ["cudnn"] or "cudnn" in sv.contenders(64, 4096)
    # a backend with no time at a point (failed / skipped) is never a contender there
    sv = ab.KindSurvey("prefill_causal", [(16, 0), (1024, 0)], {"flash": [1.0, 5.0], "math": [None, None]})
    assert sv.stable == "flash" and sv.to_meta()["ms"]["math"] == [None, None]


def test_chooser_round_trip_and_nearest_point():
    winners = {"decode": {(1, 128): "flash", (1, 4096): "flash", (64, 128): "cudnn", (64, 4096): "cudnn"},
               "prefill_causal": {(16, 0): "cudnn", (4096, 0): "cudnn"}}
    ch = ab.BackendChooser.from_winners(winners, {"prefill_context": "flash"})
    meta = {"sdpa": {"choice": ch.to_meta()}}
    back = ab.BackendChooser.from_meta(meta)
    for c in (ch, back):
        assert c.pick("decode", 2, 100) == "flash" and c.pick("decode", 48, 3000) == "cudnn"
        assert c.pick("prefill_causal", 777, 0) == "cudnn"
        assert c.pick("prefill_context", 100, 5000) == "flash"  # fallback, per op
    assert ch.per_kind["decode"]["rule"] == "per point" and ch.per_kind["decode"]["counts"] == {"cudnn": 2, "flash": 2}
    old = ab.BackendChooser.from_meta({"sdpa_backend": "flash"})  # packs made before selection
    assert all(old.pick(k, 8, 8) == "flash" for k in ab.KINDS)
    assert ab.BackendChooser.from_meta({"sdpa_backend": "auto: ..."}) is None


def test_forward_with_chooser_runs_each_call_on_its_backend():
    """A mixed batch gives the same logits whichever backend each call uses (both pass the check),
    and the flags are restored after the forward."""
    torch.manual_seed(0)
    rs = shapes.RankShape.of("tiny", 1)
    model = fw.Model(rs, CPU, share_layers=True)
    comp = grids.Composition(1, 6, 9, 3, 11)
    flags = ab._flags()
    outs = []
    for dec, pre in (("flash", "math"), ("math", "flash")):
        ch = ab.BackendChooser({"decode": {"rule": "per op", "backend": dec},
                                "prefill_context": {"rule": "per op", "backend": pre}})
        b = fw.Batch(comp, rs, CPU, chooser=ch)
        assert (b.decode_backend, b.prefill_backend) == (dec, pre)
        with torch.inference_mode():
            outs.append(fw.forward(model, b).float())
        assert ab._flags() == flags
    assert torch.allclose(outs[0], outs[1], rtol=3e-2, atol=3e-2)


def test_rope_rotates_pairs():
    H, KVH, D, T = 2, 1, 8, 3
    qkv = _rand(T, (H + 2 * KVH) * D)
    cs = ops.make_cos_sin(16, D, CPU, torch.bfloat16)
    pos = torch.tensor([0, 3, 7])
    out = ops.rope_op(qkv, pos, cs, H, KVH, D)
    assert out.shape == (T, H + KVH, D)
    # position 0 is the identity; rotation keeps each (x1, x2) pair's norm
    assert torch.allclose(out[0].float(), qkv[0, :(H + KVH) * D].view(H + KVH, D).float(), atol=1e-2)
    x = qkv[:, :(H + KVH) * D].view(T, H + KVH, D).float()
    n_in = x[..., :D // 2] ** 2 + x[..., D // 2:] ** 2
    n_out = out.float()[..., :D // 2] ** 2 + out.float()[..., D // 2:] ** 2
    assert torch.allclose(n_in, n_out, rtol=3e-2, atol=3e-2)


def test_batch_layout_and_mixed_forward_equals_separate():
    """A mixed batch gives each sequence the same logits as running it alone on the same cache:
    checks slots, positions, KV views and sampled rows together."""
    torch.manual_seed(0)
    rs = shapes.RankShape.of("tiny", 1)
    model = fw.Model(rs, CPU, share_layers=False)
    comp = grids.Composition(2, 5, 7, 3, 9)
    b = fw.Batch(comp, rs, CPU)
    assert b.T == 13 and b.slots.tolist()[:5] == [7, 8, 9, 10, 11]
    assert b.slots.tolist()[5:10] == [19, 20, 21, 22, 23]
    assert b.slots.tolist()[10:] == [24 + 9, 24 + 10 + 9, 24 + 20 + 9]
    assert b.sample_idx.tolist() == [4, 9, 10, 11, 12]
    k0, v0 = b.k_cache.clone(), b.v_cache.clone()
    with torch.inference_mode():
        mixed = fw.forward(model, b).float()
        # prefill sequence 1 alone
        b1 = fw.Batch(grids.Composition(1, 5, 7, 0, 0), rs, CPU)
        b1.ids.copy_(b.ids[5:10])
        b1.k_cache.copy_(k0[12:24])
        b1.v_cache.copy_(v0[12:24])
        alone = fw.forward(model, b1).float()
        assert torch.allclose(mixed[1], alone[0], rtol=3e-2, atol=3e-2)
        # decode sequence 2 alone
        b2 = fw.Batch(grids.Composition(0, 0, 0, 1, 9), rs, CPU)
        b2.ids.copy_(b.ids[12:13])
        b2.k_cache.copy_(k0[24 + 20:24 + 30])
        b2.v_cache.copy_(v0[24 + 20:24 + 30])
        alone = fw.forward(model, b2).float()
        assert torch.allclose(mixed[4], alone[0], rtol=3e-2, atol=3e-2)


def test_timer_never_returns_nonpositive():
    assert timing.Timer._summarize([0.0, -1.0, float("nan")], "x") is None
    m = timing.Timer._summarize([1.0, 2.0, 0.0, 3.0], "x")
    assert m.median_ms == 2.0 and m.n == 3
    t = timing.Timer(CPU, common.Budget())
    calls = []
    m = t.measure([lambda: calls.append(1)], "noop")
    assert m is not None and m.median_ms > 0 and calls


def _check_pack_csv(path: Path):
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0].keys()) == list(writers.COLUMNS)
    for r in rows:
        t = float(r["time_ms"])
        assert math.isfinite(t) and t > 0
        assert r["std_ms"] == "" or float(r["std_ms"]) >= 0
        if r["op"] in ("attn_decode", "overhead_eager", "overhead_cuda_graph", "all_reduce", "send_recv"):
            assert int(r["batch"]) >= 1
        if r["op"] not in ("attn_decode", "overhead_eager", "overhead_cuda_graph", "all_reduce", "send_recv"):
            assert int(r["tokens"]) >= 1
    return rows


def test_cli_all_quick_on_cpu():
    """The whole pipeline (ops at TP 1 and 2, iterations, gloo collectives, merge) on a tiny shape."""
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, str(HERE / "profile_gpu.py"), "all", "--models", "tiny",
                            "--tps", "1,2", "--device", "cpu", "--quick", "--out", d],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        out = Path(d)
        rows1 = _check_pack_csv(out / "packs" / "cpu" / "tiny.csv")
        rows2 = _check_pack_csv(out / "packs" / "cpu" / "tiny-tp2.csv")
        ops1 = {r["op"] for r in rows1}
        for op in ("input_norm", "qkv_proj", "rope", "kv_write", "attn_prefill", "attn_decode", "o_proj",
                   "post_attn_norm", "gate_up_proj", "act", "down_proj", "residual_add", "embed",
                   "final_norm", "lm_head", "send_recv"):
            assert op in ops1, op
        assert "all_reduce" not in ops1
        assert any(r["op"] == "all_reduce" and r["batch"] == "2" for r in rows2)
        import yaml
        meta = yaml.safe_load((out / "packs" / "cpu" / "tiny-tp2.yaml").read_text())
        for key in ("gpu", "model", "tp", "source", "dtype", "shape", "origin", "date", "device",
                    "method", "command", "notes", "sdpa_backend", "sdpa"):
            assert key in meta, key
        # the choice per kind, each backend's survey times, and the forwards made the same choice
        assert set(meta["sdpa"]["choice"]) == set(ab.KINDS)
        for kind in ab.KINDS:
            sv = meta["sdpa"]["survey"][kind]
            assert set(sv["ms"]) == {"flash", "math"} and len(sv["points"]) >= 2
        vmeta = yaml.safe_load((out / "validation" / "cpu" / "tiny.yaml").read_text())
        assert vmeta["sdpa_choice"] and vmeta["sdpa_per_composition"]
        assert meta["tp"] == 2 and meta["rank_shape"]["num_heads"] == 2
        with (out / "validation" / "cpu" / "tiny.csv").open() as fh:
            vrows = list(csv.DictReader(fh))
        assert list(vrows[0].keys()) == list(writers.VAL_COLUMNS)
        assert all(float(v["measured_ms"]) > 0 for v in vrows)


def test_shared_measurements_only_between_equal_shapes():
    rs8, rsl = shapes.RankShape.of("qwen3-8b", 1), shapes.RankShape.of("llama-3-8b", 1)
    t = timing.Timer(CPU, common.Budget())
    s = ab.Sdpa(CPU)
    b8 = opbench.OpBench(rs8, CPU, t, s, True, kv_cap_bytes=1, rot_bytes=1)
    bl = opbench.OpBench(rsl, CPU, t, s, True, kv_cap_bytes=1, rot_bytes=1)
    for op in ("attn_decode", "attn_prefill", "qkv_proj", "o_proj", "input_norm", "kv_write"):
        assert b8.sig(op) == bl.sig(op), op
    for op in ("gate_up_proj", "down_proj", "act", "lm_head", "embed", "rope"):
        assert b8.sig(op) != bl.sig(op), op  # intermediate / vocab / rope table differ
    assert b8.sig("input_norm") == b8.sig("post_attn_norm") == b8.sig("final_norm")
    assert opbench.OpBench(shapes.RankShape.of("qwen3-8b", 2), CPU, t, s, True, 1, 1).sig("attn_decode") \
        != b8.sig("attn_decode")


def test_ops_multi_pack_overhead_only_and_combine():
    """`ops` with two packs in one process shares measurements; `--stages overhead --tables-from`
    re-measures only overheads; `combine` keeps rows from older packs and takes the median overhead."""
    with tempfile.TemporaryDirectory() as d:
        me = [sys.executable, str(HERE / "profile_gpu.py")]
        a, o2, old = Path(d) / "a", Path(d) / "o2", Path(d) / "old"
        r = subprocess.run(me + ["ops", "--model", "tiny", "--tp", "1,2", "--device", "cpu", "--quick",
                                 "--stages", "token ops,attn_decode,overhead", "--out", str(a)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        import yaml
        meta = yaml.safe_load((a / "packs" / "cpu" / "tiny-tp2.yaml").read_text())
        assert meta["grid"]["name"] == "quick" and "attn_prefill (not asked for)" in meta["stages_skipped"]
        assert not meta["shared_measurements"].startswith("0 of")  # norms / embed shared with TP1
        r = subprocess.run(me + ["ops", "--model", "tiny", "--tp", "1,2", "--device", "cpu", "--quick",
                                 "--stages", "overhead", "--tables-from", str(a / "packs" / "cpu"),
                                 "--out", str(o2)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        (old).mkdir()
        writers.write_rows(old / "tiny.csv", [("attn_prefill", 16, 0, 0, 0, 1.5, 0.1)])
        writers.write_yaml(old / "tiny.yaml", {"date": "2000-01-01", "command": "x"})
        writers.write_rows(old / "tiny-tp2.csv", [("attn_prefill", 16, 0, 0, 0, 0.9, 0.1),
                                             ("all_reduce", 4096, 2, 0, 4096, 0.01, 0.0)])
        writers.write_yaml(old / "tiny-tp2.yaml", {"date": "2000-01-01", "command": "x"})
        assert cli.main(["combine", "--out", str(a), "--keep-from", str(old), "--keep-ops",
                        "attn_prefill,all_reduce", "--overheads-from", str(o2)]) == 0
        rows = _check_pack_csv(a / "packs" / "cpu" / "tiny-tp2.csv")
        assert [r["time_ms"] for r in rows if r["op"] == "attn_prefill"] == ["0.9"]
        assert any(r["op"] == "all_reduce" for r in rows)
        meta = yaml.safe_load((a / "packs" / "cpu" / "tiny-tp2.yaml").read_text())
        assert meta["kept_rows"]["rows"] == 2 and meta["overhead"]["combined"]["processes"] == 2
        for key, v in meta["overhead"]["combined"]["points"].items():
            assert len(v["diff_ms_per_process"]) == 2
            med = sorted(v["diff_ms_per_process"])
            assert abs(v["median_ms"] - (med[0] + med[1]) / 2) < 1e-4


def test_then_chain_every_and_combine_replace():
    """`--then` runs several modes in one process; `iterations --every k` measures a stratified
    subset; `combine --replace-from` takes attn_prefill from newer packs (or a pack with the same
    attention shape) and overheads keep every process already combined."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        base, new, o2 = d / "base", d / "new", d / "o2"
        assert cli.main(["ops", "--model", "tiny", "--tp", "1", "--device", "cpu", "--quick",
                        "--out", str(base), "--then", "iterations", "--model", "tiny", "--every", "2",
                        "--backends-from", str(base / "packs" / "cpu"), "--eager-every", "1",
                        "--device", "cpu", "--quick", "--out", str(d / "n")]) == 0
        comps = grids.validation_compositions("tiny", quick=True)
        with (d / "n" / "validation" / "cpu" / "tiny.csv").open() as fh:
            assert len(list(csv.DictReader(fh))) == len(comps[::2])
        import yaml
        assert "every 2-th" in yaml.safe_load((d / "n" / "validation" / "cpu" / "tiny.yaml").read_text())["subset"]
        # a newer prefill measurement for another model with the same attention shape only
        writers.write_rows(new / "other.csv", [("attn_prefill", 16, 0, 0, 0, 2.5, 0.1),
                                          ("attn_prefill", 1024, 0, 1500, 0, 9.0, 0.1)])
        rs = shapes.RankShape.of("tiny", 1)
        writers.write_yaml(new / "other.yaml", {"date": "2000-01-02", "command": "y", "model": "other",
                                           "rank_shape": rs.as_dict(),
                                           "grid": {"prefill_chunk": "2 points", "prefill_context": "x"},
                                           "timing_methods": {"attn_prefill": ["cuda-graph"]}})
        packs = base / "packs" / "cpu"
        r = subprocess.run([sys.executable, str(HERE / "profile_gpu.py"), "ops", "--model", "tiny",
                            "--tp", "1", "--device", "cpu", "--quick", "--stages", "overhead",
                            "--tables-from", str(packs), "--calib-batches", "8", "--out", str(o2)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        for k in range(2):  # combining twice: the second keeps the first one's processes
            assert cli.main(["combine", "--out", str(base), "--replace-from", str(new),
                            "--replace-ops", "attn_prefill", "--overheads-from", str(o2)]) == 0
        rows = _check_pack_csv(packs / "tiny.csv")
        assert [r["time_ms"] for r in rows if r["op"] == "attn_prefill"] == ["2.5"]  # 1024+1500 > 2048
        meta = yaml.safe_load((packs / "tiny.yaml").read_text())
        note = meta["replaced_rows"]["per_op"]["attn_prefill"]
        assert note["shared_from_equal_shape"] and note["rows"] == 1
        assert meta["grid"]["prefill_chunk"] == "2 points"
        pts = meta["overhead"]["combined"]["points"]
        for key, v in pts.items():
            n = len(v["diff_ms_per_process"])
            assert n == (3 if "batch=8" in key else 1), (key, v)


def test_iterations_long_set_goes_to_its_own_folder():
    """`iterations --compositions long`: the long-context set (grids.LONG_*, QUICK_LONG here), written to
    validation_long/<gpu>/ so the standard validation set (read by glob) is not mixed with it."""
    from profiler import grids
    full = grids.long_compositions("llama-3.1-8b", quick=False)
    qwen = grids.long_compositions("qwen3-8b", quick=False)  # 32K context: the 128K points drop
    assert len(qwen) < len(full) and all(c.prefill_ctx + c.prefill_len <= 32768 for c in qwen)
    dense = {"tokens": 16384, "chunk": 8192, "ctx": 24576, "decode": 32768}
    assert all(c.tokens > dense["tokens"] or c.prefill_len > dense["chunk"] or c.prefill_ctx > dense["ctx"]
               or c.decode_ctx > dense["decode"] for c in full)  # every batch beyond the dense grid
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, str(HERE / "profile_gpu.py"), "iterations", "--model", "tiny",
                            "--compositions", "long", "--device", "cpu", "--quick", "--out", d],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        path = Path(d) / "validation_long" / "cpu" / "tiny.csv"
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == len(grids.QUICK_LONG) and not (Path(d) / "validation").exists()
        r = subprocess.run([sys.executable, str(HERE / "profile_gpu.py"), "iterations", "--model", "tiny",
                            "--compositions", "long", "--tp", "2", "--device", "cpu", "--quick", "--out", d],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 2 and "TP 1 only" in r.stdout + r.stderr


def test_iterations_tp2_on_gloo():
    """`iterations --tp 2`: one process per rank, all-reduces after o_proj and down_proj, ranks in
    lockstep; rows carry tp = 2 and go to <model>-tp2.csv."""
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, str(HERE / "profile_gpu.py"), "iterations", "--model", "tiny",
                            "--tp", "2", "--device", "cpu", "--quick", "--max-compositions", "2",
                            "--out", d], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        path = Path(d) / "validation" / "cpu" / "tiny-tp2.csv"
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == 2 and all(v["tp"] == "2" and float(v["measured_ms"]) > 0 for v in rows)
        import yaml
        meta = yaml.safe_load(path.with_suffix(".yaml").read_text())
        assert meta["tp"] == 2 and meta["rank_shape"]["num_heads"] == 2 and "all_reduce" in meta["method"]
