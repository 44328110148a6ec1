#!/usr/bin/env bash
# One run on a GPU (or TPU) machine: the feed, the step and every backend, in a
# few minutes; writes benchmarks/results/accelerator-<device>.json. Arguments
# pass on to accelerator.py (e.g. --quick, --out-dir DIR, --backends numpy,hf).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" benchmarks/accelerator.py "$@"
