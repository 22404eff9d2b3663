#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (torch preinstalled there, no network):
# bench/gpu_bench.py, whose raw result (with provenance) lands in
# $OUT/bench/gpu_bench_<device>.json (OUT defaults to ./gpu-out), then the many-core figures
# (`zoo predict --out` vs ORT, serve batching at c=32, predict's split of the cores between
# decoding and inference: bench/predict_split.py) as <bench>_<N>cpu.json, then the
# `gpu`-marked tests. Each step has its own timeout, so one that hangs leaves the rest.
# All four take about 11 minutes on the H200 machine (2026-12-04: install 30 s, gpu_bench
# 255 s, predict 103 s, serve 63 s, tests about 220 s), more than one 10-minute call: run
# them as two calls back to back, while the machine is still warm:
#   STEPS="gpu_bench predict serve" bash bench/run_gpu_checks.sh     (about 8 minutes)
#   STEPS="split tests" bash bench/run_gpu_checks.sh                  (about 5 minutes)
#
# Where the copied tree has no .git, pass the commit it was copied from, e.g.
#   ZOO_BENCH_COMMIT=<full sha> ZOO_BENCH_DIRTY=0 bash bench/run_gpu_checks.sh
# (the JSON also records a digest of the measured sources; `python bench/provenance.py`
# prints the digest of a checkout, to compare).
# Afterwards, here: copy the JSON into docs/bench/ (it replaces the stale one of the same
# device), run `python scripts/make_benchmarks_doc.py` and commit both.
# Needs the MobileNetV2 test weights in .devcarry/ (copied from torch hub's cache) and, where
# the machine lacks zoo's serving dependencies, their wheels in .whl/ (README of the device
# tool: `pip download --python-version 3.12 ... msgspec starlette uvicorn python-multipart
# httptools`); carry both.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/bench"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCH_HOME=/tmp/torch
if [ -z "${ZOO_BENCH_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
  echo "warning: no .git and no ZOO_BENCH_COMMIT: the JSON will say commit unknown" >&2
fi
mkdir -p "$TORCH_HOME/hub/checkpoints"
cp .devcarry/mobilenet_v2-b0353104.pth "$TORCH_HOME/hub/checkpoints/"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/tmp/wheels.log 2>&1 \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || tail -5 /tmp/wheels.log
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/zoo-install.log 2>&1 || {
  echo "editable install failed, using a shim"; tail -5 /tmp/zoo-install.log
  export PYTHONPATH=$PWD
  printf '#!/bin/sh\nexec %s -m zoo.cli.app "$@"\n' "$(command -v python3)" >"$(dirname "$(command -v python3)")/zoo"
  chmod +x "$(dirname "$(command -v python3)")/zoo"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, torchvision, onnxruntime; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tv', torchvision.__version__, 'ort', onnxruntime.__version__, onnxruntime.get_available_providers())"
cpus=$(nproc)
STEPS=${STEPS:-gpu_bench predict serve split tests}
step() { [[ " $STEPS " == *" $1 "* ]]; }
step gpu_bench && timeout "${BENCH_TIMEOUT:-300}" python3 bench/gpu_bench.py --out-dir "$OUT/bench" 2>&1 | tail -60 | tee -a "$OUT/steps.log"
step predict && timeout "${PREDICT_TIMEOUT:-150}" python3 bench/predict_throughput.py --per-class 300 --mem-sizes 1000,5000 \
  --ceiling-seconds 3 --kills 3 --out "$OUT/bench/predict_throughput_${cpus}cpu.json" 2>&1 | tail -30 | tee -a "$OUT/steps.log"
step serve && timeout "${SERVE_TIMEOUT:-110}" python3 bench/serve_load.py --concurrency 8,32 --window 3 --soak 10 \
  --out "$OUT/bench/serve_load_${cpus}cpu.json" 2>&1 | tail -30 | tee -a "$OUT/steps.log"
step split && timeout "${SPLIT_TIMEOUT:-150}" python3 bench/predict_split.py --per-class 300 --rounds 2 \
  --out "$OUT/bench/predict_split_${cpus}cpu.json" 2>&1 | tail -30 | tee -a "$OUT/steps.log"
# not in the default steps (the 15 minutes are spent without it): two models in one server on
# the many cores, where the load generator no longer shares the two cores with the workers
# (issue #34's isolation figure); needs aiohttp's wheels in .whl/ as well
step multi && timeout "${MULTI_TIMEOUT:-200}" python3 bench/serve_multi.py --window 3 --rounds 4 \
  --out "$OUT/bench/serve_multi_${cpus}cpu.json" 2>&1 | tail -30 | tee -a "$OUT/steps.log"
# GPU_TESTS_K=expr runs only the matching gpu tests (a rerun after one change)
step tests && timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s -m gpu tests/test_gpu.py -p no:cacheprovider -rs ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} 2>&1 | tee "$OUT/gpu_tests.log"
ls -l "$OUT/bench"
