#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (torch preinstalled there, no network):
# the `gpu`-marked tests, then bench/gpu_bench.py, whose raw result (new format, with
# provenance) lands in $OUT/bench/gpu_bench_<device>.json (OUT defaults to ./gpu-out).
#
# The copied tree there has no .git: pass the commit it was copied from, e.g.
#   ZOO_BENCH_COMMIT=<full sha> ZOO_BENCH_DIRTY=0 bash bench/run_gpu_checks.sh
# (the JSON also records a digest of the measured sources; `python bench/provenance.py`
# prints the digest of a checkout, to compare).
# Afterwards, here: copy the JSON into docs/bench/ (it replaces the stale one of the same
# device), run `python scripts/make_benchmarks_doc.py` and commit both.
# Needs the MobileNetV2 test weights in .devcarry/ (copied from torch hub's cache).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/bench"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCH_HOME=/tmp/torch
if [ -z "${ZOO_BENCH_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
  echo "warning: no .git and no ZOO_BENCH_COMMIT: the JSON will say commit unknown" >&2
fi
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
# GPU_TESTS_K=expr runs only the matching gpu tests (a rerun after one change)
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s -m gpu tests/test_gpu.py -p no:cacheprovider -rs ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} 2>&1 | tee "$OUT/gpu_tests.log"
timeout "${BENCH_TIMEOUT:-330}" python3 bench/gpu_bench.py --out-dir "$OUT/bench" 2>&1 | tail -80 | tee "$OUT/gpu_bench.log"
ls -l "$OUT/bench"
