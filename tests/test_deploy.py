"""Export, parity, prediction, TorchScript/torch.export comparison, quantization and bench,
with real ImageNet weights, real images and real onnxruntime sessions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from PIL import Image
from torch import nn

from tests.conftest import zoo_here
from zoo.deploy.export.jit_compare import compare_jit
from zoo.deploy.export.lint import lint_graph
from zoo.deploy.export.onnx_export import export_onnx
from zoo.deploy.quantize.options import QuantizeOptions
from zoo.errors import ExportError, ParityError
from zoo.onnx_meta import read_metadata
from zoo.preprocess import preprocess
from zoo.samples import sample_image_paths
from zoo.transforms import eval_transform


def test_export_embeds_metadata_and_passes_checker(mobilenet_onnx: Path) -> None:
    model = onnx.load(str(mobilenet_onnx))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch
    meta = read_metadata(mobilenet_onnx)
    assert meta["registry_id"] == "mobilenet_v2.tv_in1k" and len(meta["class_names"]) == 1000
    assert meta["preprocessing"]["resize_size"] == 256 and meta["opset"] == 18
    assert meta["source_weights_sha256"].startswith("b0353104")
    assert meta["parity"]["passed"] and meta["parity"]["dynamic_checked"] == [
        [1, 224],
        [2, 224],
        [5, 224],
    ]
    assert not lint_graph(model, dynamic_batch=True, export_batch=2)


def test_predict_from_onnx_alone(mobilenet_onnx: Path) -> None:
    r = zoo_here("predict", str(mobilenet_onnx), *map(str, sample_image_paths()), "--json")
    assert r.returncode == 0, r.stderr
    top1 = [res["top"][0]["label"] for res in json.loads(r.stdout)]
    assert top1[0] in {"Egyptian cat", "tabby", "tiger cat"} and top1[1] == "espresso"


def test_numpy_preprocessing_matches_torchvision(mobilenet_weights) -> None:
    import zoo

    info = zoo.model_info("mobilenet_v2")
    tf = eval_transform(info)
    rng = np.random.default_rng(0)
    images = [Image.open(p) for p in sample_image_paths()]
    images += [
        Image.fromarray(rng.integers(0, 255, (301, 517, 3), dtype=np.uint8)),
        Image.fromarray(rng.integers(0, 255, (400, 250), dtype=np.uint8)),
    ]  # grayscale, portrait
    for im in images:
        ref = tf(im).numpy()
        got = preprocess(im, info.preprocessing())
        assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-5


class HardBatchView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.adaptive_avg_pool2d(self.conv(x), 8)
        return self.fc(y.reshape(2, -1))  # batch size hard-coded: breaks dynamic batch


def test_hard_coded_batch_is_caught_and_nothing_written(tmp_path: Path, mobilenet_weights) -> None:
    out = tmp_path / "bad.onnx"
    with pytest.raises(ExportError):
        export_onnx(
            "mobilenet_v2", out, dynamic_batch=True, exporter="legacy", model=HardBatchView()
        )
    assert not out.exists() and not list(tmp_path.iterdir())


def test_train_mode_dropout_is_linted(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Dropout(0.5), nn.Linear(8, 2)).train()
    path = tmp_path / "m.onnx"
    torch.onnx.export(
        model,
        (torch.randn(2, 3, 2, 2),),
        str(path),
        dynamo=False,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
    )
    problems = lint_graph(onnx.load(str(path)), dynamic_batch=False, export_batch=2)
    assert any("Dropout" in p for p in problems)


class NoisyCopy(nn.Module):
    """Exports fine but computes something else in ONNX than in eager (a parity breach)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            return x.mean((2, 3)).repeat(1, 334)[:, :1000] + 1.0
        return x.mean((2, 3)).repeat(1, 334)[:, :1000]


def test_parity_breach_fails_unless_allowed(tmp_path: Path, mobilenet_weights) -> None:
    out = tmp_path / "noisy.onnx"
    with pytest.raises(ParityError, match="does not match PyTorch"):
        export_onnx("mobilenet_v2", out, exporter="legacy", model=NoisyCopy())
    assert not out.exists()
    res = export_onnx(
        "mobilenet_v2", out, exporter="legacy", model=NoisyCopy(), allow_mismatch=True
    )
    assert out.exists() and res.parity is not None and res.parity.passed is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "mobilenet_v2", "--opset", "7"], "outside the supported range"),
        (["export", "no_such_model"], "Unknown model"),
        (["predict", "missing.onnx", "x.jpg"], "does not exist"),
    ],
)
def test_bad_input_exits_1(args: list[str], message: str, tmp_path: Path) -> None:
    r = zoo_here(*args, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir()), "no partial output"


def test_non_onnx_file_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "fake.onnx"
    fake.write_text("not a model")
    img = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(img)
    r = zoo_here("predict", str(fake), str(img))
    assert r.returncode == 1 and "not an ONNX model" in r.stderr
    q = zoo_here("quantize", str(fake), "--mode", "dynamic")
    assert q.returncode == 1 and "not an ONNX model" in q.stderr


class DataDependent(nn.Module):
    """Control flow that depends on the data: trace freezes one branch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_compare_jit_catches_trace_divergence() -> None:
    torch.manual_seed(0)
    report = compare_jit(DataDependent(), [(2, 3), (1, 3), (4, 3)])
    assert report.path("script").passed
    assert not report.path("trace").passed, "trace must diverge on the other branch"
    assert any("TracerWarning" in w for w in report.path("trace").warnings)
    assert "deprecated" in report.note


def test_compare_jit_cli_on_registry_model(mobilenet_weights) -> None:
    r = zoo_here("compare-jit", "simple_cnn", "--json")
    assert r.returncode == 0, r.stderr
    paths = {p["path"]: p for p in json.loads(r.stdout)["paths"]}
    assert paths["trace"]["passed"] and paths["script"]["passed"] and paths["export"]["passed"]
    assert {c["shape"][0] for c in paths["trace"]["checks"]} == {1, 2, 3}


@pytest.mark.slow
def test_quantize_static_and_dynamic_tell_the_truth(mobilenet_onnx: Path, tmp_path: Path) -> None:
    calib = sample_image_paths()[0].parent
    s = zoo_here(
        "quantize",
        str(mobilenet_onnx),
        "--mode",
        "static",
        "--engine",
        "ort",
        "--calib",
        str(calib),
        "-o",
        str(tmp_path / "s.onnx"),
        "--json",
    )
    assert s.returncode == 0, s.stderr
    rs = json.loads(s.stdout)
    assert rs["size_ratio"] < 0.35 and rs["coverage"]["quantized"] == rs["coverage"]["heavy_ops"]
    assert rs["top1_agreement"] == 1.0 and "p50" in json.dumps(rs["latency_ms"])
    d = zoo_here(
        "quantize",
        str(mobilenet_onnx),
        "--mode",
        "dynamic",
        "-o",
        str(tmp_path / "d.onnx"),
        "--json",
    )
    assert d.returncode == 0, d.stderr
    assert "conv-heavy" in d.stderr and "Static QDQ" in d.stderr  # said before
    rd = json.loads(d.stdout)
    assert rd["mode"] == "dynamic" and rd["coverage"]["quantized"] > 0  # nothing silently switched
    meta = read_metadata(tmp_path / "d.onnx")
    assert meta["quantization"]["mode"] == "dynamic" and meta["class_names"]


def test_quantize_with_nncf_runs_every_layer_in_int8(
    mobilenet_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--engine nncf`` on the real MobileNetV2: NNCF's ranges, and a graph onnxruntime runs
    fully in int8 (its fused ops counted in the optimised graph), with the agreement's interval.
    On a CPU without VNNI (patched here) both weight widths are made and the one agreeing more
    with fp32 on the calibration images is written (a tie: 7): at 7 bits every convolution that
    sums across channels has 7-bit weights (NNCF's overflow fix; depthwise ones cannot saturate
    and keep 8); the choice is in the report, its summary and the file's metadata."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from zoo.deploy.quantize import options

    monkeypatch.setattr(options, "int8_weight_bits", lambda flags=None: 7)
    calib = sample_image_paths()[0].parent
    out = tmp_path / "n.onnx"
    r = zoo_here(
        *("quantize", str(mobilenet_onnx), "--engine", "nncf", "--calib", str(calib)),
        *("-o", str(out), "--json"),
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["engine"] == "nncf" and rep["method"] is None
    tried = rep["weight_bits_agreement"]
    assert set(tried) == {"7", "8"}
    bits = rep["weight_bits"]
    assert bits == (7 if tried["7"] >= tried["8"] else 8)
    assert rep["coverage"] == {"heavy_ops": 53, "quantized": 52, "fp32_left": 1}  # the classifier
    low, high = rep["agreement_ci95"]
    assert low <= rep["top1_agreement"] <= high and rep["n_images"] == 2
    said = read_metadata(out)["quantization"]
    assert said["engine"] == "nncf" and said["weight_bits"] == bits
    assert said["weight_bits_agreement"] == tried
    graph = onnx.load(out).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    weights = {
        n.output[0]: inits[n.input[0]]
        for n in graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in inits
    }
    reach = {}  # conv → the largest |int8 weight|, grouped or not
    for n in graph.node:
        if n.op_type == "Conv" and n.input[1] in weights:
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            reach[n.name] = (group > 1, int(np.abs(weights[n.input[1]].astype(int)).max()))
    dense = [m for grouped, m in reach.values() if not grouped]
    assert len(dense) == 35 and (max(dense) <= 64) == (bits == 7), (bits, dense)
    assert max(m for grouped, m in reach.values() if grouped) > 64  # 8 bits where it is safe
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node]
    assert ops.count("QLinearConv") == 52 and "Conv" not in ops  # every conv fused in int8
    from zoo.deploy.quantize.int8 import quantize
    from zoo.errors import InputError

    with pytest.raises(InputError, match="--engine nncf quantizes statically"):
        quantize(
            QuantizeOptions(mobilenet_onnx, tmp_path / "d.onnx", mode="dynamic", engine="nncf")
        )
    with pytest.raises(InputError, match="is already quantized"):
        quantize(QuantizeOptions(out, tmp_path / "again.onnx", mode="dynamic"))


def test_quantize_accuracy_gate(mobilenet_onnx: Path, tmp_path: Path) -> None:
    r = zoo_here(
        "quantize",
        str(mobilenet_onnx),
        "--mode",
        "dynamic",
        "--max-accuracy-drop",
        "-1",
        "-o",
        str(tmp_path / "g.onnx"),
    )
    assert r.returncode == 1 and "exceeds --max-accuracy-drop" in r.stderr
    assert not (tmp_path / "g.onnx").exists()


def test_bench_rows_and_unavailable_devices(mobilenet_weights) -> None:
    r = zoo_here(
        "bench",
        "mlp",
        "--backends",
        "eager,torchscript,ort_fp32,ort_fp16",
        "--devices",
        "cpu,cuda",
        "--seconds",
        "0.1",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    rows = {(x["backend"], x["device"]): x for x in rep["rows"]}
    eager = rows[("eager", "cpu")]
    for b in ("eager", "torchscript", "ort_fp32", "ort_fp16"):
        row = rows[(b, "cpu")]
        assert row["status"] == "✅" and row["n"] >= 30 and row["batch"] == 1
        # the derived figures come from this row's own median and the eager one beside it
        assert row["img_per_s"] == round(1000 / row["p50_ms"], 1)
        assert row["speedup_vs_eager"] == round(eager["p50_ms"] / row["p50_ms"], 2)
        if not torch.cuda.is_available():
            assert rows[(b, "cuda")]["status"] == "❌" and "CUDA" in rows[(b, "cuda")]["reason"]
    from zoo.system import available_cpus

    threads = available_cpus()
    assert rep["fingerprint"]["threads"] == rep["ort_threads"] == rep["torch_threads"] == threads


def test_bench_percentiles_interpolate_like_numpy() -> None:
    from zoo.deploy.bench.harness import _percentile

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 30, 101):
        xs = list(rng.exponential(3.0, n))
        for q in (0.5, 0.9, 0.99):
            assert _percentile(xs, q) == pytest.approx(np.percentile(xs, q * 100), rel=1e-12)


def test_cuda_provider_missing_is_an_error_not_a_fallback(mobilenet_onnx: Path) -> None:
    import onnxruntime as ort

    from zoo.deploy.runtimes.loader import make_session
    from zoo.errors import BackendUnavailableError

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(BackendUnavailableError, match="CUDAExecutionProvider is not available"):
        make_session(mobilenet_onnx, device="cuda")
    # auto: whatever this machine has, here the CPU (zoo eval's --device auto reaches ORT)
    assert make_session(mobilenet_onnx, device="auto").get_providers()[0] == "CPUExecutionProvider"
