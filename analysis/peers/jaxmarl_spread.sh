#!/usr/bin/env bash
# marl-q against JaxMARL's IPPO on simple_spread (docs/mappo.md, "Against JaxMARL").
# Builds JaxMARL's own virtualenv from PyPI (jaxmarl 0.2.0 and the two packages its IPPO baseline
# imports that it does not install: distrax, omegaconf), takes the baseline file from a JaxMARL
# checkout, checks that both envs compute the same observations and rewards, then runs
# analysis/peers/jaxmarl_spread.py: 3 interleaved rounds, one core, one thread.
#
#   JAXMARL_SRC=/path/to/JaxMARL analysis/peers/jaxmarl_spread.sh [extra args, e.g. --steps 2000000]
#
# JAXMARL_SRC: a checkout of github.com/FLAIROx/JaxMARL (cloned to /tmp/jaxmarl_src when unset);
# JAXMARL_VENV: where the virtualenv goes (/tmp/jaxmarl_venv).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${JAXMARL_VENV:-/tmp/jaxmarl_venv}"
SRC="${JAXMARL_SRC:-/tmp/jaxmarl_src}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "jaxmarl==0.2.0" distrax omegaconf
fi
BASELINE="$SRC/baselines/IPPO/ippo_ff_mpe.py"
if [ ! -f "$BASELINE" ]; then
    if [ -z "${JAXMARL_SRC:-}" ]; then
        git clone -q --depth 1 https://github.com/FLAIROx/JaxMARL "$SRC"
    else
        echo "jaxmarl_spread.sh: $BASELINE: no such file (JAXMARL_SRC must be a JaxMARL checkout)" >&2
        exit 2
    fi
fi
cd "$ROOT"
exec python analysis/peers/jaxmarl_spread.py --jaxmarl-python "$VENV/bin/python" --baseline "$BASELINE" \
    --config "$SRC/baselines/IPPO/config/ippo_ff_mpe.yaml" --rounds 3 --out "${OUT:-jaxmarl_spread.json}" "$@"
