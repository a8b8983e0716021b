"""workload.streams: the generated requests (mix shares, independence, contamination, rate_scale,
sessions and traces per stream)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from servesim.scenario import scenario_from_dict
from servesim.simulate import scenario_workload
from tests.conftest import BASE, merge

FIX = Path(__file__).parent / "fixtures" / "traces"

CHAT = {"prompt": {"dist": "uniform", "min": 200, "max": 440}, "output": {"dist": "uniform", "min": 20, "max": 80}}
EDU = {"prompt": {"dist": "normal", "mean": 4200, "std": 1800, "min": 16, "max": 7000},
       "output": {"dist": "fixed", "value": 300}}
CODE = {"prompt": {"dist": "normal", "mean": 1024, "std": 600, "min": 16, "max": 4000},
        "output": {"dist": "fixed", "value": 128}}


def mix_scenario(seed=0, requests=2000, duration_s=None, **workload):
    """The 3:5:2 mix (chat / education documents / code) by default; ``workload`` keys replace
    the defaults (None removes one)."""
    wl = {"arrival": {"process": "poisson", "rate": 10.0},
          "streams": [{"name": "chat", "class": "P0", "share": 3, **CHAT},
                      {"name": "edu", "class": "P2", "share": 5, **EDU},
                      {"name": "code", "class": "P1", "share": 2, **CODE}]}
    wl.update(workload)
    raw = {k: v for k, v in BASE.items() if k not in ("workload", "stop")}
    raw = merge(raw, {"seed": seed, "engine": {"max_num_batched_tokens": 8192}})
    raw["stop"] = {k: v for k, v in (("requests", requests), ("duration_s", duration_s)) if v is not None}
    raw["workload"] = {k: v for k, v in wl.items() if v is not None}
    return scenario_from_dict(raw, "test")


def counts(w, k):
    return np.bincount(w.stream, minlength=k)


# ------------------------------------------------------------------------------------ shares
def _share_pvalues(seeds, n):
    p = np.array([3, 5, 2]) / 10
    pvals, total = [], np.zeros(3)
    for seed in seeds:
        w = scenario_workload(mix_scenario(seed=seed, requests=n))
        c = counts(w, 3)
        assert c.sum() == n
        total += c
        pvals.append(stats.chisquare(c, p * n).pvalue)
    return np.array(pvals), stats.chisquare(total, p * total.sum()).pvalue


def test_shares_match_the_mix_chi_square_over_seeds():
    pvals, pooled = _share_pvalues(range(20), 2000)
    # each seed's counts fit 3:5:2; under the hypothesis the p-values are uniform
    assert pooled > 1e-3
    assert (pvals < 0.05).sum() <= 5  # P(Binomial(20, 0.05) > 5) < 0.001
    assert stats.kstest(pvals, "uniform").pvalue > 1e-3


@pytest.mark.slow
def test_shares_match_the_mix_many_seeds():
    pvals, pooled = _share_pvalues(range(200), 20_000)
    assert pooled > 1e-3
    assert stats.kstest(pvals, "uniform").pvalue > 1e-3


def test_shares_split_one_arrival_process():
    """The streams of a split share the process: their union is the Poisson process of the
    workload (same times as one stream drawing from it), each stream keeps its lengths."""
    w = scenario_workload(mix_scenario(seed=3, requests=3000))
    gaps = np.diff(np.concatenate([[0.0], w.arrival_s]))
    assert np.all(gaps >= 0)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 10.0)).pvalue > 1e-3
    chat = w.stream == 0
    assert w.prompt_tokens[chat].min() >= 200 and w.prompt_tokens[chat].max() <= 440
    assert np.all(w.output_tokens[w.stream == 1] == 300)
    np.testing.assert_array_equal(np.unique(w.klass[chat]), [0])
    np.testing.assert_array_equal(np.unique(w.klass[w.stream == 1]), [2])
    assert w.stream_names == ("chat", "edu", "code")


def test_changing_one_stream_leaves_the_others_alone():
    base = scenario_workload(mix_scenario(seed=5))
    changed = scenario_workload(mix_scenario(seed=5, streams=[
        {"name": "chat", "class": "P0", "share": 3, **CHAT},
        {"name": "edu", "class": "P2", "share": 5, **EDU},
        {"name": "code", "class": "P1", "share": 2, **CODE, "output": {"dist": "fixed", "value": 999}}]))
    np.testing.assert_array_equal(base.arrival_s, changed.arrival_s)
    np.testing.assert_array_equal(base.stream, changed.stream)
    keep = base.stream != 2
    np.testing.assert_array_equal(base.prompt_tokens, changed.prompt_tokens)
    np.testing.assert_array_equal(base.output_tokens[keep], changed.output_tokens[keep])
    assert np.all(changed.output_tokens[~keep] == 999)


def test_streams_with_own_arrivals_are_independent():
    def sc(rate_b):
        return mix_scenario(seed=2, requests=None, duration_s=200, arrival=None, streams=[
            {"name": "a", "arrival": {"process": "poisson", "rate": 2.0}, **CHAT},
            {"name": "b", "class": "P3", "arrival": {"process": "gamma", "rate": rate_b, "cv": 2}, **CODE}])

    x = scenario_workload(sc(1.0))
    y = scenario_workload(sc(4.0))
    np.testing.assert_array_equal(x.arrival_s[x.stream == 0], y.arrival_s[y.stream == 0])
    np.testing.assert_array_equal(x.prompt_tokens[x.stream == 0], y.prompt_tokens[y.stream == 0])
    assert np.all(np.diff(x.arrival_s) >= 0)
    # rate 2 for 200 s: 400 requests (sd 20)
    assert abs(int((x.stream == 0).sum()) - 400) < 100


# ------------------------------------------------------------------------------- rate_scale
def test_rate_scale_multiplies_every_stream_rate():
    def wl(scale):
        return scenario_workload(mix_scenario(seed=4, requests=None, duration_s=400, arrival=None, rate_scale=scale,
                                              streams=[{"name": "a", "arrival": {"process": "poisson", "rate": 2.0}, **CHAT},
                                                       {"name": "b", "arrival": {"process": "constant", "rate": 1.0}, **CODE}]))

    one, three = wl(1.0), wl(3.0)
    # constant process: one arrival every 1/(rate x scale) s from 0 (cumulative rounding may add one)
    assert abs(int((three.stream == 1).sum()) - 1200) <= 1 and abs(int((one.stream == 1).sum()) - 400) <= 1
    n_a = (three.stream == 0).sum()
    assert abs(n_a - 2400) < 5 * np.sqrt(2400)
    # same draws, gaps divided by 3
    np.testing.assert_allclose(three.arrival_s[three.stream == 0][:100], one.arrival_s[one.stream == 0][:100] / 3)


def test_rate_scale_one_changes_nothing():
    a = scenario_workload(mix_scenario(seed=1))
    b = scenario_workload(mix_scenario(seed=1, rate_scale=1.0))
    for col in ("arrival_s", "prompt_tokens", "output_tokens", "klass", "stream"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))


def test_rate_scale_composes_with_a_trace_rate_scale():
    trace = {"file": str(FIX / "mooncake_tiny.jsonl"), "format": "mooncake", "rate_scale": 2.0}
    w = scenario_workload(mix_scenario(requests=5, arrival=None, rate_scale=2.0,
                                       streams=[{"name": "mc", "trace": trace}]))
    np.testing.assert_allclose(w.arrival_s, np.array([0, 0.5, 1.5, 2.0, 3.0]) / 4)
    # the single-stream form composes the same way
    single = merge(BASE, {"stop": {"requests": 5}})
    single["workload"] = {"trace": trace, "rate_scale": 2.0}
    w1 = scenario_workload(scenario_from_dict(single, "t"))
    np.testing.assert_allclose(w1.arrival_s, w.arrival_s)


# ----------------------------------------------------------------------------- contaminate
ABNORMAL = {"fraction": 0.1, "prompt": {"dist": "uniform", "min": 16384, "max": 32768}}


@pytest.mark.parametrize("seed", range(5))
def test_contaminate_marks_a_fraction_abnormal(seed):
    clean = scenario_workload(mix_scenario(seed=seed, requests=4000))
    dirty = scenario_workload(mix_scenario(seed=seed, requests=4000, contaminate=ABNORMAL))
    assert dirty.stream_names == ("chat", "edu", "code", "abnormal")
    hit = dirty.stream == 3
    n = int(hit.sum())
    assert abs(n - 400) < 5 * np.sqrt(4000 * 0.1 * 0.9)
    assert dirty.prompt_tokens[hit].min() >= 16384 and dirty.prompt_tokens[hit].max() <= 32768
    np.testing.assert_array_equal(dirty.arrival_s, clean.arrival_s)
    np.testing.assert_array_equal(dirty.prompt_tokens[~hit], clean.prompt_tokens[~hit])
    np.testing.assert_array_equal(dirty.output_tokens, clean.output_tokens)  # no output dist given
    np.testing.assert_array_equal(dirty.klass, clean.klass)  # priority of the stream they came from
    np.testing.assert_array_equal(dirty.stream[~hit], clean.stream[~hit])


def test_contaminate_in_the_single_stream_form():
    raw = merge(BASE, {"stop": {"requests": 3000}})
    raw["workload"]["contaminate"] = {**ABNORMAL, "fraction": 0.2, "stream": "huge", "priority": "P4",
                                      "output": {"dist": "fixed", "value": 7}}
    w = scenario_workload(scenario_from_dict(raw, "t"))
    hit = w.stream == 1
    assert w.stream_names == ("default", "huge")
    assert abs(hit.mean() - 0.2) < 0.04
    assert np.all(w.klass[hit] == 4) and np.all(w.klass[~hit] == 0)
    assert np.all(w.output_tokens[hit] == 7) and np.all(w.prompt_tokens[~hit] == 16)


# ------------------------------------------------------------------------- sessions, traces
def test_session_streams_never_share_prefixes_by_numbering():
    sess = {"turns": 3, "think_s": 1.0, "new_input": {"dist": "fixed", "value": 64},
            "output": {"dist": "fixed", "value": 32}, "system_prompt_tokens": 64, "block_tokens": 16}
    sc = mix_scenario(requests=300, arrival=None, streams=[
        {"name": "a", "arrival": {"process": "poisson", "rate": 1.0}, "sessions": sess},
        {"name": "b", "arrival": {"process": "poisson", "rate": 1.0}, "sessions": {**sess, "block_tokens": 8}},
        {"name": "c", "arrival": {"process": "poisson", "rate": 1.0}, **CHAT}])
    w = scenario_workload(sc)
    assert w.prefix_block_tokens == 8  # the smaller block size of the two session streams
    rows = {i: np.flatnonzero(w.stream == i) for i in range(3)}
    hashes = {i: set(np.concatenate([w.hashes_of(r) for r in rows[i]]).tolist()) for i in range(2)}
    assert hashes[0] and hashes[1] and not hashes[0] & hashes[1]
    assert all(len(w.hashes_of(r)) == 0 for r in rows[2])
    assert all(len(w.hashes_of(r)) == w.prompt_tokens[r] // 8 for r in rows[1])
    s0, s1 = set(w.session[rows[0]].tolist()), set(w.session[rows[1]].tolist())
    assert not s0 & s1 and -1 not in s0 | s1
    assert set(w.session[rows[2]].tolist()) == {-1}
