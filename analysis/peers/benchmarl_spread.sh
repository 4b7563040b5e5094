#!/usr/bin/env bash
# Peer benchmark: BenchMARL 1.5.2 MAPPO and IPPO on PettingZoo simple_spread_v3
# (N=3, max_cycles=25, local_ratio=0.5, discrete actions), CPU, 1 torch thread.
#
# Creates the BenchMARL virtualenv if missing (outside the repo), installs the
# pins, then runs the (algorithm, seed) grid SEQUENTIALLY through
# benchmarl_spread.py, one process per run, at nice 19 pinned to one core.
#
# Usage:
#   analysis/peers/benchmarl_spread.sh            # smoke run + 6 full runs
#   SMOKE_ONLY=1 analysis/peers/benchmarl_spread.sh
#   SKIP_SMOKE=1 ALGOS="mappo" SEEDS="0 1" FRAMES=300000 analysis/peers/benchmarl_spread.sh
#   nohup analysis/peers/benchmarl_spread.sh > /work/peers/out/chain.log 2>&1 &
#
# Env vars: VENV (default /work/peers/benchmarl-venv), OUT (default /work/peers/out),
#           FRAMES (300000), SMOKE_FRAMES (6000), ALGOS ("mappo ippo"), SEEDS ("0 1 2"),
#           CPU (core to pin with taskset, default 0), NICE (default 19), EXTRA_ARGS (passed to the driver).
#
# Why these pins: benchmarl 1.5.2 requires torchrl>=0.10,<0.12; torchrl 0.11.1
# requires tensordict>=0.11,<0.12 and torch>=2.1 (works with torch 2.13 CPU; its
# compiled extension is only used by optional features). torchvision is a hard
# dependency of benchmarl -> 0.28.0, the release paired with torch 2.13.
# torchrl's PettingZoo wrapper imports `pettingzoo.mpe`, removed after 1.24 ->
# pettingzoo[mpe]==1.24.3 (pulls pygame 2.3.0).  torch==2.13.0 resolves to a
# local CPU wheel on this machine; never install an unpinned torch (CUDA build).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-/work/peers/benchmarl-venv}"
OUT="${OUT:-/work/peers/out}"
FRAMES="${FRAMES:-300000}"
SMOKE_FRAMES="${SMOKE_FRAMES:-6000}"
ALGOS="${ALGOS:-mappo ippo}"
SEEDS="${SEEDS:-0 1 2}"
CPU="${CPU:-0}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
PY_BASE="${PYTHON:-python3}"

mkdir -p "$OUT"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[benchmarl_spread] creating venv $VENV"
    "$PY_BASE" -m venv "$VENV"
    "$VENV/bin/pip" install torch==2.13.0
    "$VENV/bin/pip" install \
        benchmarl==1.5.2 \
        torchrl==0.11.1 \
        "tensordict>=0.11,<0.12" \
        torchvision==0.28.0 \
        "pettingzoo[mpe]==1.24.3"
fi
"$VENV/bin/pip" freeze > "$OUT/pip_freeze.txt"
echo "[benchmarl_spread] venv pip freeze -> $OUT/pip_freeze.txt"

export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
PIN=()
if command -v taskset >/dev/null 2>&1; then PIN=(taskset -c "$CPU"); fi

run_one() {  # algo seed frames tag
    local algo="$1" seed="$2" frames="$3" tag="$4"
    local log="$OUT/${algo}_s${seed}${tag}.log"
    echo "[benchmarl_spread] $(date -u +%FT%TZ) start $algo seed=$seed frames=$frames -> $log"
    # run from OUT so nothing lands in the repository
    (cd "$OUT" && nice -n "${NICE:-19}" "${PIN[@]}" "$VENV/bin/python" "$HERE/benchmarl_spread.py" \
        --algo "$algo" --seed "$seed" --frames "$frames" --tag "$tag" \
        --out "$OUT" --pip-freeze "$OUT/pip_freeze.txt" $EXTRA_ARGS) > "$log" 2>&1 \
        && echo "[benchmarl_spread] $(date -u +%FT%TZ) done  $algo seed=$seed" \
        || echo "[benchmarl_spread] $(date -u +%FT%TZ) FAILED $algo seed=$seed (see $log)"
}

if [ -z "${SKIP_SMOKE:-}" ]; then
    run_one mappo 0 "$SMOKE_FRAMES" _smoke
    [ -f "$OUT/mappo_s0_smoke.json" ] || { echo "smoke run failed"; exit 1; }
fi
[ -n "${SMOKE_ONLY:-}" ] && exit 0

# seed-major order so that paired (mappo, ippo) results exist early
for seed in $SEEDS; do
    for algo in $ALGOS; do
        run_one "$algo" "$seed" "$FRAMES" ""
    done
done
echo "[benchmarl_spread] $(date -u +%FT%TZ) all runs finished; JSONs in $OUT"
