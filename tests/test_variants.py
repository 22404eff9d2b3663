"""A run's derived files (zoo.variants): the user's chain on a real tiny run. Export, quantize
(written to model/variants/), then predict, predict --variant, list, eval, bench and serve
all still read the run; a stray file is named with what to do; --resume --extend keeps the
exports and they read as stale, with one warning line when loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import file_sha256, zoo_here, zoo_ok
from tests.serving import server
from zoo.artifact import REQUIRED_FILES, read_config
from zoo.errors import ArtifactError, InputError
from zoo.variants import (
    default_variant_path,
    exports,
    find_variant,
    list_variants,
    resolve_variant,
    stale_exports,
)


@pytest.fixture(scope="module")
def chain(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/X: simple_cnn, 1 epoch at 32 px, exported, with an int8 variant (the user's chain)."""
    runs = tmp_path_factory.mktemp("runs")
    # val/loss: the seeded second epoch of --extend lowers it, so new weights ship
    zoo_ok(
        "finetune", "simple_cnn", "--data", str(small_digits), "--weights", "none",
        "--epochs", "1", "--image-size", "32", "--runs", str(runs), "--name", "X",
        "--num-workers", "0", "--no-progress", "--monitor", "val/loss",
    )  # fmt: skip
    run = runs / "X"
    zoo_ok("export", str(run))
    zoo_ok("quantize", str(run / "model" / "model.onnx"), "--mode", "dynamic")
    return run


@pytest.fixture(scope="module")
def resumed(chain: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A copy of the chain's run resumed for one more epoch; the exports' hashes before it."""
    run = tmp_path_factory.mktemp("resumed") / "X"
    shutil.copytree(chain, run)
    model = run / "model"
    before = {
        p.name: file_sha256(p) for p in (model / "model.onnx", *model.glob("variants/*.onnx"))
    }
    zoo_ok("finetune", "--resume", str(run), "--extend", "1", "--no-progress")
    return run, before


@pytest.fixture(scope="module")
def flagged(chain: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chain's run with the variants whose input contract is their own:
    ``batch4`` (``--static-batch 4``), ``pixels`` (``--embed-preprocessing``) and ``fp16``
    (``--precision fp16``)."""
    run = tmp_path_factory.mktemp("flagged") / "X"
    shutil.copytree(chain, run)
    for flags in (("--static-batch", "4"), ("--embed-preprocessing",), ("--precision", "fp16")):
        zoo_ok("export", str(run), *flags)
    return run


def image(digits: Path) -> str:
    return str(sorted((digits / "digit_3").iterdir())[0])


def test_the_chain_leaves_the_run_readable(chain: Path, small_digits: Path) -> None:
    model = chain / "model"
    assert {p.name for p in model.iterdir()} == REQUIRED_FILES | {"model.onnx", "variants"}
    assert [v.name for v in list_variants(model)] == ["int8-dynamic"]
    read_config(model)  # the contract holds with variants/ in it
    plain = zoo_here("predict", str(chain), image(small_digits), "--json")
    int8 = zoo_here("predict", str(chain), image(small_digits), "--variant", "int8", "--json")
    assert plain.returncode == 0 and int8.returncode == 0, plain.stderr + int8.stderr
    assert "warning" not in plain.stderr + int8.stderr  # fresh exports: nothing to say
    for r in (plain, int8):  # the run's own classes, from either file
        assert json.loads(r.stdout)[0]["top"][0]["label"] in {f"digit_{d}" for d in range(10)}
    ev = zoo_here("eval", str(chain), "--json", "--device", "cpu")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["n"] > 0


def test_list_shows_the_variants(chain: Path) -> None:
    rows = json.loads(_list(chain.parent).stdout)
    row = next(r for r in rows if r["name"] == str(chain))
    assert [(v["name"], v["stale"]) for v in row["variants"]] == [
        ("model.onnx", False),
        ("int8-dynamic", False),
    ]
    table = zoo_here("list", f"{chain.parent}/*", "--runs", str(chain.parent))
    assert table.returncode == 0 and "int8-dynamic" in table.stdout


def _list(runs: Path, *args: str) -> object:
    r = zoo_here("list", f"{runs}/*", "--runs", str(runs), "--json", *args)
    assert r.returncode == 0, r.stderr
    return r


def test_a_stray_file_is_named_with_what_to_do(
    chain: Path, small_digits: Path, tmp_path: Path
) -> None:
    run = tmp_path / "runs" / "Y"
    shutil.copytree(chain / "model", run / "model")
    model = run / "model"
    shutil.copy(model / "model.onnx", model / "notes.onnx")
    (model / "last.pt").write_bytes(b"")
    (model / "todo.txt").write_text("x")
    r = zoo_here("predict", str(run), image(small_digits))
    assert r.returncode == 1
    line = r.stderr.splitlines()[0]
    assert f"notes.onnx (derived files belong in variants/: move it to {model}/variants/" in line
    assert "last.pt (pickle checkpoints are never part of an artifact" in line
    assert "todo.txt (not part of a model folder: move or delete it)" in line
    assert line.count("pickle") == 1  # only the pickle is called one
    rows = json.loads(_list(tmp_path / "runs").stdout)  # listed with its problem, not dropped
    assert rows == [{"name": str(run), "problem": line.removeprefix("error: ")}]


def test_default_path_and_resolution(chain: Path, tmp_path: Path) -> None:
    model = chain / "model"
    assert default_variant_path(model / "model.onnx", "int8-static") == (
        model / "variants" / "int8-static.onnx"
    )
    assert default_variant_path(model / "variants" / "int8-dynamic.onnx", "x") == (
        model / "variants" / "x.onnx"
    )
    loose = tmp_path / "m.onnx"
    shutil.copy(model / "model.onnx", loose)
    assert default_variant_path(loose, "int8-static") is None
    assert resolve_variant(model, "int8") == model / "variants" / "int8-dynamic.onnx"
    with pytest.raises(
        InputError, match="has no variant 'fp16': it has int8-dynamic; `zoo q"
    ) as no:
        resolve_variant(model, "fp16")
    # the file quantize's default engine writes: NNCF's where it is installed
    assert "writes an int8 variant in" in str(no.value)
    assert "(int8-nncf.onnx; int8-static.onnx without NNCF or for a quant" in str(no.value)
    two = tmp_path / "two"
    shutil.copytree(model, two)
    shutil.copy(two / "variants" / "int8-dynamic.onnx", two / "variants" / "int8-static.onnx")
    with pytest.raises(InputError, match=r"'int8' of .* is ambiguous: .*int8-dynamic, int8-static"):
        resolve_variant(two, "int8")
    assert resolve_variant(two, "int8-static").name == "int8-static.onnx"
    assert find_variant(two, "int8-d").backend == "ort_int8"
    (two / "variants").rename(two / "variants.bak")  # a file called variants is no folder
    (two / "variants").write_text("")
    with pytest.raises(ArtifactError, match=r"variants \(not part of a model folder"):
        read_config(two)


def test_bundle_carries_the_variants(chain: Path, tmp_path: Path) -> None:
    from zoo.bundle import bundle

    out = bundle(str(chain), tmp_path / "b")
    assert (out / "variants" / "int8-dynamic.onnx").read_bytes() == (
        chain / "model" / "variants" / "int8-dynamic.onnx"
    ).read_bytes()
    assert [v.stale for v in exports(out)] == [False, False]


def test_bench_times_the_variant_as_its_backend(chain: Path) -> None:
    r = zoo_here(
        "bench", str(chain), "--variant", "int8", "--backends", "eager", "--seconds", "0.05",
        "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = {row["backend"]: row for row in json.loads(r.stdout)["rows"]}
    variant = chain / "model" / "variants" / "int8-dynamic.onnx"
    assert rows["ort_int8"]["status"] == "✅", rows["ort_int8"]
    assert rows["ort_int8"]["size_mb"] == float(f"{variant.stat().st_size / 2**20:.4g}")


def test_bench_runs_a_fixed_batch_or_pixels_variant_as_zoo_runs_it(flagged: Path) -> None:
    """A variant with an input contract of its own is timed as zoo runs it: a fixed batch of
    4 padded at batch 1 and 3, while int8 is still quantized from an fp32 export of its own
    (not from the variant, and not left unexported because the variant took its place); a graph that takes decoded pixels is a row
    saying why it cannot be timed, not an abort naming a temporary file."""
    run = flagged
    r = zoo_here(
        "bench", str(run), "--variant", "batch4", "--backends", "ort_fp32,ort_int8",
        "--batch-sizes", "1,3", "--seconds", "0.05", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(row["backend"], row["batch"], row["status"]) for row in rows] == [
        ("ort_fp32", 1, "✅"), ("ort_fp32", 3, "✅"), ("ort_int8", 1, "✅"), ("ort_int8", 3, "✅")
    ], rows  # fmt: skip
    fixed = run / "model" / "variants" / "batch4.onnx"
    assert {row["size_mb"] for row in rows[:2]} == {float(f"{fixed.stat().st_size / 2**20:.4g}")}
    assert all(row["agreement"] == 1.0 for row in rows[:2])  # padded, not refused or mixed up
    r = zoo_here(
        "bench", str(run), "--variant", "pixels", "--backends", "eager", "--seconds", "0.05",
        "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = {row["backend"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["eager"]["status"] == "✅" and rows["ort_fp32"]["status"] == "❌"
    assert "pixels.onnx takes decoded uint8 pixels" in rows["ort_fp32"]["reason"]


@pytest.mark.parametrize("engine", ["ort", "nncf"])
def test_a_fixed_batch_export_quantizes_calibrated_a_full_batch_at_a_time(
    flagged: Path, tmp_path: Path, small_digits: Path, engine: str
) -> None:
    """``zoo export RUN --static-batch 4`` → ``zoo quantize variants/batch4.onnx``: the
    calibration feeds batches of exactly 4 (it fed single images, and onnxruntime refused
    them with a traceback), and the int8 graph keeps the fixed batch that predict pads to."""
    import onnx

    out = tmp_path / f"q-{engine}.onnx"
    fixed = flagged / "model" / "variants" / "batch4.onnx"
    zoo_ok("quantize", str(fixed), "--engine", engine, "-o", str(out))
    dim = onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_value == 4
    r = zoo_here("predict", str(out), image(small_digits), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["top"], r.stderr


def test_eval_of_a_pixels_variant_scores_the_file_on_decoded_images(
    flagged: Path, small_digits: Path
) -> None:
    """``zoo eval RUN --variant pixels`` runs that graph on the decoded images (it resizes
    them itself) and scores the same split as the PyTorch model, ``--ood --knn`` included
    (its embeddings too); ``--tta`` with it is a usage error naming the file (its views are
    crops of the preprocessed image)."""
    r = zoo_here("eval", str(flagged), "--variant", "pixels", "--json")
    assert r.returncode == 0, r.stderr
    got, torch_ = json.loads(r.stdout), json.loads(zoo_ok("eval", str(flagged), "--json").stdout)
    assert got["scored_by"].endswith("pixels.onnx") and "scored_by" not in torch_
    assert got["n"] == torch_["n"] > 0
    assert abs(got["acc"] - torch_["acc"]) <= 0.05  # the graph's float resize vs PIL's
    # image by image, the answers zoo predict gets from the same file: cm[true, predicted]
    split = json.loads((flagged / "split.json").read_text())
    val, classes = split["splits"]["val"], split["classes"]
    shown = zoo_here(
        "predict", str(flagged), *(str(Path(split["root"]) / p) for p, _ in val),
        "--variant", "pixels", "-k", "1", "--json",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    cm = [[0] * len(classes) for _ in classes]
    for (_, true), row in zip(val, json.loads(shown.stdout), strict=True):
        cm[classes.index(true)][classes.index(row["top"][0]["label"])] += 1
    assert got["confusion_matrix"] == cm
    outside = str(small_digits / "digit_3")  # any folder: this checks the path, not the AUROC
    ood = zoo_here("eval", str(flagged), "--variant", "pixels", "--ood", outside, "--knn", "--json")
    assert ood.returncode == 0, ood.stderr
    assert set(json.loads(ood.stdout)["ood"]["scores"]) >= {"msp", "knn"}
    tta = zoo_here("eval", str(flagged), "--variant", "pixels", "--tta", "flip")
    assert tta.returncode == 2 and "pixels.onnx" in tta.stderr and "Traceback" not in tta.stderr


def test_embeddings_of_an_fp16_variant_are_written(
    flagged: Path, small_digits: Path, tmp_path: Path
) -> None:
    """``zoo predict RUN DIR --variant fp16 --out F --embeddings``: the added embeddings
    output is declared with the graph's own type (float16 here), read back as float32."""
    out = tmp_path / "p.parquet"
    folder = str(small_digits / "digit_3")
    r = zoo_here(
        "predict", str(flagged), folder, "--variant", "fp16", "--out", str(out), "--embeddings"
    )
    assert r.returncode == 0, r.stderr
    import pyarrow.parquet as pq

    emb = pq.read_table(out).column("embedding").to_pylist()
    assert emb and all(len(e) == len(emb[0]) > 0 for e in emb)


def test_a_variants_refresh_command_keeps_the_flags_it_was_made_with(flagged: Path) -> None:
    """The "refresh it:" command of a stale ``pixels``/``batch4``/``fp16`` variant makes the
    same kind of file again, in the same place (tests/test_variant_names.py runs one)."""
    made = {v.name: v.refresh for v in exports(flagged / "model")}
    model = flagged / "model"
    assert made["pixels"] == (
        f"zoo export {flagged} --embed-preprocessing -o {model / 'variants' / 'pixels.onnx'}"
    )
    assert made["batch4"] == (
        f"zoo export {flagged} --static-batch 4 -o {model / 'variants' / 'batch4.onnx'}"
    )
    assert made["fp16"] == (
        f"zoo export {flagged} --precision fp16 -o {model / 'variants' / 'fp16.onnx'}"
    )


def test_resume_keeps_the_exports_and_they_read_as_stale(
    resumed: tuple[Path, dict[str, str]], small_digits: Path
) -> None:
    run, before = resumed
    model = run / "model"
    assert read_config(model).weights_sha256 != exports(model)[0].source_sha256  # new weights
    kept = {p.name: file_sha256(p) for p in (model / "model.onnx", *model.glob("variants/*.onnx"))}
    assert kept == before  # nothing deleted, nothing rewritten
    stale = stale_exports(model)
    assert [v.name for v in stale] == ["model.onnx", "int8-dynamic"]
    assert "refresh it: zoo export " + str(run) in stale[0].warning()
    r = zoo_here("predict", str(run), image(small_digits), "--variant", "int8")
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "int8-dynamic.onnx holds the weights of epoch 1, but" in warned[0]
    assert f"zoo quantize {model / 'model.onnx'} --mode dynamic" in warned[0]
    fresh = zoo_here("predict", str(run), image(small_digits))  # PyTorch: the current weights
    assert fresh.returncode == 0 and "warning" not in fresh.stderr
    rows = json.loads(_list(run.parent).stdout)
    assert [v["stale"] for v in rows[0]["variants"]] == [True, True]


def test_serve_variant_warns_once(resumed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    run, _ = resumed
    log = tmp_path / "serve.log"
    with server(run, "--variant", "int8-dynamic", log=log) as (url, _proc):
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
    text = log.read_text()
    assert text.count("int8-dynamic.onnx holds the weights of epoch 1, but") == 1, text


def test_serve_applies_the_variant_under_the_name_given(chain: Path) -> None:
    """``zoo serve b=RUN --variant int8`` said "Model 'b=RUN' does not exist"."""
    from zoo.cli.common import with_variant
    from zoo.cli.serve import served

    int8 = with_variant(str(chain), "int8")
    assert int8.endswith(".onnx") and Path(int8).is_file()
    assert served(f"b={chain}", "int8") == f"b={int8}"
    assert served(str(chain), "int8") == int8 and served(f"b={chain}", None) == f"b={chain}"
