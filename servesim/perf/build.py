"""Build the step-time model a scenario asks for."""

from __future__ import annotations

from servesim.hardware import GPUS
from servesim.perf.base import StepTimeModel
from servesim.perf.constant import ConstantStepModel
from servesim.perf.roofline import RooflineStepModel
from servesim.scenario import AutoStepConfig, ConstantStepConfig, PackStepConfig, RooflineStepConfig, Scenario


def build_step_model(sc: Scenario, cross_hops: int = 0) -> StepTimeModel:
    """The step-time model of one replica of ``sc``; ``cross_hops``: its pipeline-stage
    boundaries that cross servers (servesim/config/placement.py), sent over hardware.inter_server_link."""
    cfg = sc.step_time
    hw = sc.hardware
    cross = {}
    caps = dict(graph_max_batch=getattr(cfg, "cuda_graph_max_batch", None) or 0,
                graph_max_tokens=getattr(cfg, "cuda_graph_max_tokens", None) or 0)
    if cross_hops:
        link = hw.inter_server_link
        cross = dict(cross_hops=cross_hops, link_bytes_per_s=link.bandwidth_gb_s * 1e9, link_latency_s=link.latency_s)
    if isinstance(cfg, ConstantStepConfig):
        return ConstantStepModel(cfg.seconds)
    if isinstance(cfg, AutoStepConfig):  # the pack where one fits, else the roofline, uncalibrated
        from servesim.perf.select import choose, read_as

        choice = choose(sc)
        if choice.model == "pack" and choice.kv_rule:  # an FP8 KV cache by rule on the pack of the own KV dtype
            return _fp8_kv_model(sc, choice, cross, caps)
        if choice.model == "pack" and not choice.calibrated:  # a pack of the same GPU class, transferred
            from servesim.perf.packmodel import PackStepModel
            from servesim.perf.pack import load_pack
            from servesim.perf.transfer import transfer_pack

            src = choice.pack.split("/")[0]
            return PackStepModel(transfer_pack(load_pack(src, read_as(choice, sc.model_shape), sc.tp), hw.gpu,
                                               sc.model_shape),
                                 sc.model_shape, tp=sc.tp, pp=sc.pp, cuda_graph=cfg.cuda_graph, **cross, **caps)
        if choice.model == "pack":
            from servesim.perf.packmodel import load_pack_model

            # a twin's pack is read under its own name and checked against the model's numbers
            return load_pack_model(hw.gpu, read_as(choice, sc.model_shape), tp=sc.tp, pp=sc.pp,
                                   cuda_graph=cfg.cuda_graph, **cross, **caps)
        return RooflineStepModel(GPUS[hw.gpu], sc.model_shape, sc.tp, sc.pp, note="uncalibrated: " + choice.reason,
                                 expert_parallel=sc.engine.enable_expert_parallel, **cross)
    if isinstance(cfg, RooflineStepConfig):
        cross = dict(cross, expert_parallel=sc.engine.enable_expert_parallel, moe_imbalance=cfg.moe_imbalance)
        if cfg.fit is not None:  # efficiency factors and overhead fitted to a pack of this GPU
            from servesim.perf.rooflinefit import fit_roofline

            f = fit_roofline(cfg.fit)
            return RooflineStepModel(GPUS[hw.gpu], sc.model_shape, sc.tp, sc.pp,
                                     f.mfu, f.mbu, f.overhead_s,
                                     note=(f"fitted to pack {f.pack}: median |err| "
                                           f"{100 * f.median_abs_err:.1f}% on {f.points} iterations"),
                                     **cross)
        return RooflineStepModel(GPUS[hw.gpu], sc.model_shape, sc.tp, sc.pp,
                                 cfg.mfu, cfg.mbu, cfg.overhead_s, **cross)
    if isinstance(cfg, PackStepConfig):
        from servesim.perf.packmodel import load_pack_model  # measured kernel timings
        from servesim.perf.select import choose, read_as

        choice = choose(sc)
        if choice.kv_rule:  # the GPU's own pack of the model's KV dtype, an FP8 KV cache by rule
            return _fp8_kv_model(sc, choice, cross, caps)
        if choice.twin_of:  # this GPU's pack of another model of the same layer shapes
            return load_pack_model(hw.gpu, read_as(choice, sc.model_shape), tp=sc.tp, pp=sc.pp,
                                   cuda_graph=cfg.cuda_graph, **cross, **caps)

        from servesim.perf.pack import pack_path
        from servesim.perf.select import pack_problem

        # a pack of another precision or kind (an MLA model without a latent pack, expert
        # parallelism) is refused in one line; a missing pack is load_pack_model's error (it
        # names what exists and the fallback)
        from servesim.perf.select import _expert_parallel_problem

        problem = pack_problem(hw.gpu, sc.model_shape, sc.tp, sc.pp, cfg.cuda_graph) or _expert_parallel_problem(sc)
        if problem is not None and (problem.startswith("expert parallelism") or sc.model_shape.is_mla or pack_path(hw.gpu, sc.model_shape, sc.tp).is_file()
                                    or sc.model_shape.unlike_bf16_packs() is not None):
            from servesim.errors import PackError

            raise PackError(f"step_time.model: pack: {problem}; use step_time: {{model: roofline}} or leave "
                            f"step_time out (docs/models.md)")
        return load_pack_model(hw.gpu, sc.model_shape, tp=sc.tp, pp=sc.pp,
                               cuda_graph=cfg.cuda_graph, **cross, **caps)
    raise TypeError(f"unknown step_time config {cfg!r}")  # pragma: no cover


def _fp8_kv_model(sc: Scenario, choice, cross: dict, caps: dict) -> StepTimeModel:
    """The pack ``choice`` names (of the model's own KV dtype; transferred first when it is another
    GPU's) with its decode attention over an FP8 cache by rule (servesim/perf/kvfp8.py)."""
    from servesim.models import with_precision
    from servesim.perf.kvfp8 import with_fp8_kv
    from servesim.perf.pack import load_pack
    from servesim.perf.packmodel import PackStepModel
    from servesim.perf.select import read_as
    from servesim.perf.transfer import transfer_pack

    base = with_precision(sc.model_shape, kv_cache_dtype="auto")
    pack = load_pack(choice.pack.split("/")[0], read_as(choice, base), sc.tp)  # a twin's under its own name
    if not choice.calibrated:  # the base pack is of another GPU of the class: transferred first
        pack = transfer_pack(pack, sc.hardware.gpu, base)
    return PackStepModel(with_fp8_kv(pack, sc.model_shape.kv_cache_dtype, gpu=sc.hardware.gpu), sc.model_shape,
                         tp=sc.tp, pp=sc.pp, cuda_graph=sc.step_time.cuda_graph, **cross, **caps)
