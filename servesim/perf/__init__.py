"""Step-time models: batch composition -> seconds of one engine iteration."""

from servesim.exports import exports

__all__, __getattr__ = exports(__name__, {
    "StepTimeModel": "servesim.perf.base",
    "load_pack_model": "servesim.perf.packmodel",
})
