"""OpenVINO: the IR export behind the parity gate at its precision, the explicit inference
precision (never the plugin's silent choice), predict and serve from the IR, and zoo bench's
OpenVINO rows with the agreement column and --min-agreement.

The gate logic is tested on plain values first (seconds); the real MobileNetV2 ImageNet weights
and real photographs then go through the real ``zoo`` commands, OpenVINO and onnxruntime."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from tests.conftest import run_zoo
from tests.serving import server
from zoo.cli.app import app
from zoo.deploy.bench.options import BenchOptions
from zoo.deploy.bench.report import BenchRow, fastest_within
from zoo.deploy.export import parity
from zoo.errors import BackendUnavailableError, InputError, ModelRefError, ParityError
from zoo.ref import ModelRef
from zoo.system import int8_weight_bits

ov = pytest.importorskip("openvino")
SAMPLES = Path(__file__).resolve().parent.parent / "zoo" / "sample_images"


# ---- the explicit precision: asked, read back, refused where the CPU cannot ----------------
class _Compiled:
    def __init__(self, got: str) -> None:
        self.got = got

    def get_property(self, name: str) -> SimpleNamespace:
        assert name == "INFERENCE_PRECISION_HINT"
        return SimpleNamespace(to_string=lambda: self.got)


class _Core:
    """OpenVINO's Core as the precision check sees it: the CPU's capabilities, and what a
    compile reports back (the plugin may run another precision than asked)."""

    def __init__(self, caps: list[str], runs: str | None = None) -> None:
        self.caps, self.runs = caps, runs
        self.config: dict = {}

    def get_property(self, device: str, name: str) -> list[str]:
        assert (device, name) == ("CPU", "OPTIMIZATION_CAPABILITIES")
        return self.caps

    def compile_model(self, model: object, device: str, config: dict) -> _Compiled:
        self.config = config
        return _Compiled(self.runs or config["INFERENCE_PRECISION_HINT"])


def test_every_compile_names_its_precision_threads_and_one_stream() -> None:
    from zoo.deploy.runtimes.openvino import compile_cpu

    core = _Core(["FP32", "INT8"])
    compile_cpu(core, object(), "int8", 3)
    assert core.config == {
        "INFERENCE_PRECISION_HINT": "f32",  # int8 lives in the graph; the rest runs f32
        "INFERENCE_NUM_THREADS": 3,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
    }
    compile_cpu(core, object(), "fp32", 1)
    assert core.config["INFERENCE_PRECISION_HINT"] == "f32"
    compile_cpu(_Core(["FP32", "BF16"]), object(), "bf16", 1)


def test_bf16_is_refused_where_the_cpu_would_silently_run_f32() -> None:
    from zoo.deploy.runtimes.openvino import compile_cpu, require_precision

    with pytest.raises(BackendUnavailableError, match=r"cannot run OpenVINO bf16.*FP32, INT8"):
        require_precision(_Core(["FP32", "INT8"]), "bf16")
    # a plugin that compiles something else than asked is caught by reading it back
    with pytest.raises(BackendUnavailableError, match=r"Asked OpenVINO for bf16 .* compiled f32"):
        compile_cpu(_Core(["FP32", "BF16"], runs="f32"), object(), "bf16", 1)


def test_bf16_export_on_a_cpu_without_it_exits_1_before_any_work(tmp_path: Path) -> None:
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU runs bf16: the refusal cannot be met here")
    r = run_zoo("export", "mobilenet_v2", "--format", "openvino", "--precision", "bf16", "-o",
                str(tmp_path / "ir"))  # fmt: skip
    assert r.returncode == 1 and "would silently run f32" in r.stderr
    assert not (tmp_path / "ir").exists()


def test_this_machines_plugin_is_asked_not_assumed() -> None:
    from zoo.deploy.runtimes.openvino import require_precision

    core = ov.Core()
    require_precision(core, "fp32")
    if "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        require_precision(core, "bf16")
    else:
        with pytest.raises(BackendUnavailableError, match="silently run f32"):
            require_precision(core, "bf16")


def test_bf16_and_int8_pass_through_the_agreement_check() -> None:
    assert parity.TOLERANCES["bf16"].min_agreement == 0.98
    assert parity.TOLERANCES["int8"].min_agreement == 0.98
    assert parity.TOLERANCES["fp32"].min_agreement == 1.0


# ---- zoo bench --min-agreement: the fastest backend that keeps the answers ----------------
def _row(backend: str, p50: float, agreement: float | None, **kw: Any) -> BenchRow:
    batch = kw.pop("batch", 1)
    return BenchRow(backend, "cpu", batch, timing={"p50_ms": p50}, agreement=agreement, **kw)


def test_fastest_within_the_floor_per_device_and_batch() -> None:
    rows = [
        _row("ort_fp32", 10.0, 1.0),
        _row("ov_int8", 3.0, 0.84),
        _row("ov_fp32", 7.0, 0.99),
        _row("ort_int8", 1.0, 1.0, status="❌"),  # did not run: never picked
        _row("eager", 0.5, None),  # not compared: never picked
        _row("ov_int8", 20.0, 0.84, batch=16),
        _row("ort_fp32", 90.0, 1.0, batch=16),
    ]
    picked = fastest_within(rows, 0.99)
    assert [(f.batch, f.backend) for f in picked] == [(1, "ov_fp32"), (16, "ort_fp32")]
    assert picked[0].agreement == 0.99 and picked[0].min_agreement == 0.99  # >= floor
    assert [f.backend for f in fastest_within(rows, 0.8)] == ["ov_int8", "ov_int8"]
    assert fastest_within(rows, 1.0)[0].backend == "ort_fp32"


def test_fastest_within_says_whether_the_sample_proves_the_floor() -> None:
    from zoo.deploy.bench.report import floor_notes
    from zoo.deploy.quantize.verdict import wilson

    def row(agreement: float, n: int, backend: str = "ov_int8", **kw: Any) -> BenchRow:
        return _row(backend, 3.0, agreement, agreement_ci95=wilson(agreement, n), **kw)

    assert fastest_within([row(1.0, 400)], 0.99)[0].proven  # lower bound 0.9905
    assert not fastest_within([row(1.0, 300)], 0.99)[0].proven  # lower bound 0.9874
    assert not fastest_within([_row("ov_int8", 3.0, 1.0)], 0.5)[0].proven  # no interval
    assert fastest_within([row(1.0, 2, "eager")], 0.99)[0].proven  # the reference itself
    # one note per backend and device, whatever the batch sizes; none for a proven pick
    picks = fastest_within([row(1.0, 300), row(1.0, 300, batch=16)], 0.99)
    (note,) = floor_notes(picks, 300)
    assert note == (
        "note: 300 images do not show ov_int8 on cpu keeps ≥ 99.0% agreement: the 95% "
        "interval starts at 98.7%: pass --data with more images like yours to prove the floor"
    )
    assert floor_notes(fastest_within([row(1.0, 400)], 0.99), 400) == []
    (never,) = floor_notes(fastest_within([row(1.0, 10_000)], 1.0), 10_000)
    assert "no finite sample proves an agreement of 100%" in never
    (bare,) = floor_notes(fastest_within([_row("ov_int8", 3.0, 1.0)], 0.5), 2)
    assert bare.endswith("its agreement has no interval here")


# ---- references, options and refusals before any work --------------------------------------
def test_an_xml_file_or_its_folder_is_an_openvino_reference(tmp_path: Path) -> None:
    (tmp_path / "model.xml").write_text("<net/>")
    assert ModelRef.parse(str(tmp_path / "model.xml")).kind == "openvino"
    folder = ModelRef.parse(str(tmp_path))  # the folder zoo export --format openvino wrote
    assert folder.kind == "openvino" and folder.path == tmp_path / "model.xml"
    with pytest.raises(ModelRefError, match=r"no such OpenVINO IR"):
        ModelRef.parse(str(tmp_path / "other.xml"))


def test_a_broken_ir_is_named_plainly(tmp_path: Path) -> None:
    from zoo.deploy.runtimes.openvino import read_ir

    (tmp_path / "a.xml").write_text("hello")
    with pytest.raises(InputError, match=r"a\.xml is not an OpenVINO IR \(no <net> element"):
        read_ir(ov.Core(), tmp_path / "a.xml")
    (tmp_path / "b.xml").write_text('<?xml version="1.0"?><net name="x" version="11"></net>')
    with pytest.raises(InputError, match=r"b\.bin is missing: an IR is the \.xml and its \.bin"):
        read_ir(ov.Core(), tmp_path / "b.xml")


def test_bench_refuses_ov_int8_input_before_timing(tmp_path: Path) -> None:
    from zoo.deploy.bench.table import run_bench

    common: dict[str, Any] = {"devices": ("cpu",), "batch_sizes": (1,), "backends": ("ov_int8",)}
    with pytest.raises(InputError, match="ov_int8 needs --calib DIR"):
        run_bench(BenchOptions("simple_cnn.scratch", **common))
    with pytest.raises(InputError, match=r"are also --calib images"):
        run_bench(
            BenchOptions("simple_cnn.scratch", calib=str(SAMPLES), data=str(SAMPLES), **common)
        )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--precision", "int8"],
            "not one of --format onnx's: fp32, fp16 (int8 ONNX: zoo quantize)",
        ),
        (["--format", "openvino", "--precision", "fp16"], "openvino's: fp32, bf16, int8"),
        (["--calib", "x"], "--calib applies to --format openvino --precision int8"),
        (["--format", "openvino", "--precision", "int8"], "int8 needs --calib DIR"),
        (["--format", "openvino", "--min-agreement", "0.9"], "--min-agreement applies to"),
        (
            ["--format", "openvino", "--precision", "int8", "--min-agreement", "1.5"],
            "less than or equal to 1",
        ),
        (
            ["--format", "openvino", "--precision", "int8", "--calib", "c", "--min-agreement", "0"],
            "give a share in (0, 1]",
        ),
    ],
)
def test_export_usage_errors_exit_2(args: list[str], says: str) -> None:
    r = CliRunner().invoke(app, ["export", "mobilenet_v2", *args])
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()).replace("│", "").replace("  ", " ")


def test_export_refuses_a_folder_that_is_not_an_ir_and_int8_without_calibration(
    tmp_path: Path,
) -> None:
    from zoo.deploy.export.openvino import _calibration, export_openvino

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="is not an OpenVINO IR folder"):
        export_openvino("simple_cnn.scratch", tmp_path / "mine")
    with pytest.raises(InputError, match=r"an OpenVINO export is a folder .* -o .*m_openvino"):
        export_openvino("simple_cnn.scratch", tmp_path / "m.xml")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    gate = sorted(SAMPLES.glob("*.jpg"))
    with pytest.raises(InputError, match="needs --calib DIR"):
        _calibration(None, gate, None, 10)
    with pytest.raises(InputError, match=r"2 --data image\(s\) are also --calib images"):
        _calibration(str(SAMPLES), gate, None, 10)


def test_a_failed_gate_writes_nothing_and_keeps_the_old_ir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo.deploy.export import openvino as openvino_export

    out = tmp_path / "ir"
    first = openvino_export.export_openvino("simple_cnn.scratch", out)
    assert first.parity is not None and first.parity.passed
    assert sorted(p.name for p in out.iterdir()) == ["model.bin", "model.xml"]
    before = (out / "model.bin").read_bytes()
    impossible = parity.Tolerances(atol=0.0, rtol=0.0, min_cosine=1.1)
    strict = lambda *a, **k: parity.check_parity(*a, **{**k, "tolerances": impossible})  # noqa: E731
    monkeypatch.setattr(openvino_export, "check_parity", strict)  # the IR's gate, not ONNX's
    with pytest.raises(
        ParityError, match=r"OpenVINO fp32 IR of simple_cnn\.scratch does not match"
    ):
        openvino_export.export_openvino("simple_cnn.scratch", out)
    assert (out / "model.bin").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ir"]  # no temporary left behind


# ---- the real MobileNetV2: export, predict, serve, against onnxruntime --------------------
@pytest.fixture(scope="module")
def ir_fp32(tmp_path_factory: pytest.TempPathFactory, mobilenet_weights: Path) -> Path:
    out = tmp_path_factory.mktemp("ov") / "mnv2_openvino"
    r = run_zoo("export", "mobilenet_v2", "--format", "openvino", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["format"] == "openvino" and report["precision"] == "fp32"
    assert report["parity"]["passed"] and report["parity"]["tolerances"]["atol"] == 1e-4
    assert [d["batch"] for d in report["parity"]["dynamic"]] == [1, 2, 5]
    assert report["attempts"][0]["onnx"]["parity"]["passed"]  # the ONNX step's own gate
    return out / "model.xml"


@pytest.mark.slow
def test_the_fp32_ir_carries_zoo_metadata_and_matches_onnxruntime(
    ir_fp32: Path, mobilenet_onnx: Path
) -> None:
    from zoo.deploy.runtimes.loader import OnnxClassifier
    from zoo.deploy.runtimes.openvino import OpenVinoClassifier, read_ir_file_metadata

    meta = read_ir_file_metadata(ir_fp32)
    assert meta["format"] == "openvino" and meta["precision"] == "fp32"
    assert meta["openvino"]["inference_precision"] == "f32" and meta["openvino"]["int8"] is None
    assert meta["class_names"][285] == "Egyptian cat" and meta["parity"]["passed"]
    clf, ref = OpenVinoClassifier(ir_fp32, threads=2), OnnxClassifier(mobilenet_onnx)
    assert clf.precision == "fp32" and clf.width == 1000 and clf.static_batch is None
    x = np.stack(ref.preprocess_images(sorted(SAMPLES.glob("*.jpg")) * 3))
    np.testing.assert_allclose(clf.run(x), ref.run(x), atol=1e-4, rtol=1e-3)
    # an fp32 .onnx file compiled by OpenVINO (zoo serve --runtime openvino) gives the same
    np.testing.assert_allclose(OpenVinoClassifier(mobilenet_onnx).run(x), ref.run(x), atol=1e-4)


@pytest.mark.slow
def test_predict_reads_the_ir_alone(ir_fp32: Path) -> None:
    folder = str(ir_fp32.parent)  # the IR folder names its model.xml
    r = run_zoo("predict", folder, *map(str, sorted(SAMPLES.glob("*.jpg"))), "--json")
    assert r.returncode == 0, r.stderr
    top = {Path(x["image"]).stem: x["top"][0]["label"] for x in json.loads(r.stdout)}
    assert top == {"chelsea": "Egyptian cat", "coffee": "espresso"}
    r = run_zoo("predict", str(ir_fp32), str(SAMPLES), "--embeddings", "--out", "x.parquet")
    assert r.returncode == 1 and "give the .onnx file the IR was exported from" in r.stderr


@pytest.mark.slow
@pytest.mark.serve
def test_serve_runs_the_ir_and_onnx_in_openvino(ir_fp32: Path, mobilenet_onnx: Path) -> None:
    chelsea = (SAMPLES / "chelsea.jpg").read_bytes()
    with server(ir_fp32) as (url, _):
        meta = httpx.get(f"{url}/v2/models/mobilenet_v2.tv_in1k").json()
        assert meta["inputs"][0]["name"] == "input"
        r = httpx.post(
            f"{url}/v2/models/mobilenet_v2.tv_in1k/predict", files={"file": ("c.jpg", chelsea)}
        )
        assert r.status_code == 200 and r.json()["predictions"][0]["label"] == "Egyptian cat"
        bad = httpx.post(
            f"{url}/v2/models/mobilenet_v2.tv_in1k/infer",
            json={"inputs": [{"name": "input", "shape": [1, 3, 2, 2], "datatype": "FP32",
                              "data": [0.0] * 12}]},
        )  # fmt: skip
        assert bad.status_code == 400 and "expected [batch, 3, 224, 224]" in bad.text
        assert meta["platform"] == "openvino"
    refused = run_zoo("serve", str(ir_fp32), "--runtime", "onnxruntime", "--port", "1")
    assert refused.returncode == 1 and "run it with --runtime openvino" in refused.stderr
    with server(mobilenet_onnx, "--runtime", "openvino") as (url, _):
        r = httpx.post(
            f"{url}/v2/models/mobilenet_v2.tv_in1k/predict", files={"file": ("c.jpg", chelsea)}
        )
        assert r.status_code == 200 and r.json()["predictions"][0]["label"] == "Egyptian cat"


# ---- int8: NNCF on the IR, judged by agreement on held-out real images --------------------
@pytest.mark.slow
def test_int8_ir_is_judged_by_agreement_on_held_out_images(small_digits: Path, tmp_path: Path):
    from zoo.deploy.export.openvino import export_openvino
    from zoo.deploy.runtimes.openvino import read_ir_file_metadata

    out = tmp_path / "int8"
    r = export_openvino(
        "simple_cnn.scratch",
        out,
        precision="int8",
        data=str(small_digits / "digit_1"),
        calib=str(small_digits / "digit_0"),
        min_agreement=0.5,
    )
    p = r.to_dict()["parity"]
    assert p["passed"] and p["tolerances"] == {**asdict(parity.INT8), "min_agreement": 0.5}
    assert p["predictions"]["n_images"] == 30 and p["predictions"]["agreement"] >= 0.5
    meta = read_ir_file_metadata(out / "model.xml")
    assert meta["precision"] == "int8" and meta["openvino"]["int8"]["calib_images"] == 30
    assert meta["openvino"]["inference_precision"] == "f32"
    graph = ov.Core().read_model(str(out / "model.xml")).get_ops()
    ops = {op.get_type_name() for op in graph}
    assert "FakeQuantize" in ops  # int8 in the graph, run by the CPU plugin's int8 kernels
    # the weights' bits (NNCF's overflow fix: 7 on every layer, or on the first alone): on a
    # CPU without VNNI both are made and the one agreeing more with fp32 kept (a tie: 7)
    said = meta["openvino"]["int8"]
    bits, tried = said["weight_bits"], said["weight_bits_agreement"]
    if int8_weight_bits() == 7:
        assert set(tried) == {"7", "8"} and bits == (7 if tried["7"] >= tried["8"] else 8)
    else:
        assert tried is None and bits == 8
    reach = [
        int(np.abs(op.get_data().astype(int)).max())
        for op in graph
        if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.i8
    ]
    assert len(reach) == 5 and min(reach) <= 64, reach  # simple_cnn's 5 layers; the first 7-bit
    assert (max(reach) <= 64) == (bits == 7), reach


@pytest.mark.slow
def test_bench_rows_for_openvino_with_agreement_and_the_fastest_within_a_floor(
    small_digits: Path,
) -> None:
    from zoo.deploy.bench.table import run_bench

    report = run_bench(
        BenchOptions(
            "simple_cnn.scratch",
            backends=("eager", "ort_fp32", "ov_fp32", "ov_int8", "ov_bf16"),
            devices=("cpu",),
            batch_sizes=(1,),
            threads=2,
            calib=str(small_digits / "digit_0"),
            data=str(small_digits / "digit_1"),
            min_seconds=0.05,
            min_agreement=1.0,
        )
    ).to_dict()
    rows = {r["backend"]: r for r in report["rows"]}
    assert report["agreement_images"] == 30
    assert rows["eager"]["agreement"] == 1.0 and rows["ov_fp32"]["agreement"] == 1.0
    assert rows["ov_int8"]["status"] == "✅" and rows["ov_int8"]["agreement_ci95"][1] <= 1.0
    bf16_runs = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert (rows["ov_bf16"]["status"] == "✅") == bf16_runs
    if not bf16_runs:
        assert "silently run f32" in rows["ov_bf16"]["reason"]
    (best,) = report["fastest"]
    ok = [r for r in report["rows"] if r["status"] == "✅" and r["agreement"] >= 1.0]
    assert best["backend"] == min(ok, key=lambda r: r["p50_ms"])["backend"]
    assert not best["proven"]  # no finite sample proves an agreement of 1.0
