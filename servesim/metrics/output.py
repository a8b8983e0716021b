"""Parquet files in bounded memory (a chunk of rows at a time), written with pyarrow alone.

Imported when a run is written, not with servesim: pyarrow is a twentieth of a second of start-up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from servesim.request import Reject, RequestTable
from servesim.metrics.summary import LABEL_COLUMNS, ROW_GROUP_ROWS, STATUS_NAMES, Labels, request_columns

REJECT_LABELS = [""] + [Reject.NAMES[k] for k in sorted(Reject.NAMES)]


def _column(col: np.ndarray) -> pa.Array:
    """A numpy column as an arrow array over the same memory. ``pa.array`` would do, but its first
    call imports pandas (~0.5 s of a 10k-request run's 2 s) to ask whether ``col`` is a Series."""
    col = np.ascontiguousarray(col)
    if col.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(col), [None, pa.py_buffer(np.packbits(col, bitorder="little"))])
    return pa.Array.from_buffers(pa.from_numpy_dtype(col.dtype), len(col), [None, pa.py_buffer(col)])


def _strings(names) -> pa.Array:
    """Arrow strings from Python ones, without ``pa.array`` (see :func:`_column`)."""
    data = [str(s).encode() for s in names]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([len(b) for b in data])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def _codes(col: np.ndarray, dtype, names) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(_column(col.astype(dtype)), _strings(names))


def _arrow(cols: dict[str, np.ndarray], labels: Labels | None = None) -> pa.Table:
    arrays = {}
    for name, col in cols.items():
        if labels is not None and name in LABEL_COLUMNS:
            arrays[name] = _codes(col, np.int16, labels.stream_names if name == "stream" else labels.class_names)
        elif name == "status":
            arrays[name] = _codes(col, np.int8, STATUS_NAMES)
        elif name == "reject_reason":
            arrays[name] = _codes(col, np.int8, REJECT_LABELS)
        else:
            arrays[name] = _column(col)
    return pa.Table.from_arrays(list(arrays.values()), names=list(arrays))


def write_requests_parquet(req: RequestTable, path: Path, labels: Labels | None = None, rows: int = 0) -> None:
    """One row per request sent by the run's end, written ``rows`` rows at a time (one row group each); with
    ``labels``, the ``stream`` and ``class_label`` columns as dictionaries of names. A row group is built whole
    (columns, arrow arrays, the encoded pages): 2**18 rows cost ~90 MB over the run's memory at 1M requests,
    more than a 1,024-replica run's own peak left free; 2**16, ~15 MB (benchmarks/RESULTS.md)."""
    rows = rows or ROW_GROUP_ROWS
    writer = None
    try:
        for lo in range(0, max(req.n, 1), rows):
            table = _arrow(request_columns(req, lo, min(lo + rows, req.n), labels, sent_only=True), labels)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def write_columns_parquet(cols: dict[str, np.ndarray], path: Path) -> None:
    """Plain numeric columns as one parquet table (what pandas' to_parquet writes, without it)."""
    pq.write_table(pa.Table.from_arrays([_column(v) for v in cols.values()], names=list(cols)), path)
