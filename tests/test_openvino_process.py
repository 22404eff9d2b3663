"""tests/test_openvino.py and tests/test_gates_openvino.py in a pytest process of their own.

OpenVINO's runtime and its ONNX frontend bring native libraries (TBB threads, their own
protobuf) into the process; in the full suite, with torch, onnxruntime and NNCF loaded beside
them, the process once died of a segmentation fault a few tests after the OpenVINO ones.
Running them in a child process keeps every other test's process free of them, and a crash
of the child is a failure here, not the end of the suite. The gate tests of the OpenVINO
runtime joined them on 5 Dec 2026: run in the suite's process, two of them (an fp16-io graph,
the kNN column) were followed by the same fault in a later test. ``ZOO_OPENVINO_CHILD=1``
collects both files directly (``tests/conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MOBILENET_ONNX_ENV

HERE = Path(__file__).resolve().parent


def _child(name: str, env: dict[str, str] | None = None) -> None:
    """``name`` in a pytest process of its own; its failures (or crash) are this test's."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / name)],
        env={**os.environ, "ZOO_OPENVINO_CHILD": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=560,  # inside pytest-timeout's 600 s, so the child's output is still shown
    )
    tail = r.stdout[-6000:] + r.stderr[-3000:]
    assert r.returncode == 0, tail
    assert " passed" in r.stdout and " failed" not in r.stdout, tail


def test_the_openvino_gate_tests_pass_in_their_own_process() -> None:
    """Tiny graphs, seconds: in the quick tier (`-m "not slow"`) too."""
    _child("test_gates_openvino.py")


@pytest.mark.slow
def test_the_openvino_tests_pass_in_their_own_process(mobilenet_onnx: Path) -> None:
    """The session's MobileNetV2 export is handed to the child, which would export it again."""
    _child("test_openvino.py", {MOBILENET_ONNX_ENV: str(mobilenet_onnx)})
