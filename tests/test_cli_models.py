"""The real ``zoo`` command: exit codes, messages, JSON shapes."""

from __future__ import annotations

import json

from tests.conftest import run_zoo, zoo_here
from tests.test_registry import EXPECTED_PARAMS


def test_help() -> None:
    r = zoo_here("--help")
    assert r.returncode == 0
    for cmd in ("list", "info", "doctor"):
        assert cmd in r.stdout


def test_list_json_has_every_entry() -> None:
    r = zoo_here("list", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    for name, params in EXPECTED_PARAMS.items():
        row = rows[name]
        assert row["params"] == params
        assert {"input_size", "num_classes", "weights"} <= row.keys()


def test_info_resnet18_json() -> None:
    r = zoo_here("info", "resnet18", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["params"] == 11_689_512 and d["name"] == "resnet18.tv_in1k"
    assert d["weights"]["pinned"] is True


def test_unknown_model_did_you_mean() -> None:
    r = zoo_here("info", "resnet81")
    assert r.returncode == 1
    assert "Unknown model 'resnet81'" in r.stderr and "Did you mean" in r.stderr
    assert "Traceback" not in r.stderr


def test_debug_variable_shows_traceback() -> None:
    r = run_zoo("info", "resnet81", env={"ZOO_DEBUG": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_usage_error_exits_2() -> None:
    assert zoo_here("list", "--no-such-flag").returncode == 2
    assert zoo_here("no-such-command").returncode == 2


def test_list_pattern_without_match() -> None:
    r = zoo_here("list", "nothing*")
    assert r.returncode == 1 and "No model matches" in r.stderr


def test_doctor_json() -> None:
    r = zoo_here("doctor", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in (
        "python",
        "torch",
        "torchvision",
        "timm",
        "onnx",
        "onnxruntime",
        "ort_providers",
        "torch_threads",
        "cpus_available",
        "cuda_available",
        "warnings",
    ):
        assert key in d
    assert "CPUExecutionProvider" in d["ort_providers"]


def test_a_headless_entry_says_what_it_is_and_a_command_on_it_says_what_to_do(
    tmp_path, mobilenet_weights
) -> None:
    """mobilenet_v2_s16 has no head: `zoo list` says backbone, `zoo info` what it leaves out of
    its weights file; predicting with the bare entry exits 1 naming the ways to give it one."""
    r = zoo_here("list", "mobilenet_v2*")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "mobilenet_v2_s16" in ln)
    assert "none (backbone)" in line and "542,528" in line
    info = zoo_here("info", "mobilenet_v2_s16")
    assert "num_classes: 0 (a backbone without a head" in info.stdout
    assert "unused_weights: 5 blocks of the weights file left out: features.14" in info.stdout
    assert "unused_weights" not in zoo_here("info", "mobilenet_v2").stdout
    d = json.loads(zoo_here("info", "mobilenet_v2_s16", "--json").stdout)
    assert d["num_classes"] == 0 and d["unused_weights"][0] == "features.14"
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (40, 40), (90, 30, 200)).save(image)
    p = zoo_here("predict", "mobilenet_v2_s16", str(image))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    said = " ".join(p.stderr.split())
    assert "pretrained backbone without a classifier head" in said
    assert "zoo finetune mobilenet_v2_s16.tv_in1k --data DIR" in said
