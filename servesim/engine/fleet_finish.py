"""The end of a fleet's run: every engine's last buffers folded into its recorder in one pass.

``Engine.finish`` (engine/driver.py) drains one engine: its irregular inter-token gaps, then its
step buffer folded by ``Recorder._fold`` (metrics/collect.py), ~50 numpy calls. A fleet's engines
flush rarely (buffers sized to their share of the run), so most of their steps are folded at the
end: 1,024 engines took 0.36-0.44 CPU s of a ~5 s run at 200,000 requests (benchmarks/RESULTS.md).
:func:`finish_engines` drains every engine the same way, but
hands all the step buffers to the recorders' ``fold_many`` (metrics/fold.py: one compiled call,
every recorder's bits as its own fold gives them), then finishes each engine as ``finish`` does.
The recorder's class comes down from the metrics floor with the recorders (``new_recorder``), so
this module imports nothing above the engine. The compiled routed loop folds an engine's buffer
the same way when it fills during the run (engine/fleet_compiled.py, :func:`drain_engines`).
"""

from __future__ import annotations

FOLD_MIN_ENGINES = 64  # fewer engines compile the fold kernel only when it is built already


def batched(engines) -> bool:
    """Whether the engines' folds go in one compiled pass: several engines, all compiled (a
    Python engine means this machine has not compiled the engine yet), recorders that offer
    ``fold_many``, and either :data:`FOLD_MIN_ENGINES` of them or the fold kernel built already
    (it compiles in ~5 s, once a kernel version; 24 engines save ~10 ms a run)."""
    return (len(engines) > 1 and all(e.path == "compiled" for e in engines)
            and all(hasattr(e.recorder, "fold_many") for e in engines)
            and (len(engines) >= FOLD_MIN_ENGINES or engines[0].recorder.fold_ready()))


def drain_engines(engines) -> None:
    """``Engine._drain`` of each engine, the step buffers folded in one pass (the caller checked
    ``all(e.path == "compiled")``): per recorder the same order, its irregular gaps, then its fold
    (``itl_from`` set before it)."""
    recs, bufs = [], []
    for eng in engines:
        st, rec, s = eng.st, eng.recorder, eng.s  # (s: the scalars' array views, ~5x a record's attributes)
        m = s.get_i("itl_len")
        if m:
            rec.itl.add(st.itl_v[:m].copy(), st.itl_w[:m].copy())
            s.set_i("itl_len", 0)
        f = s.get_i("rows")
        if f:
            rec.itl_from = s.get_f("itl_from")
            recs.append(rec)
            bufs.append((st.rb_start, st.rb_end, st.rb_vals, st.rb_itlw, f))
            s.set_i("rows", 0)
    if recs:
        recs[0].fold_many(recs, bufs)


def finish_engines(engines) -> None:
    """``for e in engines: e.finish()``, the step buffers folded in one pass where
    :func:`batched` (:func:`drain_engines`), then ``Engine._finish`` of each."""
    if not batched(engines):
        for eng in engines:
            eng.finish()
        return
    drain_engines(engines)
    for eng in engines:
        eng._finish()
