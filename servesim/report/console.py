"""Terminal output for the CLI: run header, progress bar, summary table."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servesim.metrics.stats import PCT_KEYS
from servesim.request import CAUSE_LABELS, CAUSE_NAMES, Cause

CLASS_LABELS = ("P0", "P1", "P2", "P3", "P4")


def print_header(console: Console, built) -> None:
    sc = built.scenario

    def say(text: str) -> None:  # user data (names, notes, paths) is plain text, never markup
        console.print(text, markup=False)

    hw, e, shape = sc.hardware, sc.engine, sc.model_shape
    console.rule(f"[bold]servesim[/] · {escape(sc.name)}")
    say(f"model     {shape.headline()}")
    if sc.is_fleet:
        _fleet_header(say, built)
    else:
        say(f"hardware  1 replica of {sc.gpus_per_replica} x {hw.gpu} (tp {sc.tp}, pp {sc.pp})")
        say(f"KV cache  {built.memory.describe()}")
        if e.api_server_count is not None:  # (a path with delays runs as a fleet: its router line says it)
            say(f"path      {request_path_text(sc)}")
    chunk = "chunked prefill" if e.enable_chunked_prefill else "no chunked prefill"
    preset = f" (preset {e.preset})" if e.preset else ""
    say(f"engine    {e.scheduler}{preset}: max_num_seqs {e.max_num_seqs}, max_num_batched_tokens "
                  f"{e.max_num_batched_tokens}, {chunk}, block {e.block_size}, preemption {e.preemption}, "
                  f"max_model_len {sc.max_model_len}")
    _step_line(say, sc, built.model.describe())
    rep = built.replica
    why = rep.why
    if rep.path == "compiled" and not why:
        from servesim.jit import compiled_ready

        why = "" if compiled_ready() else "not built on this machine yet: the run compiles it first (1-2 min, once)"
    say(f"simulator {rep.path} engine" + (f" -- {why}" if why else ""))
    w = built.workload
    wc = sc.workload
    priced = getattr(built.model, "name", "")
    for note in getattr(sc, "load_notes", ()):
        if note.startswith("cuda graphs:") and priced != "pack":
            # the preset's capture rule is a pack's: a roofline (auto's fallback) prices no graph
            note += f" -- not used: the {priced or 'chosen'} step model prices no CUDA graphs"
        console.print(f"note      {note}")
    if wc.streams is not None:
        source = f"{len(wc.streams)} streams" + (f", rate_scale {wc.rate_scale:g}" if wc.rate_scale != 1.0 else "")
    elif wc.trace is not None:
        source = f"trace replay ({wc.trace.format})"
    else:
        a = wc.arrival.model_dump()
        source = "arrivals " + ", ".join(f"{k}={v}" for k, v in a.items() if v is not None)
        if wc.sessions is not None:
            source += " (session starts)"
    lengths = (f"prompt mean {w.prompt_tokens.mean():.0f}, output mean {w.output_tokens.mean():.0f} tokens"
               if len(w) else "no requests")
    say(f"workload  {len(w):,} requests; {source}; {lengths}")
    for note in w.notes:
        say(f"          {note}")


def _step_line(say, sc, described: str) -> None:
    """``step time: pack a100-80g/llama-3-8b (...)``, or ``roofline (uncalibrated): <reason>``
    with the model's own description below (servesim/perf/select.py chooses)."""
    from servesim.perf.select import provenance

    p = provenance(sc)
    if p["model"] == "pack":  # a twin: another model's pack of the same layer shapes, said so
        twin = p.get("same_layer_shapes_as")
        say(f"step time: {described}" + (f"; same layer shapes as {twin}" if twin else ""))
        return
    say(f"step time: {p['label']}")
    say(f"          {described}")


def _fleet_header(say, built) -> None:
    """Servers, groups (GPU, parallelism, count, KV per GPU), the router."""
    from servesim.memory import plan_memory

    sc = built.scenario
    hw, c = sc.hardware, sc.cluster
    gpus = sum(g.replicas * g.scenario.gpus_per_replica for g in sc.replica_groups)
    servers = f"{hw.servers} servers" if hw.servers is not None else "servers as needed"
    say(f"hardware  {sc.num_replicas} replicas, {gpus} GPUs on {sc.placement.servers_used} of {servers} "
        f"x {hw.gpus_per_server} GPUs" + (f"; inter-server link {hw.inter_server_link.bandwidth_gb_s:g} GB/s, "
                                         f"{hw.inter_server_link.latency_s * 1e6:g} us" if hw.inter_server_link else ""))
    for g in sc.replica_groups:
        gs = g.scenario
        ve = f", {gs.pp} virtual engines of {plan_memory(gs).num_blocks // gs.pp:,} blocks" if gs.pp > 1 else ""
        say(f"  group   {g.name}: {g.replicas} x {gs.hardware.gpu} tp {gs.tp} x pp {gs.pp}, {gs.model_shape.name}, "
            f"{gs.engine.scheduler}{ve}")
        say(f"          KV per GPU: {plan_memory(gs).describe()}")
    api = request_path_text(sc)
    say(f"router    {c.router}; overhead {c.router_overhead_s * 1e3:g} ms, network {c.network_delay_s * 1e3:g} ms "
        f"each way" + (f"; {api}" if api else ""))


def request_path_text(sc) -> str:
    """``request path 3 ms in, 1 ms out (engine.api_*)``, with the API servers' queue when
    engine.api_server_count is set (engine/api_queue.py); "" when the path is free."""
    e = sc.engine
    n = e.api_server_count
    if n is None:
        return (f"request path {e.api_request_s * 1e3:g} ms in, {e.api_token_s * 1e3:g} ms out "
                f"(engine.api_*)" if e.api_request_s or e.api_token_s else "")
    r = sc.num_replicas
    pool = f", pooled over {r} replicas: {n * r} servers ahead of the router" if r > 1 else ""
    return (f"request path {e.api_request_s * 1e3:g} ms in as a FIFO queue of {n} API server{'s' if n > 1 else ''} "
            f"per replica{pool}, {e.api_token_s * 1e3:g} ms out (engine.api_*)")


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f}"


def _slo_text(slo: dict) -> str:
    """``ttft_p99 ok`` / ``MISS`` per percentile target (targets and values are in
    summary.json); the per-request thresholds for streams without targets."""
    if not slo["met"]:
        return ", ".join(f"{k.removesuffix('_s')}<={v:g}" for k, v in slo["targets"].items())
    return ", ".join(f"{key} " + ("-" if m["met"] is None else ("ok" if m["met"] else "MISS"))
                     for key, m in slo["met"].items())


def _s(x) -> str:
    return "-" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.3g}")


def print_classes(console: Console, by_class: dict) -> None:
    """One row per class label: counts, P99 tails in seconds, share of good requests (each
    against its stream's SLO) and the class's SLO verdicts."""
    table = Table(title="per class (P99 in seconds)", show_edge=False, header_style="bold", pad_edge=False)
    for col in ("class", "done", "rejected", "TTFT", "TPOT", "E2E", "good", "SLO"):
        table.add_column(col, justify="left" if col in ("class", "SLO") else "right")
    for name, c in by_class.items():
        r, lat, slo = c["requests"], c["latency_s"], c["slo"]
        att = slo["attainment"]
        own = c["streams"] == [name] or (name in CLASS_LABELS and c["streams"] == ["default"])
        table.add_row(name if own else f"{name} ({', '.join(c['streams'])})", f"{r['completed']:,}",
                      f"{r['rejected']:,}", _s(lat["ttft"]["p99"]), _s(lat["tpot"]["p99"]), _s(lat["e2e"]["p99"]),
                      "-" if att is None else f"{att:.0%}", _slo_text(slo))
    console.print(table)


MAX_REPLICA_ROWS = 48


def print_cluster(console: Console, c: dict) -> None:
    """One row per replica (the first MAX_REPLICA_ROWS), then the load balance."""
    table = Table(title=f"replicas ({c['router']} router)", show_edge=False, header_style="bold", pad_edge=False)
    for col in ("#", "group", "tp x pp", "server", "sent", "done", "rej", "busy", "batch", "KV peak"):
        table.add_column(col, justify="left" if col in ("group", "server") else "right")
    rows = c["per_replica"]
    for r in rows[:MAX_REPLICA_ROWS]:
        servers = ",".join(str(x) for x in dict.fromkeys(r["servers"]))
        table.add_row(str(r["replica"]), r["group"], f"{r['tp']}x{r['pp']}", servers,
                      f"{r['requests']:,}", f"{r['completed']:,}", f"{r['rejected']:,}", f"{r['busy_share']:.0%}",
                      f"{r['mean_batch']:.1f}", f"{r['kv_peak']:.0%}")
    console.print(table)
    if len(rows) > MAX_REPLICA_ROWS:
        console.print(f"          ... {len(rows) - MAX_REPLICA_ROWS} more replicas in summary.json (cluster.per_replica)")
    b = c["balance"]

    def ratio(x):
        return "-" if x["max_over_mean"] is None else f"{x['max_over_mean']:.2f}"

    line = (f"balance   max/mean: requests {ratio(b['requests'])}, busy {ratio(b['busy_share'])}, "
            f"tokens {ratio(b['tokens'])}")
    if "affinity" in c:
        a = c["affinity"]
        line += f"; affinity: {a['hits']:,} to their key's replica, {a['overflows']:,} overflowed (load cap)"
    if "cache_aware" in c:
        a = c["cache_aware"]
        line += (f"; cache-aware: {a['cache_routed']:,} to their longest cached prefix, {a['below_threshold']:,} "
                 f"below the threshold, {a['unbalanced']:,} unbalanced; {a['matched_token_share']:.0%} of prompt "
                 f"tokens cached where routed")
    console.print(line)


def print_summary(console: Console, res) -> None:
    s = res.summary
    r = s["requests"]
    console.rule("summary")
    console.print(f"requests  {r['arrived']:,} arrived, {r['completed']:,} completed, "
                  f"{r['rejected']:,} rejected, {r['in_flight']:,} in flight; {r['preemptions']:,} preemptions"
                  + (f" ({s['engine']['swap_outs']:,} by swap)" if s["engine"].get("swap_outs") else "")
                  + (f"; rejected: {r['rejected_by_reason']}" if r["rejected_by_reason"] else ""))
    t = s["throughput"]
    att = s["slo"]["attainment"]
    console.print(f"throughput {t['req_per_s']:.3f} req/s, {t['output_tok_per_s']:,.0f} output tok/s; "
                  f"goodput {t['goodput_req_per_s']:.3f} req/s "
                  f"(SLO TTFT <= {s['slo']['ttft_s']} s, TPOT <= {s['slo']['tpot_s']} s: "
                  f"{'-' if att is None else f'{att:.1%}'} met)")
    table = Table(title="latency (ms)", show_edge=False, header_style="bold")
    table.add_column("metric")
    for col in ("mean",) + PCT_KEYS:
        table.add_column(col.replace("p999", "p99.9"), justify="right")
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        d = s["latency_s"][name]
        table.add_row(name.upper() if name != "queue" else "queue", *(_ms(d[k]) for k in ("mean",) + PCT_KEYS))
    console.print(table)
    if len(s.get("by_class", {})) > 1 or "by_stream" in s:
        print_classes(console, s["by_class"])
    kv = s["kv"]
    line = (f"KV        {kv['blocks_total']:,} blocks; peak {kv['peak_usage']:.1%}, "
            f"time-mean {kv['mean_usage']:.1%}")
    alloc = kv.get("of_allocated", {})
    if alloc.get("internal_fragmentation") is not None:
        line += (f"; of allocated KV: internal fragmentation {alloc['internal_fragmentation']:.1%}, "
                 f"reserved-unused {alloc['reservation_waste']:.1%}")
    if kv.get("external_fragmentation", {}).get("mean"):
        line += f"; external fragmentation {kv['external_fragmentation']['mean']:.1%} of the pool"
    hit = kv.get("prefix_hit_rate", {}).get("tokens")
    if hit is not None:
        line += f"; prefix-cache hits {hit:.1%} of tokens"
    console.print(line)
    b = s["blockage"].get("all")
    if b and b["waiting_s"] > 0:
        top = sorted(b["share"].items(), key=lambda kv_: -kv_[1])[:3]
        parts = [f"{CAUSE_LABELS[Cause(CAUSE_NAMES.index(k))]} {v:.0%}" for k, v in top if v > 0]
        console.print(f"waiting   {b['waiting_s']:,.1f} s in all; by cause: " + ", ".join(parts))
    e = s["engine"]
    cpu = f", of which engine CPU {e['cpu_overhead_s'] / max(e['gpu_s'] + e['cpu_overhead_s'] + e['other_s'], 1e-12):.1%}" \
        if e.get("cpu_overhead_s") else ""
    console.print(f"engine    {e['iterations']:,} iterations, busy {e['busy_fraction']:.1%}{cpu}, "
                  f"mean {e['mean_running']:.1f} running, {e['mean_batch_tokens']:.0f} tokens/iteration")
    ex = s.get("extrapolation")
    if ex is not None:  # how much of the run the pack's measured grid covered (servesim/perf/extrapolation.py)
        from servesim.perf.extrapolation import summary_line

        console.print(f"pack grid {summary_line(ex)}", markup=False)
        if ex.get("warning"):
            console.print("[bold yellow]warning[/]   " + escape(ex["warning"]), soft_wrap=True)
    if "cluster" in s:
        print_cluster(console, s["cluster"])
    console.print(f"simulated {s['sim_time_s']:,.1f} s in {s['wall_s']:.2f} s wall "
                  f"({r['arrived'] / max(s['wall_s'], 1e-9):,.0f} requests/s)")


# ------------------------------------------------------------------------- replicated runs
def _decimals(half_width: float) -> int:
    """Decimals that show a half-width with one significant digit (the estimate is rounded alike)."""
    import math

    if not math.isfinite(half_width) or half_width < 0:
        return 3
    if half_width == 0:
        return 0
    return min(max(-math.floor(math.log10(half_width)), 0), 6)


def pm(estimate, half_width, unit: str = "") -> str:
    """``1.23 ± 0.05`` (the estimate rounded like its half-width); ``n=1`` runs show no ±."""
    import math

    if estimate is None or not math.isfinite(estimate):
        return "-"
    u = f" {unit}" if unit else ""
    if half_width is None or not math.isfinite(half_width):
        return f"{estimate:.3g}{u}"
    if half_width <= 1e-9 * abs(estimate):  # identical in every run (up to float rounding)
        half_width = 0.0
    d = _decimals(half_width)
    if half_width == 0:
        return (f"{estimate:,.0f}" if estimate == int(estimate) else f"{estimate:.4g}") + f"{u} ± 0"
    return f"{estimate:,.{d}f}{u} ± {half_width:,.{d}f}"


def pm_seconds(estimate, half_width) -> str:
    """A latency with its interval in the unit that suits it: ``1.23 s ± 0.05``, ``41.2 ms ± 0.9``."""
    import math

    if estimate is None or not math.isfinite(estimate):
        return "-"
    scale, unit = ((1.0, "s") if abs(estimate) >= 1 else (1e3, "ms") if abs(estimate) >= 1e-3 or estimate == 0
                   else (1e6, "µs"))
    hw = None if half_width is None else half_width * scale
    return pm(estimate * scale, hw, unit)


def print_replicated_summary(console: Console, summary: dict) -> None:
    """The summary of ``servesim run --seeds N``: every figure with its confidence interval."""
    iv = summary["intervals"]
    reps = summary["replications"]

    def get(name):
        d = iv.get(name) or {}
        return d.get("estimate"), d.get("half_width")

    def pct(name):
        est, hw = get(name)
        return pm(None if est is None else est * 100, None if hw is None else hw * 100, "%")

    seeds = reps["seeds"]
    console.rule(f"summary over {reps['n']} replications (seeds {seeds[0]}..{seeds[-1]}), "
                 f"{reps['confidence']:.0%} intervals")
    console.print(f"requests  {pm(*get('completed'))} completed, {pm(*get('rejected'))} rejected, "
                  f"{pm(*get('preemptions'))} preemptions per run")
    console.print(f"throughput {pm(*get('req_per_s'), 'req/s')}, {pm(*get('output_tok_per_s'), 'output tok/s')}; "
                  f"goodput {pm(*get('goodput_req_per_s'), 'req/s')} (SLO TTFT <= {summary['slo']['ttft_s']} s, "
                  f"TPOT <= {summary['slo']['tpot_s']} s: "
                  f"{pct('slo_attainment')} met)")
    from rich import box

    names = ("ttft", "tpot", "itl", "e2e", "queue")
    table = Table(title="latency", box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False,
                  collapse_padding=True)
    table.add_column("", no_wrap=True, min_width=5)
    for name in names:
        table.add_column(name.upper() if name != "queue" else "queue", justify="right", no_wrap=True)
    for k in ("mean",) + PCT_KEYS:
        table.add_row(k.replace("p999", "p99.9"), *(pm_seconds(*get(f"{name}_{k}")) for name in names))
    console.print(table)
    classes = list(summary.get("by_class") or {})
    if len(classes) > 1 or "by_stream" in summary:
        ct = Table(title="per class (P99)", box=box.SIMPLE_HEAD, show_edge=False, header_style="bold",
                   pad_edge=False, collapse_padding=True)
        for col in ("class", "done", "TTFT", "TPOT", "E2E", "good"):
            ct.add_column(col, justify="left" if col == "class" else "right", no_wrap=True)
        for c in classes:
            att = get(f"slo_attainment@{c}")
            ct.add_row(c, pm(*get(f"completed@{c}")), pm_seconds(*get(f"ttft_p99@{c}")),
                       pm_seconds(*get(f"tpot_p99@{c}")), pm_seconds(*get(f"e2e_p99@{c}")),
                       pm(None if att[0] is None else att[0] * 100, None if att[1] is None else att[1] * 100, "%"))
        console.print(ct)
    console.print(f"KV        peak {pct('kv_peak_usage')}, time-mean {pct('kv_mean_usage')}")
    console.print(f"engine    busy {pm(*get('busy_fraction'))}, {pm(*get('iterations'))} iterations per run")
    console.print(f"simulated {reps['n']} runs in {summary['wall_s']:.2f} s wall")


# ------------------------------------------------------------------------------ many points
# ------------------------------------------------------------------------------ capacity
def _metric_pm(name: str, iv) -> str:
    est, hw = iv.estimate, iv.half_width
    if name.split("_")[0] in ("ttft", "tpot", "itl", "e2e", "queue") or name.endswith("_s"):
        return pm_seconds(est, hw)
    return pm(est, hw)


def print_capacity(console: Console, search) -> None:
    """The search path (one line per probe: configuration, replications, each SLO metric with its
    interval and verdict), then the answer with its margins, or why there is none."""
    what = "rate" if search.kind == "max-rate" else "replicas"
    console.rule(f"capacity: {search.kind} subject to " + ", ".join(str(s) for s in search.slos))
    if search.step_model is not None:
        console.print(f"step time: {search.step_model['label']}", markup=False, soft_wrap=True)
    table = Table(show_edge=False, header_style="bold")
    table.add_column("#", justify="right")
    table.add_column(what, justify="right")
    table.add_column("runs", justify="right")
    for s in search.slos:
        table.add_column(str(s), justify="right")
    table.add_column("verdict")
    style = {"pass": "green", "fail": "red", "open": "yellow"}
    for i, p in enumerate(search.path, 1):
        if search.kind == "max-rate":
            r = search.rate(p)
            label = f"{r:.4g} req/s" if r is not None else f"x{p.x:.4g}"
        else:
            label = f"{int(p.x)}" if p.x >= 1 else f"1 at x{p.x:g} load"
        cells = [f"[{style[v]}]{_metric_pm(s.metric, iv)}[/]" for s, iv, v in p.checks]
        table.add_row(str(i), label, str(p.n), *cells, f"[{style[p.verdict]}]{p.verdict}[/]")
    console.print(table)
    if not search.answered:
        console.print(f"[bold yellow]{search.refused}[/]", soft_wrap=True)
        return
    b = search.best
    if search.kind == "max-rate":
        r = search.rate(b)
        head = f"{r:.4g} req/s (x{b.x:.4g} the scenario's rate)" if r is not None else f"rate scale x{b.x:.4g}"
        if search.bound is not None:
            rb = search.rate(search.bound)
            nxt = f"{rb:.4g} req/s" if rb is not None else f"x{search.bound.x:.4g}"
            gap = search.bound.x / b.x - 1
            head += f"; {nxt} fails ({gap:.1%} above, within --tol {search.tol:.0%})"
        c = search.crossing
        if c is not None:
            def at(x: float) -> str:
                return f"{x * search.base_rate:.4g} req/s" if search.base_rate is not None else f"x{x:.4g}"
            iv = (f" ({c.confidence:.0%} interval {at(c.lo)} .. {at(c.hi)})" if math.isfinite(c.lo) else "")
            pn = c.p_next_meets
            nxt = ("" if pn is None else "; the next step up meets it with probability "
                   + ("under 1%" if pn < 0.01 else "over 99%" if pn > 0.99 else f"{pn:.0%}"))
            console.print(f"[bold]capacity:[/] {at(c.estimate)}{iv}, where {c.slo} crosses its bound{nxt}",
                          soft_wrap=True)
        console.print(f"[bold]largest rate verified to meet every SLO:[/] {head}")
    else:
        head = f"{int(b.x)} replicas"
        if search.bound is not None:
            head += f"; {int(search.bound.x)} fail"
        console.print(f"[bold]fewest replicas meeting every SLO:[/] {head}")
    if search.note:
        console.print(f"[yellow]{search.note}[/]", soft_wrap=True)
    for s, iv, room in search.margins():
        console.print(f"  {s}: {_metric_pm(s.metric, iv)} over {b.n} runs ({iv.confidence:.0%}); "
                      f"headroom {room:.1%} of the bound")
    if search.reused:
        console.print(f"{search.reused} runs reused from the probe store, {search.runs} run now", markup=False)


def print_plan(console: Console, result) -> None:
    """The plan's answer: the best few options (cost, fleet, binding SLO and its headroom), then
    the options without an answer and why."""
    spec = result.spec
    ranked = result.ranked()
    console.rule(f"plan: {spec.name}: the cheapest fleet meeting " + ", ".join(str(s) for s in spec.slos))
    table = Table(show_edge=False, header_style="bold")
    for col, just in (("#", "right"), ("option", "left"), (f"{spec.currency}/h", "right"), ("fleet", "right"),
                      ("binding SLO", "left"), ("headroom", "right")):
        table.add_column(col, justify=just)
    feas = [o for o in ranked if o.feasible]
    for i, o in enumerate(feas[:spec.top], 1):
        below = "" if o.fails_below is None else (" (one fewer fails)" if o.fails_below else "")
        table.add_row(str(i), escape(o.label()), f"{o.cost_per_hour:,.2f}",
                      f"{o.replicas} x {o.gpus_per_replica} {o.gpu}{below}", escape(o.binding or ""),
                      f"{o.headroom:.1%}")
    console.print(table)
    for o in ranked:
        if not o.feasible:
            console.print(f"  no answer for {o.label()}: {o.refused}", markup=False, soft_wrap=True)
    for label in dict.fromkeys(o.step_model for o in feas[:spec.top] if o.step_model):
        names = ", ".join(o.label() for o in feas[:spec.top] if o.step_model == label)
        console.print(f"step time ({names}): {label}", markup=False, soft_wrap=True)
    if feas:
        b = feas[0]
        console.print(f"[bold]cheapest:[/] {escape(b.label())}: {b.replicas} x {b.gpus_per_replica} {b.gpu} = "
                      f"{b.replicas * b.gpus_per_replica} GPUs, {b.cost_per_hour:,.2f} {spec.currency}/h", soft_wrap=True)
    else:
        console.print("[bold yellow]no option meets every SLO[/]")
