"""The frozen Python reference of the prefix cache, its lower tiers and hot-prefix preload.

What prefix caching ran on before its rules became kernels (servesim/kv/pcache.py, pqueue.py,
ptiers.py): a KV manager object (``PrefixCacheKV``, prefix.py; tiers.py; preload.py; its free
queues and eviction orders, freeq.py and evict.py; decode-run arithmetic, steps.py; the object
contract, base.py) that the uncompiled engine binds in place of the KV kernels (adapters.py).
It lives here, not in servesim/kv/, so that every KV rule is written once in the package; the
equivalence tests (tests/test_prefix_kernels.py and the golden, preload and property tests that
run both) hold the kernels to it request by request. Do not edit it to follow the kernels: a
change of behaviour shows up as a difference there.

``build.build_reference`` builds it for a scenario: set ``servesim.kv.factory.OBJECT_REFERENCE``
to it and ``build()`` returns this object instead of the kernels' pool.
"""
