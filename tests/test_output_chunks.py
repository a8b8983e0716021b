"""The run's files are written in bounded memory (issue 30): requests.parquet a row group at a
time, the ITL sketch a slice of gaps at a time -- and the content does not depend on the sizes."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from servesim import scenario_from_dict
from servesim.metrics import summary as S
from servesim.metrics.output import write_requests_parquet
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge

RUN = merge(BASE, {"stop": {"requests": 3000, "duration_s": 40.0}, "hardware": {"replicas": 3},
                   "cluster": {"router": "least-tokens"},
                   "workload": {"arrival": {"process": "poisson", "rate": 90.0},
                                "output": {"dist": "uniform", "min": 1, "max": 60}}})


def test_requests_parquet_rows_do_not_depend_on_the_row_group_size(tmp_path):
    res = run_built(build(scenario_from_dict(RUN)))
    write_requests_parquet(res.table, tmp_path / "one.parquet", res.labels, rows=1 << 18)
    write_requests_parquet(res.table, tmp_path / "many.parquet", res.labels, rows=700)
    one, many = pq.ParquetFile(tmp_path / "one.parquet"), pq.ParquetFile(tmp_path / "many.parquet")
    assert one.metadata.num_row_groups == 1 and many.metadata.num_row_groups == -(-res.table.n // 700)
    assert one.schema_arrow == many.schema_arrow
    a, b = one.read(), many.read()
    assert a.num_rows > 2000 and a.to_pandas().equals(b.to_pandas())  # same rows, order, values (NaN = NaN)


def test_itl_sketch_does_not_depend_on_the_slices(monkeypatch):
    res = run_built(build(scenario_from_dict(RUN)))
    whole = S.latency_sketches(res.table, res.recorder, 0)
    monkeypatch.setattr(S, "CHUNK_ROWS", 37)
    sliced = S.latency_sketches(res.table, res.recorder, 0)
    for name in whole:
        assert whole[name].to_dict() == sliced[name].to_dict(), name
    assert sum(np.asarray(w).sum() for _, w in res.recorder.itl.parts()) > 10_000
