"""Build the step-time model a scenario asks for."""

from __future__ import annotations

from servesim.hardware import GPUS
from servesim.perf.base import StepTimeModel
from servesim.perf.constant import ConstantStepModel
from servesim.perf.roofline import RooflineStepModel
from servesim.scenario import ConstantStepConfig, PackStepConfig, RooflineStepConfig, Scenario


def build_step_model(sc: Scenario) -> StepTimeModel:
    cfg = sc.step_time
    hw = sc.hardware
    if isinstance(cfg, ConstantStepConfig):
        return ConstantStepModel(cfg.seconds)
    if isinstance(cfg, RooflineStepConfig):
        return RooflineStepModel(GPUS[hw.gpu], sc.model_shape, hw.tensor_parallel, hw.pp,
                                 cfg.mfu, cfg.mbu, cfg.overhead_s)
    if isinstance(cfg, PackStepConfig):
        from servesim.perf.packmodel import load_pack_model  # measured kernel timings

        return load_pack_model(hw.gpu, sc.model_shape, tp=hw.tensor_parallel, pp=hw.pp,
                               cuda_graph=cfg.cuda_graph)
    raise TypeError(f"unknown step_time config {cfg!r}")  # pragma: no cover
