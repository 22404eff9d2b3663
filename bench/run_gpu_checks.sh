#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (torch preinstalled there, no network):
# the `gpu`-marked tests, then bench/gpu_bench.py. Results land in $OUT (or ./gpu-out).
# Needs the MobileNetV2 test weights in .devcarry/ (copied from torch hub's cache).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCH_HOME=/tmp/torch
mkdir -p "$TORCH_HOME/hub/checkpoints"
cp .devcarry/mobilenet_v2-b0353104.pth "$TORCH_HOME/hub/checkpoints/"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || {
  echo "editable install failed, using a shim"; tail -5 "$OUT/install.log"
  export PYTHONPATH=$PWD
  printf '#!/bin/sh\nexec %s -m zoo.cli.app "$@"\n' "$(command -v python3)" >"$(dirname "$(command -v python3)")/zoo"
  chmod +x "$(dirname "$(command -v python3)")/zoo"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, torchvision, onnxruntime; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tv', torchvision.__version__, 'ort', onnxruntime.__version__, onnxruntime.get_available_providers())"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -rs 2>&1 | tee "$OUT/gpu_tests.log"
timeout "${BENCH_TIMEOUT:-270}" python3 bench/gpu_bench.py --out "$OUT/gpu_bench.json" --copies 6 2>&1 | tail -60 | tee "$OUT/gpu_bench.log"
