"""Terminal output for the CLI: run header, progress bar, summary table."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servesim.metrics.stats import PCT_KEYS
from servesim.request import CAUSE_LABELS, CAUSE_NAMES, Cause

SHOW_AFTER_S = 2.0
CLASS_LABELS = ("P0", "P1", "P2", "P3", "P4")  # a progress bar appears only on runs longer than this


def print_header(console: Console, built) -> None:
    sc = built.scenario

    def say(text: str) -> None:  # user data (names, notes, paths) is plain text, never markup
        console.print(text, markup=False)

    hw, e, shape = sc.hardware, sc.engine, sc.model_shape
    console.rule(f"[bold]servesim[/] · {escape(sc.name)}")
    say(f"model     {shape.name}: {shape.num_layers} layers, hidden {shape.hidden_size}, "
                  f"heads {shape.num_heads}/{shape.num_kv_heads} kv, {shape.num_params() / 1e9:.2f} B params")
    if sc.is_fleet:
        _fleet_header(say, built)
    else:
        say(f"hardware  1 replica of {sc.gpus_per_replica} x {hw.gpu} (tp {sc.tp}, pp {sc.pp})")
        say(f"KV cache  {built.memory.describe()}")
    chunk = "chunked prefill" if e.enable_chunked_prefill else "no chunked prefill"
    say(f"engine    {e.scheduler}: max_num_seqs {e.max_num_seqs}, max_num_batched_tokens "
                  f"{e.max_num_batched_tokens}, {chunk}, block {e.block_size}, preemption {e.preemption}, "
                  f"max_model_len {sc.max_model_len}")
    say(f"step time {built.model.describe()}")
    rep = built.replica
    say(f"simulator {rep.path} engine" + (f" -- {rep.why}" if rep.why else ""))
    w = built.workload
    wc = sc.workload
    for note in getattr(sc, "load_notes", ()):
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
    say(f"router    {c.router}; overhead {c.router_overhead_s * 1e3:g} ms, network {c.network_delay_s * 1e3:g} ms "
        f"each way")


class ProgressReporter:
    """Shows a bar only once a run has lasted a few seconds; cheap to call often."""

    def __init__(self, console: Console, total: int | None, enabled: bool = True):
        self.console = console
        self.total = total
        self.enabled = enabled
        self._t0 = 0.0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.stop()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            if time.perf_counter() - self._t0 < SHOW_AFTER_S:
                return
            self._progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("requests"), TimeElapsedColumn(), console=self.console,
                                      transient=True)
            self._progress.start()
            self._task = self._progress.add_task("sim", total=self.total)
        self._progress.update(self._task, completed=done)


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
    console.print(line)


def print_summary(console: Console, res) -> None:
    s = res.summary
    r = s["requests"]
    console.rule("summary")
    console.print(f"requests  {r['arrived']:,} arrived, {r['completed']:,} completed, "
                  f"{r['rejected']:,} rejected, {r['in_flight']:,} in flight; {r['preemptions']:,} preemptions"
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
    if "cluster" in s:
        print_cluster(console, s["cluster"])
    console.print(f"simulated {s['sim_time_s']:,.1f} s in {s['wall_s']:.2f} s wall "
                  f"({r['arrived'] / max(s['wall_s'], 1e-9):,.0f} requests/s)")
