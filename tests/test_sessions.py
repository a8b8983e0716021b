"""Prefix chains: chaining, block-size mapping, trace sessions, synthetic multi-turn sessions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from servesim.request import Request, Workload
from servesim.workload.chains import chain_hashes, expand_prefix_blocks, is_prefix_closed, session_chains
from servesim.workload.sessions import synthesize_sessions
from servesim.config.traces import SessionsConfig


def ragged(rows):
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return offsets, np.array([x for r in rows for x in r], dtype=np.int64)


# ------------------------------------------------------------------------------ chain_hashes
def test_chain_identifies_whole_prefix():
    off, ids = ragged([[0, 1, 2], [0, 1, 3], [9, 1, 2], [0]])
    h = chain_hashes(off, ids)
    rows = [h[off[i]:off[i + 1]] for i in range(4)]
    assert rows[0][0] == rows[1][0] == rows[3][0]
    assert rows[0][1] == rows[1][1]
    assert rows[0][2] != rows[1][2]
    # same raw ids after a different first block: different chain ids
    assert rows[2][1] != rows[0][1] and rows[2][2] != rows[0][2]


def test_is_prefix_closed():
    assert is_prefix_closed(*ragged([[0, 1, 2], [0, 1, 3], [0, 4]]))
    assert not is_prefix_closed(*ragged([[0, 1], [5, 1]]))  # id 1 has two parents
    assert not is_prefix_closed(*ragged([[1], [0, 1]]))  # id 1 at two positions


# ----------------------------------------------------------------------- expand_prefix_blocks
def mooncake_like() -> Workload:
    reqs = [
        Request(0.0, 1200, 1, prefix_hashes=(10, 11, 12)),  # last block partial (176 tokens)
        Request(1.0, 1100, 1, prefix_hashes=(10, 11, 13)),
        Request(2.0, 600, 1, prefix_hashes=(10, 14)),
        Request(3.0, 1024, 1, prefix_hashes=(10,)),  # chain shorter than the prompt
    ]
    return Workload.from_requests(reqs, prefix_block_tokens=512)


def test_expand_block_dividing_512():
    w = expand_prefix_blocks(mooncake_like(), 256)
    assert w.prefix_block_tokens == 256
    # full 256-token blocks covered: 1200 -> 4, 1100 -> 4, 600 -> 2, chain of 512 -> 2
    np.testing.assert_array_equal(np.diff(w.prefix_offsets), [4, 4, 2, 2])
    a, b, c, d = (w.hashes_of(i) for i in range(4))
    np.testing.assert_array_equal(a, b)  # blocks 0..3 lie in the shared ids 10, 11
    np.testing.assert_array_equal(a[:2], c)
    np.testing.assert_array_equal(a[:2], d)
    assert len(set(a.tolist())) == 4  # each engine block of one id is its own block


def test_expand_partial_last_block_yields_its_full_engine_blocks():
    w = expand_prefix_blocks(mooncake_like(), 16)
    # 1200 tokens: 75 full 16-token blocks, the last 11 inside the partial id 12
    assert len(w.hashes_of(0)) == 75
    a, b = w.hashes_of(0), w.hashes_of(1)
    assert (a[:64] == b[:64]).all() and not np.intersect1d(a[64:], b[64:]).size


def test_expand_block_not_dividing_512():
    w = expand_prefix_blocks(mooncake_like(), 384)
    # engine block j takes the source block of its last token: 383->0, 767->1, 1151->2
    a, b, c = w.hashes_of(0), w.hashes_of(1), w.hashes_of(2)
    assert len(a) == 3 and len(b) == 2 and len(c) == 1
    np.testing.assert_array_equal(a[:2], b)  # blocks ending in ids 10, 11: shared
    assert c[0] == a[0]  # ends in id 10 (tokens 0..383)
    w2 = expand_prefix_blocks(mooncake_like(), 768)
    # block 0 (tokens 0..767) ends in source block 1: shared by requests 0 and 1; request 2 has
    # 600 tokens and request 3 a chain of 512 tokens: no full 768-token block
    assert w2.hashes_of(0)[0] == w2.hashes_of(1)[0]
    assert len(w2.hashes_of(2)) == len(w2.hashes_of(3)) == 0


def test_expand_same_block_size_keeps_full_blocks_only():
    w = expand_prefix_blocks(mooncake_like(), 512)
    np.testing.assert_array_equal(np.diff(w.prefix_offsets), [2, 2, 1, 1])
    assert expand_prefix_blocks(Workload.from_requests([Request(0.0, 5, 1)]), 16).prefix_offsets is None


@settings(max_examples=60, deadline=None)
@given(
    tree=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=2, max_size=8),
    prompts=st.lists(st.integers(1, 3200), min_size=8, max_size=8),
    block=st.sampled_from([1, 16, 100, 128, 384, 512, 700, 1024]),
)
def test_expand_is_sound_and_complete(tree, prompts, block):
    """Equal engine ids imply equal source prefixes up to the engine block's last token (sound);
    when B divides S, equal full source prefixes give equal engine ids (complete)."""
    S = 512
    # raw chains from branch choices: the id of a block is the path so far (prefix-closed)
    rows = []
    for i, path in enumerate(tree):
        n = min(len(path), -(-prompts[i] // S))
        rows.append([hash(tuple(path[: j + 1])) & 0xFFFFFFFF for j in range(n)])
    reqs = [Request(float(i), prompts[i], 1, prefix_hashes=tuple(r)) for i, r in enumerate(rows) if r]
    if len(reqs) < 2:
        return
    w = Workload.from_requests(reqs, prefix_block_tokens=S)
    e = expand_prefix_blocks(w, block)
    for x in range(len(w)):
        for y in range(len(w)):
            hx, hy = e.hashes_of(x), e.hashes_of(y)
            sx, sy = w.hashes_of(x), w.hashes_of(y)
            for j in range(min(len(hx), len(hy))):
                k = ((j + 1) * block - 1) // S
                if hx[j] == hy[j]:
                    assert (sx[: k + 1] == sy[: k + 1]).all()
                elif S % block == 0:
                    full = min(w.prompt_tokens[x], w.prompt_tokens[y]) // S
                    assert not (k < full and (sx[: k + 1] == sy[: k + 1]).all())


# --------------------------------------------------------------------------- trace sessions
def test_session_chains_full_mode_restarts_after_a_cut_history():
    # session 7: 32 -> next prompt 64 >= 32+8 extends; then 20 < 64+8: history was cut
    prompt, off, h, restarted = session_chains(
        np.array([7, 7, 7]), np.array([32, 64, 20]), np.array([8, 8, 8]), "full", 16
    )
    np.testing.assert_array_equal(prompt, [32, 64, 20])
    assert restarted == 1
    r = [h[off[i]:off[i + 1]] for i in range(3)]
    np.testing.assert_array_equal(r[1][:2], r[0])
    assert r[2][0] != r[0][0]


def test_session_chains_rejects_unknown_mode():
    with pytest.raises(ValueError, match="'both'"):
        session_chains(np.array([1]), np.array([1]), np.array([1]), "both", 16)


# ------------------------------------------------------------------------ synthetic sessions
def fixed_sessions(**kw) -> SessionsConfig:
    base = dict(turns=3, new_input=40, output=20, think_s=5.0, think_dist="fixed", block_tokens=16)
    base.update(kw)
    return SessionsConfig(**base)


def test_synthetic_sessions_exact():
    w = synthesize_sessions(fixed_sessions(system_prompt_tokens=32), np.array([0.0, 1.0]), np.random.default_rng(0))
    np.testing.assert_allclose(w.arrival_s, [0, 1, 5, 6, 10, 11])
    np.testing.assert_array_equal(w.session, [0, 1, 0, 1, 0, 1])
    # 32 system + 40 ; + 60 ; + 60
    np.testing.assert_array_equal(w.prompt_tokens, [72, 72, 132, 132, 192, 192])
    h = [w.hashes_of(i) for i in range(6)]
    assert [len(x) for x in h] == [4, 4, 8, 8, 12, 12]
    # the 2 system-prompt blocks are shared by both sessions, nothing else is
    np.testing.assert_array_equal(h[0][:2], h[1][:2])
    assert h[0][2] != h[1][2]
    # each turn's chain starts with the previous turn's chain (the history)
    for a, b in ((0, 2), (2, 4), (1, 3), (3, 5)):
        np.testing.assert_array_equal(h[b][: len(h[a])], h[a])


def test_synthetic_sessions_deterministic_and_capped():
    cfg = SessionsConfig(
        turns={"dist": "geometric", "mean": 4}, new_input={"dist": "lognormal", "mean": 300, "sigma": 1.0},
        output={"dist": "uniform", "min": 10, "max": 400}, max_context_tokens=3000,
    )
    starts = np.sort(np.random.default_rng(1).uniform(0, 100, 200))
    a = synthesize_sessions(cfg, starts, np.random.default_rng(5))
    b = synthesize_sessions(cfg, starts, np.random.default_rng(5))
    np.testing.assert_array_equal(a.prefix_hashes, b.prefix_hashes)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert np.all(np.diff(a.arrival_s) >= 0)
    assert np.all(a.prompt_tokens + a.output_tokens <= 3000)
    # turns of a session: strictly growing prompts, each chain extends the previous one
    for s in np.unique(a.session)[:50]:
        idx = np.flatnonzero(a.session == s)
        assert np.all(np.diff(a.prompt_tokens[idx]) > 0)
        for i, j in zip(idx[:-1], idx[1:]):
            prev = a.hashes_of(i)
            np.testing.assert_array_equal(a.hashes_of(j)[: len(prev)], prev)
    c = synthesize_sessions(cfg, starts, np.random.default_rng(5), max_requests=100)
    assert len(c) == 100
    np.testing.assert_array_equal(c.arrival_s, a.arrival_s[:100])
    d = synthesize_sessions(cfg, starts, np.random.default_rng(5), until_s=50.0)
    np.testing.assert_array_equal(d.arrival_s, a.arrival_s[a.arrival_s < 50.0])


def test_synthetic_sessions_from_length_pairs():
    from pathlib import Path

    fix = Path(__file__).parent / "fixtures" / "traces"
    cfg = SessionsConfig(turns=2, pairs={"file": "lengths_tiny.csv", "min_prompt": 4, "max_prompt": 1024,
                                         "min_output": 4, "max_total": 2048}, think_s=1.0)
    w = synthesize_sessions(cfg, np.array([0.0]), np.random.default_rng(0), base_dir=fix)
    assert len(w) == 2
    assert w.output_tokens[0] in (4, 1024, 200)


def test_sessions_config_messages():
    with pytest.raises(ValidationError, match="give new_input and output distributions, or pairs"):
        SessionsConfig()
    with pytest.raises(ValidationError, match="not both"):
        SessionsConfig(new_input=5, output=5, pairs={"file": "x.csv"})
    with pytest.raises(ValidationError, match="leaves no room"):
        SessionsConfig(new_input=5, output=5, system_prompt_tokens=100, max_context_tokens=100)


# ----------------------------------------------------- stop.requests with sessions (issue 17)
def _session_scenario(requests, system_prompt_tokens=0, duration_s=None):
    from servesim import scenario_from_dict
    from tests.conftest import BASE, merge

    raw = merge(BASE, {"stop": {"requests": requests}})
    if duration_s is not None:
        raw["stop"]["duration_s"] = duration_s
    raw["workload"] = {"arrival": {"process": "poisson", "rate": 2.0},
                       "sessions": {"turns": {"dist": "geometric", "mean": 4}, "think_s": 5,
                                    "new_input": {"dist": "lognormal", "mean": 600, "sigma": 1},
                                    "output": {"dist": "lognormal", "mean": 300, "sigma": 0.8},
                                    "system_prompt_tokens": system_prompt_tokens, "max_context_tokens": 800}}
    return scenario_from_dict(raw)


def test_sessions_deliver_stop_requests_when_max_context_drops_turns():
    """max_context_tokens drops most turns (whole sessions when the first turn is over): 1,000
    sessions gave 676 requests and the run said so only in a header line. More sessions are drawn
    until the count is reached."""
    from servesim import simulate
    from servesim.simulate import scenario_workload as generate_workload

    sc = _session_scenario(1000)
    wl = generate_workload(sc)
    assert len(wl) == 1000
    assert wl.session.max() + 1 > 1000  # more sessions than requested requests were started
    assert np.all(np.diff(wl.arrival_s) >= 0)
    res = simulate(_session_scenario(200))
    assert res.summary["requests"]["arrived"] == 200


def test_sessions_that_cannot_reach_stop_requests_fail_in_one_line():
    from servesim import ServesimError
    from servesim.simulate import scenario_workload as generate_workload

    with pytest.raises(ServesimError, match=r"^workload\.sessions: 64,000 sessions gave only 0 of the 1,000 requests "
                                            r"stop\.requests asks for \(sessions\.max_context_tokens 800"):
        generate_workload(_session_scenario(1000, system_prompt_tokens=790))


def test_sessions_with_a_binding_duration_keep_what_arrives():
    from servesim.simulate import scenario_workload as generate_workload

    wl = generate_workload(_session_scenario(1000, duration_s=50.0))
    assert 0 < len(wl) < 1000 and wl.arrival_s.max() < 50.0
