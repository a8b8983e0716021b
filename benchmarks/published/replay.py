"""Replay the published measurements of ``rows.yaml`` in servesim and score the error of each.

A row is one published configuration (GPU, model, engine, batch, prompt and output lengths) with
the numbers its source printed; each number is one scored value. The scenario of a row is its
source's engine preset (``scenarios/engines/<engine>.yaml``) with the row's setup over it (see the
header of rows.yaml): closed-loop clients for an offline benchmark, Poisson arrivals (or all at
once) for a serving benchmark's request rate. Nothing is fitted: the errors are reported as they come out.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ROWS = HERE / "rows.yaml"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
SECTION = "## published validation"

#: metric key -> (what the table calls it, how to read it from summary.json)
METRICS = {
    "out_tok_s": ("output tok/s", lambda s: s["throughput"]["output_tok_per_s"]),
    "ttft_mean_s": ("TTFT mean (s)", lambda s: s["latency_s"]["ttft"]["mean"]),
    "itl_p50_s": ("ITL P50 (s)", lambda s: s["latency_s"]["itl"]["p50"]),
    "itl_mean_s": ("ITL mean (s)", lambda s: s["latency_s"]["itl"]["mean"]),
    "e2e_mean_s": ("E2E mean (s)", lambda s: s["latency_s"]["e2e"]["mean"]),
    # per request (E2E - TTFT) / (output - 1), requests of one output token left out: what
    # vLLM's benchmark_serving.py calls Mean TPOT (docs/metrics.md)
    "tpot_mean_s": ("TPOT mean (s)", lambda s: s["latency_s"]["tpot"]["mean"]),
    # mean ITL as a streaming client that counts one gap per chunk sees it (vLLM's
    # benchmark_serving.py: tokens that arrive together are one chunk, one gap): servesim's gaps
    # with the zero ones (tokens of one multi-step burst, docs/metrics.md) left out; equal to
    # itl_mean_s when every token arrives alone
    "itl_chunk_mean_s": ("ITL mean, per chunk (s)", lambda s: s["_itl_chunk_mean_s"]),
}


def itl_chunk_mean(res) -> float:
    """Mean of the run's non-zero inter-token gaps, each weighted by how many requests it spans
    (the recorder's (gap, count) pairs): the mean ITL of a client that sees a burst's tokens as
    one chunk."""
    import numpy as np

    rec = res.recorder
    rec.flush()
    total = weight = 0.0
    for v, w in rec.itl.parts():
        v, w = np.asarray(v, dtype=float), np.asarray(w, dtype=float)
        nz = v > 0
        total += float((v[nz] * w[nz]).sum())
        weight += float(w[nz].sum())
    return total / weight if weight else float("nan")


@dataclass(frozen=True)
class Scored:
    row: str
    source: str
    metric: str
    measured: float
    simulated: float
    step_model: str
    outside: float | None  # share of step time beyond the pack's measured grid
    why: str
    arm: str = ""  # "" for the row as its source states it; else the name of a source's arm

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0


def load_rows(path: Path = ROWS) -> dict:
    data = yaml.safe_load(path.read_text())
    ids = [r["id"] for r in data["rows"]]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"{path}: row id {dup[0]!r} appears twice")
    for r in data["rows"]:
        if r["source"] not in data["sources"]:
            raise ValueError(f"{path}: row {r['id']}: source {r['source']!r} is not in sources")
        unknown = sorted(set(r["measured"]) - set(METRICS))
        if unknown:
            raise ValueError(f"{path}: row {r['id']}: metric {unknown[0]!r}; allowed: {', '.join(METRICS)}")
    stray = sorted(set(data.get("why") or {}) - set(ids))
    if stray:
        raise ValueError(f"{path}: why names row {stray[0]!r}, which is not a row")
    for key, src in data["sources"].items():
        for name, arm in (src.get("arms") or {}).items():
            bad = sorted(set(arm) - ARM_KEYS)
            if bad:
                raise ValueError(f"{path}: source {key} arm {name}: key {bad[0]!r}; allowed: {', '.join(sorted(ARM_KEYS))}")
            if not str(arm.get("what", "")).strip():
                raise ValueError(f"{path}: source {key} arm {name}: 'what' (what the arm changes and why) is missing")
            if not any(arm_applies(arm, r) for r in data["rows"] if r["source"] == key):
                raise ValueError(f"{path}: source {key} arm {name}: its 'rows' match no row of the source")
            mine = {r["id"] for r in data["rows"] if r["source"] == key and arm_applies(arm, r)}
            stray = sorted(set(arm.get("per_row") or {}) - mine)
            if stray:
                raise ValueError(f"{path}: source {key} arm {name}: per_row names {stray[0]!r}, not a row of the arm")
    return data


#: an arm of a source: the same rows replayed with one stated change (``setup`` over the row's
#: setup, ``set`` over its settings), e.g. another weight recipe; reported next to the rows as the
#: source states them, never mixed into the headline numbers
ARM_KEYS = {"what", "rows", "setup", "set", "per_row"}


def arm_applies(arm: dict, row: dict) -> bool:
    """``rows``: row-id prefixes the arm replays (all of the source's rows when absent)."""
    prefixes = arm.get("rows")
    return not prefixes or any(str(row["id"]).startswith(str(p)) for p in prefixes)


def arm_row(row: dict, arm: dict) -> dict:
    """The row with the arm's change applied: ``setup`` / ``set`` for every row, then ``per_row``
    (row id -> its own setup / set, e.g. the engine limits a benchmark tool derives from that row's
    lengths under the arm's change)."""
    own = (arm.get("per_row") or {}).get(row["id"]) or {}
    return {**row, "setup": {**row["setup"], **(arm.get("setup") or {}), **(own.get("setup") or {})},
            "set": {**(row.get("set") or {}), **(arm.get("set") or {}), **(own.get("set") or {})}}


def read_lengths(name: str) -> list[tuple[int, int]]:
    """A row's per-request lengths (``setup.lengths``): a CSV under benchmarks/published/ with a
    ``prompt,output`` header, one row per request in the source's order, as its result file lists
    them (e.g. benchmark_serving.py's ``input_lens`` / ``output_lens``)."""
    path = HERE / name
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    if lines[0].replace(" ", "") != "prompt,output":
        raise ValueError(f"{path}: header {lines[0]!r}; allowed: 'prompt,output'")
    pairs = []
    for i, ln in enumerate(lines[1:], start=2):
        a, b = (int(x) for x in ln.split(","))
        if a < 1 or b < 0:
            raise ValueError(f"{path}:{i}: prompt {a}, output {b}; allowed: prompt >= 1, output >= 0")
        pairs.append((a, b))
    return pairs


def sglang_random(spec: dict, n: int, rate) -> list[tuple[float, int, int]]:
    """The requests SGLang's ``python -m sglang.bench_serving --dataset-name random`` sends,
    rebuilt from its seed: (send time, prompt tokens, output tokens) each. Its
    sample_random_requests draws every prompt length, then every output length, from numpy's
    global RandomState seeded with ``--seed`` (randint over [max(int(L r), 1), L] and
    [int(O r), O], r = --random-range-ratio), and get_request then draws one exponential gap of
    mean 1/rate after each request it sends (python/sglang/bench_serving.py, e.g. commit 0033168f);
    the row's ``sglang_random`` gives input_len, output_len, range_ratio and seed."""
    import numpy as np

    unknown = sorted(set(spec) - {"input_len", "output_len", "range_ratio", "seed"})
    if unknown:
        raise ValueError(f"sglang_random: key {unknown[0]!r}; allowed: input_len, output_len, range_ratio, seed")
    rs = np.random.RandomState(int(spec["seed"]))
    i_len, o_len, r = int(spec["input_len"]), int(spec["output_len"]), float(spec["range_ratio"])
    prompts = rs.randint(max(int(i_len * r), 1), i_len + 1, size=n)
    outputs = rs.randint(int(o_len * r), o_len + 1, size=n)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        if str(rate) != "inf":
            t += float(rs.exponential(1.0 / float(rate)))
    return [(times[k], int(prompts[k]), int(outputs[k])) for k in range(n)]


def lengths_trace(row: dict) -> tuple[Path, int]:
    """The row's requests as a trace servesim replays as it is (workload.trace, BurstGPT format),
    so every request has exactly its own lengths and send time: ``setup.lengths`` (a file of
    lengths, every request at time 0: a serving benchmark's infinite rate) or
    ``setup.sglang_random`` (SGLang's random dataset and Poisson sends rebuilt from the seed). A
    request with 0 output tokens (one the source recorded as returning none, or a 0 drawn)
    replays with 1, servesim's least."""
    import tempfile

    s = row["setup"]
    if s.get("sglang_random"):
        reqs = sglang_random(s["sglang_random"], int(s["requests"]), s.get("rate", "inf"))
    else:
        reqs = [(0.0, a, b) for a, b in read_lengths(s["lengths"])]
    out = Path(tempfile.gettempdir()) / "servesim-published" / f"{row['id']}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
        f"{t:.6f},published,{a},{max(b, 1)},{a + max(b, 1)},Conversation log\n" for t, a, b in reqs)
    out.write_text(text)
    return out, len(reqs)


def scenario_of(row: dict, source: dict):
    """The row's scenario: its source's engine preset with the row's setup over it."""
    import servesim

    s = row["setup"]
    rounds = int(source.get("rounds", 1))
    # a row may give its own request count (a benchmark that sends a fixed number of requests
    # through an engine that holds at most `batch` of them) instead of batch x rounds
    n_requests = int(s.get("requests", s["batch"] * rounds))
    preset = REPO / "scenarios" / "engines" / f"{source['engine']}.yaml"
    # a weight format other than the checkpoint's (e.g. fp8): the model as a mapping, so that the
    # step model is the pack of that precision (or says why none fits)
    model = f"{{name: {s['model']}, quantization: {s['quantization']}}}" if s.get("quantization") else s["model"]
    if "rate" not in s:  # `batch` clients back to back, all sending at time 0
        arrival = f"{{process: closed, clients: {s['batch']}, think_s: 0}}"
    elif s.get("lengths") or s.get("sglang_random"):  # per-request lengths (and send times): a trace
        arrival = None
    elif str(s["rate"]) == "inf":  # a serving benchmark's infinite rate: every request at time 0
        arrival = f"{{process: closed, clients: {n_requests}, think_s: 0}}"
    else:  # a serving benchmark's request rate: Poisson arrivals (the engine's cap is `batch`)
        arrival = f"{{process: poisson, rate: {float(s['rate'])}}}"
    if s.get("sglang_random"):
        trace, n_requests = lengths_trace(row)
        workload = f"workload={{trace: {{file: '{trace}', format: burstgpt}}}}"
    elif s.get("lengths"):
        if str(s.get("rate")) != "inf":
            raise ValueError(f"row {row['id']}: setup.lengths needs rate inf (got {s.get('rate')!r}); allowed: inf")
        trace, n_requests = lengths_trace(row)
        workload = f"workload={{trace: {{file: '{trace}', format: burstgpt}}}}"
    else:
        workload = (f"workload={{arrival: {arrival}, prompt: {{dist: fixed, value: {s['prompt']}}}, "
                    f"output: {{dist: fixed, value: {s['output']}}}}}")
    over = [
        f"name=published-{row['id']}", "seed=1", f"hardware.gpu={s['gpu']}", f"model={model}",
        f"hardware.gpus_per_replica={int(s.get('tp', 1))}", "step_time={model: auto}",
        f"stop={{requests: {n_requests}, warmup_requests: 0}}", workload,
        f"engine.max_num_seqs={s['batch']}",
    ]
    # the source's own settings, as its methodology states them (e.g. a benchmark config's KV
    # block count), given like --set so the preset's rules leave them alone
    over += [f"{k}={v}" for k, v in (source.get("set") or {}).items()]
    # and the row's own (e.g. an engine limit its benchmark tool derived from the row's lengths)
    over += [f"{k}={v}" for k, v in (row.get("set") or {}).items()]
    sc = servesim.load_scenario(str(preset), over)
    extra = {}
    # offline benchmarks (no HTTP server): no request-path time, where the engine models one; an
    # online source (a client against the engine's server) keeps the preset's
    if not source.get("online"):
        for field in ("api_request_s", "api_token_s"):
            if hasattr(sc.engine, field):
                extra[f"engine.{field}"] = 0.0
    if s.get("max_model_len"):
        extra["engine.max_model_len"] = s["max_model_len"]
    return sc.override(extra, source="published row") if extra else sc


def replay(rows: list[dict] | None = None, data: dict | None = None) -> list[Scored]:
    import servesim

    data = data or load_rows()
    out = []
    for row in rows if rows is not None else data["rows"]:
        source = data["sources"][row["source"]]
        arms = [("", row)] + [(name, arm_row(row, arm)) for name, arm in (source.get("arms") or {}).items()
                              if arm_applies(arm, row)]
        for name, r in arms:
            res = servesim.simulate(scenario_of(r, source))
            s = res.summary
            if "itl_chunk_mean_s" in row["measured"]:
                s = {**s, "_itl_chunk_mean_s": itl_chunk_mean(res)}
            ex = s.get("extrapolation") or {}
            outside = ex.get("step_time_share") if ex.get("measured_grid") else None
            why = "" if name else str((data.get("why") or {}).get(row["id"], "")).strip()
            for metric, value in row["measured"].items():
                out.append(Scored(row["id"], row["source"], metric, float(value), float(METRICS[metric][1](s)),
                                  s["step_model"]["label"], outside, why, name))
    return out


def unexplained(scored: list[Scored], limit: float = 0.25) -> list[Scored]:
    """Values off by more than ``limit`` whose row has no why-text in rows.yaml: the table says
    so by name instead of claiming every miss is explained."""
    return [x for x in scored if abs(x.error) > limit and not x.why and not x.arm]


def table(scored: list[Scored], data: dict) -> str:
    """The markdown section written into benchmarks/RESULTS.md: the headline and the row table hold
    the rows as their sources state them; a source's arms follow in a table of their own."""
    arms = [x for x in scored if x.arm]
    scored = [x for x in scored if not x.arm]
    errs = [abs(x.error) for x in scored]
    sources = sorted({x.source for x in scored})
    lines = [SECTION, "",
             "`python -m benchmarks.published` replays the published measurements of "
             "`benchmarks/published/rows.yaml` (source, table and setup per row) on each source's engine "
             "preset; error = servesim / published - 1. Nothing is fitted to these rows. Kept aside, not used: "
             "the SGLang repository's benchmark/benchmark_vllm_060 results and Sarathi-Serve (OSDI'24) Table 4.", ""]
    if errs:
        lines += [f"**{len(scored)} published values from {len({x.row for x in scored})} configurations of "
                  f"{len(sources)} sources: median |error| {100 * statistics.median(errs):.1f}%, max "
                  f"{100 * max(errs):.1f}%; within 10%: {sum(e <= 0.10 for e in errs)}, within 25%: "
                  f"{sum(e <= 0.25 for e in errs)}.** Target (median <= 10%, max <= 25%): "
                  f"{'met' if statistics.median(errs) <= 0.10 and max(errs) <= 0.25 else 'not met'}; "
                  + (f"NOT explained (no why in rows.yaml): "
                     f"{', '.join(sorted({f'{x.row} {METRICS[x.metric][0]}' for x in unexplained(scored)}))}."
                     if unexplained(scored) else "every value off by more than 25% says why in the last column."), ""]
        lines += ["| metric | values | median abs err | max abs err |", "|---|---:|---:|---:|"]
        for m in METRICS:
            e = [abs(x.error) for x in scored if x.metric == m]
            if e:
                lines.append(f"| {METRICS[m][0]} | {len(e)} | {100 * statistics.median(e):.1f}% | {100 * max(e):.1f}% |")
        for src in sources:
            e = [abs(x.error) for x in scored if x.source == src]
            lines.append(f"| source {src} | {len(e)} | {100 * statistics.median(e):.1f}% | {100 * max(e):.1f}% |")
        lines.append("")
    lines += ["Sources:", ""]
    for key in sources:
        src = data["sources"][key]
        lines.append(f"- `{key}`: {src['title']}, {src['where']}. <{src['url']}> (preset `{src['engine']}`)"
                     + (f" **What it says:** {str(src['finding']).strip()}" if src.get("finding") else ""))
    lines += ["", "| row | metric | published | servesim | error | step model | beyond grid (step time) | why (misses over 25%) |",
              "|---|---|---:|---:|---:|---|---:|---|"]
    for x in scored:
        why = x.why if abs(x.error) > 0.25 else ""
        beyond = "-" if x.outside is None else f"{100 * x.outside:.0f}%"
        lines.append(f"| {x.row} | {METRICS[x.metric][0]} | {_num(x.measured)} | {_num(x.simulated)} | "
                     f"{100 * x.error:+.1f}% | {x.step_model} | {beyond} | {why} |")
    if arms:
        lines += _arm_lines(arms, scored, data)
    return "\n".join(lines) + "\n"


def _arm_lines(arms: list[Scored], primary: list[Scored], data: dict) -> list[str]:
    """Each arm's errors against the same rows as their source states them (not in the headline)."""
    base = {(x.row, x.metric): x for x in primary}
    lines = ["", "Arms (the same published rows replayed with one stated change; not in the headline numbers):", ""]
    for src, name in dict.fromkeys((x.source, x.arm) for x in arms):
        mine = [x for x in arms if (x.source, x.arm) == (src, name)]
        e = [abs(x.error) for x in mine]
        b = [abs(base[x.row, x.metric].error) for x in mine if (x.row, x.metric) in base]
        lines.append(f"- `{src}` arm `{name}`: {str(data['sources'][src]['arms'][name]['what']).strip()} "
                     f"**{len(mine)} values: median |error| {100 * statistics.median(e):.1f}%, max {100 * max(e):.1f}%**"
                     + (f" (the same rows as stated: median {100 * statistics.median(b):.1f}%, max {100 * max(b):.1f}%)."
                        if b else "."))
    lines += ["", "| row | arm | metric | published | servesim | error | as stated | step model | beyond grid (step time) |",
              "|---|---|---|---:|---:|---:|---:|---|---:|"]
    for x in arms:
        b = base.get((x.row, x.metric))
        beyond = "-" if x.outside is None else f"{100 * x.outside:.0f}%"
        lines.append(f"| {x.row} | {x.arm} | {METRICS[x.metric][0]} | {_num(x.measured)} | {_num(x.simulated)} | "
                     f"{100 * x.error:+.1f}% | {'-' if b is None else f'{100 * b.error:+.1f}%'} | {x.step_model} | {beyond} |")
    return lines


def _num(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"


def write_results(section: str, path: Path = RESULTS) -> None:
    """Replace the section in RESULTS.md (or append it): one current table, not a growing log."""
    text = path.read_text() if path.is_file() else ""
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("" if end < 0 else text[end:])
    path.write_text(text)
