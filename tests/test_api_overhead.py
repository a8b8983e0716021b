"""engine.api_request_s / api_token_s (the request path: API server, tokenization,
detokenization, streaming) shift every latency a client sees by exactly the stated amounts:
TTFT and E2E by their sum, TPOT and the inter-token gaps not at all; the schedule itself is
unchanged (the engine sees the same requests at the same relative times)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import simulate
from servesim.scenario import load_scenario
from tests.conftest import REPO

BASE = ["stop.requests=120", "stop.warmup_requests=0", "workload.arrival.rate=6.0"]


def run(extra):
    return simulate(load_scenario(REPO / "scenarios" / "quickstart.yaml", BASE + extra))


@pytest.mark.parametrize("a,d", [(0.003, 0.001), (0.0, 0.002), (0.004, 0.0)])
def test_api_overhead_shifts_latencies_exactly(a, d):
    base = run([])
    over = run([f"engine.api_request_s={a}", f"engine.api_token_s={d}"])
    x, y = base.requests, over.requests
    assert (x["arrival_s"].to_numpy() == y["arrival_s"].to_numpy()).all()  # the client's send times
    for col, shift in (("ttft_s", a + d), ("e2e_s", a + d), ("tpot_s", 0.0)):
        got = y[col].to_numpy() - x[col].to_numpy()
        assert np.allclose(got, shift, rtol=0, atol=1e-9), (col, got[:5])
    sx, sy = base.summary["latency_s"], over.summary["latency_s"]
    assert sy["ttft"]["p50"] == pytest.approx(sx["ttft"]["p50"] + a + d, abs=1e-9)
    assert sy["itl"]["p50"] == pytest.approx(sx["itl"]["p50"], abs=1e-12)
    assert sy["itl"]["mean"] == pytest.approx(sx["itl"]["mean"], rel=1e-12)


def test_api_overhead_per_group_refused():
    from servesim.errors import ScenarioError
    with pytest.raises(ScenarioError, match=r"cluster.groups\[0\].engine.api_request_s"):
        load_scenario(REPO / "scenarios" / "quickstart.yaml",
                      ["cluster.groups=[{replicas: 1, engine: {api_request_s: 0.01}}]"])
