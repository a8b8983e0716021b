"""MoE and MLA step times against published single-GPU runs (docs/models.md, "Against published
throughput": "MoE and MLA on one GPU").

Each row replays a run published in a public pull request with the pack servesim derives for the
model on the H200 (servesim/tools/derive_variants.py: the H200's llama-3-8b packs and op surveys;
no pack of the model read, though the MoE survey's five layer shapes include both models' MoE
layers), transferred to the H100 by op-wise efficiency -- the
default a planner gets after ``servesim calibrate derive --gpu h200 --model <model>`` -- where the
repository ships the model's own measured H200 pack, that pack too (transferred the same way),
where it ships the model's measured H100 pack (qwen3-30b-a3b, from 2026-12-05), that pack as
measured (the default since then: the two transferred arms are replayed without it), and, for
reference, the roofline at its default factors. Nothing is fitted to these rows.

* vLLM PR #23151 (https://github.com/vllm-project/vllm/pull/23151, description of 2025-08-19,
  "WO tuned configs (TP=1, EP=1, on H100)"): Qwen3-30B-A3B bf16, ``vllm serve`` (V1), random
  dataset 2048 in / 1024 out (100 prompts; 101,576 tokens generated: 1,016 per request),
  max-concurrency 10: 739.79 output tok/s, mean TPOT 13.18 ms, mean TTFT 267.22 ms.
* vLLM PR #10927 (https://github.com/vllm-project/vllm/pull/10927, description of 2024-12-05,
  the MLA branch with FlashInfer's MLA decode): DeepSeek-V2-Lite-Chat fp16 on one H100 80GB,
  ``benchmark_throughput.py --input-len 1000 --output-len 100 --num-prompts 200 --max-model-len
  8192 --enforce-eager`` (vLLM 0.6, V0 engine, gpu_memory_utilization 0.9): 18.5 requests/s.

Run: ``python benchmarks/derived_published.py`` (about 3 minutes on the 2-core VM).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servesim import scenario_from_dict, simulate  # noqa: E402
from servesim.perf import pack as packmod  # noqa: E402
from servesim.tools.derive_variants import write_derived  # noqa: E402

ROWS = [
    {"label": "Qwen3-30B-A3B bf16, H100 TP1, vLLM V1 serve, 2048/1024, concurrency 10 (vLLM PR #23151)",
     "model": "qwen3-30b-a3b",
     "scenario": {"hardware": {"gpu": "h100-80g"},
                  "engine": {"preset": "vllm-v1", "enable_prefix_caching": False, "max_model_len": 8192},
                  "workload": {"arrival": {"process": "closed", "clients": 10, "think_s": 0.0},
                               "prompt": {"dist": "fixed", "value": 2048},
                               "output": {"dist": "fixed", "value": 1016}},
                  "stop": {"requests": 100}},
     "published": {"output_tok_per_s": 739.79, "tpot_ms": 13.18, "ttft_ms": 267.22}},
    {"label": "DeepSeek-V2-Lite fp16 (MLA), H100 TP1, vLLM 0.6 offline, 1000/100 x 200, eager (vLLM PR #10927)",
     "model": "deepseek-v2-lite",
     "scenario": {"hardware": {"gpu": "h100-80g"},
                  "engine": {"preset": "vllm-v0", "max_model_len": 8192, "gpu_memory_utilization": 0.9},
                  "workload": {"arrival": {"process": "poisson", "rate": 1e5},
                               "prompt": {"dist": "fixed", "value": 1000},
                               "output": {"dist": "fixed", "value": 100}},
                  "stop": {"requests": 200}},
     "eager": True,
     "published": {"req_per_s": 18.5}},
]


GPU = "h100-80g"  # the rows' GPU


def without_own(models: list[str]) -> Path:
    """A pack folder: the shipped packs less the rows' GPU's own packs of ``models``, so that a run
    there takes the H200 pack transferred (what every H100 run got before the H100 was measured)."""
    root = Path(tempfile.mkdtemp(prefix="servesim-derived-"))
    shutil.copytree(packmod.pack_root(), root, dirs_exist_ok=True)
    for m in models:
        for ext in (".csv", ".yaml"):
            (root / GPU / f"{m}{ext}").unlink(missing_ok=True)
    return root


def derived_root(models: list[str]) -> Path:
    """A pack folder: the shipped packs (less the rows' GPU's own) plus the H200 packs derived for
    ``models``."""
    root = without_own(models)
    write_derived("h200", root, models, [1])
    return root


def replay(row: dict, step_time: dict) -> dict:
    sc = scenario_from_dict({"model": row["model"], **row["scenario"],
                             "step_time": {**step_time, **({"cuda_graph": False} if row.get("eager") and
                                                           step_time["model"] != "roofline" else {})}},
                            "derived_published")
    r = simulate(sc)
    s = r.summary
    return {"step": r.step_model, "output_tok_per_s": s["throughput"]["output_tok_per_s"],
            "req_per_s": s["throughput"]["req_per_s"], "tpot_ms": 1e3 * s["latency_s"]["tpot"]["mean"],
            "ttft_ms": 1e3 * s["latency_s"]["ttft"]["mean"]}


def measured(model: str, gpu: str = "h200") -> bool:
    """Whether the repository ships a measured tp-1 pack of ``model`` for ``gpu``."""
    from servesim.perf.pack import pack_path

    path = pack_path(gpu, model, 1).with_suffix(".yaml")
    return path.is_file() and "source: measured" in path.read_text()


def main() -> None:
    shipped = packmod.pack_root
    models = sorted({r["model"] for r in ROWS})
    own = {m for m in models if measured(m)}
    here = {m for m in models if measured(m, GPU)}
    root, moved = derived_root(models), without_own(models)
    print("| row | step model | metric | published | simulated | error |")
    print("|---|---|---|---:|---:|---:|")
    for row in ROWS:
        arms = [("derived pack (H200 -> H100)", {"model": "auto"}, root)]
        if row["model"] in own:  # the model's own measured H200 pack, transferred like the derived one
            arms.append(("measured pack (H200 -> H100)", {"model": "auto"}, moved))
        if row["model"] in here:  # the model's own measured H100 pack: the default since it shipped
            arms.append(("measured pack (H100)", {"model": "auto"}, None))
        arms.append(("roofline (defaults)", {"model": "roofline"}, root))
        for name, st, where in arms:
            # the derived packs are found as a planner's `derive` leaves them; the measured as shipped
            packmod.pack_root = (lambda: where) if where is not None else shipped
            got = replay(row, st)
            for metric, pub in row["published"].items():
                sim = got[metric]
                print(f"| {row['label']} | {name} | {metric} | {pub:,.2f} | {sim:,.2f} | {100 * (sim / pub - 1):+.0f} % |",
                      flush=True)
    packmod.pack_root = shipped
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(moved, ignore_errors=True)


if __name__ == "__main__":
    main()
