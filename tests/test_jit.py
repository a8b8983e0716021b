"""servesim.jit: one source, compiled or pure."""

from __future__ import annotations

import pytest

from servesim import jit


def test_kernels_must_be_declared_in_listed_modules():
    def f(x):
        return x

    with pytest.raises(RuntimeError, match="KERNEL_MODULES"):
        jit.kernel(f)


def test_pure_rebuilds_callees_and_applies_overrides(monkeypatch):
    monkeypatch.setattr(jit, "KERNEL_MODULES", jit.KERNEL_MODULES + (__file__,))
    # declare two kernels from this (test) module
    def inner(x):
        return x + 1

    inner_k = jit.kernel(inner)

    def outer(x):
        return inner_k(x) * 2

    outer.__globals__["inner_k"] = inner_k
    outer_k = jit.kernel(outer)
    p = jit.pure(outer_k)
    assert not isinstance(p, jit.Dispatcher)
    assert p.__globals__["inner_k"] is not inner_k  # the callee was rebuilt as Python too
    assert not isinstance(p.__globals__["inner_k"], jit.Dispatcher)
    assert p(3) == 8
    q = jit.pure(outer_k, {inner_k: lambda x: x - 1})
    assert q(3) == 4
    assert outer_k(3) == 8  # compiled
