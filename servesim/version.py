"""The package version (a module of its own: the resolved scenario names it, low in the floors)."""

__version__ = "0.1.0"
