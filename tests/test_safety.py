"""Safety: scenario and trace files are data only; a plug-in policy is imported only from the
import path the user wrote, and only when the run is built; output never leaves the chosen
folder."""

from __future__ import annotations

import json
import os
import pickle
import sys

import pytest
import yaml
from typer.testing import CliRunner

from servesim import load_scenario
from servesim.cli import app
from servesim.errors import ScenarioError
from tests.conftest import BASE, merge

runner = CliRunner()


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit)
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


def run(tmp_path, text: str, *extra: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out"), *extra])


# ------------------------------------------------------------------------------ data only
@pytest.mark.parametrize("tag", [
    "!!python/object/apply:os.system [\"touch {marker}\"]",
    "!!python/object/new:os.system [\"touch {marker}\"]",
    "!!python/name:os.system",
    "!!python/module:os",
])
def test_yaml_python_tags_are_refused_never_run(tmp_path, tag):
    marker = tmp_path / "ran"
    text = yaml.safe_dump(BASE) + f"notes: {tag.format(marker=marker)}\n"
    line = one_error_line(run(tmp_path, text))
    assert "python" in line or "tag" in line
    assert not marker.exists()
    # the same through --set
    line = one_error_line(run(tmp_path, yaml.safe_dump(BASE), "--set", f"name={tag.format(marker=marker)}"))
    assert not marker.exists()


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["trace", "lengths"])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".pkl", ".gz"])
def test_a_pickle_given_as_a_data_file_is_never_unpickled(tmp_path, where, suffix):
    marker = tmp_path / "ran"
    data = tmp_path / f"data{suffix}"
    data.write_bytes(pickle.dumps(_Payload(marker)))
    raw = merge(BASE, {})
    if where == "trace":
        raw["workload"] = {"trace": {"file": str(data), "format": "mooncake" if suffix == ".jsonl" else "azure"}}
    else:
        del raw["workload"]["prompt"], raw["workload"]["output"]
        raw["workload"]["lengths"] = {"file": str(data)}
    one_error_line(run(tmp_path, yaml.safe_dump(raw)))
    assert not marker.exists()


def test_a_python_file_given_as_a_trace_is_read_as_text(tmp_path):
    marker = tmp_path / "ran"
    src = tmp_path / "evil_trace.py"
    src.write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    raw = merge(BASE, {})
    raw["workload"] = {"trace": {"file": str(src), "format": "azure"}}
    one_error_line(run(tmp_path, yaml.safe_dump(raw)))
    assert not marker.exists() and "evil_trace" not in sys.modules


# ------------------------------------------------------------------------------ plug-ins
PLUGIN = '''
import pathlib
pathlib.Path({marker!r}).write_text("imported")

def touch(*a, **k):
    pathlib.Path({called!r}).write_text("called")

class Policy:
    base = "vllm"
    parts = {{"head": None}}
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    name = f"plugin_{os.getpid()}_{tmp_path.name}".replace("-", "_")
    marker, called = tmp_path / "imported", tmp_path / "called"
    (tmp_path / f"{name}.py").write_text(PLUGIN.format(marker=str(marker), called=str(called)))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker, called
    sys.modules.pop(name, None)


def test_loading_a_scenario_imports_no_policy(tmp_path, plugin):
    name, marker, _ = plugin
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(merge(BASE, {"engine": {"scheduler": f"{name}:Policy"}})))
    load_scenario(path)
    assert not marker.exists() and name not in sys.modules


def test_building_imports_exactly_the_path_written(tmp_path, plugin):
    """The run imports the module it names (a part of None is then refused in one line)."""
    name, marker, _ = plugin
    res = run(tmp_path, yaml.safe_dump(merge(BASE, {"engine": {"scheduler": f"{name}:Policy"}})))
    line = one_error_line(res)
    assert marker.exists() and "part 'head' is not a function" in line


def test_a_function_named_as_a_policy_is_never_called(tmp_path, plugin):
    name, marker, called = plugin
    line = one_error_line(run(tmp_path, yaml.safe_dump(merge(BASE, {"engine": {"scheduler": f"{name}:touch"}}))))
    assert "not a policy class" in line and marker.exists() and not called.exists()
    line = one_error_line(run(tmp_path, yaml.safe_dump(merge(BASE, {"engine": {"scheduler": "os:system"}}))))
    assert "not a policy class" in line


@pytest.mark.parametrize("path", ["os.system", "../evil:Policy", "evil/mod:Policy", ".relative:Policy",
                                  "mod:Policy.attr", "mod:", ":Policy", "import os:x"])
def test_only_plain_import_paths_are_accepted(tmp_path, path):
    line = one_error_line(run(tmp_path, yaml.safe_dump(merge(BASE, {"engine": {"scheduler": path}}))))
    assert "engine.scheduler" in line


def test_module_names_in_data_fields_are_never_imported(tmp_path, plugin):
    """Strings elsewhere in a scenario are names and paths, read as data: the run, the stream
    name, the class label, a tier name."""
    name, marker, _ = plugin
    raw = merge(BASE, {"name": name, "engine": {"enable_prefix_caching": True},
                       "kv_tiers": [{"kind": "cpu", "capacity_gib": 0.01, "name": name}]})
    raw["workload"] = {"streams": [{"name": name, "class": f"{name}", "priority": 1,
                                    "arrival": {"process": "poisson", "rate": 10.0},
                                    "prompt": {"dist": "fixed", "value": 16}, "output": {"dist": "fixed", "value": 4}}]}
    res = run(tmp_path, yaml.safe_dump(raw))
    assert res.exit_code == 0, res.output
    assert not marker.exists() and name not in sys.modules


# ------------------------------------------------------------------------------- outputs
@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "..", ".", "a/b", "a\\b", ""])
def test_a_run_name_cannot_point_outside_out(tmp_path, name):
    line = one_error_line(run(tmp_path, yaml.safe_dump(merge(BASE, {"name": name}))))
    assert "name" in line
    line = one_error_line(run(tmp_path, yaml.safe_dump(BASE), "--set", f"name={json.dumps(name)}"))
    assert "name" in line


def test_symlinks_in_the_output_folder_are_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    for name in ["summary.json", ".summary.json.partial", "requests.parquet", ".timeseries.parquet.partial",
                 ".sketches.json.partial", ".scenario.resolved.yaml.partial", ".requests.parquet.partial"]:
        (out / name).symlink_to(outside)
    res = run(tmp_path, yaml.safe_dump(BASE), "--force")
    assert res.exit_code == 0, res.output
    assert outside.read_text() == "keep me"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["requests.parquet", "scenario.resolved.yaml", "sketches.json", "summary.json",
                     "timeseries.parquet"]
    assert not any((out / f).is_symlink() for f in files)


def test_a_run_writes_nothing_outside_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(merge(BASE, {"name": "mine"})))
    before = {p for p in tmp_path.rglob("*")}
    res = runner.invoke(app, ["run", "s.yaml"])
    assert res.exit_code == 0, res.output
    new = sorted(str(p.relative_to(tmp_path)) for p in set(tmp_path.rglob("*")) - before)
    assert new == ["out", "out/mine", "out/mine/requests.parquet", "out/mine/scenario.resolved.yaml",
                   "out/mine/sketches.json", "out/mine/summary.json", "out/mine/timeseries.parquet"]


def test_the_library_refuses_the_same(tmp_path):
    from servesim import scenario_from_dict

    with pytest.raises(ScenarioError, match="name"):
        scenario_from_dict(merge(BASE, {"name": "../escape"}))
