"""The ahead-of-time engine (servesim/aot.py): a process that runs it never imports numba, and it
gives the JIT-compiled engine's results bit for bit, for every built-in policy and allocator."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from servesim import aot
from tests.conftest import BASE, merge

LENGTHS = {"prompt": {"dist": "uniform", "min": 8, "max": 900}, "output": {"dist": "uniform", "min": 1, "max": 120}}
ROOF = {"step_time": {"model": "roofline"}}


def _cases() -> dict[str, dict]:
    def case(**patch):
        return merge(merge(BASE, {"stop": {"requests": 300}, "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                                                                          **LENGTHS}, **ROOF}), patch)

    paged = {"engine": {"num_gpu_blocks_override": 400, "max_num_seqs": 32, "max_num_batched_tokens": 2048,
                        "max_model_len": 2048}}
    return {
        "vllm": case(**paged),
        "vllm-chunked": case(engine={**paged["engine"], "enable_chunked_prefill": True, "max_num_batched_tokens": 512}),
        "sglang": case(engine={**paged["engine"], "scheduler": "chunked", "chunked_prefill_size": 256}),
        "halo": case(engine={**paged["engine"], "scheduler": "priority"}),
        "spark": case(engine={**paged["engine"], "scheduler": "static-fifo", "max_num_seqs": 16}),
        "static-kv": case(engine={**paged["engine"], "kv_allocator": "static"}),
        "elastic-kv": case(engine={**paged["engine"], "kv_allocator": "elastic"}),
        "closed-loop": case(**paged, workload={"arrival": {"process": "closed", "clients": 12, "think_s": 0.2}},
                            stop={"requests": 200, "warmup_requests": 20}),
        "duration": case(**paged, stop={"requests": None, "duration_s": 4.0}),
        "prefix-cache (Python engine)": case(engine={**paged["engine"], "enable_prefix_caching": True}),
        "fleet (JIT or Python)": case(**paged, hardware={"gpu": "a100-80g", "replicas": 2}),
    }


CHILD = textwrap.dedent("""
    import json, sys, pickle
    from servesim import aot
    assert aot.request_plain()
    from servesim import scenario_from_dict
    from servesim.simulate import build, run_built
    out = {}
    for name, raw in json.loads(sys.stdin.read()).items():
        b = build(scenario_from_dict(raw, name))
        rep = b.replica if b.fleet is None else None
        res = run_built(b)
        out[name] = (None if rep is None else (rep.path, rep.ahead_of_time, rep.why), res.requests, res.summary)
    out["numba imported"] = "numba" in sys.modules
    sys.stdout.buffer.write(pickle.dumps(out))
""")


@pytest.fixture(scope="module")
def aot_built():
    if not aot.available():
        from servesim.warmup import build_ahead_of_time

        build_ahead_of_time()  # (numba's cache is warm in a test session: seconds)
    if not aot.available():
        pytest.skip(aot.status())


def test_runs_without_numba_give_the_jit_engines_results(aot_built):
    """Every built-in policy and allocator takes the ahead-of-time module in a process with no
    numba (so one build serves them all) and matches the JIT engine per request, bit for bit;
    runs that need the Python engine (a prefix cache, a fleet) run it there, still matching."""
    import pickle

    from servesim import scenario_from_dict, simulate

    cases = _cases()
    proc = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(cases).encode(), capture_output=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    got = pickle.loads(proc.stdout)
    assert got.pop("numba imported") is False
    for name, raw in cases.items():
        how, requests, summary = got[name]
        mine = simulate(scenario_from_dict(raw, name))
        if how is not None:
            path, ahead, why = how
            if "Python engine" in name:
                assert path == "python" and not ahead, name
            else:
                assert (path, ahead, why) == ("compiled", True, ""), (name, why)
        pd.testing.assert_frame_equal(requests, mine.requests, check_exact=True, obj=name)
        summary.pop("wall_s"), mine.summary.pop("wall_s")
        assert json.dumps(summary, sort_keys=True, default=str) == json.dumps(mine.summary, sort_keys=True,
                                                                             default=str), name


def test_arguments_of_another_layout_are_refused(aot_built):
    """The module cannot check what it is given: a run whose arrays differ from those it was built
    for (here one strided, one of another dtype) does not call it."""
    from servesim.simulate import build
    from tests.conftest import scenario

    r = build(scenario(), cold="compile").replica
    fn, why = aot.entry(r.cfg, r.st, r.kv, r.tab)
    assert fn is not None and why == ""
    strided = r.st._replace(b_ids=np.zeros(2 * len(r.st.b_ids), dtype=np.int64)[::2])
    retyped = r.st._replace(t_finish=r.st.t_finish.astype(np.float32))
    for st in (strided, retyped):
        fn, why = aot.entry(r.cfg, st, r.kv, r.tab)
        assert fn is None and "differ" in why


def test_layout_names_what_numba_types_by():
    a = np.zeros(4)
    assert aot.layout(a) != aot.layout(a.astype(np.int64))
    assert aot.layout(a) != aot.layout(np.zeros(8)[::2])
    ro = a.copy()
    ro.flags.writeable = False
    assert aot.layout(a) != aot.layout(ro)
    assert aot.layout((1, 2.0, True)) == "(int,float,bool)"
    with pytest.raises(TypeError, match="layout"):
        aot.layout([1, 2])


def test_cli_runs_without_numba_when_the_module_is_built(aot_built, tmp_path):
    """``servesim run`` of one replica imports no numba and writes what the JIT engine writes;
    with ``-q`` it imports no rich either and prints the folder as a plain line."""
    from servesim.cli import main

    raw = _cases()["halo"]
    path = tmp_path / "s.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    probe = textwrap.dedent(f"""
        import sys
        from servesim.cli import main
        try:
            main(["run", {str(path)!r}, "--out", {str(tmp_path / "aot")!r}, "-q"])
        except SystemExit as e:
            assert not e.code, e.code
        print("numba" in sys.modules, "rich" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [str(tmp_path / "aot"), "False False"]
    with pytest.raises(SystemExit) as done:  # this process has numba: the JIT engine
        main(["run", str(path), "--out", str(tmp_path / "jit"), "-q"])
    assert done.value.code == 0
    a = pd.read_parquet(tmp_path / "aot" / "requests.parquet")
    b = pd.read_parquet(tmp_path / "jit" / "requests.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_a_damaged_module_or_record_is_refused_in_one_line(tmp_path, monkeypatch):
    """A truncated extension or a record without its layout: the run is told why, nothing raises."""
    from servesim import kernel_cache

    monkeypatch.setattr(kernel_cache, "cache_dir", lambda: str(tmp_path))
    so, meta = aot.paths()
    so.write_bytes(b"not an ELF file")
    meta.write_text(json.dumps({"format": aot.FORMAT, "layout": "()"}))
    mod, why = aot._import()
    assert mod is None and why.startswith("the ahead-of-time engine did not load (ImportError")
    meta.write_text(json.dumps({"format": aot.FORMAT}))
    mod, why = aot._import()
    assert mod is None and why.startswith("the ahead-of-time engine did not load (KeyError")
