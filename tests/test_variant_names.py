"""Names of derived variants (zoo.variants): ``zoo quantize`` of a variant writes a file named
after it (``variants/batch4-int8-static.onnx``), never over the int8 of ``model.onnx``; the new
file is listed and selectable; and each variant's "refresh it" command makes the same kind of
file again, in the same place (the export flags its metadata records, the export a quantized
file came from)."""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.conftest import file_sha256, zoo_ok
from zoo.errors import InputError
from zoo.variants import ExportFlags, exports, find_variant, list_variants

QUANTIZE = ("--mode", "static", "--engine", "ort", "--allow-drop")  # tiny run: judged on 20 images


@dataclass(frozen=True)
class Quantized:
    """The run, and the sha256 of its ``variants/int8-static.onnx`` before ``batch4.onnx`` was
    quantized."""

    run: Path
    own_int8_before: str


@pytest.fixture(scope="module")
def quantized(digits16: Path, tmp_path_factory: pytest.TempPathFactory) -> Quantized:
    """runs/X: simple_cnn, 1 epoch on 16 px digits; model.onnx and its static int8, then a
    ``--static-batch 4`` export quantized the same way with the default output."""
    runs = tmp_path_factory.mktemp("runs")
    zoo_ok(
        "finetune", "simple_cnn", "--data", str(digits16), "--weights", "none", "--epochs", "1",
        "--image-size", "32", "--runs", str(runs), "--name", "X", "--num-workers", "0",
        "--no-progress",
    )  # fmt: skip
    run = runs / "X"
    variants = run / "model" / "variants"
    zoo_ok("export", str(run))
    zoo_ok("quantize", str(run / "model" / "model.onnx"), *QUANTIZE)
    before = file_sha256(variants / "int8-static.onnx")
    zoo_ok("export", str(run), "--static-batch", "4")
    zoo_ok("quantize", str(variants / "batch4.onnx"), *QUANTIZE)
    return Quantized(run, before)


def test_quantizing_a_batch4_variant_leaves_the_int8_of_model_onnx_alone(
    quantized: Quantized,
) -> None:
    import onnx

    run = quantized.run
    model = run / "model"
    variants = model / "variants"
    own, made = variants / "int8-static.onnx", variants / "batch4-int8-static.onnx"
    assert file_sha256(own) == quantized.own_int8_before  # not overwritten
    assert onnx.load(str(made)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 4
    assert onnx.load(str(own)).graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert [v.name for v in list_variants(model)] == ["batch4", "batch4-int8-static", "int8-static"]
    # selectable by its full name or its unique prefix; int8 still means model.onnx's
    assert find_variant(model, "batch4-int8").path == made
    assert find_variant(model, "batch4").path == variants / "batch4.onnx"  # exact wins
    assert find_variant(model, "int8").path == own
    rows = json.loads(zoo_ok("list", f"{run.parent}/*", "--runs", str(run.parent), "--json").stdout)
    listed = next(r for r in rows if r["name"] == str(run))["variants"]
    names = ["model.onnx", "batch4", "batch4-int8-static", "int8-static"]
    assert [v["name"] for v in listed] == names


def test_predict_picks_the_variant_made_from_batch4(quantized: Quantized, digits16: Path) -> None:
    image = str(sorted((digits16 / "digit_3").iterdir())[0])
    out = zoo_ok(
        "predict", str(quantized.run), image, "--variant", "batch4-int8-static", "--json"
    ).stdout
    assert json.loads(out)[0]["top"][0]["label"].startswith("digit_")


def test_refresh_of_a_quantized_variant_exports_its_source_again(quantized: Quantized) -> None:
    run = quantized.run
    model = run / "model"
    variants = model / "variants"
    made = {v.name: v.refresh for v in exports(model)}
    assert made["model.onnx"] == f"zoo export {run}"
    assert made["batch4"] == f"zoo export {run} --static-batch 4 -o {variants / 'batch4.onnx'}"
    assert made["int8-static"] == (
        f"zoo export {run} && zoo quantize {model / 'model.onnx'} --mode static --engine ort"
    )
    assert made["batch4-int8-static"] == (
        f"zoo export {run} --static-batch 4 -o {variants / 'batch4.onnx'} && zoo quantize "
        f"{variants / 'batch4.onnx'} --mode static --engine ort"
    )
    # a file named otherwise (e.g. quantized before names said their source) keeps its name
    old = find_variant(model, "batch4-int8-static")
    moved = replace(old, name="int8-x", path=variants / "int8-x.onnx")
    assert moved.refresh.endswith(f"--mode static --engine ort -o {variants / 'int8-x.onnx'}")
    # never a graph of another contract over model.onnx: a fixed-batch int8 whose source was
    # not recorded (or recorded as a model.onnx elsewhere) re-exports to the variant its flags
    # name; a contract-keeping int8 made from a variant (--slim) re-exports that variant
    for source in (None, Path("/elsewhere/model.onnx")):
        unknown = replace(old, quantized_from=source)
        assert unknown.refresh.startswith(
            f"zoo export {run} --static-batch 4 -o {variants / 'batch4.onnx'} && zoo quantize "
            f"{variants / 'batch4.onnx'} "
        ), unknown.refresh
    slim = replace(old, flags=ExportFlags(slim=True), quantized_from=variants / "slim.onnx")
    assert slim.refresh.startswith(
        f"zoo export {run} --slim -o {variants / 'slim.onnx'} && zoo quantize "
        f"{variants / 'slim.onnx'} "
    ), slim.refresh
    assert "model.onnx" not in slim.refresh and "model.onnx" not in unknown.refresh


def test_the_flags_a_file_records_are_the_flags_its_refresh_passes() -> None:
    pixels = {"input": {"dtype": "uint8", "layout": "NHWC"}, "static_batch": None}
    assert ExportFlags.from_metadata(pixels).args() == " --embed-preprocessing"
    io16 = {"input": {"dtype": "float16"}, "precision": "fp16", "slim": {"nodes_after": 3}}
    assert ExportFlags.from_metadata(io16).args("fp16") == " --precision fp16 --fp16-io --slim"
    sized = {"input": {"dtype": "float32"}, "static_batch": 8, "dynamic_size": True}
    assert ExportFlags.from_metadata(sized).args() == " --static-batch 8 --dynamic-size"
    assert ExportFlags.from_metadata({}) == ExportFlags()  # records none: a plain export
    assert ExportFlags.from_metadata({"static_batch": 0}).static_batch is None
    assert ExportFlags(dynamic_size=True, slim=True).contract
    assert not ExportFlags(static_batch=1).contract
    # the one naming rule zoo export's default destination uses too
    from zoo.deploy.export.options import export_variant_name

    for flags in (ExportFlags(), ExportFlags(static_batch=4), ExportFlags(fp16_io=True),
                  ExportFlags(embedded_preprocessing=True, static_batch=2)):  # fmt: skip
        for precision in ("fp32", "fp16"):
            assert flags.variant_name(precision) == export_variant_name(
                "onnx", precision, embed=flags.embedded_preprocessing,
                static_batch=flags.static_batch, fp16_io=flags.fp16_io,
            )  # fmt: skip
    assert ExportFlags(fp16_io=True).variant_name("fp16") == "fp16-io16"


def test_an_int8_prefix_does_not_pick_an_int8_made_from_another_variant(
    quantized: Quantized, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(quantized.run / "model", model)
    (model / "variants" / "int8-static.onnx").unlink()
    with pytest.raises(
        InputError, match=r"\(batch4-int8-static is made from batch4: give its full name\)"
    ):
        find_variant(model, "int8")


def test_the_refresh_command_remakes_the_same_files(quantized: Quantized, tmp_path: Path) -> None:
    """Run as printed, the refresh of ``batch4-int8-static`` writes ``batch4.onnx`` and
    ``batch4-int8-static.onnx`` again (a fixed batch of 4) and nothing else."""
    import onnx

    run = tmp_path / "X"
    shutil.copytree(quantized.run, run)
    variants = run / "model" / "variants"
    before = {p.name: p.stat().st_mtime_ns for p in variants.iterdir()}
    command = find_variant(run / "model", "batch4-int8-static").refresh
    for part in command.split(" && "):
        words = shlex.split(part)
        assert words[0] == "zoo", command
        zoo_ok(*words[1:], *(["--allow-drop"] if words[1] == "quantize" else []))
    after = {p.name: p.stat().st_mtime_ns for p in variants.iterdir()}
    assert after.keys() == before.keys()
    assert {n for n in after if after[n] != before[n]} == {"batch4.onnx", "batch4-int8-static.onnx"}
    made = onnx.load(str(variants / "batch4-int8-static.onnx"))
    assert made.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 4
