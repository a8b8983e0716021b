"""Reports render in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright; no browser download) with the network off. Every chart must draw an SVG with marks,
the page must request nothing but itself, and log no error or warning.

Skipped, with the reason, where /usr/bin/chromium or Playwright is absent (``.ci/run`` installs
the Debian packages where it can)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.report_fixtures import TIERS, TWO_CLASSES, inject_cluster, write_run, write_sweep

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium: install Debian's chromium and chromium-driver (apt-get install -y chromium "
                    "chromium-driver) to run the browser test")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def render(browser, page_path: Path) -> dict:
    """Open a report offline; what it requested, logged, and drew per chart."""
    ctx = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    requests, console, errors = [], [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: console.append((m.type, m.text)))
    page.on("pageerror", lambda e: errors.append(str(e)))
    url = page_path.resolve().as_uri()
    page.goto(url)
    page.wait_for_function("document.body.getAttribute('data-rendered') !== null", timeout=20_000)
    charts = page.evaluate("""() => Array.from(document.querySelectorAll('figure')).map(f => {
        const svg = f.querySelector('.vis svg');
        if (!svg) return {slug: f.dataset.slug, width: 0, marks: 0};
        const box = svg.getBoundingClientRect();
        // data marks (role-mark groups; not axes, grids or legends) with real geometry
        const marks = Array.from(svg.querySelectorAll('g.role-mark path, g.role-mark rect, g.role-mark line, '
                                                      + 'g.role-mark symbol, g.role-mark text'))
          .filter(e => { const b = e.getBBox(); return b.width > 0 || b.height > 0; }).length;
        return {slug: f.dataset.slug, width: box.width, height: box.height, marks: marks};
    })""")
    state = page.evaluate("document.body.getAttribute('data-rendered')")
    ctx.close()
    return {"state": state, "charts": charts, "requests": [u for u in requests if u != url],
            "console": [c for c in console if c[0] in ("error", "warning")], "errors": errors}


def assert_clean(out: dict, min_charts: int) -> None:
    assert out["state"] == "yes", out
    assert out["requests"] == [], out["requests"]
    assert out["console"] == [] and out["errors"] == [], (out["console"], out["errors"])
    assert len(out["charts"]) >= min_charts
    for c in out["charts"]:
        assert c["width"] > 50 and c["height"] > 50 and c["marks"] > 0, c


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    write_run(TWO_CLASSES, root / "a")
    write_run({**TWO_CLASSES, "engine": {**TWO_CLASSES["engine"], "max_num_seqs": 12}}, root / "b")
    write_run(TIERS, root / "tiers")
    inject_cluster(root / "tiers", [{"id": 0, "requests": 120, "busy_fraction": 0.9},
                                    {"id": 1, "requests": 80, "busy_fraction": 0.6}], {"load_imbalance": 1.2})
    write_sweep(root / "sweep")
    return root


def test_run_report_renders_offline(browser, folders):
    from servesim.report.build import write_run_report

    out = render(browser, write_run_report(folders / "tiers")[0])
    assert_clean(out, 10)
    slugs = {c["slug"] for c in out["charts"]}
    assert {"latency-ttft", "latency-itl", "kv-usage", "batch-composition", "tier-hits", "tier-traffic",
            "replicas"} <= slugs


def test_compare_and_sweep_reports_render_offline(browser, folders, tmp_path):
    from servesim.report.build import write_compare_report
    from servesim.report.sweepreport import write_sweep_report

    out = render(browser, write_compare_report([folders / "a", folders / "b"], tmp_path / "cmp")[0])
    assert_clean(out, 8)
    out = render(browser, write_sweep_report(folders / "sweep")[0])
    assert_clean(out, 10)
    assert any(c["slug"].startswith("pareto") for c in out["charts"])


def test_the_checks_can_fail(browser, tmp_path):
    """A chart that asks for remote data is caught: the page either requests it or logs the
    refusal (the page's content policy forbids fetching), and the chart draws no marks."""
    import altair as alt

    from servesim.report.charts import Figure
    from servesim.report.page import render as page

    chart = alt.Chart(alt.Data(url="https://example.invalid/data.csv")).mark_line().encode(x="a:Q", y="b:Q")
    path = tmp_path / "bad.html"
    path.write_text(page("bad", "", "", [("s", [Figure("remote", "remote data", chart)])]))
    out = render(browser, path)
    assert out["requests"] or out["console"] or out["errors"]
    assert out["charts"][0]["marks"] == 0
