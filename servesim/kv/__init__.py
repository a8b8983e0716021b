"""KV memory: the allocators' pool kernels, the prefix cache and its tiers (docs/kv.md)."""

from servesim.exports import exports

__all__, __getattr__ = exports(__name__, {
    "build_kv": "servesim.kv.factory",
    "make_kv": "servesim.kv.kernels",
    "kv_allocate": "servesim.kv.kernels",
    "kv_free": "servesim.kv.kernels",
    "kv_check": "servesim.kv.kernels",
})
