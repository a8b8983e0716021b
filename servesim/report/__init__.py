"""What users look at: the console (console.py), and reports (altair charts in one
self-contained HTML page, or PNG/SVG files).

    rundata ─► curves ─► charts ─┐
    (a run folder or a Result)   ├─► page ─► report.html, charts/NN-name.png|svg
    tables (header, deltas) ─────┘
    build: a run's report, a comparison     sweepdata ─► sweepcharts ─► sweepreport: a sweep's

Nothing is imported here until asked (servesim/exports.py): ``servesim run`` prints through console.py
without paying for altair.
"""

from servesim.exports import exports

__all__, __getattr__ = exports(__name__, {
    "charts": "servesim.report.charts",
    "write_run_report": "servesim.report.build",
    "write_compare_report": "servesim.report.build",
    "from_result": "servesim.report.rundata",
    "load_run": "servesim.report.rundata",
    "t_interval": "servesim.report.curves",
    "offline_charts": "servesim.report.notebook",
    "field": "servesim.report.notebook",
    "plain_columns": "servesim.report.notebook",
})
