"""A user's own policy: a built-in composition with parts replaced (servesim/sched/custom.py)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import simulate
from servesim.errors import ScenarioError
from servesim.request import Request, Workload
from servesim.simulate import build
from tests.conftest import scenario

SPF = "tests.plugins.spf:ShortestPromptFirst"


def test_shortest_prompt_first_admits_short_prompts_first():
    """One slot: while r0 runs, r1 (long) and r2 (short) wait; SPF admits r2 first, vllm r1."""
    reqs = [Request(0.0, 8, 4), Request(0.001, 12, 2), Request(0.002, 2, 2)]
    wl = Workload.from_requests(reqs)
    res = {}
    for name in ("vllm", SPF):
        sc = scenario(engine={"scheduler": name, "max_num_seqs": 1}, sim={"check_invariants": True})
        res[name] = simulate(sc, workload=wl).requests.set_index("id")
    assert res["vllm"].loc[1, "first_scheduled_s"] < res["vllm"].loc[2, "first_scheduled_s"]
    assert res[SPF].loc[2, "first_scheduled_s"] < res[SPF].loc[1, "first_scheduled_s"]
    assert (res[SPF].status == "finished").all()


def test_user_parts_run_on_the_python_engine_and_say_so():
    b = build(scenario(engine={"scheduler": SPF}))
    assert b.replica.path == "python" and "policy parts of your own" in b.replica.why


def test_fast_path_equals_single_stepping_with_user_parts():
    base = dict(engine={"scheduler": SPF, "max_num_seqs": 4}, stop={"requests": 80},
                workload={"arrival": {"process": "poisson", "rate": 40.0},
                          "prompt": {"dist": "uniform", "min": 1, "max": 60},
                          "output": {"dist": "uniform", "min": 1, "max": 40}})
    a = simulate(scenario(**base, sim={"fast_path": True})).requests
    b = simulate(scenario(**base, sim={"fast_path": False})).requests
    for col in ("first_scheduled_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(a[col], b[col], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path,needle", [
    ("tests.plugins.spf:NoParts", "non-empty dict"),
    ("tests.plugins.spf:BadPart", "unknown part 'admission'"),
    ("tests.plugins.spf:Nope", "cannot import"),
    ("tests.plugins.nope:X", "cannot import"),
])
def test_bad_user_policies_are_one_line_errors(path, needle):
    with pytest.raises(ScenarioError, match=needle):
        build(scenario(engine={"scheduler": path}))
