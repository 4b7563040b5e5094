#!/usr/bin/env bash
# marl-q against EPyMARL itself (issues 28 and 29; docs/value_based.md, "Against EPyMARL").
#
# EPyMARL is run from its own checkout, unpatched:
#   git clone https://github.com/uoe-agents/epymarl && git -C epymarl checkout cbc38c0
# and in its own virtualenv, which this script builds (VENV, default /tmp/venv_epymarl) with what its
# code imports for the gymma envs: torch 2.13.0 (pinned: it resolves to the local CPU wheel; never
# an unpinned torch, which downloads a CUDA build), sacred, PyYAML, numpy, gymnasium, cloudpickle
# (its parallel runner), lbforaging 2.0.0, pettingzoo[mpe] 1.24.3 (EPyMARL registers
# `pz-mpe-simple-spread-v3` from `pettingzoo.mpe`, which later PettingZoo releases moved to mpe2) and
# smaclite (its envs/__init__.py imports it unconditionally; env_requirements.txt installs it from
# GitHub; installed without its Rtree==1.0.0 pin, see below). Its requirements.txt pins PyYAML==5.3.1, which does not build on Python 3.11; any PyYAML
# reads its configs. Nothing else of requirements.txt is imported by the code paths used here.
#
# Then runs analysis/peers/epymarl_compare.py (speed rounds and/or seeds; one core, one thread,
# interleaved; see its docstring) with the arguments given, e.g.
#
#   EPYMARL_DIR=/path/to/epymarl analysis/peers/epymarl.sh speed --pairs lbf_mappo,lbf_qmix --steps 20000 --rounds 3
#   EPYMARL_DIR=/path/to/epymarl analysis/peers/epymarl.sh returns --pairs lbf_mappo,lbf_qmix --steps 100000 --seeds 0,1,2
#   EPYMARL_DIR=/path/to/epymarl analysis/peers/epymarl.sh check
#
# EPYMARL_DIR: the EPyMARL checkout (required; its src/ is copied unchanged into the work folder,
#              since EPyMARL writes its sacred results next to its own src/).
# VENV: the virtualenv (/tmp/venv_epymarl). SMACLITE: what pip installs for smaclite
#       (git+https://github.com/uoe-agents/smaclite.git; a local clone's path where GitHub is unreachable).
# WORK: where runs are written (/tmp/epymarl_work).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-/tmp/venv_epymarl}"
SMACLITE="${SMACLITE:-git+https://github.com/uoe-agents/smaclite.git}"
if [ -z "${EPYMARL_DIR:-}" ] || [ ! -f "$EPYMARL_DIR/src/main.py" ]; then
    echo "epymarl.sh: EPYMARL_DIR must name an EPyMARL checkout (src/main.py); got '${EPYMARL_DIR:-}'" >&2
    echo "  git clone https://github.com/uoe-agents/epymarl && git -C epymarl checkout cbc38c0" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0
    # sacred 0.8.7 imports pkg_resources, which setuptools 81 removed
    "$VENV/bin/pip" install -q sacred "setuptools<81" pyyaml numpy gymnasium cloudpickle \
        lbforaging==2.0.0 "pettingzoo[mpe]==1.24.3"
    # smaclite pins Rtree==1.0.0, whose sdist needs a system libspatialindex; rtree >= 1.1 wheels carry it
    "$VENV/bin/pip" install -q --no-deps "$SMACLITE"
    "$VENV/bin/pip" install -q scikit-learn "rtree>=1.1" pygame
fi
cd "$ROOT"
exec python analysis/peers/epymarl_compare.py --epymarl-dir "$EPYMARL_DIR" --epymarl-python "$VENV/bin/python" "$@"
