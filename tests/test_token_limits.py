"""Token counts the engine cannot represent are refused before any int32 cast (issue 17).

The request columns are 32-bit: a 3e9-token prompt used to wrap to -1.29e9 (negative TPOT, TTFT
> E2E), a trace row of 4294967297 read as 1 token, a 2147483600-token prompt with chunked prefill
hung. Every source of token counts now refuses counts above ``MAX_TOKENS`` (1e9) with one line:
scenario fields at load, trace and length-file rows as malformed rows (``on_bad_row``), synthetic
sessions whose history grows past it, and workloads built by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from servesim import ServesimError, scenario_from_dict, simulate
from servesim.cli import app
from servesim.errors import TraceError, WorkloadError
from servesim.fields import MAX_TOKENS
from servesim.request import Request, Workload
from servesim.config.traces import LengthsConfig, TraceConfig
from servesim.workload.traces import load_length_pairs, load_trace
from tests.conftest import BASE, merge, scenario

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_workload_by_hand_refuses_counts_that_would_wrap():
    with pytest.raises(WorkloadError, match=r"request 1 has prompt_tokens = 3,000,000,000; allowed: 0\.\.1,000,000,000"):
        Workload.from_requests([Request(0.1, 16, 4), Request(0.2, 3_000_000_000, 4)])
    with pytest.raises(WorkloadError, match=r"output_tokens = -2"):
        Workload.from_requests([Request(0.1, 16, -2)])


def test_workload_at_the_limit_runs_and_is_rejected_as_too_long():
    wl = Workload.from_requests([Request(0.1, 16, 4), Request(0.2, MAX_TOKENS, MAX_TOKENS), Request(0.3, 16, 4)])
    res = simulate(scenario(engine={"enable_prefix_caching": True}), workload=wl)
    q = res.requests
    assert q.status.tolist() == ["finished", "rejected", "finished"]
    assert q.prompt_tokens.tolist() == [16, MAX_TOKENS, 16] and q.output_tokens.tolist() == [4, MAX_TOKENS, 4]
    assert (q.ttft_s.dropna() > 0).all() and (q.tpot_s.dropna() > 0).all()


@pytest.mark.parametrize("patch, field", [
    ({"workload": {"prompt": {"dist": "fixed", "value": 3_000_000_000}}}, "workload.prompt.fixed.value"),
    # chunked prefill used to hang on this one
    ({"workload": {"prompt": {"dist": "fixed", "value": 2_147_483_600}}, "engine": {"enable_chunked_prefill": True}},
     "workload.prompt.fixed.value"),
    ({"workload": {"output": {"dist": "lognormal", "mean": 100, "sigma": 1, "max": 5_000_000_000}}},
     "workload.output.lognormal.max"),
    ({"engine": {"max_model_len": 4_294_967_297, "enable_chunked_prefill": True}}, "engine.max_model_len"),
])
def test_scenario_token_fields_are_bounded(patch, field):
    with pytest.raises(ServesimError, match=rf"{field} = .*less than or equal to 1000000000"):
        scenario_from_dict(merge(BASE, patch))


def test_sessions_whose_history_outgrows_the_limit_fail_loudly():
    raw = merge(BASE, {"stop": {"requests": 20}})
    raw["workload"] = {"arrival": {"process": "poisson", "rate": 1.0},
                       "sessions": {"turns": 4, "think_s": 1.0, "new_input": {"dist": "fixed", "value": 600_000_000},
                                    "output": {"dist": "fixed", "value": 10}}}
    with pytest.raises(ServesimError, match=r"workload\.sessions: a turn's prompt .* reaches 2,400,000,030 tokens"):
        simulate(scenario_from_dict(raw))


@pytest.mark.parametrize("count", ["4294967297", "12345678901234567890123", "3e9", "1e30"])
def test_trace_row_too_large_is_a_malformed_row(tmp_path, count):
    f = tmp_path / "big.csv"
    f.write_text(AZURE_HEADER + "2023-11-16 18:00:00,100,10\n" + f"2023-11-16 18:00:01,{count},10\n"
                 + "2023-11-16 18:00:02,300,30\n")
    with pytest.raises(TraceError, match=r"big\.csv:3: column ContextTokens: .* tokens is more than the 1,000,000,000"):
        load_trace(TraceConfig(file=str(f), format="azure"), None)
    w = load_trace(TraceConfig(file=str(f), format="azure", on_bad_row="skip"), None)
    np.testing.assert_array_equal(w.prompt_tokens, [100, 300])  # not 1 (4294967297 mod 2**32)
    assert "skipped 1 malformed rows" in w.notes[0]


def test_mooncake_and_length_file_rows_too_large(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text('{"timestamp": 0, "input_length": 4294967297, "output_length": 5, "hash_ids": []}\n')
    with pytest.raises(TraceError, match=r"m\.jsonl:1: column input_length: 4294967297 tokens is more than"):
        load_trace(TraceConfig(file=str(m), format="mooncake"), None)
    f = tmp_path / "l.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens\n100,10\n5,99999999999999999999999\n")
    with pytest.raises(TraceError, match=r"l\.csv:3: column num_decode_tokens: .* tokens is more than"):
        load_length_pairs(LengthsConfig(file=str(f)), None)
    p, o, notes = load_length_pairs(LengthsConfig(file=str(f), on_bad_row="skip"), None)
    assert p.tolist() == [100] and o.tolist() == [10] and "skipped 1 malformed rows" in notes[0]


def test_cli_exit_2_for_a_wrapping_prompt(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(merge(BASE, {"workload": {"prompt": {"dist": "fixed", "value": 3_000_000_000}}})))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and res.stderr.startswith("error:") and "workload.prompt" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()
