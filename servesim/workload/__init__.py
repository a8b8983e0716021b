"""Workloads: arrivals, lengths, classes, sessions, traces and streams, each from its own seeded
stream (docs/traces.md for the functions below)."""

from servesim.exports import exports

__all__, __getattr__ = exports(__name__, {
    "load_trace": "servesim.workload.traces",
    "load_length_pairs": "servesim.workload.traces",
    "sample_length_pairs": "servesim.workload.traces",
    "assign_classes": "servesim.workload.traces",
    "expand_prefix_blocks": "servesim.workload.chains",
    "synthesize_sessions": "servesim.workload.sessions",
    "servegen_arrivals": "servesim.workload.servegen",
})
