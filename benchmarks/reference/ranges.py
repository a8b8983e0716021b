"""Each headline prediction of docs/reference-experiments.md as a range over the assumptions the
field reports leave open (issue 33): router, chunked prefill and its budget, precision, lengths,
ramp-up, CPU overheads, load.

A headline is one number computed from a pair of arms (e.g. SGLang's output tokens/s over vLLM's).
Its *base* is the arms as shipped in scenarios/reference/, shortened (fewer requests, fixed seed
1) so that a whole tornado costs a minute or two; each *setting* changes one assumption (overrides
on the same files) and reruns the pair. The tornado chart orders the settings by how far they move
the headline from its base; the first one is "the assumption that moves it most".

Short runs are not the long runs of the tables above them: a base here can differ from the same
arm's number in the full table (say so beside it), and the spread is what this module is for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from benchmarks.reference.plan import REF, Run, _rel
from benchmarks.reference.tables import coverage
from servesim import load_scenario


@dataclass(frozen=True)
class Setting:
    assumption: str  # the open question (one per tornado bar group)
    value: str  # this setting's answer, as the table prints it
    both: dict[str, Any] = field(default_factory=dict)  # overrides on both arms
    a: dict[str, Any] = field(default_factory=dict)  # overrides on arm a only
    b: dict[str, Any] = field(default_factory=dict)  # overrides on arm b only


@dataclass(frozen=True)
class Headline:
    id: str
    title: str  # what the number is
    unit: str  # "%", "x", "s"
    arm_a: str  # scenario files in scenarios/reference/
    arm_b: str
    base: dict[str, Any]  # the short-run overrides every setting starts from
    metric: Callable[[dict, dict], float | None]  # (record a, record b) -> the headline
    report: str  # the report's figure for it, with its place
    report_value: float | None
    settings: tuple[Setting, ...]


def _tok_s(rec: dict) -> float:
    return rec["summary"]["throughput"]["output_tok_per_s"]


def _stream_p99(rec: dict, stream: str, metric: str = "ttft") -> float | None:
    s = (rec["summary"].get("by_stream") or {}).get(stream)
    if not s:
        return None
    v = (s.get("latency_s") or {}).get(metric, {}).get("p99")
    return v


def _lead(a: dict, b: dict) -> float | None:
    """b's output tokens/s over a's, minus one, in %."""
    return 100.0 * (_tok_s(b) / _tok_s(a) - 1.0) if _tok_s(a) > 0 else None


def _ratio_chat_ttft(a: dict, b: dict) -> float | None:
    """a's chat P99 TTFT over b's (how many times more damage a's engine lets through)."""
    x, y = _stream_p99(a, "chat"), _stream_p99(b, "chat")
    return x / y if x and y else None


def _pct_lower_chat(a: dict, b: dict) -> float | None:
    """How much lower b's chat P99 TTFT is than a's, in % (the report's "23 % lower")."""
    x, y = _stream_p99(a, "chat"), _stream_p99(b, "chat")
    return 100.0 * (1.0 - y / x) if x and y else None


AWQ8 = {"model": {"name": "qwen3-8b", "quantization": "awq"}, "step_time": {"model": "roofline"}}
BF16_ROOF = {"step_time": {"model": "roofline"}}
NO_CPU = {"engine.cpu_overhead_s": 0.0, "engine.cpu_overhead_per_seq_s": 0.0}
VLLM_CPU = {"engine.cpu_overhead_s": 0.002, "engine.cpu_overhead_per_seq_s": 1.5e-5}
# vLLM V0 with chunked prefill on runs _schedule_chunked_prefill (decodes first, then chunks in the
# same step: the vllm policy's running_first); the arms ship V0's order without it (prefill_first),
# which the option does not switch by itself when chunked prefill is turned on
V0_CHUNKED = {"engine.enable_chunked_prefill": True, "engine.options.mix": "running_first"}

HEADLINES: tuple[Headline, ...] = (
    Headline(
        "H-B1", "SGLang's output tokens/s over vLLM's, Qwen3-8B, 64 clients (2,048 in / 512 out)", "%",
        "b1_closed_vllm.yaml", "b1_closed_sglang.yaml",
        {"workload.arrival.clients": 64, "stop.requests": 384, "stop.warmup_requests": 64},
        _lead, "report B §4.1 table: 4,120 against 3,680 tokens/s at 64 concurrency = +12 %", 12.0,
        (
            Setting("CPU overhead", "none in either engine", both=NO_CPU),
            Setting("CPU overhead", "vLLM's estimate in both", both=VLLM_CPU),
            Setting("precision", "AWQ (roofline)", both=AWQ8),
            Setting("precision", "bf16 on the roofline", both=BF16_ROOF),
            Setting("ramp-up", "none (all 64 clients at t=0)", both={"workload.arrival.ramp_up_s": 0.0}),
            Setting("vLLM chunked prefill", "on, 8,192 (report §3.3)",
                    a={**V0_CHUNKED, "engine.max_num_batched_tokens": 8192}),
            Setting("run length", "1,280 requests", both={"stop.requests": 1280}),
            # "平均输入长度2048、输出长度512": averages, so the spread is open
            Setting("lengths", "averages 2,048 / 512, std half the mean",
                    both={"workload.prompt": {"dist": "normal", "mean": 2048, "std": 1024, "min": 16, "max": 8192},
                          "workload.output": {"dist": "normal", "mean": 512, "std": 256, "min": 16, "max": 2048}}),
        )),
    Headline(
        "H-B3", "vLLM's chat P99 TTFT over SGLang's with 10 % prompts of 16-30K tokens, Qwen3-8B", "x",
        "b3_abnormal_vllm.yaml", "b3_abnormal_sglang.yaml",
        {"stop.duration_s": 600.0},
        _ratio_chat_ttft,
        "report B §3.4: vLLM 'triggers the OOM killer', SGLang 'stays available' (no figure)", None,
        (
            Setting("vLLM chunked prefill", "on, 2,048 (V1-like chunks)",
                    a={**V0_CHUNKED, "engine.max_num_batched_tokens": 2048}),
            Setting("vLLM chunked prefill", "on, 8,192 (report §3.3)",
                    a={**V0_CHUNKED, "engine.max_num_batched_tokens": 8192}),
            Setting("context limit", "8,192 (report §4.1 max_seq_len): long prompts rejected",
                    both={"engine.max_model_len": 8192},
                    a={"engine.max_num_batched_tokens": 8192}),
            Setting("SGLang chunk", "256 (report §3.3)", b={"engine.chunked_prefill_size": 256}),
            Setting("precision", "AWQ (roofline)", both=AWQ8),
            Setting("load", "1.0 req/s", both={"workload.arrival.rate": 1.0}),
            Setting("load", "2.0 req/s", both={"workload.arrival.rate": 2.0}),
            Setting("CPU overhead", "none in either engine", both=NO_CPU),
        )),
    Headline(
        "H-A", "how much lower Halo's chat P99 TTFT is than Spark's (24 A100s, 2 % of the offered load)", "%",
        "a_fleet_spark.yaml", "a_fleet_halo.yaml",
        {"workload.rate_scale": 0.02, "stop.duration_s": 60.0, "stop.warmup_requests": 40},
        _pct_lower_chat, "report A §1: Halo's P99 latency 23 % lower than Spark's", 23.0,
        (
            Setting("router", "round robin (Nginx's default)", both={"cluster.router": "round-robin"}),
            Setting("model", "Qwen3-14B", both={"model": "qwen3-14b"}),
            Setting("precision", "AWQ (roofline)", both=AWQ8),
            Setting("load", "4 % of the offered load", both={"workload.rate_scale": 0.04}),
            Setting("load", "1 % of the offered load", both={"workload.rate_scale": 0.01}),
            Setting("CPU overhead", "none in either engine", both=NO_CPU),
        )),
)


def _run(h: Headline, arm: str, label: str, over: dict[str, Any]) -> Run:
    path = REF / arm
    sc = load_scenario(path, dict(over))
    src = _rel(path) + "".join(f" --set {k}={v}" for k, v in over.items())
    return Run(f"ranges-{h.id}", label, sc, src, {})


def pairs(h: Headline) -> list[tuple[Setting | None, Run, Run]]:
    """(setting, arm a run, arm b run); the first pair is the base (setting None)."""
    out = [(None, _run(h, h.arm_a, "base-a", h.base), _run(h, h.arm_b, "base-b", h.base))]
    for i, s in enumerate(h.settings):
        oa = {**h.base, **s.both, **s.a}
        ob = {**h.base, **s.both, **s.b}
        out.append((s, _run(h, h.arm_a, f"s{i}-a", oa), _run(h, h.arm_b, f"s{i}-b", ob)))
    return out


def all_runs(only: list[str] | None = None) -> list[Run]:
    return [r for h in HEADLINES if not only or h.id in only for _, a, b in pairs(h) for r in (a, b)]


def row_of(h: Headline, s: Setting | None, a: dict, b: dict) -> dict:
    """One setting's row from its two records (``s`` None: the base)."""
    return {"assumption": "base" if s is None else s.assumption,
            "value": "as the arms ship (short runs)" if s is None else s.value,
            "headline": h.metric(a, b), "cov_a": coverage(a), "cov_b": coverage(b)}


def row_line(h: Headline, r: dict) -> str:
    return f"| {r['assumption']} | {r['value']} | {fmt(r['headline'], h.unit)} | {r['cov_a']} / {r['cov_b']} |"


def evaluate(h: Headline, recs: dict[tuple[str, str], dict]) -> list[dict]:
    """One row per setting (the base first): the headline's value and each arm's coverage."""
    rows = [row_of(h, s, recs[(ra.exp, ra.label)], recs[(rb.exp, rb.label)]) for s, ra, rb in pairs(h)]
    base = rows[0]["headline"]
    for r in rows:
        r["delta"] = None if (r["headline"] is None or base is None) else r["headline"] - base
    return rows


def most(rows: list[dict]) -> dict | None:
    moved = [r for r in rows[1:] if r["delta"] is not None]
    return max(moved, key=lambda r: abs(r["delta"])) if moved else None


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "%":
        return "0 %" if round(v) == 0 else f"{v:+.0f} %"
    if unit == "x":
        return f"{v:.1f}x" if v < 10 else f"{v:.0f}x"
    return f"{v:.3g} {unit}"


def table(h: Headline, rows: list[dict]) -> str:
    lines = [f"**{h.id}: {h.title}.** The report: {h.report}.", "",
             "| assumption | setting | headline | calibration coverage (step time extrapolated: a / b) |",
             "|---|---|---|---|"]
    lines += [row_line(h, r) for r in rows]
    vals = [r["headline"] for r in rows if r["headline"] is not None]
    m = most(rows)
    lines.append("")
    if vals:
        lines.append(f"Range: {fmt(min(vals), h.unit)} to {fmt(max(vals), h.unit)}; base {fmt(rows[0]['headline'], h.unit)}."
                     + (f" The assumption that moves it most: **{m['assumption']}** ({m['value']}: "
                        f"{fmt(m['headline'], h.unit)})." if m else ""))
    return "\n".join(lines)


def tornado(h: Headline, rows: list[dict]):
    """Bars from the base to each setting's value, the largest move on top; a rule at the base
    and, where the report gives one, a dashed rule at the report's figure."""
    import altair as alt
    import pandas as pd

    base = rows[0]["headline"]
    data = [{"setting": f"{r['assumption']}: {r['value']}"[:60], "lo": min(base, r["headline"]),
             "hi": max(base, r["headline"]), "move": abs(r["delta"]), "value": r["headline"]}
            for r in rows[1:] if r["headline"] is not None and base is not None]
    if not data:
        return None
    df = pd.DataFrame(data)
    order = list(df.sort_values("move", ascending=False)["setting"])
    y = alt.Y("setting:N", sort=order, title=None)
    bars = alt.Chart(df).mark_bar(height=12).encode(
        y=y, x=alt.X("lo:Q", title=f"{h.id} ({h.unit})"), x2="hi:Q",
        color=alt.condition(alt.datum.value > base, alt.value("#4c78a8"), alt.value("#e45756")))
    layers = [bars, alt.Chart(pd.DataFrame({"x": [base]})).mark_rule(color="black").encode(x="x:Q")]
    if h.report_value is not None:
        layers.append(alt.Chart(pd.DataFrame({"x": [h.report_value]})).mark_rule(
            color="gray", strokeDash=[4, 3]).encode(x="x:Q"))
    return alt.layer(*layers).properties(width=360, height=22 * len(df),
                                         title=h.title[:90])


def blocks(recs: dict, chart, only: list[str] | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in HEADLINES:
        if only and h.id not in only:
            continue
        rows = evaluate(h, recs)
        out[f"range-{h.id}"] = table(h, rows)
        chart(f"tornado_{h.id.lower().replace('-', '_')}", tornado(h, rows))
    return out


def spans(recs: dict) -> dict[str, tuple[float, float]]:
    """headline id -> (lowest, highest) value over its settings (the base included)."""
    out = {}
    for h in HEADLINES:
        try:
            vals = [r["headline"] for r in evaluate(h, recs) if r["headline"] is not None]
        except KeyError:
            continue
        if vals:
            out[h.id] = (min(vals), max(vals))
    return out


def _evaluated(recs: dict):
    """(headline, its rows) for every headline whose runs are all in ``recs``."""
    for h in HEADLINES:
        try:
            yield h, evaluate(h, recs)
        except KeyError:
            continue


def setting_values(recs: dict) -> dict[str, dict[str, str]]:
    """headline id -> {assumption: the headline with that assumption's setting} for the claims
    table (a claim about one setting quotes its own value, not whichever moves most)."""
    return {h.id: {r["assumption"]: fmt(r["headline"], h.unit) for r in rows[1:]} for h, rows in _evaluated(recs)}


def summary_rows(recs: dict) -> dict[str, tuple[str, str]]:
    """headline id -> (range text, most-moving assumption) for the claims table."""
    out = {}
    for h, rows in _evaluated(recs):
        vals = [r["headline"] for r in rows if r["headline"] is not None]
        m = most(rows)
        out[h.id] = ((f"{fmt(rows[0]['headline'], h.unit)} (range {fmt(min(vals), h.unit)} to "
                      f"{fmt(max(vals), h.unit)})") if vals else "-",
                     f"{m['assumption']} ({m['value']})" if m else "-")
    return out

