"""Per-request output in bounded memory: chunked parquet, latency sketches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from servesim.request import FINISHED, Reject, RequestTable
from servesim.metrics.collect import Recorder
from servesim.metrics.sketch import LogSketch
from servesim.metrics.summary import LABEL_COLUMNS, STATUS_NAMES, Labels, request_columns

CHUNK_ROWS = 1 << 18
REJECT_LABELS = [""] + [Reject.NAMES[k] for k in sorted(Reject.NAMES)]


def _arrow(cols: dict[str, np.ndarray], labels: Labels | None = None) -> pa.Table:
    arrays = {}
    for name, col in cols.items():
        if labels is not None and name in LABEL_COLUMNS:
            names = labels.stream_names if name == "stream" else labels.class_names
            arrays[name] = pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int16)), pa.array(list(names)))
        elif name == "status":
            arrays[name] = pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int8)), pa.array(STATUS_NAMES))
        elif name == "reject_reason":
            arrays[name] = pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int8)), pa.array(REJECT_LABELS))
        else:
            arrays[name] = pa.array(col)
    return pa.table(arrays)


def write_requests_parquet(req: RequestTable, path: Path, labels: Labels | None = None) -> None:
    """One row per request, written ``CHUNK_ROWS`` rows at a time (one row group each); with
    ``labels``, the ``stream`` and ``class_label`` columns as dictionaries of names."""
    writer = None
    try:
        for lo in range(0, max(req.n, 1), CHUNK_ROWS):
            table = _arrow(request_columns(req, lo, min(lo + CHUNK_ROWS, req.n), labels), labels)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def latency_sketches(req: RequestTable, rec: Recorder, warmup: int, rel_err: float = 0.01) -> dict[str, LogSketch]:
    """Sketches of the measured requests' latencies, filled chunk by chunk (bounded memory)."""
    sk = {name: LogSketch(rel_err) for name in ("ttft", "tpot", "itl", "e2e", "queue")}
    for lo in range(0, req.n, CHUNK_ROWS):
        hi = min(lo + CHUNK_ROWS, req.n)
        cols = request_columns(req, lo, hi)
        m = cols["status"] == FINISHED
        m[: max(0, warmup - lo)] = False
        for name in ("ttft", "tpot", "e2e", "queue"):
            sk[name].add(cols[f"{name}_s"][m])
    rec.flush()
    for v, w in rec.itl.parts():
        sk["itl"].add(np.asarray(v), np.asarray(w))
    return sk


def write_columns_parquet(cols: dict[str, np.ndarray], path: Path) -> None:
    """Plain numeric columns as one parquet table (what pandas' to_parquet writes, without it)."""
    pq.write_table(pa.table({k: pa.array(v) for k, v in cols.items()}), path)
