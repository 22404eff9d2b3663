"""Fast gate tests of ``zoo export``'s ONNX path (``deploy/export/onnx_export.py``), for
mutation testing (``scripts/mutation.sh export``): real exports of the registry's MLP with
torch's TorchScript-based exporter (a fifth of a second each), judged by the real gate on the
bundled photos. Whatever fails (the exporter, the lint, the parity gate) writes nothing and
leaves the file already there as it was; the exporter that ``auto`` falls back to, and the
graph it keeps, are the ones it reports. The same paths on MobileNetV2 through the CLI are in
test_deploy.py and test_export_variants.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from zoo.deploy.export import onnx_export
from zoo.deploy.export.onnx_export import (
    DEFAULT_OPSET,
    EXPORT_BATCH,
    MAX_OPSET,
    MIN_OPSET,
    atomic_output,
    dummy_input,
    export_onnx,
)
from zoo.errors import ExportError, InputError, ParityError
from zoo.factory import create_model, info_of
from zoo.onnx_meta import read_metadata

REAL_EXPORT = torch.onnx.export


class Breach(nn.Module):
    """The MLP in eager; the MLP plus one in the exported graph: a parity breach."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = create_model("mlp").eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return y + 1.0 if torch.onnx.is_in_onnx_export() else y


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test in a folder of its own: a file written under a wrong name (``None``) by
    one test (or mutant) is never found by the next."""
    monkeypatch.chdir(tmp_path)


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def dims(path: Path) -> list[int | str]:
    shape = onnx.load(str(path)).graph.input[0].type.tensor_type.shape
    return [d.dim_param or d.dim_value for d in shape.dim]


def exporting(monkeypatch: pytest.MonkeyPatch, fake: Any) -> None:
    monkeypatch.setattr(torch.onnx, "export", fake)


def test_an_export_is_checked_stamped_and_written_whole(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    model = create_model("mlp").train()  # exported in eval mode all the same
    result = export_onnx("mlp", out, exporter="legacy", model=model)
    assert not model.training
    assert listing(tmp_path) == ["m.onnx"]
    assert (result.path, result.format, result.model) == (str(out), "onnx", "mlp")
    assert (result.exporter, result.opset, result.precision) == ("legacy", DEFAULT_OPSET, "fp32")
    assert result.dynamic_batch and result.static_batch is None and not result.dynamic_size
    assert result.lint == [] and result.parity is not None and result.parity.passed
    assert [d.batch for d in result.parity.dynamic] == [1, 2, 5]
    assert result.size_mb == float(f"{out.stat().st_size / 2**20:.4g}") > 0
    (attempt,) = result.attempts
    assert attempt["exporter"] == "legacy" and attempt["lint"] == [] and attempt["parity_passed"]
    assert "error" not in attempt and isinstance(attempt["warnings"], list)
    meta = read_metadata(out)
    assert (meta["opset"], meta["exporter"], meta["precision"]) == (DEFAULT_OPSET, "legacy", "fp32")
    assert meta["num_classes"] == 10 and meta["dynamic_batch"] is True
    graph = onnx.load(str(out))
    assert graph.opset_import[0].version == DEFAULT_OPSET
    assert [i.name for i in graph.graph.input] == ["input"]
    assert [o.name for o in graph.graph.output] == ["logits"]
    assert dims(out) == ["batch", 1, 28, 28]
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(sess.run(None, {"input": x.numpy()})[0], want, atol=1e-5)


def test_a_static_batch_is_the_graphs_input(tmp_path: Path) -> None:
    fixed = export_onnx("mlp", tmp_path / "fixed.onnx", exporter="legacy", static_batch=3)
    assert dims(tmp_path / "fixed.onnx") == [3, 1, 28, 28]
    assert not fixed.dynamic_batch and fixed.static_batch == 3
    assert fixed.parity is not None and fixed.parity.passed and fixed.parity.dynamic == ()
    assert read_metadata(tmp_path / "fixed.onnx")["dynamic_batch"] is False
    x = dummy_input(info_of(create_model("mlp")), EXPORT_BATCH)
    assert x.shape == (EXPORT_BATCH, 1, 28, 28)
    assert torch.equal(x, dummy_input(info_of(create_model("mlp")), EXPORT_BATCH))  # seeded


def test_a_dynamic_size_export_of_a_small_model_is_judged_at_sizes_it_can_take(
    tmp_path: Path,
) -> None:
    pooled = nn.Sequential(nn.Conv2d(3, 10, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    out = tmp_path / "sized.onnx"
    sized = export_onnx("simple_cnn", out, exporter="legacy", dynamic_size=True, model=pooled)
    assert dims(out) == ["batch", 3, "height", "width"] and sized.dynamic_size
    assert sized.parity is not None and sized.parity.passed
    assert [(d.batch, d.size) for d in sized.parity.dynamic][-2:] == [(3, 16), (3, 64)]


def test_dynamic_size_on_a_model_whose_layers_fix_the_size_is_refused_before_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporting(monkeypatch, lambda *a, **kw: pytest.fail("exported a model that cannot be"))
    out = tmp_path / "m.onnx"
    with pytest.raises(InputError) as info:
        export_onnx("mlp", out, exporter="legacy", dynamic_size=True)
    message = str(info.value)
    assert message.startswith("mlp does not take 14x14 inputs (mat1 and mat2 shapes cannot be")
    assert message.endswith(
        "), one of the two sizes --dynamic-size proves a graph at (14x14 and 60x60, width x "
        "height): export it without --dynamic-size, at 28x28."
    )
    assert listing(tmp_path) == []


class SizeBound(nn.Module):
    """Takes sizes up to its own, and says nothing when it refuses a larger one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 28:
            raise ValueError()
        return x.mean((2, 3)).repeat(1, 10)


def test_a_refusal_at_the_larger_size_without_a_message_is_named_by_its_type(
    tmp_path: Path,
) -> None:
    with pytest.raises(InputError, match=r"^mlp does not take 60x60 inputs \(ValueError\), one"):
        export_onnx("mlp", tmp_path / "m.onnx", dynamic_size=True, model=SizeBound())
    assert listing(tmp_path) == []


def test_a_dynamo_graph_of_a_small_model_may_take_the_sizes_it_is_checked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dynamo's lower bound on H/W is 16 px, or lower where the gate checks a smaller side."""
    seen: list[dict[str, Any]] = []

    def spy(model: Any, args: Any, f: str, **kw: Any) -> Any:
        seen.append(kw["dynamic_shapes"][0])
        raise RuntimeError("recorded")

    exporting(monkeypatch, spy)
    pooled = nn.Sequential(nn.Conv2d(1, 10, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    with pytest.raises(ExportError):
        export_onnx("mlp", tmp_path / "m.onnx", exporter="dynamo", dynamic_size=True, model=pooled)
    assert {k: d.min for k, d in seen[0].items()} == {0: 1, 2: 14, 3: 14}


def test_a_parity_breach_writes_nothing_unless_allowed(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    breach = Breach()  # one set of random weights: the same failures each time
    out.write_bytes(b"the file already there")
    with pytest.raises(ParityError) as info:
        export_onnx("mlp", out, exporter="legacy", model=breach)
    message = str(info.value)
    assert message.startswith("Exported mlp does not match PyTorch: ")
    assert message.endswith(". Nothing was written; --allow-mismatch writes it anyway.")
    assert out.read_bytes() == b"the file already there" and listing(tmp_path) == ["m.onnx"]
    with pytest.raises(ParityError, match=r"Nothing was written; try another way\.$"):
        export_onnx("mlp", out, exporter="legacy", model=breach, mismatch_hint="try another way")
    assert out.read_bytes() == b"the file already there"
    result = export_onnx("mlp", out, exporter="legacy", model=breach, allow_mismatch=True)
    assert result.parity is not None and not result.parity.passed
    failures = result.parity.failures()
    assert len(failures) > 1 and message == (
        f"Exported mlp does not match PyTorch: {'; '.join(failures)}. Nothing was written; "
        "--allow-mismatch writes it anyway."
    )
    assert result.attempts[0]["parity_passed"] is False and listing(tmp_path) == ["m.onnx"]
    assert read_metadata(out)["exporter"] == "legacy"  # written, and stamped all the same


def test_a_lint_finding_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bool, int]] = []

    def lint(graph: Any, *, dynamic_batch: bool, export_batch: int) -> list[str]:
        seen.append((dynamic_batch, export_batch))
        return ["a Dropout in the graph", "a fixed batch"]

    monkeypatch.setattr(onnx_export, "lint_graph", lint)
    out = tmp_path / "m.onnx"
    with pytest.raises(
        ExportError, match=r"^Graph lint failed for mlp: a Dropout in the graph; a fixed batch$"
    ):
        export_onnx("mlp", out, exporter="legacy", allow_mismatch=True)
    assert listing(tmp_path) == [] and seen == [(True, EXPORT_BATCH)]
    with pytest.raises(ExportError):
        export_onnx("mlp", out, exporter="legacy", static_batch=4)
    assert listing(tmp_path) == [] and seen[-1] == (False, 4)


def test_auto_falls_back_to_the_next_exporter_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dynamo_fails(model: Any, args: Any, f: str, **kw: Any) -> Any:
        if kw["dynamo"]:
            raise RuntimeError("dynamo cannot\nsecond line")
        return REAL_EXPORT(model, args, f, **kw)

    exporting(monkeypatch, dynamo_fails)
    out = tmp_path / "m.onnx"
    result = export_onnx("mlp", out)
    assert result.exporter == "legacy" and read_metadata(out)["exporter"] == "legacy"
    assert result.attempts[0] == {"exporter": "dynamo", "error": "RuntimeError: dynamo cannot"}
    assert result.attempts[1]["exporter"] == "legacy" and result.attempts[1]["parity_passed"]

    def both_fail(model: Any, args: Any, f: str, **kw: Any) -> Any:
        Path(f).write_bytes(b"half a graph")  # and external data beside it
        Path(f"{f}.weights.data").write_bytes(b"x")
        raise RuntimeError("no" if kw["dynamo"] else "nor this " + "x" * 1000 + "\nmore")

    exporting(monkeypatch, both_fail)
    out.write_bytes(b"old")
    with pytest.raises(ExportError) as info:
        export_onnx("mlp", out)
    assert str(info.value) == (
        "ONNX export of mlp failed (dynamo: RuntimeError: no; legacy: RuntimeError: nor this "
        + "x" * 391  # an exporter's error: its first line, 400 characters at most, marked cut
        + " …)."
    )
    assert listing(tmp_path) == ["m.onnx"] and out.read_bytes() == b"old"


def test_a_later_failed_attempt_leaves_the_kept_graph_as_it_was_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto``: the first exporter's graph is kept (it only missed parity, allowed here)
    after the second exporter wrote half a graph over it and failed: the kept one is
    written again, and it is the one the file holds."""

    def first_works_second_breaks(model: Any, args: Any, f: str, **kw: Any) -> Any:
        if kw["dynamo"]:  # the first attempt, made with the fast exporter
            return as_legacy(model, args, f, **kw)
        Path(f).write_bytes(b"half a graph")
        raise RuntimeError("broke halfway")

    exporting(monkeypatch, first_works_second_breaks)
    out = tmp_path / "m.onnx"
    result = export_onnx("mlp", out, model=Breach(), allow_mismatch=True)
    assert result.exporter == "dynamo" and result.parity is not None and not result.parity.passed
    assert result.attempts[1] == {"exporter": "legacy", "error": "RuntimeError: broke halfway"}
    assert dims(out) == ["batch", 1, 28, 28] and read_metadata(out)["exporter"] == "dynamo"


def as_legacy(model: Any, args: Any, f: str, **kw: Any) -> Any:
    """The dynamo attempt made by the fast TorchScript-based exporter (a dynamic batch)."""
    kw = {k: kw[k] for k in ("input_names", "output_names", "opset_version")}
    axes = {"input": {0: "batch"}, "logits": {0: "batch"}}
    return REAL_EXPORT(model, args, f, dynamo=False, dynamic_axes=axes, **kw)


def test_a_graph_with_lint_findings_gives_way_to_the_next_exporters_clean_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    findings = [["a Dropout in the graph"], []]
    monkeypatch.setattr(onnx_export, "lint_graph", lambda *a, **k: findings.pop(0))
    exporting(
        monkeypatch,
        lambda m, a, f, **kw: (as_legacy if kw["dynamo"] else REAL_EXPORT)(m, a, f, **kw),
    )
    result = export_onnx("mlp", tmp_path / "m.onnx")
    assert result.exporter == "legacy" and result.lint == [] and findings == []
    assert [a["lint"] for a in result.attempts] == [["a Dropout in the graph"], []]


def test_each_exporter_is_asked_for_the_graph_zoo_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What torch's two exporters are asked for: the input and output names zoo's runtimes
    read, the opset, one file without external data, and the batch (and with
    ``dynamic_size`` height and width) as named dynamic axes."""
    calls: list[dict[str, Any]] = []

    def spy(model: Any, args: Any, f: str, **kw: Any) -> Any:
        calls.append(dict(kw))
        if kw["dynamo"]:
            raise RuntimeError("recorded")  # then the legacy exporter, really
        return REAL_EXPORT(model, args, f, **kw)

    exporting(monkeypatch, spy)
    pooled = nn.Sequential(nn.Conv2d(3, 10, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    out = tmp_path / "m.onnx"
    result = export_onnx(
        "simple_cnn", out, dynamic_size=True, model=pooled, opset=17, allow_mismatch=True
    )
    dynamo, legacy = calls
    (shapes,) = dynamo.pop("dynamic_shapes")
    assert {k: (d.__name__, d.min) for k, d in shapes.items()} == {
        0: ("batch", 1),
        2: ("height", 16),
        3: ("width", 16),
    }
    names = {"input_names": ["input"], "output_names": ["logits"], "opset_version": 17}
    assert dynamo == {
        "dynamo": True, "external_data": False, **names, "optimize": True, "verbose": False,
    }  # fmt: skip
    assert legacy == {
        "dynamo": False,
        **names,
        "dynamic_axes": {"input": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}},
        "do_constant_folding": True,
    }
    assert dims(out) == ["batch", 3, "height", "width"] and result.exporter == "legacy"
    assert not any("legacy TorchScript-based" in w for w in result.attempts[1]["warnings"])
    calls.clear()
    export_onnx("mlp", tmp_path / "fixed.onnx", static_batch=2)
    assert calls[0]["dynamic_shapes"] is None and calls[1]["dynamic_axes"] is None
    assert dims(tmp_path / "fixed.onnx") == [2, 1, 28, 28]


def test_each_variant_is_made_judged_and_stamped(tmp_path: Path) -> None:
    """``--slim``, ``--precision fp16`` (with ``--fp16-io``) and ``--embed-preprocessing``:
    each step runs on the file the gate then judges, and the result and the file's
    metadata say what the graph takes."""
    model = create_model("mlp").eval()
    slim = export_onnx("mlp", tmp_path / "slim.onnx", exporter="legacy", model=model, slim=True)
    assert slim.slim and slim.slim == slim.attempts[0]["slim"]
    assert read_metadata(tmp_path / "slim.onnx")["slim"] == slim.slim
    half = export_onnx(
        "mlp", tmp_path / "half.onnx", exporter="legacy", model=model, precision="fp16",
        fp16_io=True,
    )  # fmt: skip
    assert half.precision == "fp16" and half.fp16_io and half.attempts[0]["fp16"]
    assert half.parity is not None and half.parity.passed and half.slim is None
    assert half.parity.tolerances == onnx_export.TOLERANCES["fp16"]
    meta = read_metadata(tmp_path / "half.onnx")
    assert meta["precision"] == "fp16" and meta["input"]["dtype"] == "float16"
    graph = onnx.load(str(tmp_path / "half.onnx"))
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    pixels = export_onnx(
        "mlp", tmp_path / "pixels.onnx", exporter="legacy", model=model, embed_preprocessing=True
    )
    assert pixels.embedded_preprocessing and pixels.attempts[0]["input"]
    assert pixels.parity is not None and pixels.parity.passed
    assert read_metadata(tmp_path / "pixels.onnx")["input"] == {
        "dtype": "uint8", "layout": "NHWC", "preprocessing": "in-graph",
    }  # fmt: skip
    assert read_metadata(tmp_path / "slim.onnx")["input"] == {
        "dtype": "float32", "layout": "NCHW", "preprocessing": "client",
    }  # fmt: skip


def test_the_source_weights_are_named_by_their_hash(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from zoo.weights import sha256_file

    weights = tmp_path / "w.safetensors"
    model = create_model("mlp")
    save_file(model.state_dict(), str(weights))
    export_onnx("mlp", tmp_path / "w.onnx", exporter="legacy", weights=str(weights))
    meta = read_metadata(tmp_path / "w.onnx")
    assert meta["source_weights_sha256"] == sha256_file(weights)  # no hash known: computed
    x = torch.randn(2, 1, 28, 28)
    sess = ort.InferenceSession(str(tmp_path / "w.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = model.eval()(x).numpy()
    np.testing.assert_allclose(sess.run(None, {"input": x.numpy()})[0], want, atol=1e-5)
    export_onnx("mlp", tmp_path / "none.onnx", exporter="legacy")  # random init: no source
    assert read_metadata(tmp_path / "none.onnx")["source_weights_sha256"] is None


@pytest.fixture
def knn_folder(tmp_path: Path) -> Path:
    """The MLP's model folder with a ``knn`` rejection rule and its bank (20 rows of the
    256-wide features the head reads)."""
    import json

    from zoo.bundle import bundle
    from zoo.knn import KnnBank

    folder = bundle("mlp", tmp_path / "folder")
    config = json.loads((folder / "config.json").read_text())
    rule = {"score": "knn", "threshold": 0.5, "acceptance": 0.95}
    config["calibration"] = {"temperature": 1.0, "reject": rule}
    (folder / "config.json").write_text(json.dumps(config))
    rows = np.random.default_rng(0).standard_normal((20, 256)).astype(np.float32)
    KnnBank.of(rows, k=3).save(folder)
    return folder


def test_a_knn_rule_is_built_into_the_graph_and_judged_with_it(
    knn_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zoo.deploy.export.knn as knn_export
    from zoo.knn import KNN_OUTPUT, KnnBank

    for name, options in [
        ("dynamic", {}),
        ("static", {"static_batch": 2}),
        ("pixels", {"embed_preprocessing": True}),
    ]:
        out = tmp_path / f"{name}.onnx"
        result = export_onnx(str(knn_folder), out, exporter="legacy", **options)
        knn = result.attempts[0]["knn"]
        assert (knn["rows"], knn["dim"], knn["k"]) == (20, 256, 3), name
        assert result.parity is not None and result.parity.passed and result.parity.knn
        assert result.parity.knn.images > 0 and result.parity.knn.max_abs <= 1e-4
        outputs = [o.name for o in onnx.load(str(out)).graph.output]
        assert outputs == ["logits", KNN_OUTPUT], name

    real = knn_export.add_to_graph

    def nudged(model: Any, features: str, bank: KnnBank) -> None:  # another bank's score
        rows = bank.rows.copy()
        rows[:, 0] += 0.05
        real(model, features, KnnBank(rows / np.linalg.norm(rows, axis=1, keepdims=True), bank.k))

    monkeypatch.setattr(knn_export, "add_to_graph", nudged)
    out = tmp_path / "nudged.onnx"
    with pytest.raises(ParityError, match=KNN_OUTPUT):
        export_onnx(str(knn_folder), out, exporter="legacy")
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"static_batch": 0}, "--static-batch 0: use a batch size of 1 or more."),
        ({"dynamic_batch": False},
         "dynamic_batch=False needs static_batch=N (the fixed batch size)."),
        ({"opset": MIN_OPSET - 1}, f"--opset {MIN_OPSET - 1} is outside the supported range "
         f"{MIN_OPSET}–{MAX_OPSET} (default {DEFAULT_OPSET})."),
        ({"opset": MAX_OPSET + 1}, f"--opset {MAX_OPSET + 1} is outside the supported range "
         f"{MIN_OPSET}–{MAX_OPSET} (default {DEFAULT_OPSET})."),
        ({"fp16_io": True}, "--fp16-io makes an fp16 graph's inputs and outputs float16: it "
         "needs --precision fp16."),
        ({"fp16_io": True, "precision": "fp16", "embed_preprocessing": True},
         "--fp16-io makes an fp16 graph's inputs and outputs float16: it needs --precision "
         "fp16 and takes float arrays, not --embed-preprocessing's uint8 pixels."),
        ({"embed_preprocessing": True, "static_batch": 2}, "--embed-preprocessing takes images "
         "of any size in a dynamic batch: drop --static-batch."),
        ({"embed_preprocessing": True, "dynamic_size": True}, "--embed-preprocessing takes "
         "images of any size in a dynamic batch: drop --dynamic-size."),
        ({"exporter": "onnxscript"}, "exporter 'onnxscript' is not one of auto, dynamo, legacy."),
        ({"precision": "int8"}, "precision 'int8' is not one of fp32, fp16."),
    ],
)  # fmt: skip
def test_contradictory_options_are_refused_before_anything_is_loaded(
    options: dict[str, Any], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnx_export, "load_for_export", loads)
    with pytest.raises(InputError) as info:
        export_onnx("mlp", tmp_path / "m.onnx", **options)
    assert str(info.value) == message
    assert listing(tmp_path) == []


class Loaded(Exception):
    """Raised where the model would load: every check before it passed."""


def loads(*args: Any) -> Any:
    raise Loaded


def test_the_ends_of_each_range_are_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_export, "load_for_export", loads)
    for options in ({"opset": MIN_OPSET}, {"opset": MAX_OPSET}, {"static_batch": 1},
                    {"fp16_io": True, "precision": "fp16"}, {"embed_preprocessing": True},
                    {"dynamic_batch": False, "static_batch": 2}):  # fmt: skip
        with pytest.raises(Loaded):
            export_onnx("mlp", tmp_path / "m.onnx", **options)


def test_atomic_output_replaces_only_on_success_and_sweeps_external_data(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_output(out) as tmp:
        tmp.write_bytes(b"new")
        Path(f"{tmp}.data").write_bytes(b"weights")
        raise RuntimeError("exporter failed")
    assert listing(tmp_path) == ["m.onnx"] and out.read_bytes() == b"old"
    with atomic_output(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".m.onnx.")
        tmp.write_bytes(b"new")
        Path(f"{tmp}.data").write_bytes(b"weights")
    assert listing(tmp_path) == ["m.onnx"] and out.read_bytes() == b"new"


@pytest.mark.parametrize(
    ("nbytes", "want"),
    [(0, 0.0), (3_000, 0.002861), (2**20, 1.0), (14_057_000, 13.41), (123_456_789_012, 117700.0)],
)
def test_every_size_is_mib_to_four_significant_figures(nbytes: int, want: float) -> None:
    """zoo.system.mib: export, quantize, bench, distill and zoo cache report sizes this way, so
    a model of a few kB never reads 0 MiB and a big one is not falsely precise."""
    from zoo.system import mib

    assert mib(nbytes) == want


def test_tracing_out_of_place_restores_the_models_in_place_activations() -> None:
    """The exporter traces in-place activations as out-of-place ones (faster under dynamo's
    symbolic shapes); the model is given back as it was, also when the export fails."""
    import torch
    from torch import nn

    from zoo.deploy.export.onnx_export import out_of_place

    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU6(inplace=True), nn.ReLU(), nn.Dropout(0.1))
    with out_of_place(net):
        assert [getattr(m, "inplace", None) for m in net] == [None, False, False, False]
    assert [getattr(m, "inplace", None) for m in net] == [None, True, False, False]
    with pytest.raises(RuntimeError), out_of_place(net):
        raise RuntimeError("the exporter failed")
    assert net[1].inplace is True
    x = torch.rand(1, 3, 8, 8)
    with torch.no_grad():
        y = net.eval()(x)
        with out_of_place(net):
            assert torch.equal(net(x), y)  # the same values


def test_the_dynamo_exporter_is_given_the_batchnorms_folded_and_the_gate_judges_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dynamo traces a copy with each BatchNorm folded into its conv (half the tracing; the
    graph is the same: onnxscript folds them anyway); the gate compares the file with the
    model as it is, which keeps its BatchNorm."""
    from torch import fx

    traced: list[nn.Module] = []

    def spy(model: Any, args: Any, f: str, **kw: Any) -> Any:
        traced.append(model)
        return REAL_EXPORT(model, args, f, **kw)

    exporting(monkeypatch, spy)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    ).eval()  # fmt: skip
    with torch.no_grad():  # statistics a fresh BatchNorm does not have: folding must move them
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
        net[1].weight.uniform_(0.5, 2)
    result = export_onnx("simple_cnn", tmp_path / "m.onnx", model=net, exporter="dynamo")
    assert result.parity is not None and result.parity.passed
    (folded,) = traced
    assert isinstance(folded, fx.GraphModule)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert isinstance(net[1], nn.BatchNorm2d)  # the model itself keeps its BatchNorm
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert "BatchNormalization" not in {n.op_type for n in graph.node}


def test_folding_leaves_what_it_cannot_fold_as_it_is() -> None:
    """No BatchNorm, a forward that branches on its input (symbolic tracing refuses it), a
    conv of a subclass (QAT's fake-quantized conv), one conv called twice before two
    BatchNorms (``fuse`` would fold both into it): the exporter gets the model unchanged."""
    from zoo.deploy.export.onnx_export import bn_folded

    class Branching(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x if x.sum() > 0 else -x))

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.bn1, self.bn2 = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
            with torch.no_grad():
                self.bn1.running_var.fill_(4.0)
                self.bn2.running_mean.fill_(1.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn2(self.conv(self.bn1(self.conv(x))))

    class FakeQuantConv(nn.Conv2d):
        pass

    x = torch.rand(2, 3, 8, 8)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    branching, shared = Branching().eval(), Shared().eval()
    for model in (plain, branching, shared):
        assert bn_folded(model, x) is model
    qat = nn.Sequential(FakeQuantConv(3, 4, 3), nn.BatchNorm2d(4)).eval()
    kept = bn_folded(qat, x)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in kept.modules()) == 1
    with torch.no_grad():
        assert torch.allclose(kept(x), qat(x))
