"""Per-request output in bounded memory: chunked parquet, latency sketches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from servesim.engine.state import FINISHED, Reject, RequestTable
from servesim.metrics.collect import Recorder
from servesim.metrics.sketch import LogSketch
from servesim.metrics.summary import STATUS_NAMES, request_columns

CHUNK_ROWS = 1 << 20
REJECT_LABELS = [""] + [Reject.NAMES[k] for k in sorted(Reject.NAMES)]


def _arrow(cols: dict[str, np.ndarray]) -> pa.Table:
    arrays = {}
    for name, col in cols.items():
        if name == "status":
            arrays[name] = pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int8)), pa.array(STATUS_NAMES))
        elif name == "reject_reason":
            arrays[name] = pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int8)), pa.array(REJECT_LABELS))
        else:
            arrays[name] = pa.array(col)
    return pa.table(arrays)


def write_requests_parquet(req: RequestTable, path: Path) -> None:
    """One row per request, written ``CHUNK_ROWS`` rows at a time (one row group each)."""
    writer = None
    try:
        for lo in range(0, max(req.n, 1), CHUNK_ROWS):
            table = _arrow(request_columns(req, lo, min(lo + CHUNK_ROWS, req.n)))
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def latency_sketches(req: RequestTable, rec: Recorder, warmup: int, rel_err: float = 0.01) -> dict[str, LogSketch]:
    meas = np.flatnonzero(req.status == FINISHED)
    meas = meas[meas >= warmup]
    arrival = req.arrival[meas]
    ttft = req.t_first_token[meas] - arrival
    e2e = req.t_finish[meas] - arrival
    out = req.output[meas]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), np.nan)
    sk = {
        "ttft": LogSketch(rel_err).add(ttft),
        "tpot": LogSketch(rel_err).add(tpot),
        "e2e": LogSketch(rel_err).add(e2e),
        "queue": LogSketch(rel_err).add(req.t_first_sched[meas] - arrival),
        "itl": LogSketch(rel_err),
    }
    rec.flush()
    for v, w in rec.itl.parts():
        sk["itl"].add(np.asarray(v), np.asarray(w))
    return sk
