"""servesim.jit: one source, compiled or pure."""

from __future__ import annotations

import pytest

from servesim import jit

SOURCE = '''
def inner(x):
    return x + 1

inner = kernel(inner)

def outer(x):
    return inner(x) * 2

outer = kernel(outer)
'''


def test_kernels_must_be_declared_in_listed_modules():
    def f(x):
        return x

    with pytest.raises(RuntimeError, match="KERNEL_MODULES"):
        jit.kernel(f)


def test_pure_rebuilds_callees_and_applies_overrides(monkeypatch):
    monkeypatch.setattr(jit, "KERNEL_MODULES", jit.KERNEL_MODULES + (__file__,))
    ns = {"kernel": jit.kernel, "__name__": __name__}
    exec(compile(SOURCE, __file__, "exec"), ns)  # a module of two kernels, calling by global name
    inner, outer = ns["inner"], ns["outer"]
    assert isinstance(outer, jit.Dispatcher)
    p = jit.pure(outer)
    assert not isinstance(p, jit.Dispatcher)
    callee = p.__globals__["inner"]
    assert callee is not inner and not isinstance(callee, jit.Dispatcher)  # rebuilt as Python too
    assert p(3) == 8
    q = jit.pure(outer, {inner: lambda x: x - 1})
    assert q(3) == 4
    assert outer(3) == 8  # compiled
    assert ns["inner"] is inner  # the module itself is untouched


def test_cache_folder_follows_the_install_and_the_files_stamps(tmp_path, monkeypatch):
    """numba's own index keys by path and modification stamp: a copy elsewhere (a new venv) or a
    touched file gets a folder of its own, so a READY marker never speaks for code numba will
    recompile."""
    import os
    import shutil

    from servesim import kernel_cache as kc

    def copy_to(root):
        for rel in kc.KERNEL_MODULES:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(kc._PKG / rel, root / rel)
        return root

    a, b = copy_to(tmp_path / "a"), copy_to(tmp_path / "b")
    monkeypatch.setattr(kc, "_PKG", a)
    h_a = kc._source_hash()
    assert kc._source_hash() == h_a  # stable while nothing changes
    monkeypatch.setattr(kc, "_PKG", b)
    assert kc._source_hash() != h_a  # same bytes, another install
    monkeypatch.setattr(kc, "_PKG", a)
    st = os.stat(a / kc.KERNEL_MODULES[0])
    os.utime(a / kc.KERNEL_MODULES[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert kc._source_hash() != h_a  # touched: numba would recompile it


def test_unused_cache_folders_are_pruned(tmp_path, monkeypatch):
    import os
    import time

    from servesim import kernel_cache as kc

    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path))
    root = tmp_path / "servesim-numba"
    old, recent = root / "0ld", root / "recent"
    for d in (old, recent):
        d.mkdir(parents=True)
        (d / "x.nbi").write_text("")
    stale = time.time() - (kc.UNUSED_DAYS + 1) * 86400
    os.utime(old, (stale, stale))
    mine = kc._cache_dir()
    assert mine.startswith(str(root)) and os.path.isdir(mine)
    assert not old.exists() and recent.exists()


def test_a_warm_process_loads_the_cached_engine_without_numbas_registries():
    """Loading cached kernels skips numba's refresh of every lowering it knows (the NumPy array
    implementations among them: 0.2-0.4 s of a small run's start-up); the cached engine gives the
    same result as in this process, and a function compiled afterwards in that process still finds
    every implementation it needs (numba refreshes on compile)."""
    import os
    import subprocess
    import sys

    from conftest import scenario
    from servesim import simulate

    sc = scenario(sim={"engine": "compiled"})
    here = simulate(sc).table.t_finish.tolist()  # compiles into the shared cache if it is cold
    code = ("import sys, json, numpy as np, numba\n"
            "from conftest import scenario\n"
            "from servesim import simulate\n"
            "res = simulate(scenario(sim={'engine': 'compiled'}))\n"
            "loaded = 'numba.np.arraymath' in sys.modules\n"
            "f = numba.njit(lambda a, q, b: np.searchsorted(a, q, side='right') + np.dot(b, b))\n"
            "print(json.dumps([loaded, res.table.t_finish.tolist(), float(f(np.arange(5.0), 2.5, np.ones(3)))]))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"}
    env["PYTHONPATH"] = os.path.dirname(__file__) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    loaded, there, value = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert loaded is False
    assert there == here
    assert value == 3.0 + 3.0


@pytest.mark.parametrize("dtype", ["int64", "float64"])
def test_bisect_kernels_agree_with_searchsorted_compiled_and_pure(dtype):
    """The engine's binary searches (written out so that numba's searchsorted module is never
    loaded) answer as ``np.searchsorted`` does, ties and both ends included, on both engines."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.integers(-20, 20) if dtype == "int64" else st.floats(-20, 20, allow_nan=False)

    @settings(max_examples=200, deadline=None)
    @given(st.lists(values, max_size=12), values)
    def check(xs, q):
        a = np.sort(np.array(xs, dtype=dtype))
        for side, k in (("left", jit.bisect_left), ("right", jit.bisect_right)):
            want = int(np.searchsorted(a, q, side=side))
            assert k(a, q) == want
            assert jit.pure(k)(a, q) == want

    check()
