"""Charts in notebooks that draw offline, and column names altair reads as written.

* **Offline.** Altair's default renderers load Vega, Vega-Lite and vega-embed from a CDN: with
  no network (a cluster node, a plane, a locked-down lab) every chart stays blank, silently.
  :func:`offline_charts` registers and enables a renderer that puts vl-convert's bundle of the
  three (the same one ``report.html`` inlines) into the notebook once, then draws each chart
  with it. ``from servesim.report import offline_charts; offline_charts()`` at the top of a
  notebook; the bundled notebooks do it.
* **Dotted names.** ``simulate_many`` and sweep rows name axes by their dotted scenario path
  (``workload.arrival.rate``). Vega-Lite reads a dot in a field name as "the field ``rate`` of
  the field ``arrival`` of ...", finds nothing, and draws an empty chart without an error.
  :func:`field` escapes such a name (``alt.X(field("workload.arrival.rate"), type="quantitative")``),
  and :func:`plain_columns` returns a copy of a frame whose dotted column names are made plain
  (``workload.arrival.rate`` -> ``workload_arrival_rate``) for charting.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

RENDERER = "servesim-offline"
_ids = itertools.count()
_bundle_sent: set[str] = set()  # vl versions whose bundle this kernel's page already holds


def field(name: str) -> str:
    """``name`` as a Vega-Lite field: dots and brackets escaped, so ``workload.arrival.rate`` is
    the column of that name, not a nested field (which draws an empty chart)."""
    return "".join("\\" + c if c in ".[]\\" else c for c in str(name))


def plain_columns(df: "pd.DataFrame") -> "pd.DataFrame":
    """A copy of ``df`` whose column names hold no '.', '[' or ']' (each becomes '_'): charts can
    name them as they are. Refuses names that would then collide."""
    new = {c: str(c).replace(".", "_").replace("[", "_").replace("]", "_") for c in df.columns}
    seen: dict[str, str] = {}
    for old, n in new.items():
        if n in seen and seen[n] != old:
            raise ValueError(f"columns {seen[n]!r} and {old!r} would both become {n!r}; rename one first")
        seen[n] = old
    return df.rename(columns=new)


def offline_html(spec: dict, bundle: str | None = None) -> str:
    """The HTML that draws ``spec`` with the inlined bundle (``bundle``: the JavaScript; None
    means it is on the page already). Nothing is fetched from the network."""
    div = f"servesim-chart-{next(_ids)}"
    payload = json.dumps(spec, separators=(",", ":")).replace("</", "<\\/")
    head = f"<script>{bundle}</script>" if bundle is not None else ""
    return (f'{head}<div id="{div}"></div><script>(function () {{ var spec = {payload}; '
            f'vegaEmbed("#{div}", spec, {{renderer: "svg", actions: false}}).catch(function (e) {{ '
            f'document.getElementById("{div}").textContent = "chart error: " + e; }}); }})();</script>')


def _render(spec: dict, **_metadata) -> dict:
    from servesim.report.page import js_bundle, vl_version

    v = vl_version()
    bundle = None if v in _bundle_sent else js_bundle(v)
    _bundle_sent.add(v)
    return {"text/html": offline_html(spec, bundle)}


def offline_charts() -> None:
    """Draw every altair chart of this notebook offline (see the module docstring). The first
    chart carries the Vega bundle (about 1 MB); later ones reuse it."""
    import altair as alt

    alt.renderers.register(RENDERER, _render)
    if alt.renderers.active not in ("default", RENDERER):
        return  # a renderer chosen on purpose (e.g. "json", to capture the specs) stays
    _bundle_sent.clear()  # a new page (a restarted kernel re-runs this): send the bundle again
    alt.renderers.enable(RENDERER)
