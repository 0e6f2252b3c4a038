#!/usr/bin/env bash
# GPU readiness check for a CUDA machine with no network; 8 minutes at most.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]       # default: $OUT, else ./gpu_check_out
#
# Installs specloop with `pip install --no-deps -e .` over the machine's own torch and
# transformers (pyproject declares a torch range; nothing is fetched), then runs
# benchmarks/gpu_check.py on models built on the device: a tiny random Llama for
# lossless greedy (every drafter needing no shipped artefact; chain, static tree,
# EAGLE-2 tree) and a sampling chi-square, and a random-weight Llama-3-8B-shaped model
# in bfloat16 for syncs per round, round overhead and verify cost against width (after
# a warm-up). Every section runs even if an earlier one fails; the one JSON
# ($OUT_DIR/gpu_check.json) lists what failed. Without CUDA it exits 2.
# Exit 0 when every section passed, 1 otherwise.
set -u
OUT_DIR="${1:-${OUT:-./gpu_check_out}}"
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check.sh: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine" >&2
    exit 2
fi
python -m pip install --quiet --no-deps --no-build-isolation --no-index -e . > "$OUT_DIR/install.log" 2>&1 \
    || echo "gpu_check.sh: pip install --no-deps -e . failed (see install.log); running from the source tree" >&2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 480 python benchmarks/gpu_check.py --device cuda --out "$OUT_DIR/gpu_check.json" 2>&1 | tee "$OUT_DIR/gpu_check.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "gpu_check.sh: stopped at the 8-minute limit" >&2
exit "$rc"
