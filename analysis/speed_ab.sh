#!/usr/bin/env bash
# One scenario's env steps per second on several marl-q checkouts, interleaved round by round: each run a
# fresh process on one core (CPU, default 0), one thread, eval and plots off; `uptime` before and after.
# "loop" is env steps over the run's summary.json wall_s (the training loop), "process" over the whole
# process's wall time (imports included). Use it for before/after figures (docs/performance.md).
#
#   TREES="/path/to/before /path/to/after" analysis/speed_ab.sh STEPS ROUNDS SCENARIO [--set KEY=VALUE ...]
#
# TREES: checkouts (git worktree add ... <commit>), each run with its own code on PYTHONPATH; OUT: where
# the run folders go (a new temporary folder by default). Run every tree once first (a short run): numba
# compiles its kernels into each checkout's __pycache__ on a checkout's first run.
set -euo pipefail
if [ $# -lt 3 ] || [ -z "${TREES:-}" ]; then
    echo "usage: TREES=\"<checkout> <checkout> ...\" $0 STEPS ROUNDS SCENARIO [--set KEY=VALUE ...]" >&2
    exit 2
fi
STEPS=$1; ROUNDS=$2; SCENARIO=$3; shift 3
CPU="${CPU:-0}"
OUT="${OUT:-$(mktemp -d)}"
for tree in $TREES; do
    [ -f "$tree/$SCENARIO" ] || { echo "$0: $tree/$SCENARIO: no such scenario file in that checkout" >&2; exit 2; }
done
echo "uptime before: $(uptime)"
for r in $(seq 1 "$ROUNDS"); do
    for tree in $TREES; do
        out="$OUT/$(basename "$tree")_r$r"
        rm -rf "$out"
        t0=$(date +%s.%N)
        (cd "$tree" && PYTHONPATH="$tree" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c "$CPU" \
            python -m marl_q.cli run "$SCENARIO" --set run.total_env_steps="$STEPS" --set run.eval_every=null \
            --set run.plots=false --quiet --out "$out" "$@" > "$out.log" 2>&1) \
            || { echo "$0: the run in $tree failed: $out.log" >&2; exit 1; }
        t1=$(date +%s.%N)
        python - "$out" "$STEPS" "$t0" "$t1" "$tree" "$r" <<'PY'
import json, sys
out, steps, t0, t1, tree, r = sys.argv[1:]
summary = json.load(open(f"{out}/summary.json"))
print(f"round {r} {tree}: loop {int(steps) / summary['wall_s']:,.0f} env steps/s, "
      f"process {int(steps) / (float(t1) - float(t0)):,.0f}/s, final return {summary.get('final_return')}")
PY
    done
done
echo "uptime after: $(uptime)"
