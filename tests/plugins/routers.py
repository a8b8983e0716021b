"""A user router for tests and docs/cluster.md: every request to the last replica."""

from servesim.engine.router import Router


class LastReplica(Router):
    """Reads no load: the fleet may route every arrival at once (``choose_many``)."""

    name = "last"
    reads_load = False

    def choose(self, rid, klass, view):
        return self.n - 1

    def choose_many(self, m):
        import numpy as np

        return np.full(m, self.n - 1, dtype=np.int64)


class NotARouter:
    pass
