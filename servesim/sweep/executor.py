"""Where tasks run: in this process, or on Dask (a local cluster of processes, or a remote one).

Both executors have one method, ``map_unordered(fn, items, key)``, yielding ``(item, result)``
as results arrive, so sweeps, replications and capacity searches share one code path whatever
runs them. Results depend on the items only (a task carries its scenario and seed), never on the
worker, hence the same rows on 1 or 100 workers.

Dask brings the fault tolerance: when a worker dies, the scheduler hands its unfinished tasks
(and results not yet fetched) to the remaining workers; a task that kills
``distributed.scheduler.allowed-failures`` workers (3) in a row is given up with ``KilledWorker``,
reported here as one line.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Callable, Iterable, Iterator, TypeVar

from servesim.errors import ServesimError

T = TypeVar("T")


class ExecutorError(ServesimError):
    """The executor could not run the work: no scheduler at that address, a task that keeps
    killing workers."""


class SerialExecutor:
    """Runs every task here, in order: notebooks, tests, single replications."""

    workers = 1
    description = "this process"

    def map_unordered(self, fn: Callable[[T], Any], items: Iterable[T], key: Callable[[T], str] | None = None
                      ) -> Iterator[tuple[T, Any]]:
        for it in items:
            yield it, fn(it)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DaskExecutor:
    """Tasks on a ``dask.distributed`` cluster: an embedded ``LocalCluster`` of ``workers``
    single-threaded processes (default: one per core), or the scheduler at ``scheduler``
    (``tcp://HOST:PORT``), whose workers must be able to import servesim and read the files the
    scenarios name."""

    def __init__(self, workers: int | None = None, scheduler: str | None = None, connect_timeout_s: float = 10.0):
        from distributed import Client, LocalCluster

        self._cluster = None
        if scheduler is not None:
            _reachable(scheduler, connect_timeout_s)
            try:
                self.client = Client(scheduler, timeout=f"{connect_timeout_s}s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise ExecutorError(f"--scheduler {scheduler}: cannot reach a dask scheduler there "
                                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no answer'})"
                                    ) from None
            self.description = f"dask scheduler {scheduler}"
        else:
            n = workers or os.cpu_count() or 1
            if n < 1:
                raise ExecutorError(f"--workers {n}: must be at least 1")
            refuse_in_worker_import()
            try:
                self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                             dashboard_address=None, silence_logs=logging.CRITICAL)
            except Exception as exc:  # (Dask's own error is pages of worker tracebacks)
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ExecutorError(f"could not start {n} local worker processes ({first}); in a script, "
                                    f"call servesim under if __name__ == \"__main__\": (each worker re-imports "
                                    f"the script), or use workers=1") from None
            self.client = Client(self._cluster)
            self.description = f"local dask cluster, {n} worker processes"

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def map_unordered(self, fn: Callable[[T], Any], items: Iterable[T], key: Callable[[T], str] | None = None
                      ) -> Iterator[tuple[T, Any]]:
        from distributed import as_completed
        from distributed.client import FutureCancelledError

        items = list(items)
        if not items:
            return
        run = uuid.uuid4().hex[:8]  # task names unique to this call: no sharing with other clients
        names = [f"servesim-{run}-{key(it) if key else i}" for i, it in enumerate(items)]
        futures = self.client.map(fn, items, key=names, pure=False)
        by_future = dict(zip(futures, items))
        pending = set(futures)
        try:
            for fut in as_completed(futures):
                pending.discard(fut)
                item = by_future.pop(fut)
                if fut.status == "error":
                    exc = fut.exception()
                    if type(exc).__name__ == "KilledWorker":
                        raise ExecutorError(f"a task was given up after its workers died "
                                            f"distributed.scheduler.allowed-failures times (out of memory?): {exc}"
                                            ) from None
                    raise exc.with_traceback(fut.traceback())
                try:
                    result = fut.result()
                except FutureCancelledError:
                    raise ExecutorError("the dask cluster cancelled a task (scheduler restarted?); "
                                        "re-run to resume") from None
                fut.release()
                yield item, result
        finally:
            if pending:
                self.client.cancel(list(pending))

    def close(self) -> None:
        """Shut down quietly: workers and connections closing in any order is normal here, and
        Dask logs each broken heartbeat of a stopping cluster as an error with a traceback."""
        quiet = [logging.getLogger(n) for n in ("distributed", "tornado", "asyncio")]
        levels = [lg.level for lg in quiet]
        for lg in quiet:
            lg.setLevel(logging.CRITICAL)
        try:
            self.client.close()
            if self._cluster is not None:
                self._cluster.close()
        finally:
            for lg, lv in zip(quiet, levels):
                lg.setLevel(lv)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


GUARD_LINE = ("servesim: a worker process re-imported your script, which starts workers again: put the "
              "code that calls simulate_many (or servesim.testing.check_worker_independent) under "
              "if __name__ == \"__main__\":, or pass workers=1")


def refuse_in_worker_import() -> None:
    """A script without a ``__main__`` guard that calls ``simulate_many(workers=2)``: each worker
    process (spawned) re-imports the script as ``__mp_main__``, reaches the call again and would
    start workers of its own -- ~400 lines of tracebacks from Python and Dask. Here, in such a
    worker, one line says what to do and the worker exits."""
    import sys

    main = sys.modules.get("__main__")
    if getattr(main, "__name__", None) == "__mp_main__":
        print(GUARD_LINE, file=sys.stderr, flush=True)
        raise SystemExit(1)


def _reachable(address: str, timeout_s: float) -> None:
    """Fail at once, in one line, when nothing listens at a tcp:// address (Dask itself would
    retry until its timeout and then raise a long error)."""
    import socket
    from urllib.parse import urlsplit

    if not address.startswith("tcp://"):
        return  # other protocols (tls://, ucx://): leave it to Dask
    try:
        parts = urlsplit(address)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port:
        raise ExecutorError(f"--scheduler {address}: expected tcp://HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ExecutorError(f"--scheduler {address}: cannot reach a dask scheduler there "
                            f"({exc.strerror or type(exc).__name__})") from None


def make_executor(workers: int | None = None, scheduler: str | None = None):
    """``scheduler``: Dask at that address. Else ``workers`` local processes on Dask (None: one
    per core), where one worker means this process (no cluster to start; the same rows)."""
    if scheduler is not None:
        return DaskExecutor(scheduler=scheduler)
    if workers is not None and workers < 1:
        raise ExecutorError(f"--workers {workers}: must be at least 1")
    n = workers if workers is not None else (os.cpu_count() or 1)
    return SerialExecutor() if n == 1 else DaskExecutor(workers=n)
