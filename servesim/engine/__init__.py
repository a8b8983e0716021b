"""The run: the SimPy clock, the fleet every run is (a lone replica is a fleet of one), routers, each replica's kernel and its driver (docs/architecture.md)."""
