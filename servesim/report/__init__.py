"""What users look at: the console (console.py), and reports (altair charts in one
self-contained HTML page, or PNG/SVG files).

    rundata ─► curves ─► charts ─┐
    (a run folder or a Result)   ├─► page ─► report.html, charts/NN-name.png|svg
    tables (header, deltas) ─────┘
    build: a run's report, a comparison     sweepdata ─► sweepcharts ─► sweepreport: a sweep's

Nothing is imported here: ``servesim run`` prints through console.py without paying for altair.
"""
