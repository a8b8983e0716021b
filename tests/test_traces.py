"""Trace and length-file loaders on tiny hand-written fixtures: exact requests, filters, errors,
replay transforms, class assignment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from servesim.errors import TraceError
from servesim.config.traces import ClassAssignmentConfig, LengthsConfig, TraceConfig
from servesim.workload.traces import (
    assign_classes,
    load_length_pairs,
    load_trace,
    replay_times,
    sample_length_pairs,
)

FIX = Path(__file__).parent / "fixtures" / "traces"


def trace(file: str, fmt: str, **kw) -> TraceConfig:
    return TraceConfig(file=file, format=fmt, **kw)


# ------------------------------------------------------------------------------------ azure
def test_azure_exact_requests_and_notes():
    w = load_trace(trace("azure_tiny.csv", "azure"), FIX)
    # row 5 (300 prompt, 0 output) falls to the default min_output 1
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.5, 1.5, 2.0, 10.0])
    np.testing.assert_array_equal(w.prompt_tokens, [100, 2000, 5000, 3, 700])
    np.testing.assert_array_equal(w.output_tokens, [10, 20, 5, 40, 70])
    np.testing.assert_array_equal(w.klass, [0, 0, 0, 0, 0])
    assert w.prompt_tokens.dtype == np.int64 and w.klass.dtype == np.int8
    assert not w.has_prefixes and w.session is None
    assert w.notes[0] == "azure azure_tiny.csv: kept 5 of 6 rows (dropped 1: 1 output < min_output 1)"
    assert w.notes[1].startswith("azure azure_tiny.csv: replay rate_scale 1: 5 requests over 10.0 s")


def test_azure_filters_keep_and_drop_exactly():
    cfg = trace("azure_tiny.csv", "azure", min_prompt=4, max_prompt=4096, max_total=1000)
    w = load_trace(cfg, FIX)
    # (2000, 20) is over max_total, (5000, 5) over max_prompt, (3, 40) under min_prompt, (300, 0)
    # under min_output 1 (0 is refused: an engine generates at least one token)
    np.testing.assert_array_equal(w.prompt_tokens, [100, 700])
    assert w.notes[0] == (
        "azure azure_tiny.csv: kept 2 of 6 rows (dropped 4: 1 prompt < min_prompt 4, 1 prompt > max_prompt 4,096, "
        "1 output < min_output 1, 1 total > max_total 1,000)"
    )


def test_rate_scale_2_halves_inter_arrival_times():
    w1 = load_trace(trace("azure_tiny.csv", "azure"), FIX)
    w2 = load_trace(trace("azure_tiny.csv", "azure", rate_scale=2.0), FIX)
    np.testing.assert_allclose(np.diff(w2.arrival_s), np.diff(w1.arrival_s) / 2)
    np.testing.assert_array_equal(w2.prompt_tokens, w1.prompt_tokens)


def test_time_window_and_gap_compression():
    cfg = trace("azure_tiny.csv", "azure", start_s=0.5, duration_s=3.5, max_gap_s=0.75)
    w = load_trace(cfg, FIX)
    # window [0.5, 4.0): rows at 0.5, 1.5, 2.0 ; gaps 0, 1.0 -> 0.75, 0.5
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.75, 1.25])
    np.testing.assert_array_equal(w.prompt_tokens, [2000, 5000, 3])
    assert w.notes[0] == "azure azure_tiny.csv: window 0 s–4 s holds 3 of 6 rows; kept 3"


def test_replay_times_function():
    t = np.array([10.0, 11.0, 31.0, 32.0])
    np.testing.assert_allclose(replay_times(t, 10.0, 1.0, None), [0, 1, 21, 22])
    np.testing.assert_allclose(replay_times(t, 10.0, 2.0, 5.0), [0, 0.5, 3.0, 3.5])


# --------------------------------------------------------------------------------- mooncake
def test_mooncake_exact_requests_and_shared_prefixes():
    w = load_trace(trace("mooncake_tiny.jsonl", "mooncake"), FIX)
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.5, 1.5, 2.0, 3.0])
    np.testing.assert_array_equal(w.prompt_tokens, [1200, 1100, 600, 512, 2000])
    np.testing.assert_array_equal(w.output_tokens, [10, 20, 30, 5, 8])
    assert w.prefix_block_tokens == 512
    np.testing.assert_array_equal(np.diff(w.prefix_offsets), [3, 3, 2, 1, 4])
    h = [w.hashes_of(i) for i in range(len(w))]
    # raw ids [0,1,2] [0,1,3] [0,4] [5] [0,1,7,8]: chains keep exactly these equalities
    assert h[0][0] == h[1][0] == h[2][0] == h[4][0]
    assert h[0][1] == h[1][1] == h[4][1]
    assert h[0][2] != h[1][2] and h[2][1] != h[0][1]
    assert h[3][0] != h[0][0]
    assert len(np.unique(w.prefix_hashes)) == 8  # distinct raw ids 0..8 minus the unused 6
    assert "prefix chains in 512-token blocks: 13 block refs, 8 distinct (38% repeats)" in w.notes[-2]


def test_mooncake_hash_block_check(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [0, 1, 2]}\n'
    )
    with pytest.raises(TraceError) as e:
        load_trace(trace(str(f), "mooncake"), None)
    assert str(e.value) == f"{f}:2: column hash_ids: 3 blocks of 512 tokens exceed input_length 600 (at most 2)"


# --------------------------------------------------------------------------------- burstgpt
def test_burstgpt_exact_requests_and_model_classes():
    classes = ClassAssignmentConfig(column="Model", values={"GPT-4": 0, "ChatGPT": 2})
    w = load_trace(trace("burstgpt_tiny.csv", "burstgpt"), FIX, classes)
    # the failed request (0 response tokens) is dropped by min_output 1; times shift by start_s 0
    np.testing.assert_allclose(w.arrival_s, [5.0, 118.0, 145.0, 160.0])
    np.testing.assert_array_equal(w.prompt_tokens, [472, 417, 1360, 5000])
    np.testing.assert_array_equal(w.output_tokens, [18, 276, 259, 100])
    np.testing.assert_array_equal(w.klass, [2, 0, 2, 0])
    assert "dropped 1: 1 output < min_output 1" in w.notes[0]


def test_class_rules_first_match_wins_over_column():
    classes = ClassAssignmentConfig(
        column="Log Type",
        values={"Conversation log": 1, "API log": 3},
        rules=[
            {"when": {"prompt_gt": 4096}, "klass": "P4"},
            {"when": {"column": "Model", "equals": "GPT-4", "output_gt": 200}, "klass": 0},
        ],
    )
    w = load_trace(trace("burstgpt_tiny.csv", "burstgpt"), FIX, classes)
    np.testing.assert_array_equal(w.klass, [1, 0, 1, 4])


def test_class_rules_on_lengths_only():
    cfg = ClassAssignmentConfig(rules=[{"when": {"prompt_gt": 1000}, "klass": 2},
                                       {"when": {"total_lt": 100}, "klass": 0}], default=1)
    k = assign_classes(cfg, np.array([2000, 50, 500]), np.array([1, 1, 1]))
    np.testing.assert_array_equal(k, [2, 0, 1])
    with pytest.raises(TraceError, match="classes use column 'Model'"):
        assign_classes(ClassAssignmentConfig(column="Model"), np.array([1]), np.array([1]))


def test_unmapped_class_value_is_an_error_at_its_line():
    with pytest.raises(TraceError) as e:
        load_trace(trace("burstgpt_tiny.csv", "burstgpt"), FIX, ClassAssignmentConfig(column="Model", values={"ChatGPT": 1}))
    assert str(e.value) == (
        f"{FIX / 'burstgpt_tiny.csv'}:4: column Model: value 'GPT-4' maps to no class "
        "(classes.values has: ChatGPT; a value may also be 0..4 or P0..P4)"
    )


def test_burstgpt_sessions_new_input_prompts_and_chains():
    cfg = trace("burstgpt_sessions.csv", "burstgpt", sessions={"column": "Session ID", "prompt": "new", "block_tokens": 16})
    w = load_trace(cfg, FIX)
    # s1: 40 ; 40+20+100 = 160 ; 160+12+16 = 188.  s2: 30.  no session: 50
    np.testing.assert_array_equal(w.prompt_tokens, [40, 30, 160, 50, 188])
    np.testing.assert_array_equal(w.session, [0, 1, 0, -1, 0])
    assert w.prefix_block_tokens == 16
    s1 = [w.hashes_of(i) for i in (0, 2, 4)]
    assert [len(h) for h in s1] == [2, 10, 11]
    np.testing.assert_array_equal(s1[1][:2], s1[0])
    np.testing.assert_array_equal(s1[2][:10], s1[1])
    assert not set(w.hashes_of(1)) & set(np.concatenate(s1))


# ----------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "body, message",
    [
        ("2023-11-16 18:00:00,100,10\n2023-11-16 18:00:01,abc,10\n", "{f}:3: column ContextTokens: 'abc' is not a non-negative integer"),
        ("2023-11-16 18:00:00,100,-5\n", "{f}:2: column GeneratedTokens: '-5' is not a non-negative integer"),
        ("2023-11-16 18:00:00,12.5,1\n", "{f}:2: column ContextTokens: '12.5' is not a non-negative integer"),
        ("yesterday,100,10\n", "{f}:2: column TIMESTAMP: 'yesterday' is not a time like 2023-11-16 18:17:03.98"),
        ("2023-11-16 18:00:00,100\n", "{f}:2: expected 3 fields like the header"),
    ],
)
def test_azure_malformed_row_one_line(tmp_path, body, message):
    f = tmp_path / "bad.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    with pytest.raises(TraceError) as e:
        load_trace(trace(str(f), "azure"), None)
    assert str(e.value) == message.format(f=f)
    assert "\n" not in str(e.value)


def test_skip_bad_rows_summarized(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00,100,10\n2023-11-16 18:00:01,x,10\n2023-11-16 18:00:02,200,y\n"
        "2023-11-16 18:00:03,300,30\n"
    )
    w = load_trace(trace(str(f), "azure", on_bad_row="skip"), None)
    np.testing.assert_array_equal(w.prompt_tokens, [100, 300])
    assert w.notes[0] == (
        f"azure bad.csv: skipped 2 malformed rows (first: {f}:3: column ContextTokens: 'x' is not a non-negative integer)"
    )


def test_missing_file_and_missing_column(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.csv: no such file$"):
        load_trace(trace("nope.csv", "azure"), tmp_path)
    f = tmp_path / "h.csv"
    f.write_text("TIMESTAMP,Prompt,GeneratedTokens\n")
    with pytest.raises(TraceError) as e:
        load_trace(trace(str(f), "azure"), None)
    assert str(e.value) == f"{f}:1: missing column 'ContextTokens' (header has: TIMESTAMP, Prompt, GeneratedTokens)"


def test_gzip_and_utc_offset_timestamps(tmp_path):
    """The Azure 2024 week-long files carry '+00:00' and are often kept gzipped."""
    import gzip

    f = tmp_path / "week.csv.gz"
    with gzip.open(f, "wt") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.000000+00:00,10,1\n2024-05-10 00:00:01.250000+00:00,20,2\n")
    w = load_trace(trace(str(f), "azure"), None)
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.25])


def test_mooncake_skip_counts_missing_fields(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 1, "input_length": 5, "hash_ids": [0]}\n'
        '[1, 2]\n'
    )
    w = load_trace(trace(str(f), "mooncake", on_bad_row="skip"), None)
    assert len(w) == 1
    assert w.notes[0] == f"mooncake m.jsonl: skipped 2 malformed rows (first: {f}:2: missing field 'output_length')"


def test_mooncake_malformed_json(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{"timestamp": 1,\n')
    with pytest.raises(TraceError, match=rf"^{f}:2: not a JSON object \("):
        load_trace(trace(str(f), "mooncake"), None)
    f.write_text('{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": [0]}\n')
    with pytest.raises(TraceError) as e:
        load_trace(trace(str(f), "mooncake"), None)
    assert str(e.value) == f"{f}:1: column timestamp: 'soon' is not a non-negative number"


def test_everything_filtered_is_an_error():
    with pytest.raises(TraceError, match="no rows left after the time window and length filters"):
        load_trace(trace("azure_tiny.csv", "azure", min_prompt=10_000), FIX)


def test_unsorted_rows_are_sorted_with_a_note(tmp_path):
    f = tmp_path / "u.jsonl"
    f.write_text(
        '{"timestamp": 2000, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1000, "input_length": 6, "output_length": 1, "hash_ids": [2]}\n'
    )
    w = load_trace(trace(str(f), "mooncake"), None)
    np.testing.assert_array_equal(w.prompt_tokens, [6, 5])
    np.testing.assert_allclose(w.arrival_s, [1.0, 2.0])
    assert any("not in time order" in n for n in w.notes)


# ------------------------------------------------------------------------------- length pairs
LENGTHS = dict(file="lengths_tiny.csv", min_prompt=4, max_prompt=1024, min_output=4, max_total=2048)


def test_length_pairs_filters_keep_exactly():
    p, o, notes = load_length_pairs(LengthsConfig(**LENGTHS), FIX)
    np.testing.assert_array_equal(p, [4, 1024, 100])
    np.testing.assert_array_equal(o, [4, 1024, 200])
    assert notes[-1] == (
        "lengths lengths_tiny.csv: kept 3 of 7 rows (dropped 4: 1 prompt < min_prompt 4, "
        "1 prompt > max_prompt 1,024, 1 output < min_output 4, 1 total > max_total 2,048)"
    )
    assert not p.flags.writeable


def test_sample_length_pairs_joint_and_deterministic():
    cfg = LengthsConfig(**LENGTHS)
    p1, o1, _ = sample_length_pairs(cfg, FIX, 200, np.random.default_rng(7))
    p2, o2, _ = sample_length_pairs(cfg, FIX, 200, np.random.default_rng(7))
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(o1, o2)
    pairs = set(zip(p1.tolist(), o1.tolist()))
    assert pairs == {(4, 4), (1024, 1024), (100, 200)}  # whole rows, never mixed


def test_length_pairs_jsonl_and_bad_column(tmp_path):
    f = tmp_path / "l.jsonl"
    f.write_text('{"input_length": 10, "output_length": 3}\n{"input_length": 12, "output_length": 5}\n')
    p, o, _ = load_length_pairs(LengthsConfig(file=str(f), prompt_column="input_length", output_column="output_length"), None)
    np.testing.assert_array_equal(p, [10, 12])
    with pytest.raises(TraceError, match="missing column 'num_prefill_tokens'"):
        load_length_pairs(LengthsConfig(file="azure_tiny.csv"), FIX)


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(rate_scale=0), r"rate_scale\n  Input should be greater than 0"),
        (dict(rate_scale=float("inf")), r"rate_scale\n  Input should be a finite number"),
        (dict(start_s=-1), r"start_s\n  Input should be greater than or equal to 0"),
        (dict(min_prompt=10, max_prompt=5), "min_prompt 10 exceeds max_prompt 5"),
        (dict(format="csv"), "'azure', 'mooncake' or 'burstgpt'"),
        (dict(format="mooncake", sessions={"column": "x"}), "mooncake traces carry no session ids"),
        (dict(bogus=1), "Extra inputs are not permitted"),
    ],
)
def test_trace_config_messages(kw, fragment):
    base = dict(file="t.csv", format="azure")
    base.update(kw)
    with pytest.raises(ValidationError, match=fragment):
        TraceConfig(**base)


def test_class_config_messages():
    with pytest.raises(ValidationError, match=r"7 is not a class \(allowed: 0..4 or P0..P4\)"):
        ClassAssignmentConfig(default=7)
    with pytest.raises(ValidationError, match="an empty condition matches everything"):
        ClassAssignmentConfig(rules=[{"when": {}, "klass": 1}])
    with pytest.raises(ValidationError, match="give 'column' too"):
        ClassAssignmentConfig(values={"a": 1})
    assert ClassAssignmentConfig(column="M", values={"x": "P3"}).values == {"x": 3}


def test_clip_total_truncates_proportionally():
    from servesim.workload.traces import clip_total

    p = np.array([3000, 100, 4100, 10])
    o = np.array([2000, 50, 1, 4095])
    cp, co, n = clip_total(p, o, 4096)
    assert n == 3
    assert ((cp + co) <= 4096).all() and (cp >= 1).all() and (co >= 1).all()
    assert (cp[1], co[1]) == (100, 50)  # under the limit: untouched
    # 5000 -> 4096: 904 excess, 60 % taken from the prompt (543), the rest from the output
    assert (cp[0], co[0]) == (3000 - 543, 4096 - (3000 - 543))
    assert (cp[2], co[2]) == (4095, 1)
    assert (cp[3], co[3]) == (9, 4087)  # 9 excess: ceil(9 * 10 / 4105) = 1 from the prompt


def test_a_trace_shorter_than_stop_requests_says_so():
    """Issue 17 (fewer requests than stop.requests): a trace cannot be extended, so the run
    header says how many it gives instead of running fewer silently."""
    from servesim import scenario_from_dict
    from servesim.simulate import scenario_workload as generate_workload
    from tests.conftest import BASE

    raw = {**BASE, "stop": {"requests": 1000},
           "workload": {"trace": {"file": str(FIX / "azure_tiny.csv"), "format": "azure"}}}
    w = generate_workload(scenario_from_dict(raw))
    assert len(w) == 5
    assert w.notes[-1] == "run: the workload gives 5 requests, fewer than stop.requests 1,000; all of them run"


def test_a_gz_that_is_not_gzip_is_one_line(tmp_path):
    """Issue 17: a plain CSV named .gz raised gzip.BadGzipFile with a traceback."""
    f = tmp_path / "plain.csv.gz"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,100,10\n")
    with pytest.raises(TraceError, match=r"plain\.csv\.gz: not a readable gzip file .*gzip-compressed text$"):
        load_trace(trace(str(f), "azure", on_bad_row="skip"), None)
    with pytest.raises(TraceError, match=r"not a readable gzip file"):
        load_length_pairs(LengthsConfig(file=str(f)), None)
