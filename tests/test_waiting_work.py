"""The waiting requests' tokens as a running count (``st.s.q_work``, sched/state.py): the
least-tokens router's read of a replica (engine/inbox.py ``outstanding_work``) takes the waiting
queues' and the routed inbox's tokens from it instead of walking them (issue 30).

Held here: at every read the count gives what the walk gave, over the engine's features that
move a waiting request or change its ``computed`` while it waits (preemption by recompute and
by swap, SLA classes, a static batch's members, SGLang admission, the prefix cache's lookups, a
KV tier's fetches and released holders, closed loops); ``sim.check_invariants`` holds the count
to the walk after every scheduling decision, and a wrong count is an error; an engine whose
scheduler parts are the user's Python -- which may link and unlink queue entries directly, past
the count -- reads by the walk."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.engine import kernel as K
from servesim.jit import pure
from servesim.request import REJECTED, Reject
from servesim.sched import policies
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge, sessions_fleet

SPREAD = {"prompt": {"dist": "uniform", "min": 1, "max": 120}, "output": {"dist": "uniform", "min": 1, "max": 40}}


def _fleet(replicas: int, engine: dict, workload: dict | None = None, requests: int = 240) -> dict:
    return merge(BASE, {"stop": {"requests": requests}, "hardware": {"replicas": replicas},
                        "cluster": {"router": "least-tokens"}, "engine": engine,
                        "workload": {"arrival": {"process": "poisson", "rate": 300.0}, **SPREAD, **(workload or {})}})


CASES = {
    "recompute": _fleet(4, {"max_num_seqs": 4, "num_gpu_blocks_override": 30}),
    "swap-classes": _fleet(3, {"scheduler": "priority", "max_num_seqs": 4, "num_gpu_blocks_override": 20,
                               "preemption": "swap", "max_model_len": 256},
                           {"output": {"dist": "uniform", "min": 1, "max": 60}, "classes": {"weights": [1, 1, 1]}}),
    "static": _fleet(3, {"scheduler": "static-fifo", "max_num_seqs": 4, "max_batch_size": 4,
                         "num_gpu_blocks_override": 30}),
    "sglang": _fleet(3, {"scheduler": "chunked", "enable_chunked_prefill": True, "max_num_batched_tokens": 64,
                         "chunked_prefill_size": 32, "max_num_seqs": 4, "num_gpu_blocks_override": 30,
                         "options": {"admission": "sglang"}}),
    "prefix-tier": merge(sessions_fleet("least-tokens", requests=240),
                         {"engine": {"num_gpu_blocks_override": 40}, "kv_tiers": [{"kind": "cpu", "capacity_gib": 0.01}]}),
    "closed": _fleet(3, {"max_num_seqs": 3, "num_gpu_blocks_override": 20, "max_model_len": 128},
                     {"arrival": {"process": "closed", "clients": 12, "think_s": 0.0},
                      "output": {"dist": "uniform", "min": 1, "max": 30}}),
}

_WALKED = {K.waiting_work: pure(K.waiting_work_walk)}


def _watch_reads(fleet) -> list[int]:
    """Bind each engine's read to one that also walks, and asserts both agree; returns a list
    that counts the reads."""
    reads: list[int] = []
    for eng in fleet.engines:
        counted = pure(K.outstanding_work)
        walked = pure(K.outstanding_work, _WALKED)

        def work(t, _cfg=eng.cfg, _st=eng.kst, _c=counted, _w=walked):
            a, b = _c(_cfg, _st, t), _w(_cfg, _st, t)
            assert a == b, f"counted read {a} != walked read {b} at {t}"
            reads.append(1)
            return a

        eng._work = work
    return reads


@pytest.mark.parametrize("name", list(CASES))
def test_every_read_counts_what_the_walk_counts(name):
    raw = merge(CASES[name], {"sim": {"check_invariants": True, "engine": "python"}})
    b = build(scenario_from_dict(raw))
    fleet = b.replica
    fleet.compiled_loop = False
    reads = _watch_reads(fleet)
    res = run_built(b)
    assert len(reads) > 100 and (res.requests.status == "finished").sum() > 0
    for eng in fleet.engines:  # and the count is the walk's at the end too
        assert int(eng.st.s.q_work) == int(pure(K.waiting_work_walk)(eng.cfg, eng.kst))


def test_a_wrong_count_is_an_error_under_check_invariants():
    raw = merge(CASES["recompute"], {"hardware": {"replicas": 1}, "cluster": {"router": "round-robin"},
                                     "sim": {"check_invariants": True, "engine": "python"}})
    b = build(scenario_from_dict(raw))
    eng = b.replica.engines[0] if hasattr(b.replica, "engines") else b.replica
    eng.s.set_i("q_work", 5)
    with pytest.raises(AssertionError, match="is 5 off a walk"):
        run_built(b)


_schedule = pure(policies.schedule)


def shed_newest(cfg, st, kv, now):
    """A user's load shedding: past 3 waiting, the newest is rejected -- unlinked by hand, past
    the count (the built-in queue kernels, ``pure(queues.q_take)``, would have kept it)."""
    if st.q_len[0] > 3:
        prev, r = -1, st.q_head[0]
        while st.q_next[r] >= 0:
            prev, r = r, st.q_next[r]
        st.q_next[prev] = -1
        st.q_tail[0] = prev
        st.q_len[0] -= 1
        st.status[r] = REJECTED
        st.reject[r] = Reject.KV_CAPACITY
        st.t_finish[r] = now
        st.s.ended += 1
    _schedule(cfg, st, kv, now)


class ShedsByHand:
    base = "vllm"
    parts = {"schedule": shed_newest}


def test_user_parts_that_unlink_by_hand_are_read_by_the_walk():
    raw = merge(CASES["recompute"], {"engine": {"scheduler": "tests.test_waiting_work:ShedsByHand"},
                                     "sim": {"check_invariants": True}})
    b = build(scenario_from_dict(raw))
    fleet = b.replica
    walked = pure(K.outstanding_work, _WALKED)
    off: list[int] = []
    for eng in fleet.engines:
        assert eng.path == "python"
        inner = eng._work

        def work(t, _inner=inner, _cfg=eng.cfg, _st=eng.kst):
            got = _inner(t)
            assert got == walked(_cfg, _st, t)  # the engine reads by the walk ...
            off.append(int(_st.s.q_work) - int(pure(K.waiting_work_walk)(_cfg, _st)))
            return got

        eng._work = work
    res = run_built(b)  # (and check_invariants does not call the user's unlinking an engine bug)
    assert (res.requests.status == "rejected").sum() > 0
    assert np.any(np.array(off) != 0)  # ... where the count would have been wrong
