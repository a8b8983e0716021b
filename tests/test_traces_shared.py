"""The real public traces in ../shared/traces and the scenarios in scenarios/traces.

Every test here reads ../shared through :func:`shared`, which skips when it is absent (a plain
checkout of the repo without the data)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from servesim.request import Workload
from servesim.workload.servegen import client_files, read_client_fits, servegen_arrivals
from servesim.workload.chains import expand_prefix_blocks, is_prefix_closed
from servesim.workload.sessions import synthesize_sessions
from servesim.config.traces import (
    ClassAssignmentConfig,
    LengthsConfig,
    ServeGenArrivalConfig,
    SessionsConfig,
    TraceConfig,
)
from servesim.workload.traces import assign_classes, load_trace, sample_length_pairs

pytestmark = pytest.mark.needs_shared

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios" / "traces"


def distinct(x: np.ndarray) -> int:
    """Number of distinct values (sort-based: np.unique is slow on millions of int64)."""
    s = np.sort(x)
    return int(len(s) > 0) + int(np.count_nonzero(s[1:] != s[:-1]))


def shared() -> Path:
    """../shared/traces, or skip the test."""
    root = Path(__file__).resolve().parents[2] / "shared"
    if not (root / "traces").is_dir():
        pytest.skip("../shared/traces is not present")
    return root / "traces"


# -------------------------------------------------------------------------------------- azure
@pytest.mark.parametrize("kind, rows", [("conv", 19_366), ("code", 8_819)])
def test_azure_files_load_completely(kind, rows):
    w = load_trace(TraceConfig(file=f"azure_llm_2023/AzureLLMInferenceTrace_{kind}.csv", format="azure"), shared())
    assert len(w) == rows
    assert w.notes[0] == f"azure AzureLLMInferenceTrace_{kind}.csv: kept {rows:,} of {rows:,} rows"
    assert np.all(np.diff(w.arrival_s) >= 0) and w.arrival_s[0] == 0.0


def test_azure_conv_first_rows_and_rate_scale():
    cfg = dict(file="azure_llm_2023/AzureLLMInferenceTrace_conv.csv", format="azure")
    w1 = load_trace(TraceConfig(**cfg), shared())
    np.testing.assert_array_equal(w1.prompt_tokens[:2], [374, 396])
    np.testing.assert_array_equal(w1.output_tokens[:2], [44, 109])
    assert w1.arrival_s[1] == pytest.approx(4.314579)  # 18:15:50.9951690 - 18:15:46.6805900
    w2 = load_trace(TraceConfig(**cfg, rate_scale=2.0), shared())
    np.testing.assert_allclose(np.diff(w2.arrival_s), np.diff(w1.arrival_s) / 2, rtol=1e-12)


# ----------------------------------------------------------------------------------- mooncake
def raw_mooncake(name: str) -> tuple[np.ndarray, np.ndarray]:
    lens, ids = [], []
    with open(shared() / "mooncake_fast25" / name) as fh:
        for line in fh:
            h = json.loads(line)["hash_ids"]
            lens.append(len(h))
            ids.extend(h)
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), np.array(ids, dtype=np.int64)


@pytest.mark.parametrize(
    "name, refs, n_distinct", [("conversation_trace.jsonl", 288_500, 182_790), ("synthetic_trace.jsonl", 121_877, 43_924)]
)
def test_mooncake_hash_ids_are_chained_and_kept(name, refs, n_distinct):
    """Mooncake's ids already identify whole prefixes (one parent, one position each), so
    re-chaining keeps exactly their equality classes: the PROVENANCE counts are reproduced."""
    assert is_prefix_closed(*raw_mooncake(name))
    w = load_trace(TraceConfig(file=f"mooncake_fast25/{name}", format="mooncake"), shared())  # (no row has 0 output tokens)
    assert w.prefix_block_tokens == 512
    assert len(w.prefix_hashes) == refs
    assert distinct(w.prefix_hashes) == n_distinct


def test_mooncake_input_means_match_provenance():
    w = load_trace(TraceConfig(file="mooncake_fast25/conversation_trace.jsonl", format="mooncake"), shared())  # (no row has 0 output tokens)
    assert len(w) == 12_031
    assert round(w.prompt_tokens.mean()) == 12_035 and round(w.output_tokens.mean()) == 343


# ------------------------------------------------------------------------------- length pairs
@pytest.mark.parametrize(
    "name",
    ["sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"],
)
def test_length_file_filters_match_an_independent_count(name):
    path = shared() / "sarathi_vidur_length_dists" / name
    with open(path) as fh:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(fh)]
    expect = [(p, o) for p, o in rows if 4 <= p <= 1024 and o >= 4 and p + o <= 2048]
    cfg = LengthsConfig(file=str(path), min_prompt=4, max_prompt=1024, min_output=4, max_total=2048)
    p, o, notes = sample_length_pairs(cfg, None, 5000, np.random.default_rng(0))
    assert f"kept {len(expect):,} of {len(rows):,} rows" in notes[0]
    assert set(zip(p.tolist(), o.tolist())) <= set(expect)


# ------------------------------------------------------------------------------------ servegen
def test_servegen_m_small_window_counts_within_rounding():
    """Each client's count in a window is floor or ceil of rate x rate_scale x 600."""
    cfg = ServeGenArrivalConfig(process="servegen", dir=str(shared() / "servegen/language/m-small"),
                                start_s=338_400, rate_scale=0.01)
    a = servegen_arrivals(cfg, None, np.random.default_rng(0), duration_s=3600)
    fits = [read_client_fits(p) for p in client_files(cfg, None)]
    counts = np.histogram(a, bins=np.arange(7) * 600.0)[0]
    for i, c in enumerate(counts):
        w = int((338_400 + 600 * i) // 600)
        exp = np.array([f.rate[w] * 0.01 * 600 if f.pattern[w] else 0.0 for f in fits])
        assert np.floor(exp).sum() <= c <= np.ceil(exp).sum()


# ----------------------------------------------------------------------------------- scenarios
def build(path: Path, seed: int = 1) -> Workload:
    """A minimal wiring of the blocks this module owns (the engine's generator does the same)."""
    raw = yaml.safe_load(path.read_text())
    wl, base, n = raw["workload"], path.parent, raw["stop"].get("requests")
    rng = np.random.default_rng(seed)
    classes = ClassAssignmentConfig(**wl["classes"]) if "classes" in wl else None
    if "trace" in wl:
        return load_trace(TraceConfig(**wl["trace"]), base, classes)
    arr = wl["arrival"]
    if arr["process"] == "servegen":
        starts = servegen_arrivals(ServeGenArrivalConfig(**arr), base, rng, n_max=n)
    else:
        starts = np.cumsum(rng.exponential(1 / arr["rate"], n))
    if "sessions" in wl:
        w = synthesize_sessions(SessionsConfig(**wl["sessions"]), starts, rng, base, max_requests=n)
        k = assign_classes(classes, w.prompt_tokens, w.output_tokens)
        return Workload(**{**w.__dict__, "klass": k})
    p, o, notes = sample_length_pairs(LengthsConfig(**wl["lengths"]), base, len(starts), rng)
    return Workload(arrival_s=starts, prompt_tokens=p, output_tokens=o,
                    klass=assign_classes(classes, p, o), notes=notes)


SCENARIO_FILES = sorted(SCENARIOS.glob("*.yaml"))


def test_scenario_folder_holds_the_promised_files():
    names = {p.stem for p in SCENARIO_FILES}
    assert {"azure_conv", "azure_code", "mooncake_conversation", "sharegpt_poisson", "arxiv_poisson",
            "servegen_m_small"} <= names


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
def test_each_trace_scenario_builds_a_workload(path):
    shared()
    w = build(path)
    assert len(w) > 0 and w.notes
    assert np.all(np.diff(w.arrival_s) >= 0)
    assert np.all(w.prompt_tokens + w.output_tokens <= 32_768)
    assert w.prompt_tokens.min() >= 1 and w.output_tokens.min() >= 1


@pytest.mark.parametrize("name", ["mooncake_conversation", "chat_sessions"])
def test_prefix_scenarios_share_prefixes_at_the_engine_block_size(name):
    """The property the [kv] tests lean on: at the engine's 16-token blocks many requests share
    leading blocks with an earlier request."""
    shared()  # skips when ../shared is absent
    w = expand_prefix_blocks(build(SCENARIOS / f"{name}.yaml"), 16)
    assert w.prefix_block_tokens == 16
    first = w.prefix_hashes[w.prefix_offsets[:-1][np.diff(w.prefix_offsets) > 0]]
    s = np.sort(first)
    assert np.count_nonzero(s[10:] == s[:-10]) > 0  # a first block shared by > 10 requests
    repeats = 1 - distinct(w.prefix_hashes) / len(w.prefix_hashes)
    assert repeats > 0.2
