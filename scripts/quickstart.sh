#!/usr/bin/env bash
# The main job on a small built-in example, end to end on real data:
# pretrained model on real photos → fine-tune on real handwritten digits → export (parity-
# checked ONNX) → predict from the ONNX file alone.
set -euo pipefail
cd "$(dirname "$0")/.."
zoo=.venv/bin/zoo
out=${QUICKSTART_DIR:-out/quickstart}
rm -rf "$out"
set -x
$zoo predict mobilenet_v2 zoo/sample_images/chelsea.jpg zoo/sample_images/coffee.jpg -k 3
$zoo example digits "$out/digits"
$zoo finetune mobilenet_v2 --data "$out/digits" --strategy linear --cache-features \
    --epochs 5 --image-size 64 --runs "$out/runs" --name digits
$zoo export "$out/runs/digits" --dynamic-batch --data "$out/digits"
$zoo predict "$out/runs/digits/model/model.onnx" "$out/digits/digit_3/0000.png" "$out/digits/digit_8/0000.png" -k 2
