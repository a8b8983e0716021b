"""Sweep specs: axis forms, designs, zipped axes, point validation, keys; bad specs as one line."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from servesim.cli import app
from servesim.sweep.design import Axis, Dimension, SpecError, expand, parse_axis, unit_samples
from servesim.sweep.spec import load_spec, scenario_key, spec_from_dict
from tests.conftest import BASE, REPO, merge


def spec(**kw):
    return spec_from_dict({"base": BASE, **kw}, "s.yaml", REPO)


# ------------------------------------------------------------------------------------ axes
@pytest.mark.parametrize("raw,values", [
    ([1, 2, 3], (1, 2, 3)),
    ([1, 2.5], (1.0, 2.5)),
    ({"start": 2, "stop": 10, "step": 4}, (2, 6, 10)),
    ({"start": 2, "stop": 11, "step": 4}, (2, 6, 10)),
    ({"start": 0.5, "stop": 1.5, "step": 0.5}, (0.5, 1.0, 1.5)),
    ({"start": 16, "stop": 256, "num": 5, "scale": "log"}, (16, 32, 64, 128, 256)),
    ({"start": 1, "stop": 2, "num": 3}, (1.0, 1.5, 2.0)),
    ({"start": 1.0, "stop": 100.0, "num": 3, "scale": "log"}, (1.0, 10.0, 100.0)),
])
def test_axis_forms(raw, values):
    a = parse_axis("x", raw, "w")
    assert a.values == pytest.approx(values)
    assert [type(v) for v in a.values] == [type(v) for v in values]


@pytest.mark.parametrize("raw,needle", [
    ([], "no values"),
    ({"start": 1}, "start, stop and one of step or num"),
    ({"start": 1, "stop": 2, "step": 1, "num": 2}, "one of step or num"),
    ({"start": 5, "stop": 1, "step": 1}, "going from start"),
    ({"start": 0, "stop": 4, "num": 3, "scale": "log"}, "> 0 on a log scale"),
    ({"start": 1, "stop": 3, "num": 9, "type": "int"}, "repeats values"),
    ({"low": 2, "high": 1}, "low < high"),
    ({"low": 1, "high": 2, "num": 3}, "continuous range"),
    ({"start": 1, "stop": 2, "num": 2, "scale": "cubic"}, "linear, log"),
    ({"begin": 1}, "unknown key 'begin'"),
    ("fast", "not an axis"),
])
def test_axis_errors_are_one_line(raw, needle):
    with pytest.raises(SpecError) as err:
        parse_axis("engine.max_num_seqs", raw, "s.yaml: axes.engine.max_num_seqs")
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and msg.startswith("s.yaml: axes.engine.max_num_seqs")


def test_continuous_axis_maps_the_unit_interval():
    a = Axis("x", None, 10.0, 20.0)
    assert a.at(0.0) == 10.0 and a.at(0.5) == 15.0
    i = Axis("n", None, 1, 4, integer=True)
    assert [i.at(u) for u in (0.0, 0.24, 0.26, 0.99)] == [1, 1, 2, 4]
    lg = Axis("r", None, 1.0, 100.0, log=True)
    assert lg.at(0.5) == pytest.approx(10.0)


# --------------------------------------------------------------------------------- designs
def test_grid_order_first_axis_slowest_and_zip_moves_together():
    s = spec(axes={"workload.arrival.rate": [5, 10], "engine.max_num_seqs": [2, 4, 8]},
             zip=[{"engine.block_size": [8, 16], "engine.gpu_memory_utilization": [0.8, 0.9]}])
    vals = [p.values for p in s.points]
    assert len(vals) == 12
    assert vals[0] == {"workload.arrival.rate": 5, "engine.max_num_seqs": 2, "engine.block_size": 8,
                       "engine.gpu_memory_utilization": 0.8}
    assert vals[1]["engine.block_size"] == 16 and vals[1]["engine.gpu_memory_utilization"] == 0.9
    assert vals[2]["engine.max_num_seqs"] == 4 and vals[-1]["workload.arrival.rate"] == 10
    assert [p.scenario.engine.block_size for p in s.points[:2]] == [8, 16]


def test_lhs_puts_one_point_in_each_stratum():
    u = unit_samples("lhs", 3, 50, seed=4)
    for j in range(3):
        assert sorted(np.floor(u[:, j] * 50).astype(int)) == list(range(50))


def test_sampled_designs_are_reproducible_and_in_range():
    dims = [Dimension((Axis("workload.arrival.rate", None, 1.0, 8.0),)),
            Dimension((Axis("engine.max_num_seqs", (2, 4, 8)),))]
    for kind in ("random", "lhs", "sobol"):
        a, b = expand(dims, kind, 16, seed=3), expand(dims, kind, 16, seed=3)
        assert a == b and len(a) == 16
        assert all(1.0 <= p["workload.arrival.rate"] < 8.0 and p["engine.max_num_seqs"] in (2, 4, 8) for p in a)
        assert expand(dims, kind, 16, seed=4) != a


def test_grid_refuses_continuous_axes():
    with pytest.raises(SpecError, match="has no grid"):
        spec(axes={"workload.arrival.rate": {"low": 1, "high": 2}})


# -------------------------------------------------------------------------- points and keys
def test_every_point_is_validated_and_named():
    with pytest.raises(SpecError) as err:
        spec(axes={"engine.max_num_seqs": [4, -1]})
    msg = str(err.value)
    assert "point 1 (engine.max_num_seqs=-1)" in msg and "engine.max_num_seqs = -1" in msg and "\n" not in msg


def test_points_that_do_not_fit_the_gpu_are_found_at_load():
    with pytest.raises(SpecError, match=r"point 1 \(engine.gpu_memory_utilization=0.15\): model llama-3-8b does not fit"):
        spec(axes={"engine.gpu_memory_utilization": [0.9, 0.15]})


def test_invalid_skip_lists_points_instead_of_dropping_them():
    s = spec(axes={"engine.max_num_seqs": [4, -1, 8]}, invalid="skip")
    assert [p.index for p in s.points] == [0, 2]
    assert s.invalid_points[0][0] == 1 and "engine.max_num_seqs" in s.invalid_points[0][2]


def test_keys_name_configurations():
    s = spec(axes={"engine.max_num_seqs": [4, 8, 4]})
    keys = [p.key for p in s.points]
    assert keys[0] == keys[2] != keys[1]
    assert s.points[0].key == scenario_key(s.base.override({"engine.max_num_seqs": 4}))
    renamed = s.base.override({"name": "other", "engine.max_num_seqs": 4})
    assert scenario_key(renamed) == keys[0]  # the name changes no number


def test_seeds_derive_from_the_point():
    s = spec(axes={"seed": [10, 20]}, seeds=3)
    assert [s.seeds_of(p) for p in s.points] == [[10, 11, 12], [20, 21, 22]]
    s = spec(seeds=[5, 9])
    assert s.seeds_of(s.points[0]) == [5, 9]


@pytest.mark.parametrize("patch,needle", [
    ({"axis": {}}, "axis: unknown field"),
    ({"base": None}, "give a scenario file path"),
    ({"base": "nope.yaml"}, "no such scenario file"),
    ({"design": {"kind": "halton", "samples": 3}}, "allowed: grid, random, lhs, sobol"),
    ({"design": {"kind": "lhs"}}, "lhs needs an integer"),
    ({"design": {"kind": "grid", "samples": 3}}, "samples goes with"),
    ({"seeds": 0}, "give a count"),
    ({"seeds": [1, 1]}, "seeds repeat"),
    ({"metrics": ["ttft_p98"]}, "'ttft_p98' is not a metric"),
    ({"invalid": "ignore"}, "allowed: error, skip"),
    ({"zip": [{"engine.block_size": [8, 16], "engine.max_num_seqs": [2]}]}, "equally many values"),
    ({"axes": {"engine.block_size": [8]}, "zip": [{"engine.block_size": [8]}]}, "appears twice"),
    ({"axes": {"engine.blok_size": [8]}}, "engine.blok_size: unknown field"),
])
def test_bad_specs_one_line(tmp_path, patch, needle):
    raw = {"base": BASE, **patch}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError) as err:
        load_spec(f)
    assert needle in str(err.value) and "\n" not in str(err.value)
    res = CliRunner().invoke(app, ["sweep", str(f), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert res.exit_code == 2 and res.stderr.startswith("error:") and needle in res.stderr.replace("\n", " ")
    assert "Traceback" not in res.stderr


def test_bundled_example_specs_load():
    for path in sorted((REPO / "scenarios/sweeps").glob("*.yaml")):
        s = load_spec(path)
        assert s.points, path


def test_base_file_relative_to_spec(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(merge(BASE, {"name": "b"})))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "set": {"stop.requests": 20},
                                                     "axes": {"engine.max_num_seqs": [1, 2]}}))
    s = load_spec(tmp_path / "s.yaml")
    assert [p.scenario.stop.requests for p in s.points] == [20, 20] and s.name == "s"


def test_seeds_default_to_the_base_replications():
    s = spec_from_dict({"base": merge(BASE, {"stop": {"replications": 3}})}, "s.yaml", REPO)
    assert s.seeds_of(s.points[0]) == [1, 2, 3]


def _bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\nbase: x.yaml\n"


@pytest.mark.parametrize("content,needle", [
    (b"base: \xff\xfe\n", "not UTF-8"),
    (b"base: a\x00b\n", "not valid YAML"),
    (b"axes: {engine.block_size: [8]}\naxes: {engine.max_num_seqs: [2]}\nbase: b.yaml\n", "duplicate key 'axes'"),
    (_bomb().encode(), "alias bomb"),
    (b"set: &a [*a]\nbase: b.yaml\n", "recursive alias"),
    (b"base: !!python/object/apply:os.system ['true']\n", "python"),
    (b"", "empty"),
])
def test_spec_files_are_plain_yaml_data(tmp_path, content, needle):
    """A spec file is read like a scenario file (servesim/yamltext.py): a non-UTF-8 file was a
    traceback, a NUL byte a two-line message, and duplicate keys were accepted silently (the
    last one won)."""
    f = tmp_path / "bad.yaml"
    f.write_bytes(content)
    with pytest.raises(SpecError) as err:
        load_spec(f)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
    res = CliRunner().invoke(app, ["sweep", str(f), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert res.exit_code == 2 and res.stderr.startswith("error:") and "Traceback" not in res.stderr
    assert needle in " ".join(res.stderr.split()), res.stderr  # (the console wraps the one line)


def test_spec_folder_or_missing_is_one_line(tmp_path):
    for path, needle in ((tmp_path, "it is a folder"), (tmp_path / "nope.yaml", "no such sweep spec file")):
        with pytest.raises(SpecError, match=needle):
            load_spec(path)
