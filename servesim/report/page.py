"""One self-contained HTML page of charts, and the same charts as static PNG/SVG files.

The page inlines Vega, Vega-Lite and vega-embed (the bundle vl-convert ships, matched to the
Vega-Lite version altair writes), every chart's spec and data, and its stylesheet: it opens from
a file, offline, and fetches nothing. Charts render as SVG. When every chart has rendered, the
page sets ``data-rendered="yes"`` on ``<body>`` (``"error"`` if one failed, with the error on the
console): the browser test waits for it.

Static files come from vl-convert, which runs the same Vega in-process (no browser).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from html import escape
from pathlib import Path
from typing import Iterable

from servesim.report.charts import Figure

FORMATS = ("html", "png", "svg")

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1180px;
       padding: 0 16px; color: #1d2330; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #dde;
     padding-bottom: 4px; } h3 { font-size: 15px; margin: 0 0 6px; }
.sub { color: #5a6275; margin: 0 0 12px; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 13px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e6e8ee; text-align: left; vertical-align: top; }
table.num td + td, table.num th + th { text-align: right; font-variant-numeric: tabular-nums; }
table.kv td:first-child { color: #5a6275; white-space: nowrap; }
span.better { color: #137333; } span.worse { color: #b3261e; }
.grid { display: flex; flex-wrap: wrap; gap: 18px; }
figure { margin: 0 0 18px; padding: 10px 12px; border: 1px solid #e6e8ee; border-radius: 6px; background: #fff; }
figure.narrow { flex: 1 1 460px; } figure.wide { flex: 1 1 100%; }
figcaption { color: #5a6275; font-size: 12.5px; margin-top: 6px; max-width: 900px; }
details { margin: 8px 0; }
pre { background: #f6f7f9; padding: 10px; overflow: auto; font-size: 12px; max-height: 480px; }
p.note { color: #5a6275; }
"""

SCRIPT = """
(function () {
  var specs = JSON.parse(document.getElementById('report-specs').textContent);
  var jobs = specs.map(function (s) {
    return vegaEmbed('#' + s.id, s.spec, {renderer: 'svg', actions: false});
  });
  Promise.all(jobs).then(function () { document.body.setAttribute('data-rendered', 'yes'); })
    .catch(function (err) { document.body.setAttribute('data-rendered', 'error'); console.error(err); });
})();
"""


@lru_cache(maxsize=4)
def js_bundle(vl_version: str) -> str:
    """Vega + Vega-Lite + vega-embed as one script (vl-convert's bundle; a few seconds, once)."""
    import vl_convert as vlc

    return vlc.javascript_bundle(vl_version=vl_version)


def vl_version() -> str:
    """``v6.4`` for altair's ``v6.4.1`` schema: the bundle matching the specs altair writes."""
    import altair as alt

    m = re.match(r"v?(\d+)\.(\d+)", alt.SCHEMA_VERSION)
    return f"v{m.group(1)}.{m.group(2)}" if m else alt.SCHEMA_VERSION


def _script_json(obj) -> str:
    """JSON safe inside a <script> element (no '</' to close it early)."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")


def render(title: str, subtitle: str, header_html: str, sections: list[tuple[str, list[Figure]]],
           footer_html: str = "") -> str:
    """The whole page. ``header_html`` and section contents are trusted HTML built by the report
    modules (which escape user text); ``title`` and ``subtitle`` are escaped here."""
    specs, body = [], []
    if not sections:
        body.append('<p class="note">Nothing to chart: no measured request and no iteration.</p>')
    n = 0
    for name, figs in sections:
        body.append(f"<h2>{escape(name)}</h2>")
        body.append('<div class="grid">')
        for fig in figs:
            n += 1
            fid = f"fig-{n}"
            specs.append({"id": fid, "slug": fig.slug, "spec": fig.spec()})
            body.append(f'<figure class="{"wide" if fig.wide else "narrow"}" data-slug="{escape(fig.slug)}">'
                        f"<h3>{escape(fig.title)}</h3><div class=\"vis\" id=\"{fid}\"></div>"
                        f"<figcaption>{escape(fig.caption)}</figcaption></figure>")
        body.append("</div>")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # nothing may be fetched: the policy makes any attempt fail (and show on the console)
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; font-src data:\">",
        f"<title>{escape(title)}</title>",
        f"<style>{STYLE}</style>",
        f"<script>{js_bundle(vl_version())}</script>",
        "</head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="sub">{escape(subtitle)}</p>',
        header_html,
        *body,
        footer_html,
        f'<script type="application/json" id="report-specs">{_script_json(specs)}</script>',
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ])


def parse_formats(text: Iterable[str] | str | None) -> tuple[str, ...]:
    """``html``, ``png,svg`` or a list of them -> distinct formats in order; bad ones raise
    :class:`~servesim.errors.ReportError` naming the value and the allowed ones."""
    from servesim.errors import ReportError

    items = [text] if isinstance(text, str) else list(text or ["html"])
    out: list[str] = []
    for item in items:
        for f in str(item).split(","):
            f = f.strip().lower()
            if f not in FORMATS:
                raise ReportError(f"--format {f!r}: not a report format (allowed: {', '.join(FORMATS)}; "
                                  f"several as html,png)")
            if f not in out:
                out.append(f)
    return tuple(out) or ("html",)


def write_static(sections: list[tuple[str, list[Figure]]], folder: Path, fmt: str, scale: float = 2.0) -> list[Path]:
    """Every chart as ``folder/NN-slug.<fmt>`` (vl-convert: the same Vega, no browser)."""
    import vl_convert as vlc

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    n = 0
    for _, figs in sections:
        for fig in figs:
            n += 1
            path = folder / f"{n:02d}-{fig.slug}.{fmt}"
            spec = fig.spec()
            tmp = path.with_name(f".{path.name}.partial")
            if fmt == "svg":
                tmp.write_text(vlc.vegalite_to_svg(spec, vl_version=vl_version()))
            else:
                tmp.write_bytes(vlc.vegalite_to_png(spec, vl_version=vl_version(), scale=scale))
            tmp.replace(path)
            paths.append(path)
    return paths


def write_outputs(sections: list[tuple[str, list[Figure]]], folder: Path, formats: tuple[str, ...],
                  page: "callable") -> list[Path]:
    """Write ``report.html`` (``page()`` makes its text) and/or the static charts under
    ``folder/charts/``; files are written under temporary names and renamed when complete."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    if "html" in formats:
        path = folder / "report.html"
        tmp = folder / ".report.html.partial"
        tmp.write_text(page(), encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    for fmt in formats:
        if fmt != "html":
            written += write_static(sections, folder / "charts", fmt)
    return written
