#!/usr/bin/env bash
# The main job on a small built-in example, end to end on real data:
# fine-tune on real handwritten digits → export (parity-checked ONNX; a pretrained model
# classifies real photos beside it) → predict from the ONNX file alone.
set -euo pipefail
cd "$(dirname "$0")/.."
zoo=.venv/bin/zoo
out=${QUICKSTART_DIR:-out/quickstart}
rm -rf "$out"
set -x
mkdir -p "$out"
$zoo example digits "$out/digits"
$zoo finetune mobilenet_v2 --data "$out/digits" --strategy linear --cache-features \
    --epochs 5 --image-size 64 --runs "$out/runs" --name digits
# a pretrained model on two bundled photos, beside the export (which traces on one core)
$zoo predict mobilenet_v2 zoo/sample_images/chelsea.jpg zoo/sample_images/coffee.jpg -k 3 \
    > "$out/pretrained.txt" 2>&1 &
pretrained=$!
$zoo export "$out/runs/digits"   # gated on the run's own validation digits
wait "$pretrained" || { cat "$out/pretrained.txt"; exit 1; }
cat "$out/pretrained.txt"
$zoo predict "$out/runs/digits/model/model.onnx" "$out/digits/digit_3/0000.png" "$out/digits/digit_8/0000.png" -k 2
