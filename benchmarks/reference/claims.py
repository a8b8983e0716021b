"""Every claim of the two field reports, beside what servesim runs and predicts, with a verdict
(issue 33).

The reports (two Chinese blog posts, read in the original): report A, "Qwen3.6推理后端选型：Spark与
Halo性能实测对比" (Spark vs Halo on 3 x 8 A100s); report B, the vLLM vs SGLang deployment notes on
Qwen3.6 4B/8B/14B on one A100-80G (section 1 "项目概述：为什么Qwen3.6在vLLM和SGLang上的部署差异值得深挖").
Neither gives an author or a date in its text. Each claim quotes the report verbatim (a test
checks every quote is in the report) with its section, and a gloss in English.

A prediction is either computed here (physics from the model shapes and the GPU registry, or the
cheap runs of benchmarks/reference/ranges.py) or points at the table above that holds it (the
long runs). Verdicts: agrees, disagrees, inconsistent (the report contradicts itself),
implausible (physics rules it out), not expressible (servesim has no such mechanism or the report
leaves out what would be needed), each with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

VERDICTS = ("agrees", "disagrees", "inconsistent", "implausible", "not expressible")


@dataclass(frozen=True)
class Claim:
    id: str
    report: str  # "A" or "B"
    place: str  # section / table in the report
    quote: str  # verbatim from the report
    gloss: str  # what it says, in English
    runs: str  # the configuration servesim runs (or "-")
    prediction: Union[str, Callable[[dict], str]]
    verdict: Union[str, Callable[[dict], str]]
    why: Union[str, Callable[[dict], str]]


def _v(x, ctx: dict) -> str:
    return x(ctx) if callable(x) else x


# ------------------------------------------------------------------------------- physics
def physics() -> dict:
    """Numbers the verdicts rest on: model shapes (servesim/models) and the A100's data sheet
    (servesim/hardware.py)."""
    from servesim.hardware import GPUS
    from servesim.models import _load_library, with_precision

    lib = _load_library()
    g = GPUS["a100-80g"]
    q8, q8a, q14 = lib["qwen3-8b"], with_precision(lib["qwen3-8b"], "awq"), lib["qwen3-14b"]
    # B §4.1: 64 sequences of 2,048 + up to 512 tokens; a decode step reads the weights once and
    # every sequence's KV (mean context 2,048 + 256)
    kv64 = 64 * (2048 + 256) * q8a.kv_bytes_per_token()
    step = (q8a.weight_bytes() + kv64) / g.hbm_bytes_per_s
    # A: the summaries' prefill, 100 req/s x 8,192 tokens, 2 FLOPs per parameter per token
    flops8 = 2 * q8.active_params() * 100 * 8192
    # B §4.1: output tokens/s of 512-token answers to 2,048-token prompts means tok/512 requests a
    # second, each prefilled (2,048 tokens) and decoded: 2 FLOPs per active parameter per token, at
    # the A100's peak dense bf16 rate (AWQ's W4A16 kernels compute in fp16 at the same peak)
    def compute_share(tok_s: float) -> float:
        return (tok_s / 512 * 2048 + tok_s) * 2 * q8a.active_params() / g.bf16_flops_per_s

    return {
        "share3680": compute_share(3680), "share4120": compute_share(4120), "share1240": compute_share(1240),
        "hbm": g.hbm_bytes_per_s, "peak": g.bf16_flops_per_s, "mem": g.memory_bytes,
        "kv14_4k_gb": 4096 * q14.kv_bytes_per_token() / 1e9, "kv14_tok": q14.kv_bytes_per_token(),
        "w8awq_gb": q8a.weight_bytes() / 1e9, "kv64_gb": kv64 / 1e9, "ceiling64": 64 / step,
        "flops8_share": flops8 / (24 * g.bf16_flops_per_s),
        "pool_need64_gb": 64 * 2560 * q8.kv_bytes_per_token() / 1e9,
        "vllm_0p9_gb": 0.9 * g.memory_bytes / 1e9,
    }


def _rec(ctx: dict, hid: str, label: str) -> dict | None:
    return ctx["recs"].get((f"ranges-{hid}", label))


def _tok(ctx, label: str) -> str:
    r = _rec(ctx, "H-B1", label)
    return "-" if r is None else f"{r['summary']['throughput']['output_tok_per_s']:,.0f}"


def _lat(ctx, hid: str, label: str, metric: str, p: str, stream: str | None = None) -> float | None:
    r = _rec(ctx, hid, label)
    if r is None:
        return None
    s = r["summary"] if stream is None else (r["summary"].get("by_stream") or {}).get(stream, {})
    return ((s.get("latency_s") or {}).get(metric) or {}).get(p)


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x * 1000:.0f} ms" if x < 10 else f"{x:.0f} s")


def _rng(ctx, hid: str) -> str:
    return ctx["ranges"].get(hid, ("-", "-"))[0]


def _most(ctx, hid: str) -> str:
    return ctx["ranges"].get(hid, ("-", "-"))[1]


def _setting(ctx, hid: str, assumption: str) -> str:
    return ctx.get("settings", {}).get(hid, {}).get(assumption, "-")


def _b1_tput(ctx) -> str:
    return (f"64 clients, bf16 (pack): vLLM {_tok(ctx, 'base-a')}, SGLang {_tok(ctx, 'base-b')} tok/s; "
            f"AWQ (roofline): vLLM {_tok(ctx, 's2-a')}, SGLang {_tok(ctx, 's2-b')}; "
            f"(prompt + output: AWQ vLLM {_b1_total(ctx, 's2-a')}, SGLang {_b1_total(ctx, 's2-b')}). As output "
            f"tokens/s, 3,680 and 4,120 need {ctx['phys']['share3680']:.0%} and {ctx['phys']['share4120']:.0%} of "
            f"the A100's peak bf16 FLOP/s (8 concurrent, 1,240: {ctx['phys']['share1240']:.0%})")


def _within(ctx, hid: str, figure: float) -> str:
    """agrees when the report's figure lies inside the headline's range over the open
    assumptions, disagrees when outside it."""
    lo_hi = ctx.get("spans", {}).get(hid)
    if lo_hi is None:
        return "not expressible"
    return "agrees" if lo_hi[0] <= figure <= lo_hi[1] else "disagrees"


def _b1_lead_verdict(ctx) -> str:
    return _within(ctx, "H-B1", 12.0)


def _halo_verdict(ctx) -> str:
    return _within(ctx, "H-A", 23.0)


def _ceiling_verdict(ctx) -> str:
    return "implausible" if ctx["phys"]["share4120"] >= 0.9 else "disagrees"


def _b1_total(ctx, label: str) -> str:
    r = _rec(ctx, "H-B1", label)
    if r is None:
        return "-"
    t = r["summary"]["throughput"]
    return f"{t['output_tok_per_s'] + t['input_tok_per_s']:,.0f}"


def _b1_p99(ctx) -> str:
    return (f"64 clients, bf16: TTFT P99 vLLM {_ms(_lat(ctx, 'H-B1', 'base-a', 'ttft', 'p99'))}, SGLang "
            f"{_ms(_lat(ctx, 'H-B1', 'base-b', 'ttft', 'p99'))}; E2E P50 vLLM "
            f"{_ms(_lat(ctx, 'H-B1', 'base-a', 'e2e', 'p50'))}")


def _halo_gaps(ctx) -> str:
    out = []
    for who, lab in (("Spark", "base-a"), ("Halo", "base-b")):
        p50, p99, p999 = (_lat(ctx, "H-A", lab, "ttft", p, "chat") for p in ("p50", "p99", "p999"))
        if None in (p50, p99, p999):
            return "-"
        out.append(f"{who} chat TTFT P99-P50 {_ms(p99 - p50)}, P99.9-P99 {_ms(p999 - p99)}")
    return "; ".join(out) + " (2 % of the load, least-requests)"


P = physics  # (imported by the runner; kept cheap: no simulation)

CLAIMS: tuple[Claim, ...] = (
    # ----------------------------------------------------------------------------- report A
    Claim("A1", "A", "§1", "Halo版Qwen3.6的P99延迟比Spark版低23%", "Halo's P99 latency 23 % below Spark's",
          "a_fleet_{spark,halo}.yaml, 2 % of the load, 60 s, Qwen3-8B (H-A)",
          lambda c: f"{_rng(c, 'H-A')}; moved most by {_most(c, 'H-A')}", _halo_verdict,
          "the sign and size hang on the router and the load: behind a least-loaded router at light load "
          "both fleets are fast and the gap is noise-sized; the report's test ran at 350 req/s (A7), "
          "where neither fleet meets any target"),
    Claim("A2", "A", "§1, §4.2", "Spark版的显存占用平均少1.7GB/实例", "Spark uses 1.7 GB less GPU memory per instance",
          "-", "a Spark instance is 1 GPU, a Halo instance 4: both reserve gpu_memory_utilization of each GPU "
          "at start-up (A-fleet-kv table)", "not expressible",
          "§4.2's memory table is missing from the report; instances of different GPU counts are not comparable "
          "per instance"),
    Claim("A3", "A", "§1, §4.3", "Halo对历史上下文的保留准确率高出4.2个百分点",
          "Halo retains multi-turn history 4.2 points more accurately", "-", "-", "not expressible",
          "output quality: a serving engine that evicts KV recomputes it, the tokens do not change"),
    Claim("A4", "A", "§2.1", "显存峰值比静态分配低31%", "elastic KV: peak memory 31 % below static allocation "
          "(batch 8, max_seq_len 8192)", "a_sessions_{elastic,static}.yaml", "see the sessions table "
          "(KV held by elastic vs static)", "not expressible",
          "the saving depends on the request lengths of that test, which §2.1 does not give"),
    Claim("A5", "A", "§2.2", "首token延迟从平均1200ms降到680ms", "hot-key preload: TTFT 1,200 -> 680 ms",
          "a_tiers_l2_l3_preload.yaml (preload = prefix KV resident)", "see the KV tiers table", "implausible",
          "§2.2 says it preloads *weight shards* for a prompt pattern: every weight is resident on the GPU "
          "already; only a prefix-KV preload can cut TTFT, and servesim models that"),
    Claim("A6", "A", "§2.2, §3.3", "3台DP就构成8卡TP+4卡PP的混合并行",
          "3 servers form '8-GPU TP + 4-GPU PP'; throughput 3.6x one server",
          "a_fleet_halo.yaml: 2 replicas of TP2 x PP2 per server (§3.3, §4.2)", "-", "inconsistent",
          "TP2 x PP2 per instance x 2 instances per server (§3.3, §4.2) is not 8 x 4 = 32 GPUs on 24; and 3.6x "
          "the throughput of one server on 3 servers is super-linear (implausible without a different baseline)"),
    Claim("A7", "A", "§3.4", "电商客服对话流：每秒发起200个请求", "chat 200 req/s, summaries 100 req/s of 8,192 "
          "tokens, SQL 50 req/s; P0/P2/P3 targets 0.8/2/5 s (§2.2)", "a_fleet_{spark,halo}.yaml at the full rate",
          lambda c: f"the summaries' prefill alone needs {c['phys']['flops8_share']:.0%} of the 24 A100s' peak "
          "bf16 FLOP/s for an 8B model; every stream misses its target (A-fleet table)", "implausible",
          "the offered load exceeds the fleet's compute even at 100 % utilization for the smallest model "
          "considered, so no test can have held a sub-second P99 at that rate"),
    Claim("A8", "A", "§3.2", "qwen3.6-spark-int4-cu121.tar.gz包（大小约18.7GB）", "the INT4 package is 18.7 GB",
          "model: qwen3-8b (assumed; the report never names a size)", "an INT4 checkpoint of 18.7 GB is "
          "~35 B parameters at 4.25 bits", "disagrees",
          "the arms run 8B/14B as the reports' size is open: a ~35B model would make A7 worse (about 4x)"),
    Claim("A9", "A", "§3.2", "max_batch_size: 16", "Spark: batch up to 16, no dynamic batching, max_seq_len 32768, "
          "fp16 KV", "a_fleet_spark.yaml: static-fifo, batch 16", "as configured", "agrees", "expressed as given"),
    Claim("A10", "A", "§3.2", "实测改成bf16会慢12%", "bf16 KV cache 12 % slower than fp16", "-",
          "same bytes per value, same A100 bandwidth and tensor-core rate: no difference", "implausible",
          "bf16 and fp16 are both 2-byte types the A100 runs at the same rate"),
    Claim("A11", "A", "§3.3", "prefill_chunk_size: 512", "Halo: prefill chunk 512, decode 1 token, L2 4 GB",
          "a_fleet_halo.yaml: chunk 512, L2 tier 4 GB", "as configured", "agrees", "expressed as given"),
    Claim("A12", "A", "§3.4", "每个worker维持10个TCP连接", "each load worker keeps 10 TCP connections; Poisson "
          "arrivals", "open-loop Poisson arrivals", "-", "not expressible",
          "the number of workers is not given, so the cap on concurrent requests is unknown"),
    Claim("A13", "A", "§4.1", "Spark的P50-P99差值是700ms", "P50->P99 gap 700 ms (Spark), 476 ms (Halo); P99->P99.9 "
          "1,770 / 1,710 ms", "H-A base runs", _halo_gaps, "inconsistent",
          "the table these gaps come from is missing from the report, so they have no absolute level; and "
          "a P99 at least 700 ms above a P50 cannot meet P0's 800 ms target unless P50 < 100 ms"),
    Claim("A14", "A", "§4.1", "Halo稳定在94%~97%", "HBM bandwidth use 82-89 % (Spark), 94-97 % (Halo); L2 off: "
          "P99 +31 %", "-", "-", "not expressible",
          "servesim has no bandwidth counter; and an L2 tier in host memory cannot raise HBM use"),
    Claim("A15", "A", "§4.2", "Spark是$1200/GB（按A100 80GB卡市价$9600算）", "Spark $1,200/GB at $9,600 per 80 GB",
          "-", "$9,600 / 80 GB = $120/GB", "inconsistent", "a factor-10 arithmetic error"),
    Claim("A16", "A", "§4.2", "总并发能力是2×64=128", "8 x 16 = 2 x 64 = 128 concurrent per server",
          "the arms: 8 Spark replicas of 16, 2 Halo replicas of 64 per server", "as configured", "agrees",
          "arithmetic holds"),
    Claim("A17", "A", "§4.2", "Spark只能支撑100QPS，而Halo能撑到135QPS", "at P99 < 1 s Spark carries 100 req/s, "
          "Halo 135", "capacity search on the 24 GPUs (A-capacity table)", "A-capacity: a few req/s (Spark) to "
          "~20 req/s (Halo) meet every SLO", "disagrees",
          "servesim's capacities are 5-15x lower; the report's own test offered 350 req/s, above both"),
    Claim("A18", "A", "§4.3", "KV cache的碎片率（fragmentation）从12%飙升到41%", "Spark KV fragmentation 12 -> 41 % "
          "from round 6; 'compact' -> 18 %", "a_sessions_{elastic,static,paged}.yaml",
          "see the sessions table (fragmentation per round)", "implausible",
          "10 rounds of 50-100 tokens is ~1,000 tokens a session; and an engine that loses KV recomputes it, "
          "it does not 'clear history' (the quality drop §4.3 infers)"),
    Claim("A19", "A", "§4.3", "Spark版有12%的概率把第3轮提到的“张三”错记成“李四”", "12 % name swaps in round 8",
          "-", "-", "not expressible", "output quality"),
    Claim("A20", "A", "§2.3", "INT4版相比FP16版平均只掉点0.9%", "INT4 loses 0.9 points on MMLU/CMMLU/C-Eval",
          "-", "-", "not expressible", "output quality"),
    Claim("A21", "A", "§3.1", "显存带宽被限制在理论值的63%", "thermal throttling cut bandwidth to 63 %", "-", "-",
          "not expressible", "no thermal model"),
    Claim("A22", "A", "§3.1", "P99延迟跳变高达400ms", "RDMA without DCQCN: P99 jumps of 400 ms", "-", "-",
          "not expressible", "no network loss model"),
    Claim("A23", "A", "§3.2", "8卡负载均衡度从82%提升到97%", "8-GPU balance 82 -> 97 % after re-seating a card",
          "-", "-", "not expressible", "no PCIe topology model"),
    Claim("A24", "A", "§5", "P999延迟瞬间飙到15秒", "swap pushed P99.9 to 15 s", "-", "-", "not expressible",
          "no host paging model"),
    Claim("A25", "A", "§6", "大促期间峰值3500QPS，P99从1.2s压到0.85s", "a Halo customer: 3,500 req/s, P99 "
          "1.2 -> 0.85 s", "-", "-", "not expressible", "its fleet and model are not given"),
    Claim("A26", "A", "§3.1", "vLLM 0.4.2分支明确锁死了torch版本", "Halo is built on a vLLM 0.4.2 branch",
          "a_fleet_halo.yaml: vLLM's continuous batching with Halo's priority classes and chunk 512 (vLLM "
          "0.4.2's own defaults are the vllm-v0.4 preset; the arm writes Halo's flags out instead)", "-",
          "not expressible", "Halo's own flags are not public; the arm follows what §2.2 and §3.3 describe"),
    # ----------------------------------------------------------------------------- report B
    Claim("B1", "B", "§1, §4.2", "vLLM的P99延迟从327ms跃升至1140ms，而SGLang仅从291ms升至418ms",
          "8 -> 64 concurrent (2,048 in / 512 out): P99 vLLM 327 -> 1,140 ms, SGLang 291 -> 418 ms",
          "b1_closed_{vllm,sglang}.yaml, 64 clients (H-B1 base)", _b1_p99, "disagrees",
          "as end-to-end latency the figures are impossible (512 tokens at the table's own 3,680 tok/s over 64 "
          "streams take ~9 s, Little's law); as TTFT servesim finds the two engines within a few percent"),
    Claim("B2", "B", "§4.1 table", "64	3,680	4,120", "64 concurrent, Qwen3-8B AWQ: vLLM 3,680, SGLang 4,120 "
          "tok/s", "H-B1", _b1_tput, _ceiling_verdict,
          "read as output tokens/s (the table does not say), every answer needs its 2,048-token prefill: "
          "the GPU would run at or above its peak tensor rate, which no serving engine reaches (servesim's "
          "roofline assumes 60 %); read as prompt + output tokens/s, it is 1.6 req/s and servesim predicts "
          "more than the report"),
    Claim("B3", "B", "§4.1", "vLLM在低并发（≤16）时吞吐更高", "vLLM's throughput is higher at <= 16 concurrent, "
          "SGLang's above (+12 % at 64)", "H-B1", lambda c: f"SGLang's lead at 64: {_rng(c, 'H-B1')}; moved most "
          f"by {_most(c, 'H-B1')}", _b1_lead_verdict,
          "agrees when +12 % lies inside servesim's range over the open assumptions; the range shows "
          "which assumption decides it"),
    Claim("B4", "B", "§4.1", "当把 --block-size 从16调到32，vLLM在32并发下的吞吐提升至3,790",
          "block 16 -> 32: 3,420 -> 3,790 tok/s at 32, P99 +19 %", "sweeps/b4_knobs_vllm.yaml (block 16/32)",
          "B4 table: block 32 changes only the KV waste", "not expressible",
          "the packs have no block-size effect on kernel time; servesim predicts no change"),
    Claim("B5", "B", "§4.2 table", "P99	1,140	418	+722", "64 concurrent: SGLang P95 428 ms, P99 418 ms",
          "-", "a P99 is never below the P95 of the same sample", "inconsistent",
          "SGLang's P99 (418) is below its own P95 (428)"),
    Claim("B6", "B", "§4.2", "vLLM中73%的时间花在 block_manager.wait_for_block", "73 % of vLLM's P99.9 time is "
          "waiting for KV blocks", "H-B1 base (64 clients)",
          lambda c: f"64 x 2,560 tokens need {c['phys']['pool_need64_gb']:.0f} GB of KV on 8B (bf16), under half "
          "the pool: no request waits for blocks", "implausible",
          "the pool is not full at this load; vLLM 0.6 has no block_manager.wait_for_block"),
    Claim("B7", "B", "§2.1", "14B模型在4K上下文下单请求KV显存占用超3.2GB", "14B: one 4K request's KV > 3.2 GB",
          "Qwen3-14B's shape", lambda c: f"4,096 x {c['phys']['kv14_tok']:,} B = {c['phys']['kv14_4k_gb']:.2f} GB",
          "implausible", "about 5x the bytes its 40 layers x 8 KV heads x 128 x 2 x 2 B per token hold"),
    Claim("B8", "B", "§2.1, §4.3", "实测在64并发下显存碎片率控制在11.3%", "vLLM fragmentation 11.3 % (SGLang "
          "4.2 %)", "B2-run table (KV waste of allocated)", "paged KV wastes under one block per sequence: "
          "0.2-0.5 % (B2-run, B4)", "disagrees", "a 16-token block wastes at most 15 tokens of a 2,560-token "
          "sequence; SGLang's page size 1 wastes none"),
    Claim("B9", "B", "§2.3", "在14B模型上KV Cache显存占用比vLLM低18%", "SGLang's KV 18 % smaller (GQA-aware)",
          "-", lambda c: f"both store {c['phys']['kv14_tok']:,} B per token for 14B", "implausible",
          "both engines store the 8 KV heads of GQA; there is nothing to save"),
    Claim("B10", "B", "§2.2", "默认256token/chunk", "SGLang's default chunk is 256 tokens", "scenarios/engines/sglang.yaml",
          "SGLang's default is 8,192: fixed in v0.3.2 (sglang-v0.3.yaml), by GPU memory in v0.5.x (8,192 on "
          "an A100-80GB)", "disagrees", "both presets read SGLang's server_args.py of their version"),
    Claim("B11", "B", "§3.3", "--enable-chunked-prefill --max-num-batched-tokens 8192",
          "vLLM with chunked prefill, budget 8,192: throughput 2.1x, P99 -58 %", "H-B3 setting; B4 table",
          lambda c: f"with 10 % long prompts, vLLM/SGLang chat P99 TTFT {_rng(c, 'H-B3')}; in B4 (no long "
          "prompts) chunking changes TTFT P99 little and throughput not at all", "disagrees",
          "below saturation an open loop's throughput is its arrival rate: a 2.1x gain can only be capacity, "
          "which the report did not measure"),
    Claim("B12", "B", "§3.3", "--max-num-seqs 256", "vLLM --max-num-seqs 256 (512 on 14B: 92 % memory, "
          "+3 % throughput, P99 +47 %)", "b*_vllm.yaml: max_num_seqs 256", "as configured; the pool is "
          "gpu_memory_utilization x memory whatever max_num_seqs", "disagrees",
          "vLLM pre-allocates its KV pool at start-up: memory use does not follow max_num_seqs"),
    Claim("B13", "B", "§3.3", "--chunked-prefill-size 256", "SGLang --chunked-prefill-size 256 must match the "
          "NTK step", "H-B3 setting 'SGLang chunk 256'; B4 table", "B4: 256 gives SGLang TTFT P99 1.6 s, "
          "512 1.3 s", "not expressible", "RoPE numerics are not modelled; the timing of 256 is"),
    Claim("B14", "B", "§3.3", "显存节省15%", "bf16 saves 15 % memory over fp16", "-", "both 2 bytes a value",
          "implausible", "bf16 and fp16 have the same width"),
    Claim("B15", "B", "§3.3, §5.1", "否则默认0.8在Qwen3.6长上下文下极易OOM", "vLLM's default "
          "--gpu-memory-utilization is 0.8", "scenarios/engines/vllm-v0.yaml", "vLLM's default is 0.9 "
          "(vllm/engine/arg_utils.py)", "disagrees", "the report's own §3.3 then sets 0.9"),
    Claim("B16", "B", "§3.4", "客服对话（均值320±120）", "the mix: chat 320+-120, documents 4,200+-1,800, code "
          "1,024+-600, Poisson, 30 min, 3:5:2", "b2_mix_{vllm,sglang}.yaml at 1.5 req/s (the rate is not given)",
          "B2 tables", "agrees", "expressed as given; the rate is our assumption (H-B3 'load')"),
    Claim("B17", "B", "§3.4", "vLLM在此场景下会触发OOM Killer", "10 % abnormal (>16K) requests: vLLM is "
          "OOM-killed, SGLang drops chunks and stays up", "b3_abnormal_{vllm,sglang}.yaml (H-B3)",
          lambda c: f"neither is killed; vLLM preempts and stalls: chat P99 TTFT vLLM/SGLang {_rng(c, 'H-B3')}, "
          f"moved most by {_most(c, 'H-B3')}", "disagrees",
          "the KV pool is allocated at start-up: a full pool preempts, it does not exhaust host memory; "
          "SGLang has no chunk dropping"),
    Claim("B18", "B", "§3.4", "Qwen3.6在SGLang上该系数为0.23，vLLM为0.41", "jitter (std/mean) 0.23 SGLang, "
          "0.41 vLLM", "B2 arms (jitter columns)", "B2-run: the two engines' E2E jitter within 0.01 of each "
          "other", "disagrees", "no source of the gap in either scheduler at this load"),
    Claim("B19", "B", "§4.1 table", "所有测试均开启AWQ量化、bfloat16、max_seq_len=8192", "AWQ, bf16, "
          "max_seq_len 8192", "H-B1/H-B3 settings 'precision' and 'context limit'",
          lambda c: f"AWQ moves SGLang's B1 lead to the value in H-B1; a context of 8,192 rejects every "
          f"abnormal prompt (H-B3 with that context limit: {_setting(c, 'H-B3', 'context limit')}, base "
          f"{_rng(c, 'H-B3')})", "inconsistent",
          "with max_seq_len 8192, §3.4's >16K abnormal requests are rejected on arrival: the OOM of B17 "
          "cannot happen"),
    Claim("B20", "B", "§3.1", "vLLM 0.6.3", "vLLM 0.6.3, SGLang 0.3.2", "vLLM: the V0 preset (vllm-v0.yaml, "
          "0.6.x); SGLang: the 0.3.2 preset (sglang-v0.3.yaml)", "-",
          "agrees", "both versions are expressed; the arms leave out the request path (engine.api_*) and "
          "SGLang's radix cache, which finds nothing to reuse in these prompts"),
    Claim("B21", "B", "§4.3 table", "HF原生	71.5	54.2	37.1%	39.8%", "HF: 71.5 GB total, 54.2 GB KV, "
          "'effective use' 39.8 %", "-", "54.2 / 71.5 = 75.8 %, not 39.8 %", "inconsistent",
          "the vLLM and SGLang rows do satisfy KV / total (77.2 %, 71.4 %); the HF row does not"),
    Claim("B22", "B", "§4.3 table", "vLLM	62.3	48.1	11.3%	77.2%", "vLLM 14B: 62.3 GB in use",
          "-", lambda c: f"--gpu-memory-utilization 0.9 (the report's §3.3) reserves {c['phys']['vllm_0p9_gb']:.0f} GB",
          "inconsistent", "vLLM reserves its fraction at start-up, so it cannot show 62.3 GB at 0.9"),
    Claim("B23", "B", "§4.3", "显存碎片率从4.2%降到2.1%，但P99延迟上升33%", "SGLang chunk 256 -> 128: "
          "fragmentation 4.2 -> 2.1 %, P99 +33 %", "B4 table (SGLang chunk 128/256)", "B4: TTFT P99 up (1.6 -> "
          "2.9 s); no fragmentation at page 1", "disagrees", "the direction of P99 agrees; chunk size cannot "
          "change KV fragmentation"),
    Claim("B24", "B", "§2.2", "实测14B模型在8K上下文下显存峰值降低39%", "chunked prefill: 14B peak memory -39 % "
          "at 8K", "-", "-", "not expressible", "the KV pool is pre-allocated; activation peaks are not modelled "
          "per iteration"),
    Claim("B25", "B", "§2.1", "vLLM的GEMM计算占比从68%跌至41%", "vLLM GEMM share 68 -> 41 %", "-", "-",
          "not expressible", "no kernel-share output"),
    Claim("B26", "B", "§2.2", "每请求多出2.3ms的launch延迟", "T4: chunk 128 adds 2.3 ms per request", "-", "-",
          "not expressible", "no T4 pack"),
    Claim("B27", "B", "§2.3", "实测在16K上下文下端到端延迟降低22%", "SGLang skips FFN on sparse chunks: -22 % at 16K",
          "-", "-", "implausible", "SGLang has no such skipping; dense FFNs run on every token"),
    Claim("B28", "B", "§2.3, §4.4", "SGLang在8K上下文下得分比vLLM高2.7分", "quality: BLEU +2.7, MT-Bench, "
          "AlpacaEval, MMLU 62.1 -> 68.7", "-", "-", "not expressible", "output quality"),
    Claim("B29", "B", "§3.1", "P95延迟反而降低8%", "SGLang without torch.compile: P95 -8 %", "-", "-",
          "not expressible", "no compile model"),
    Claim("B30", "B", "§3.3", "--max-running-requests 128", "SGLang --max-running-requests 128: GPU use 89-93 %",
          "-", "the arms leave it unset (SGLang derives it)", "not expressible", "no SM-utilization output"),
    Claim("B31", "B", "§5.3", "这个切换过程在实测中耗时<1.2秒", "fail-over between engines < 1.2 s", "-", "-",
          "not expressible", "not a scheduler property"),
)


def rows(ctx: dict) -> list[dict]:
    return [{"id": c.id, "report": c.report, "place": c.place, "quote": c.quote, "gloss": c.gloss,
             "runs": c.runs, "prediction": _v(c.prediction, ctx), "verdict": _v(c.verdict, ctx),
             "why": _v(c.why, ctx)} for c in CLAIMS]


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\t", " ").replace("\n", " ")


def table(ctx: dict) -> str:
    rs = rows(ctx)
    lines = ["| # | place | the report (quoted) | what it says | servesim runs | servesim predicts | verdict | why |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append("| " + " | ".join(_cell(x) for x in (
            r["id"], f"{r['report']} {r['place']}", f"「{r['quote']}」", r["gloss"], r["runs"], r["prediction"],
            f"**{r['verdict']}**", r["why"])) + " |")
    counts = {v: sum(r["verdict"] == v for r in rs) for v in VERDICTS}
    lines += ["", f"{len(rs)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + "."]
    return "\n".join(lines)
