"""The README's main job, ``scripts/quickstart.sh``, as a new user runs it: pretrained predictions
on the bundled photos, the real digits fine-tuned, exported through the gate and predicted from
the ONNX file alone. Its figures are checked, not just its exit code."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT


def test_quickstart_runs_the_chain_on_real_data(mobilenet_weights: Path, tmp_path: Path) -> None:
    out = tmp_path / "qs"
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "quickstart.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "QUICKSTART_DIR": str(out)},
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout + r.stderr
    assert "tabby" in text or "tiger cat" in text  # chelsea.jpg, by the ImageNet weights
    done = re.search(r"val/acc (0\.\d+)", text)
    assert done and float(done.group(1)) > 0.8, text  # a linear probe on real digits
    model = out / "runs" / "digits" / "model"
    meta = json.loads((model / "config.json").read_text())
    assert meta["num_classes"] == 10 and (model / "model.onnx").is_file()
    assert "validation images" in text  # the gate judged the run on its own digits
    predicted = [line for line in r.stdout.splitlines() if "digit_" in line]
    assert predicted, r.stdout
