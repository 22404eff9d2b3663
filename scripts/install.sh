#!/usr/bin/env bash
# Fresh install into .venv: torch from this machine's local wheels (a CUDA build; pip only,
# never uv/poetry), zoo with its test/dev extras, and the real ImageNet test weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.14.1}" "${TORCHVISION_SPEC:-torchvision==0.29.1}"
.venv/bin/python -m pip install -q -e ".[dev]"
# byte-compile zoo's own sources once, as a non-editable install does: where
# PYTHONDONTWRITEBYTECODE is set (CI machines set it), every `zoo` process would compile them again
.venv/bin/python -m compileall -q cli zoo deploy train >/dev/null
bash scripts/fetch_test_weights.sh
echo "zoo installed in .venv ($(.venv/bin/zoo --help >/dev/null && echo ok))"
