# Here (no GPU): turn fp8_static.sh's output into the shipped fp8_static packs, as done on
# 2026-12-05 (fourth session). The run of 13:54 UTC came from an H100 80GB HBM3 (no H200 could be
# started that afternoon), so its packs are h100-80g/llama-3-8b-fp8_static and
# h100-80g/llama-3.1-8b-fp8_static; the script had copied the H200 bf16 packs' attention rows.
#   1. attention rows replaced by the H100 bf16 llama-3-8b pack's (h100_llama.sh, same machine,
#      minutes before; same layer shapes and SDPA choice as both models): profile_gpu.py combine
#   2. overhead rows recomputed against those rows: forward - table sum, the table sum moved by
#      num_layers x (H100 - H200 decode attention at the calibration batch, context 1024);
#      overhead_eager then taken from that bf16 pack, as the H200 fp8 pack does (YAML says why)
#   3. send_recv rows (the H200 2-GPU run's), each pack's efficiency record; the llama-3-8b
#      fp8_static validation forwards
# Needs the repo's venv. Usage (both tarballs as returned by the device runs):
#   bash calibration/device_runs/fp8_static_integrate.sh fp8_static.tar.gz h100_llama.tar.gz
set -euo pipefail
TAR=$1; BF=$2; W=$(mktemp -d); mkdir -p $W/f $W/b $W/c/packs/h100-80g; PY=${PY:-python}
tar xzf "$TAR" -C $W/f; tar xzf "$BF" -C $W/b
G=h100-80g; H=calibration/packs/$G; V=calibration/validation/$G; mkdir -p $H $V
cat $W/f/m/progress $W/f/m/env.txt
cp $W/f/m/a/packs/$G/*-fp8_static.csv $W/f/m/a/packs/$G/*-fp8_static.yaml $W/c/packs/$G/
$PY calibration/profile_gpu.py combine --out $W/c --replace-from $W/b/m/a/packs/$G --replace-ops attn_decode,attn_prefill --note "fp8_static.sh ran on an H100 (no H200 lent) with --attention-from calibration/packs/h200: its attention rows were the H200's. Replaced by the H100 bf16 llama-3-8b pack's attention rows, measured on the same machine minutes before (h100_llama.sh, 2026-12-05; attention reads bf16 Q/K/V whatever the weights' format; same SDPA choice); overhead rows then recomputed (overhead.recomputed)"
PYTHONPATH=$PWD $PY - $W <<'EOF'
import sys
from pathlib import Path

import yaml
sys.path.insert(0, "calibration")
from profiler.writers import read_rows, write_rows  # noqa: E402

W, G = Path(sys.argv[1]), "h100-80g"
bf = W / "b/m/a/packs" / G / "llama-3-8b.csv"
bf_eager = [r for r in read_rows(bf) if r[0] == "overhead_eager"]
for new in sorted((W / "c/packs" / G).glob("*-fp8_static.csv")):
    old = W / "f/m/a/packs" / G / new.name
    meta = yaml.safe_load(new.with_suffix(".yaml").read_text())
    L = int(meta["rank_shape"]["num_layers"])

    def dec(rows):
        return {int(r[2]): float(r[5]) for r in rows if r[0] == "attn_decode" and int(r[3]) == 1024}
    rows = read_rows(new)
    a_new, a_old = dec(rows), dec(read_rows(old))
    pts = meta["overhead"]["points"]
    re, diff = {}, {}
    for key, p in pts.items():
        op, b = key.split(" batch=")
        b = int(b)
        table = float(p["table_sum_ms"]) + L * (a_new[b] - a_old[b])
        diff[(op, b)] = float(p["forward_ms"]) - table
        re[key] = dict(table_sum_ms=round(table, 5), diff_ms=round(diff[(op, b)], 5))
    std = {(r[0], int(r[2])): r[6] for r in rows}
    rows = [r for r in rows if r[0] not in ("overhead_eager", "overhead_cuda_graph")]
    rows += [("overhead_cuda_graph", b, b, 0, 0, d, std.get(("overhead_cuda_graph", b), float("nan")))
             for (op, b), d in sorted(diff.items()) if op == "overhead_cuda_graph" and d > 0]
    rows += bf_eager
    meta["overhead"]["recomputed"] = dict(
        rule=f"forward - table sum, the table sum moved by {L} layers x (replaced - measured-with decode "
             "attention at the calibration batch, context 1024): the forwards ran the H100's own attention",
        points=re)
    meta["overhead_eager_source"] = (
        f"overhead_eager rows taken from the H100 bf16 pack of llama-3-8b ({bf.name}, h100_llama.sh, same "
        "machine, same day), not this recipe's. Why (as for the H200 fp8 pack): the engines fuse the "
        "activation's quantization into the norm / activation kernel, so their FP8 forward launches what the "
        "bf16 one does; this recipe's eager forward launches 3 more kernels per layer (the casts) and calls "
        "Python QLinear objects, and its measured host time exceeded the bf16 pack's by 5-10 ms at batch 1-128 "
        "(overhead_eager_measured_by_recipe_ms); between processes the eager launch time also varies by "
        "several ms (VALIDATION.md). CUDA-graph iterations do not read these rows.")
    meta["overhead_eager_measured_by_recipe_ms"] = {b: round(d, 4) for (op, b), d in sorted(diff.items())
                                                    if op == "overhead_eager"}
    rows = sorted(rows, key=lambda r: (r[0], int(r[2]), int(r[1]), int(r[3]), int(r[4])))
    write_rows(new, rows)
    meta["rows"] = len(rows)
    text = yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None)
    # the temporary folder's name would differ per run: name the tarballs instead
    text = text.replace(f"{W}/b/", "h100_llama.tar.gz:").replace(f"{W}/c/", "").replace(f"{W}/f/", "fp8_static.tar.gz:").replace(str(W), "<tmp>")
    new.with_suffix(".yaml").write_text(text)
    print(new.name, {k: v["diff_ms"] for k, v in re.items() if "cuda_graph" in k})
EOF
cp $W/c/packs/$G/*-fp8_static.csv $W/c/packs/$G/*-fp8_static.yaml $H/
for PK in llama-3-8b-fp8_static llama-3.1-8b-fp8_static; do
  # send_recv rows like every pack (pipeline stages); no two H100s were measured: the H200 2-GPU
  # run's rows, as calibration/device_runs/h100_integrate.sh does for the H100 bf16 pack
  $PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/$PK.csv'), [Path('calibration/packs/h200/collectives/collectives_2gpu.csv')])"
  PYTHONPATH=$PWD $PY - "$PK" <<'EOF'
import sys

import yaml
from servesim.perf.efficiency import pack_efficiency
from servesim.perf.pack import load_pack

pack = load_pack("h100-80g", sys.argv[1], 1)
path = pack.csv_path.with_suffix(".yaml")
meta = yaml.safe_load(path.read_text())
for c in meta.get("collectives") or []:
    c["measured_on"] = ("2 x NVIDIA H200 (calibration/packs/h200/collectives/), not on H100s: the transfer "
                        "rule's link term (bytes / link + 8 us) is the same for the H100 SXM and the H200 "
                        "(NVLink4, 450 GB/s a direction), so the rows are used as measured")
meta["efficiency"] = pack_efficiency(pack)
path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
EOF
done
cp $W/f/m/v/validation/$G/llama-3-8b-fp8_static.csv $W/f/m/v/validation/$G/llama-3-8b-fp8_static.yaml $V/
rm -rf $W
