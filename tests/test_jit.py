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


def test_cache_folder_follows_the_kernels_the_install_and_the_files_stamps(tmp_path, monkeypatch):
    """numba's own cache checks only the compiled function's file, not those of the kernels it
    inlined: the folder is keyed by every kernel module's bytes, so an edit anywhere compiles
    anew. numba's index also keys by path and stamp: a copy elsewhere (a new venv) or a touched
    file gets a folder of its own too, so :func:`compiled_ready` never speaks for code numba
    would recompile."""
    import os
    import shutil

    pkg = jit._PKG

    def copy_to(root):
        for rel in jit.KERNEL_MODULES:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pkg / rel, root / rel)
        return root

    a, b = copy_to(tmp_path / "a"), copy_to(tmp_path / "b")
    monkeypatch.setattr(jit, "_PKG", a)
    h_a = jit._source_hash()
    assert jit._source_hash() == h_a  # stable while nothing changes
    inlined = a / "sched/parts.py"  # a module whose kernels the replica loop inlines
    st = os.stat(inlined)
    inlined.write_text(inlined.read_text() + "\n# an edit\n")
    os.utime(inlined, ns=(st.st_atime_ns, st.st_mtime_ns))  # (same stamp: only the bytes differ)
    assert jit._source_hash() != h_a  # edited: every kernel compiles anew
    a = copy_to(tmp_path / "a")  # (the original bytes and stamps back)
    assert jit._source_hash() == h_a
    monkeypatch.setattr(jit, "_PKG", b)
    assert jit._source_hash() != h_a  # same bytes, another install
    monkeypatch.setattr(jit, "_PKG", a)
    st = os.stat(a / jit.KERNEL_MODULES[0])
    os.utime(a / jit.KERNEL_MODULES[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert jit._source_hash() != h_a  # touched: numba would recompile it


def test_unused_cache_folders_are_pruned(tmp_path, monkeypatch):
    import os
    import time

    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path))
    root = tmp_path / "servesim-numba"
    old, recent = root / "0ld", root / "recent"
    for d in (old, recent):
        d.mkdir(parents=True)
        (d / "x.nbi").write_text("")
    stale = time.time() - (jit.UNUSED_DAYS + 1) * 86400
    os.utime(old, (stale, stale))
    mine = jit._cache_dir()
    assert mine.startswith(str(root)) and os.path.isdir(mine)
    assert not old.exists() and recent.exists()


def test_compiled_ready_reads_the_installed_numbas_cache_names(tmp_path, monkeypatch):
    """``compiled_ready`` looks for numba's index file of the replica loop by its name
    (``kernel.advance-<line>...nbi``); a numba that names its files otherwise must fail here,
    not silently make every first run look cold. A function of that module and name, cached by
    the installed numba into an empty folder: not ready before its first call, ready after."""
    import importlib.util

    import numba

    cache = tmp_path / "cache"
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "kernel.py"  # the replica loop's module name (servesim/engine/kernel.py)
    src.write_text("import numba\n\n\n@numba.njit(cache=True)\ndef advance(x):\n    return x + 1\n")
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(cache))  # (read when a function is decorated)
    monkeypatch.setattr(jit, "CACHE_DIR", str(cache))
    spec = importlib.util.spec_from_file_location("servesim_test_cache_names.kernel", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert not jit.compiled_ready()
    assert mod.advance(1) == 2  # compiles and writes numba's index
    assert jit.compiled_ready()


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
