"""Step-time kernels (servesim/perf/kernels.py): bit for bit what the numpy models predicted before
they became kernels, compiled == pure Python, decode runs == single iterations, and numpy's own
summation and interpolation reproduced exactly."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim import jit
from servesim.perf import kernels as K
from servesim.perf.packmodel import load_pack_model

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _maker():
    spec = importlib.util.spec_from_file_location("make_step_times", FIXTURES / "make_step_times.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MAKER = _maker()


@pytest.fixture(scope="module")
def fx():
    data = dict(np.load(FIXTURES / "step_times.npz"))
    cfgs = json.loads(str(data["configs"]))
    off = data["comp_off"]
    comps = [(data["comp_new"][a:b].astype(np.int64), data["comp_ctx"][a:b].astype(np.int64))
             for a, b in zip(off[:-1], off[1:])]
    run_off = np.concatenate([[0], np.cumsum(data["run_steps"])])
    return {"cfgs": cfgs, "models": [MAKER.build(c) for c in cfgs], "comps": comps, "data": data,
            "run_off": run_off}


def _mismatches(got: np.ndarray, want: np.ndarray) -> str:
    bad = np.flatnonzero(got.view(np.int64) != want.view(np.int64))
    return f"{len(bad)} of {len(want)} differ, first at {bad[:1]}" if len(bad) else ""


def _check_predictions(fx, predict) -> None:
    d = fx["data"]
    got = np.array([predict(fx["models"][m], *fx["comps"][c]) for m, c in zip(d["eval_model"], d["eval_comp"])])
    assert not _mismatches(got, d["eval_out"]), _mismatches(got, d["eval_out"])


def _check_runs(fx, run) -> None:
    d = fx["data"]
    got = np.concatenate([run(fx["models"][m], int(n), int(s), int(k)) for m, n, s, k in
                          zip(d["run_model"], d["run_seqs"], d["run_ctx_sum"], d["run_steps"])])
    assert not _mismatches(got, d["run_out"]), _mismatches(got, d["run_out"])


def test_fixture_covers_the_cases(fx):
    kinds = {c["kind"] for c in fx["cfgs"]}
    assert kinds == {"constant", "roofline", "pack"}
    packs = {(c["gpu"], c["model"], c["tp"], c["pp"], c["cuda_graph"], c["graph_scope"])
             for c in fx["cfgs"] if c["kind"] == "pack"}
    from servesim.perf.pack import available_packs

    assert len(packs) == len(available_packs()) * 2 * 3
    d = fx["data"]
    assert len(d["eval_out"]) > 10_000 and len(d["run_out"]) > 5_000
    tokens = np.array([n.sum() for n, _ in fx["comps"]])
    rows = np.array([len(n) for n, _ in fx["comps"]])
    longest = np.array([n.max() if len(n) else 0 for n, _ in fx["comps"]])
    assert tokens.max() > 32768 and rows.max() > 32768 and longest.max() > 2**20  # beyond every table
    assert (rows == 0).any() and ((rows > 129) & (longest > 1)).any()  # empty; pairwise-sum blocks


# --- (1) bit for bit what the numpy models predicted ----------------------------------------

def test_predict_reproduces_the_numpy_models(fx):
    _check_predictions(fx, lambda m, new, ctx: m.predict(new, ctx))


def test_predict_decode_run_reproduces_the_numpy_models(fx):
    _check_runs(fx, lambda m, n, s, k: m.predict_decode_run(n, s, k))


def test_tables_extended_to_engine_bounds_change_nothing(fx):
    """tables(max_tokens, max_seqs) pre-evaluates the extrapolation: lookups == computed beyond."""
    tabs = {id(m): m.tables(70_000, 40_000) for m in fx["models"]}
    some_pack = next(m for m in fx["models"] if m.name == "pack")
    assert len(tabs[id(some_pack)].pk_lin) == 70_001 and len(tabs[id(some_pack)].pk_cpu) == 40_001

    def predict(m, new, ctx):
        return K.iteration_seconds(tabs[id(m)], new, ctx, len(new))

    def run(m, n, s, k):
        out = np.empty(k)
        K.decode_seconds(tabs[id(m)], n, s, k, out)
        return out

    _check_predictions(fx, predict)
    _check_runs(fx, run)


def test_engine_scratch_longer_than_the_batch(fx):
    """The engine passes scratch arrays and a length: rows past ``nb`` must not count."""
    d = fx["data"]
    rng = np.random.default_rng(3)
    for m, c, want in list(zip(d["eval_model"], d["eval_comp"], d["eval_out"]))[::7]:
        new, ctx = fx["comps"][c]
        pad = rng.integers(0, 5000, 9)
        got = K.iteration_seconds(fx["models"][m]._tables(), np.concatenate([new, pad]),
                                  np.concatenate([ctx, pad]), len(new))
        assert got == want


# --- (2) compiled == the same source run as Python ------------------------------------------

def test_pure_python_equals_compiled(fx):
    pure_iter = jit.pure(K.iteration_seconds)
    pure_dec = jit.pure(K.decode_seconds)
    assert pure_iter.__globals__["np_sum"] is not K.np_sum  # callees rebuilt as Python too

    def predict(m, new, ctx):
        return float(pure_iter(m._tables(), new, ctx, len(new)))

    def run(m, n, s, k):
        out = np.empty(k)
        pure_dec(m._tables(), n, s, k, out)
        return out

    _check_predictions(fx, predict)
    _check_runs(fx, run)


# --- (3) a decode run is a sequence of single decode iterations -------------------------------

def _models():
    from servesim.hardware import GPUS
    from servesim.models import MODELS
    from servesim.perf.constant import ConstantStepModel
    from servesim.perf.roofline import RooflineStepModel

    out = {"constant": ConstantStepModel(0.004),
           "roofline-tp2-pp2": RooflineStepModel(GPUS["h200"], MODELS["qwen3-8b"], 2, 2)}
    for gpu, model, tp in (("a100-80g", "llama-3-8b", 2), ("h200", "qwen3-14b", 1), ("h200", "qwen3-4b", 2)):
        for graph in (False, True):
            out[f"{gpu}-{model}-tp{tp}-graph{graph}"] = load_pack_model(gpu, model, tp=tp, pp=2 if graph else 1,
                                                                        cuda_graph=graph)
    return out


MODELS_3 = _models()


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(MODELS_3)), seqs=st.one_of(st.integers(0, 700), st.integers(16_000, 34_000)),
       ctx_max=st.sampled_from([0, 100, 100_000]), steps=st.integers(1, 50), data=st.data(),
       extended=st.booleans())
def test_decode_run_element_is_the_all_decode_iteration(name, seqs, ctx_max, steps, data, extended):
    m = MODELS_3[name]
    tab = m.tables(40_000, 40_000) if extended else m._tables()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    ctx = rng.integers(0, ctx_max + 1, seqs)
    out = np.full(steps + 3, -1.0)
    K.decode_seconds(tab, seqs, int(ctx.sum()), steps, out)
    assert (out[steps:] == -1.0).all()  # nothing written past ``steps``
    j = data.draw(st.integers(0, steps - 1))
    if seqs == 0:
        assert out[j] == (m.seconds if name == "constant" else out[j])
        return
    # every sequence grew by one token per step; any split of the same KV total is the same time
    assert out[j] == K.iteration_seconds(tab, np.ones(seqs, np.int64), ctx + j, seqs)
    total = int(ctx.sum()) + j * seqs
    cuts = np.sort(rng.integers(0, total + 1, size=seqs - 1))
    split = np.diff(np.concatenate([[0], cuts, [total]]))
    assert out[j] == K.iteration_seconds(tab, np.ones(seqs, np.int64), split, seqs)


# --- numpy's arithmetic, reproduced -----------------------------------------------------------

@pytest.mark.parametrize("impl", ["compiled", "pure"])
def test_np_sum_is_numpy_sum_bit_for_bit(impl):
    f = K.np_sum if impl == "compiled" else jit.pure(K.np_sum)
    rng = np.random.default_rng(11)
    lengths = list(range(0, 301)) + [511, 1000, 1029, 4096, 10_000]
    for n in lengths:
        for scale in (rng.random(n), rng.random(n) * 10.0 ** rng.integers(-8, 8, n),
                      rng.standard_normal(n) * 1e6):
            a = np.concatenate([scale, rng.random(5)])  # longer than n: only a[:n] counts
            assert f(a, n) == np.sum(a[:n]), n


def test_np_sum_order_matters():
    """The check above can fail: an in-order sum, or numpy's tree started from the first element,
    differ from numpy's sum on many arrays that np_sum gets right."""
    rng = np.random.default_rng(5)
    in_order = first_based = 0
    for _ in range(100):
        a = rng.random(200) * 10.0 ** rng.integers(-8, 8, 200)
        s = 0.0
        for v in a:
            s += v
        in_order += s != np.sum(a)
        first_based += a[0] + K.np_sum(a[1:], 199) != np.sum(a)
        assert K.np_sum(a, 200) == np.sum(a)
    assert in_order > 10 and first_based > 10


@settings(max_examples=300, deadline=None)
@given(xs=st.lists(st.floats(0, 1e6), min_size=1, max_size=30, unique=True),
       ys=st.lists(st.floats(0, 1e3), min_size=30, max_size=30),
       qs=st.lists(st.floats(-10, 2e6), min_size=1, max_size=20))
def test_interp_at_is_np_interp(xs, ys, qs):
    x = np.sort(np.array(xs))
    y = np.array(ys[: len(x)])
    q = np.array(qs + xs[:3])  # grid points exactly, too
    want = np.interp(q, x, y)
    got = np.array([K.interp_at(v, x, y) for v in q])
    np.testing.assert_array_equal(got, want)


def test_curve_at_is_the_pack_curves():
    """Every linear curve the kernels evaluate (collectives by bytes, CPU floor) equals Curve."""
    rng = np.random.default_rng(2)
    for gpu, model, tp in (("a100-80g", "llama-3-8b", 2), ("h200", "llama-3-8b", 2)):
        m = load_pack_model(gpu, model, tp=tp, pp=2)
        for op in ("all_reduce", "send_recv", "cpu_floor"):
            c = m.curves[op]
            q = np.concatenate([c.x, rng.uniform(0, c.x[-1] * 3, 200), [0.0, c.x[-1] * 1e3]])
            xy = np.vstack([c.x, c.y])
            got = np.array([K.curve_at(v, xy, c.slope) for v in q])
            np.testing.assert_array_equal(got, c(q))


@pytest.mark.parametrize("gpu,model", [("a100-80g", "llama-3-8b"), ("h200", "qwen3-8b")])
@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 3_000_000), st.integers(0, 150_000)), min_size=1, max_size=10))
def test_prefill_attention_kernel_equals_numpy_reference(gpu, model, rows):
    """Long-chunk splitting (any chunk of the call beyond the last row splits all) included."""
    pa = load_pack_model(gpu, model).prefill_attn
    t = np.array([r[0] for r in rows], dtype=float)
    c = np.array([r[1] for r in rows], dtype=float)
    np.testing.assert_array_equal(pa(t, c), pa.call_reference(t, c))


def test_counts_beyond_the_tables_follow_the_numpy_curves(tmp_path):
    """A pack whose token grid (256) ends before its lm_head grid (4096) and its CPU-floor
    batches (512), log-log or not, at TP2 x PP2: beyond the tables the kernels continue exactly
    as the numpy construction code defines each term."""
    from servesim.perf.pack import LAYER_TOKEN_OPS, read_pack, write_pack
    from servesim.perf.packmodel import PackStepModel
    from test_pack import SHAPE, synthetic_meta, synthetic_rows

    rows = [r for r in synthetic_rows() if not (r[0] in LAYER_TOKEN_OPS + ("embed",) and r[1] > 256)]
    rows.append(("overhead_eager", 0, 512, 0, 0, 1.6, 0.0))
    path = tmp_path / "h200" / "llama-3-8b.csv"
    write_pack(rows, synthetic_meta(), path)
    for loglog in (False, True):
        m = PackStepModel(read_pack(path), SHAPE, tp=2, pp=2, cuda_graph=True, loglog=loglog)
        assert m.n_table == 256 and m.curves["lm_head"].x[-1] == 4096
        tab = m._tables()
        assert len(tab.pk_seq) == 4097 and len(tab.pk_lin) == 257
        for t in (257, 300, 1000, 4096, 5000, 10**6):
            raw = m._lin_ms(np.array([256.0, float(t)]))
            assert K.pack_lin_ms(tab, t) == m._lin[256] + (raw[1] - raw[0]) == m._lin_at(t)
        for s in (1, 200, 256, 257, 1000, 4096, 5000, 100_000):
            assert K.pack_seq_ms(tab, s) == m._per_seq_ms(np.array([float(s)]))[0]
            assert K.pack_cpu_ms(tab, s) == float(m.curves["cpu_floor"](float(s))) == m._cpu_at(s)
            want = m._dec_const[s] if s <= 256 else K.pack_lin_ms(tab, s) + K.pack_seq_ms(tab, s)
            assert K.pack_dec_const_ms(tab, s) == want
        # the CPU floor's 512-batch row needed lin beyond the table while the model was being built
        assert m.curves["cpu_floor"].x[-1] == 512


# --- tables: one type for every model, bad bounds named ------------------------------------------

def test_every_model_has_the_same_table_type():
    import numba

    types = {str(numba.typeof(m.tables(8192, 256))) for m in MODELS_3.values()}
    types.add(str(numba.typeof(MODELS_3["h200-qwen3-14b-tp1-graphFalse"].tables(50_000, 20_000))))
    assert len(types) == 1


@pytest.mark.parametrize("bounds,needle", [((0, 8), "max_tokens"), ((8, -1), "max_seqs"),
                                           ((8.5, 8), "max_tokens"), ((8, True), "max_seqs")])
def test_bad_bounds_name_the_field(bounds, needle):
    for m in MODELS_3.values():
        with pytest.raises(ValueError, match=f"^{needle} must be an integer >= 1, got"):
            m.tables(*bounds)


def test_step_tables_rejects_unknown_kinds_and_fields():
    with pytest.raises(ValueError, match="kind must be"):
        K.step_tables(7)
    with pytest.raises(ValueError, match="unknown step-table field 'pk_nope'"):
        K.step_tables(K.PACK, pk_nope=np.zeros(3))
    with pytest.raises(ValueError, match="unknown PackConsts field 'nope'"):
        K.step_tables(K.PACK, pk={"nope": 1})
    with pytest.raises(ValueError, match="pk_dec_table must have 2 dimension"):
        K.step_tables(K.PACK, pk_dec_table=np.zeros(3))


def test_predict_rejects_mismatched_compositions():
    m = MODELS_3["roofline-tp2-pp2"]
    with pytest.raises(ValueError, match="equal length"):
        m.predict(np.ones(3, np.int64), np.ones(2, np.int64))


def test_loading_a_pack_does_not_load_the_kernels():
    """The CLI's check path loads packs: the step-time kernels (and their compiled code) load on
    the first prediction, not before."""
    code = ("import sys; from servesim.perf.packmodel import load_pack_model; "
            "m = load_pack_model('h200', 'qwen3-14b', tp=2, pp=2, cuda_graph=True); "
            "assert 'servesim.perf.kernels' not in sys.modules, 'kernels imported'; "
            "m.predict([1], [5]); assert 'servesim.perf.kernels' in sys.modules; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
