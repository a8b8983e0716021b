"""The on-disk memo of derived inputs (packs' step-time models, length traces): a later process
reads what an earlier one built, and never reads an entry whose inputs or code changed."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import diskmemo
from servesim.diskmemo import disk_memo, stamp


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SERVESIM_NO_DISK_MEMO", raising=False)
    return tmp_path / "cache"


def counting(value):
    calls = []

    def build():
        calls.append(1)
        return value

    return build, calls


def test_second_call_reads_the_first_ones_value(cache):
    build, calls = counting({"x": np.arange(5)})
    a = disk_memo("t", ("k", 1), build)
    b = disk_memo("t", ("k", 1), build)
    assert len(calls) == 1
    assert np.array_equal(a["x"], b["x"])
    assert list((cache / "servesim-data" / "t").glob("*.pkl"))


def test_another_key_builds_again(cache):
    build, calls = counting(3)
    disk_memo("t", ("k", 1), build)
    disk_memo("t", ("k", 2), build)
    disk_memo("u", ("k", 1), build)
    assert len(calls) == 3


def test_an_edited_input_file_is_a_new_key(cache, tmp_path):
    src = tmp_path / "trace.csv"
    src.write_text("a\n")
    build, calls = counting(1)
    disk_memo("t", (stamp(src),), build)
    src.write_text("ab\n")  # another size (and modification time)
    disk_memo("t", (stamp(src),), build)
    assert len(calls) == 2


def test_a_damaged_entry_is_rebuilt(cache):
    build, calls = counting([1, 2])
    disk_memo("t", ("k",), build)
    (entry,) = (cache / "servesim-data" / "t").glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    assert disk_memo("t", ("k",), build) == [1, 2]
    assert len(calls) == 2
    assert disk_memo("t", ("k",), build) == [1, 2] and len(calls) == 2  # the rebuilt entry is read


def test_switched_off_by_the_environment(cache, monkeypatch):
    monkeypatch.setenv("SERVESIM_NO_DISK_MEMO", "1")
    build, calls = counting(1)
    disk_memo("t", ("k",), build)
    disk_memo("t", ("k",), build)
    assert len(calls) == 2
    assert not (cache / "servesim-data").exists()


def test_an_unwritable_cache_only_costs_the_speed_up(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder would be: mkdir fails
    monkeypatch.setattr(diskmemo, "cache_bases", lambda: (blocked, blocked))
    build, calls = counting(7)
    assert disk_memo("t", ("k",), build) == 7
    assert disk_memo("t", ("k",), build) == 7
    assert len(calls) == 2


def test_a_memoized_pack_model_predicts_what_a_fresh_one_does(cache, monkeypatch):
    from servesim.perf import packmodel

    packmodel._cached_model.cache_clear()
    fresh = packmodel.load_pack_model("a100-80g", "llama-3-8b")  # builds and stores
    packmodel._cached_model.cache_clear()
    read = packmodel.load_pack_model("a100-80g", "llama-3-8b")  # this one comes from disk
    packmodel._cached_model.cache_clear()
    assert read is not fresh
    assert list((cache / "servesim-data" / "pack-models").glob("*.pkl"))
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 200))
        new = rng.integers(1, 2, n)
        new[: int(rng.integers(0, 4))] = rng.integers(16, 3000)
        ctx = rng.integers(1, 4000, n)
        assert read.predict(new, ctx) == fresh.predict(new, ctx)


def test_memoized_length_pairs_equal_the_file_read(cache, tmp_path):
    from servesim.config.traces import LengthsConfig
    from servesim.workload import traces

    f = tmp_path / "pairs.csv"
    f.write_text("prompt,output\n" + "".join(f"{10 + i},{1 + i % 7}\n" for i in range(50)) + "x,3\n")
    cfg = LengthsConfig(file=str(f), prompt_column="prompt", output_column="output", on_bad_row="skip",
                         clip_total=40)
    traces._cached_pairs.cache_clear()
    p1, o1, notes1 = traces.load_length_pairs(cfg, None)
    traces._cached_pairs.cache_clear()
    p2, o2, notes2 = traces.load_length_pairs(cfg, None)
    traces._cached_pairs.cache_clear()
    assert np.array_equal(p1, p2) and np.array_equal(o1, o2) and notes1 == notes2
    assert any("malformed" in n for n in notes2)  # the skipped row is still reported from the memo
    assert not p2.flags.writeable

