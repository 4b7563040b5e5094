#!/usr/bin/env bash
# Throughput of MAPPO on simple_spread (N=3, 25 cycles, local_ratio 0.5): BenchMARL 1.5.2 (its venv,
# made by benchmarl_spread.sh) and marl-q (this checkout), one after the other in ROUNDS interleaved
# rounds, both pinned to the same core, 1 thread, the same nice level; `uptime` before and after.
# Then prints the comparison (analysis/peers/compare_spread.py).
#   analysis/peers/speed_spread.sh                 # 3 rounds: BenchMARL 30k frames, marl-q 300k steps
#   ROUNDS=5 CPU=1 analysis/peers/speed_spread.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-/work/peers/benchmarl-venv}"
OUT="${OUT:-/work/peers/speed}"
ROUNDS="${ROUNDS:-3}"
BM_FRAMES="${BM_FRAMES:-30000}"
MQ_STEPS="${MQ_STEPS:-300000}"
CPU="${CPU:-1}"
BM_RUNS="${BM_RUNS:-/work/peers/out}"          # benchmarl_spread.sh's JSONs (returns at 300k)
MQ_SWEEPS="${MQ_SWEEPS:-sweeps/spread_mappo}"  # marl-q sweep folders of spread_mappo.yaml (returns)
[ -x "$VENV/bin/python" ] || { echo "no BenchMARL venv at $VENV: run analysis/peers/benchmarl_spread.sh first (SMOKE_ONLY=1 is enough)"; exit 2; }
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
uptime > "$OUT/uptime_before.txt"
for r in $(seq "$ROUNDS"); do
    (cd "$OUT" && taskset -c "$CPU" "$VENV/bin/python" "$HERE/benchmarl_spread.py" --algo mappo --seed "$r" \
        --frames "$BM_FRAMES" --tag "_speed_r$r" --out "$OUT") > "$OUT/bm_r$r.log" 2>&1
    rm -rf "$OUT/marlq_speed_r$r"
    (cd "$ROOT" && taskset -c "$CPU" python -m marl_q.cli run scenarios/spread_mappo.yaml --seed "$r" \
        --set run.total_env_steps="$MQ_STEPS" --set run.eval_every=null --set run.plots=false \
        --out "$OUT/marlq_speed_r$r" --quiet) > "$OUT/mq_r$r.log" 2>&1
    echo "round $r done"
done
uptime > "$OUT/uptime_after.txt"
(cd "$ROOT" && python "$HERE/compare_spread.py" --benchmarl "$BM_RUNS" --marlq $MQ_SWEEPS --speed "$OUT")
