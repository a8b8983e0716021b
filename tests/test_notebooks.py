"""The notebooks in notebooks/ (jupytext percent-format .py files) execute end to end, as a
reader would run them in Jupyter, at small sizes (SERVESIM_NOTEBOOK_QUICK=1), and each ends with
charts that render (its last cell's Vega-Lite output converts to an SVG with marks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.notebooks

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))


def test_the_notebooks_named_in_the_readme_exist():
    assert {p.stem for p in NOTEBOOKS} >= {"quickstart", "capacity_planning", "fragmentation_study",
                                           "calibration_quality"}


def _vegalite(outputs: list) -> list[dict]:
    """The Vega-Lite specs among a cell's outputs."""
    return [data for o in outputs for mime, data in (o.get("data") or {}).items()
            if mime == "application/json" and "vega-lite" in str(data.get("$schema", ""))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_ends_with_charts(path: Path, tmp_path, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    import nbformat
    import vl_convert as vlc

    monkeypatch.setenv("SERVESIM_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("SERVESIM_NOTEBOOK_OUT", str(tmp_path))
    nb = jupytext.read(path)
    # charts as Vega-Lite specs in the outputs, so the test can check them (altair 6's own mimetype,
    # application/vnd.vegalite.v6.json, is not a JSON mimetype to nbformat's schema: plain JSON)
    nb.cells.insert(0, nbformat.v4.new_code_cell('import altair as alt\nalt.renderers.enable("json")'))
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",  # a cold machine compiles once
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=dict(os.environ))
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    last = _vegalite(code[-1].get("outputs", []))
    assert last, f"{path.name}: the last cell shows no chart"
    charts = [spec for c in code for spec in _vegalite(c.get("outputs", []))]
    for spec in charts:
        svg = vlc.vegalite_to_svg(spec)
        assert svg.startswith("<svg") and svg.count("<path") + svg.count("<rect") > 5
