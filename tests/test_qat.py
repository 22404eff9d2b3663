"""Quantization-aware fine-tuning (``zoo distill RUN --qat``): the fake quantization leaves the
weights and state dict alone and passes gradients; the QAT run → ``zoo export`` →
``zoo quantize --engine ort`` chain, where the trained model's fake-quant outputs are closer
to onnxruntime's int8 than its fp32 outputs are (the rounding trained through is the one
shipped) and BatchNorm's statistics never moved; a kill -9 mid-run resumed to the
uninterrupted run; and the refusals. Real digits, a crnn (conv + BatchNorm) fine-tuned here."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests import crash
from tests.conftest import zoo_here
from zoo.onnx_meta import read_metadata, set_metadata
from zoo.train.config import TrainConfig
from zoo.train.qat import (
    OUTPUT,
    Range,
    activation_ranges,
    after,
    fake_weight,
    fold_batchnorm,
    layers,
    output_points,
    prepare,
)

QUIET = {"num_workers": 0, "progress": False}


@pytest.fixture(scope="module")
def digits(digits16: Path) -> Path:
    return digits16


@pytest.fixture(scope="module")
def teacher(digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A crnn (two conv → BatchNorm blocks, two linear layers) fine-tuned on the digits."""
    from zoo.train.trainer import fit

    cfg = TrainConfig(
        "crnn", str(digits), epochs=2, augment=False, name="t",
        runs_root=str(tmp_path_factory.mktemp("teacher")),
    )  # fmt: skip
    run = fit(TrainConfig.from_dict({**cfg.to_dict(), **QUIET}))
    assert run is not None
    return run


def val_batch(run: Path) -> tuple[torch.Tensor, list[Path]]:
    from zoo.factory import create_model
    from zoo.images import open_image
    from zoo.transforms import eval_transform

    split = json.loads((run / "split.json").read_text())
    paths = [Path(split["root"]) / rel for rel, _ in split["splits"]["val"]]
    tf = eval_transform(create_model(str(run)).zoo_info)  # type: ignore[arg-type]
    return torch.stack([tf(open_image(p)) for p in paths]), paths


def test_fake_quant_keeps_the_weights_and_passes_gradients(teacher: Path) -> None:
    from zoo.factory import create_model

    model = create_model(str(teacher)).eval()
    x, _ = val_batch(teacher)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        y32 = model(x)
    ranges = activation_ranges(model, [x[:8], x[8:]])
    # the inputs of 2 convs and 2 linear layers; their outputs (after the ReLU each conv's
    # BatchNorm and the first linear layer are followed by; the logits for the second); the logits
    assert {n for n, _ in output_points(model)} == {
        "features.2", "features.6", "classifier.2", "classifier.4"
    }  # fmt: skip
    assert set(ranges) == (
        {n for n, _ in layers(model)} | {after(n) for n, _ in output_points(model)} | {OUTPUT}
    )
    assert all(r.low <= 0 <= r.high for r in ranges.values())  # zero always representable
    assert prepare(model, ranges) == 4
    now = model.state_dict()
    assert list(now) == list(before) and all(torch.equal(before[k], now[k]) for k in before)
    with torch.inference_mode():
        yq = model(x)
    assert not torch.equal(yq, y32)  # the rounding is there ...
    assert (yq.argmax(1) == y32.argmax(1)).float().mean() >= 0.9  # ... and small
    model.train()
    model(x).sum().backward()  # straight-through: every quantized weight gets a gradient
    for name, m in layers(model):
        assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0, name
    # int8 per output channel, symmetric: ±127 at the channel's largest magnitude, and ±64
    # with 7-bit weights (onnxruntime's reduce_range, on CPUs without VNNI)
    w = torch.randn(6, 3, 3, 3)
    for bits, top in ((8, 127), (7, 64)):
        q = fake_weight(w, bits)
        for c in range(6):
            step = w[c].abs().max() / top
            levels = torch.round(q[c] / step)
            torch.testing.assert_close(levels * step, q[c])
            assert levels.abs().max() == top  # the largest magnitude is kept exactly
    from zoo.system import int8_weight_bits

    assert int8_weight_bits(frozenset({"avx2", "fma"})) == 7
    assert int8_weight_bits(frozenset({"avx2", "avx512_vnni"})) == 8
    assert int8_weight_bits(frozenset({"avx2", "avx_vnni"})) == 8
    assert Range(-1.0, 3.0).qparams() == (4 / 255, 64)


def test_qat_then_export_then_quantize_matches_onnxruntime_int8(
    teacher: Path, digits: Path, tmp_path: Path
) -> None:
    d = zoo_here(
        "distill", str(teacher), "--qat", "--data", str(digits), "--epochs", "1",
        "--runs", str(tmp_path), "--name", "q", "--num-workers", "0", "--no-progress",
        "--no-report",
    )  # fmt: skip
    assert d.returncode == 0, d.stderr
    run = tmp_path / "q"
    assert "quantization-aware: teacher" in d.stderr
    assert "qat: 4 conv/linear layers train through int8 rounding" in d.stderr
    assert "their inputs and 4 outputs uint8" in d.stderr
    assert "2 BatchNorm folded into their convs and frozen; no dropout" in d.stderr
    assert "zoo quantize RUN/model/model.onnx --engine ort" in d.stderr  # the next step
    config = json.loads((run / "config.json").read_text())
    assert config["distill"]["qat"] is True and config["model"] == str(teacher)
    # the int8 weights it trained for: those zoo quantize makes on this CPU (7 bits without VNNI)
    from zoo.system import int8_weight_bits

    bits = int8_weight_bits()
    assert config["distill"]["weight_bits"] == bits
    assert ("7 bits as onnxruntime's reduce_range" in d.stderr) == (bits == 7)
    # --qat's defaults where not typed (epochs was)
    assert (config["strategy"], config["lr"], config["backbone_lr_mult"]) == ("full", 1e-4, 1.0)
    assert (config["epochs"], config["distill"]["temperature"]) == (1, 1.0)
    assert json.loads((run / "report.json").read_text())["distill"]["qat"] is True
    from safetensors.torch import load_file

    old = load_file(teacher / "model" / "model.safetensors")
    new = load_file(run / "model" / "model.safetensors")
    assert list(new) == list(old)  # the architecture's keys: BatchNorm folded, not removed
    for k in ("features.1", "features.5"):  # folded into the convs, then frozen
        assert torch.equal(new[f"{k}.running_mean"], torch.zeros_like(old[f"{k}.running_mean"]))
        assert torch.equal(
            new[f"{k}.running_var"], torch.full_like(old[f"{k}.running_var"], 1 - 1e-5)
        )
    assert not torch.equal(old["features.0.weight"], new["features.0.weight"])

    assert zoo_here("export", str(run), "--data", str(digits)).returncode == 0
    # the folder and the export say it themselves: a copy outside the run still quantizes
    # through the rounding it was trained through (not NNCF's own ranges)
    assert json.loads((run / "model" / "config.json").read_text())["train"]["quantization_aware"]
    assert (
        json.loads((run / "model" / "config.json").read_text())["train"]["qat_weight_bits"] == bits
    )
    assert read_metadata(run / "model" / "model.onnx")["qat_weight_bits"] == bits
    copy = tmp_path / "elsewhere" / "model.onnx"
    copy.parent.mkdir()
    shutil.copy(run / "model" / "model.onnx", copy)
    said = "engine: ort, the int8 rounding this model was trained through"
    c = zoo_here("quantize", str(copy), "--calib", str(digits), "--allow-drop", "--json")
    assert c.returncode == 0 and json.loads(c.stdout)["engine"] == "ort", c.stderr
    assert said in c.stderr
    # a run written before zoo recorded it in the folder and the export: its run still says
    old = tmp_path / "old" / "q"
    shutil.copytree(run, old)
    config = json.loads((old / "model" / "config.json").read_text())
    del config["train"]["quantization_aware"]
    (old / "model" / "config.json").write_text(json.dumps(config))
    model = onnx.load(str(old / "model" / "model.onnx"))
    meta = read_metadata(old / "model" / "model.onnx")
    del meta["quantization_aware"]
    set_metadata(model, meta)
    onnx.save(model, str(old / "model" / "model.onnx"))
    o = zoo_here("quantize", str(old / "model" / "model.onnx"), "--allow-drop", "--json")
    assert o.returncode == 0 and said in o.stderr, o.stderr
    assert zoo_here("export", str(old), "--data", str(digits)).returncode == 0  # exported again
    assert read_metadata(old / "model" / "model.onnx")["quantization_aware"] is True
    q = zoo_here("quantize", str(run / "model" / "model.onnx"), "--allow-drop", "--json")
    assert q.returncode == 0, q.stderr
    # auto picks the rounding the run trained through, and says so
    assert json.loads(q.stdout)["engine"] == "ort"
    assert json.loads(q.stdout)["calibration"]["reduce_range"] == (bits == 7)
    assert "engine: ort, the int8 rounding this model was trained through" in q.stderr
    int8 = Path(json.loads(q.stdout)["path"])
    # the rounding trained through is the one shipped: the QAT model's fake-quant outputs are
    # nearer onnxruntime's int8 than its fp32 outputs are
    from zoo.deploy.runtimes.loader import make_session
    from zoo.factory import create_model
    from zoo.train.qat import prepare_for_run

    x, _ = val_batch(run)
    session = make_session(int8)
    y8 = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    model = create_model(str(run)).eval()
    with torch.inference_mode():
        y32 = model(x).numpy()
    split = json.loads((run / "split.json").read_text())
    train = [Path(split["root"]) / rel for rel, _ in split["splits"]["train"]]
    prepare_for_run(model, model.zoo_info.preprocessing(), train, torch.device("cpu"), bits)  # type: ignore[operator]
    with torch.inference_mode():
        yq = model(x).numpy()
    near, far = np.abs(yq - y8).mean(), np.abs(y32 - y8).mean()
    assert near < 0.25 * far, (near, far)


def test_the_int8_weights_get_the_fewer_bits_of_the_training_and_the_cpu(
    teacher: Path, digits: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--qat-weights 8`` (trained for a VNNI CPU), quantized on a CPU without VNNI: the int8
    weights get this CPU's 7 bits, whose kernels saturate 8-bit ones (docs/bench/qat_avx2.json),
    and the plan says why; on a VNNI CPU its 8 bits; a model trained for 7 bits is quantized
    at 7 on any CPU."""
    from zoo.deploy.quantize import int8
    from zoo.deploy.quantize.options import (
        QuantizeOptions,
        default_calibration,
        trained_weight_bits,
    )

    d = zoo_here(
        "distill", str(teacher), "--qat", "--qat-weights", "8", "--data", str(digits),
        "--epochs", "1", "--runs", str(tmp_path), "--name", "q8", "--num-workers", "0",
        "--no-progress", "--no-report",
    )  # fmt: skip
    assert d.returncode == 0, d.stderr
    assert json.loads((tmp_path / "q8" / "config.json").read_text())["distill"]["weight_bits"] == 8
    assert zoo_here("export", str(tmp_path / "q8"), "--data", str(digits)).returncode == 0
    onnx_file = tmp_path / "q8" / "model" / "model.onnx"
    assert trained_weight_bits(onnx_file) == 8
    from zoo.deploy.quantize import options

    def cpu(bits: int) -> None:  # this CPU, as zoo quantize sees it
        monkeypatch.setattr(options, "int8_weight_bits", lambda flags=None: bits)

    cpu(7)  # without VNNI: this CPU's 7 bits, and the plan says why
    plans: list[str] = []
    opts = QuantizeOptions(onnx_file, output=tmp_path / "q8.int8.onnx", allow_drop=True)
    report = int8.quantize(opts, on_plan=plans.append)
    assert report.calibration is not None and report.calibration.reduce_range is True
    assert any("trained (zoo distill --qat) for 8-bit int8 weights" in p for p in plans), plans
    written = read_metadata(tmp_path / "q8.int8.onnx")["quantization"]["calibration"]
    assert written["reduce_range"] is True
    # --weight-bits 8 here: the file for a VNNI server keeps its 8 bits, and the plan says so
    plans.clear()
    opts = QuantizeOptions(
        onnx_file, output=tmp_path / "q8f.int8.onnx", allow_drop=True, weight_bits=8
    )
    report = int8.quantize(opts, on_plan=plans.append)
    assert report.calibration is not None and report.calibration.reduce_range is False
    assert any("--weight-bits 8 on a CPU without VNNI" in p for p in plans), plans
    written = read_metadata(tmp_path / "q8f.int8.onnx")["quantization"]["calibration"]
    assert written["reduce_range"] is False
    cpu(8)  # with VNNI: the 8 bits it trained for, nothing to say
    plans.clear()
    opts = QuantizeOptions(onnx_file, output=tmp_path / "q8v.int8.onnx", allow_drop=True)
    report = int8.quantize(opts, on_plan=plans.append)
    assert report.calibration is not None and report.calibration.reduce_range is False
    assert not any("8-bit int8 weights" in p for p in plans), plans
    # a model trained for 7 bits, on a VNNI CPU: its 7 bits kept, nothing to say
    seven = tmp_path / "q7.onnx"
    model = onnx.load(str(onnx_file))
    set_metadata(model, {**read_metadata(onnx_file), "qat_weight_bits": 7})
    onnx.save(model, str(seven))
    plans.clear()
    opts = QuantizeOptions(
        seven, output=tmp_path / "q7.int8.onnx", calib=str(digits), allow_drop=True
    )
    report = int8.quantize(opts, on_plan=plans.append)
    assert report.calibration is not None and report.calibration.reduce_range is True
    assert not any("8-bit int8 weights" in p for p in plans), plans
    monkeypatch.undo()  # the flags decide again
    assert default_calibration(weight_bits=7, flags=frozenset({"avx512_vnni"})).reduce_range
    assert default_calibration(weight_bits=8, flags=frozenset({"avx2"})).reduce_range
    assert not default_calibration(weight_bits=8, flags=frozenset({"avx512_vnni"})).reduce_range
    r = zoo_here(
        "distill", str(teacher), "--qat-weights", "7", "--student", "mlp", "--data", str(digits)
    )
    assert r.returncode == 2 and "add --qat" in r.stderr, r.stderr


@pytest.mark.parametrize("bits", ["7", 6, 7.0, True])
def test_a_file_whose_trained_bits_are_not_8_or_7_is_refused(bits: object, tmp_path: Path) -> None:
    """Metadata that says quantization-aware with odd bits (a hand edit, another tool) is named,
    not read as 8: ``"7"`` would otherwise quantize at 8 bits on a VNNI CPU."""
    from onnx import TensorProto, helper

    from zoo.deploy.quantize.options import trained_weight_bits
    from zoo.errors import InputError

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph)
    path = tmp_path / "m.onnx"
    for said, expected in ((7, 7), (None, 8)):
        set_metadata(model, {"quantization_aware": True, "qat_weight_bits": said})
        onnx.save(model, str(path))
        assert trained_weight_bits(path) == expected
    set_metadata(model, {"quantization_aware": True, "qat_weight_bits": bits})
    onnx.save(model, str(path))
    with pytest.raises(InputError, match="qat_weight_bits"):
        trained_weight_bits(path)


def test_refusals(teacher: Path, digits: Path) -> None:
    r = zoo_here("distill", str(teacher), "--qat", "--student", "mlp", "--data", str(digits))
    assert r.returncode == 2 and "drop --student" in r.stderr, r.stderr
    r = zoo_here("distill", "--resume", str(teacher), "--qat")
    assert r.returncode == 2 and "drop --qat" in r.stderr, r.stderr


@pytest.mark.slow
def test_kill_mid_run_then_resume_equals_the_uninterrupted_run(
    teacher: Path, digits: Path, tmp_path: Path
) -> None:
    """The activation ranges are recalibrated on resume from the teacher: the same ones, so
    the resumed run is the uninterrupted one, bitwise. ``--unlabelled`` (the digits' folders
    ignored, the teacher's answers as labels): the resume reads those labels back from the
    run's split.json."""
    ctx = crash.fork_server()
    walk = [
        "distill", str(teacher), "--qat", "--unlabelled", "--data", str(digits), "--epochs", "2",
        "--batch-size", "16", "--save-every-steps", "2", "--no-augment",
        "--num-workers", "0", "--no-progress", "--no-report",
    ]  # fmt: skip
    ref_root, root = tmp_path / "ref", tmp_path / "killed"
    trace = tmp_path / "trace"
    code = crash.run(
        ctx, [*walk, "--runs", str(ref_root)], tmp_path / "ref.log", ZOO_FAULT_TRACE=str(trace)
    )
    assert code == 0, (tmp_path / "ref.log").read_text()
    labels = crash.trace(trace)
    epoch1 = labels.index("metrics.jsonl") + 1
    kill = next(n for n in range(epoch1 + 1, len(labels)) if labels[n - 1] == "checkpoints/last.pt")
    log = tmp_path / "killed.log"
    assert crash.run(ctx, [*walk, "--runs", str(root)], log, ZOO_FAULT_KILL_AT=str(kill)) == -9
    run = root / f"{teacher.name}-qat"  # --qat's own default name: the model's, then -qat
    resume = ["distill", "--resume", str(run), "--no-progress", "--num-workers", "0"]
    assert crash.run(ctx, resume, log) == 0, log.read_text()
    assert "resumed" in log.read_text()
    crash.assert_same_run(ref_root / run.name, run)
    assert json.loads((run / "split.json").read_text())["layout"] == "teacher"
    assert json.loads((run / "report.json").read_text())["distill"]["labels"] == "teacher"
    config = json.loads((run / "config.json").read_text())  # --unlabelled's own defaults
    assert (config["lr"], config["distill"]["alpha"], config["augment"]) == (1e-5, 1.0, False)


def test_folding_batchnorm_keeps_the_function_and_the_keys() -> None:
    """Folded, each conv holds the weights the exported graph computes, its BatchNorm the
    identity plus the folded bias: the same outputs, the same state dict keys; folding again
    changes nothing but float rounding. A conv with a bias, one without, a BatchNorm without
    affine parameters, and one not after a conv (left alone)."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU6(),
        nn.Conv2d(4, 4, 3, bias=False), nn.BatchNorm2d(4, affine=False),
        nn.ReLU(), nn.BatchNorm2d(4),
    )  # fmt: skip
    for bn in (net[1], net[4], net[6]):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(1e-4, 2.0)  # a tiny variance too, as MobileNetV2 has
        if bn.affine:
            bn.weight.data.uniform_(-2, 2)
            bn.bias.data.uniform_(-1, 1)
    net.eval()
    x = torch.rand(2, 3, 9, 9)
    y = net(x)
    keys = list(net.state_dict())
    last = {k: v.clone() for k, v in net[6].state_dict().items()}
    assert fold_batchnorm(net) == 2
    torch.testing.assert_close(net(x), y, rtol=1e-5, atol=1e-5)
    assert list(net.state_dict()) == keys
    assert torch.equal(net[1].running_mean, torch.zeros(4)) and torch.equal(
        net[1].weight, torch.ones(4)
    )
    assert torch.equal(net[0].bias, torch.zeros(4))  # the bias moved to the BatchNorm
    assert all(torch.equal(v, net[6].state_dict()[k]) for k, v in last.items())
    again = {k: v.clone() for k, v in net.state_dict().items()}
    assert fold_batchnorm(net) == 2
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, again[k], rtol=1e-6, atol=0)


def test_mobilenet_v2_fake_quant_rounds_where_onnxruntime_int8_does(
    mobilenet_weights: Path, tmp_path: Path
) -> None:
    """The ImageNet MobileNetV2 at 96 px, on real photo crops: every activation onnxruntime's
    QDQ quantizes (each conv's output, after the ReLU6 it fuses; each residual sum; the input,
    the pooled features and the logits) has its twin in the fake quantization, at the same
    uint8 scale and zero point, and there is none besides. The layers' inputs alone miss the
    projections' outputs (before each residual sum)."""
    from onnx import load, numpy_helper
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from skimage import data

    from zoo.factory import create_model

    rng = np.random.default_rng(0)
    crops = []
    for name in ("astronaut", "chelsea", "coffee", "rocket"):
        img = torch.from_numpy(getattr(data, name)()).permute(2, 0, 1).float() / 255
        for _ in range(3):
            s = int(min(img.shape[1:]) * rng.uniform(0.5, 1.0))
            i, j = (int(rng.integers(0, d - s + 1)) for d in img.shape[1:])
            crops.append(nn.functional.interpolate(img[None, :, i : i + s, j : j + s], size=96)[0])
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    x = (torch.stack(crops) - mean.view(3, 1, 1)) / std.view(3, 1, 1)
    model = create_model("mobilenet_v2").eval()
    onnx_path, int8_path = tmp_path / "m.onnx", tmp_path / "m-int8.onnx"
    torch.onnx.export(
        model, (x[:1],), str(onnx_path), dynamo=False, input_names=["input"],
        output_names=["logits"], opset_version=17, dynamic_axes={"input": {0: "b"}},
    )  # fmt: skip

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"input": x.numpy()}])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(
        str(onnx_path), str(int8_path), Reader(), quant_format=QuantFormat.QDQ,
        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    graph = load(str(int8_path)).graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    quantize = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    # one per conv output and residual sum, the input, the pooled and flattened features and
    # the logits
    assert len(quantize) == 52 + 10 + 4

    def levels(pairs: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
        return sorted({(float(f"{s:.4g}"), int(z)) for s, z in pairs})  # float noise aside

    theirs = levels((consts[q.input[1]].item(), consts[q.input[2]].item()) for q in quantize)
    assert fold_batchnorm(model) == 52
    points = output_points(model)
    assert len(points) == 52 + 1 + 10  # each conv, the classifier, the residual sums
    ranges = activation_ranges(model, [x])
    ours = levels(r.qparams() for r in ranges.values())
    assert len(ours) == len(theirs)
    for (a, za), (b, zb) in zip(ours, theirs, strict=True):
        assert za == zb and a == pytest.approx(b, rel=1e-3), ((a, za), (b, zb))
    outputs = {after(n) for n, _ in points}
    inputs_only = levels(r.qparams() for k, r in ranges.items() if k not in outputs | {OUTPUT})
    assert len(theirs) - len(inputs_only) >= 10  # what emulating the inputs alone missed


def test_a_layer_with_a_forward_of_its_own_is_left_float() -> None:
    """A conv subclass that pads in its own forward (as timm's Conv2dSame does) keeps that
    forward: replacing it with the stock conv's would silently drop the padding."""
    from zoo.train.qat import own_forward

    class PadFirst(nn.Conv2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(nn.functional.pad(x, (1, 1, 1, 1)))

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), PadFirst(4, 4, 3), nn.Flatten(), nn.Linear(64, 2))
    x = torch.rand(2, 3, 6, 6)
    ranges = activation_ranges(net, [x])
    # its output is still rounded where onnxruntime rounds it
    assert set(ranges) == {"0", "3", after("0"), after("1"), after("3"), OUTPUT}
    assert own_forward(net) == ["1"]
    assert prepare(net, ranges) == 2
    assert net(x).shape == (2, 2)  # the padding still happens: 4×4 in, 4×4 out, 64 features
    assert type(net[1]).forward is PadFirst.forward and "forward" not in vars(net[1])


def test_each_output_point_is_rounded_and_a_reused_relu_is_left_to_its_consumers() -> None:
    """Prepared, a layer's output (after its fused ReLU) lands on its uint8 grid. A ReLU called
    twice a pass gets no output range: one range would serve two tensors; the layers after it
    round their inputs instead. In a ResNet the shortcut's BatchNorm output is rounded."""
    from torchvision.models import resnet18

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3)).eval()
    x = torch.randn(3, 3, 8, 8)
    ranges = activation_ranges(net, [x])
    prepare(net, ranges)
    seen: dict[str, torch.Tensor] = {}
    net[2].register_forward_hook(lambda _m, _x, y: seen.__setitem__("relu", y))
    with torch.inference_mode():
        net(x)
    scale, zero = ranges[after("2")].qparams()
    levels = seen["relu"] / scale + zero
    torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-3)

    relu = nn.ReLU()
    shared = nn.Sequential(nn.Conv2d(3, 4, 3), relu, nn.Conv2d(4, 4, 3), relu).eval()
    ranges = activation_ranges(shared, [x])
    assert after("1") not in ranges and {"0", "2", after("2"), OUTPUT} <= set(ranges)

    ranges = activation_ranges(resnet18(weights=None).eval(), [torch.randn(2, 3, 64, 64)])
    assert after("layer2.0.downsample.1") in ranges  # the shortcut's BatchNorm
