"""``zoo export``'s option × ``--format`` seams, through the real CLI: an option the chosen
format would ignore, and an ``-o`` named as another format's, are usage errors (exit 2) that
name the option, the format and what to give instead, refused before anything is written; the
options each format does use, the outputs it is named by and its default output still pass.

Every command here stops before the export: a refusal on its own, and an accepted command at
``run_export`` (replaced by :func:`no_export`, which records the options it was handed), so the
whole file runs in seconds. Two refusals run unpatched, as a user meets them.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import typer.main
from click.testing import Result
from typer.testing import CliRunner

from zoo.cli.app import app
from zoo.errors import InputError, UsageError
from zoo.ref import ModelRef

FORMATS = ("onnx", "torchscript", "pt2", "triton", "openvino", "kserve")
EVERY = frozenset(FORMATS)
FROM_ONNX = frozenset({"onnx", "openvino", "triton", "kserve"})  # an ONNX export inside

# Each option, and the formats that take it: what deploy/export/run.py hands each format's
# exporter, and what the exporter does with it (written from the exporters, not the table).
# skip: formats that take the option but refuse this value on their own (tested elsewhere).
OPTIONS: list[tuple[list[str], frozenset[str], frozenset[str]]] = [
    (["--static-batch", "4"], frozenset({"onnx"}), frozenset()),
    # openvino, triton and kserve graphs always have a dynamic batch: saying so is true there
    (["--dynamic-batch"], FROM_ONNX, frozenset()),
    (["--dynamic-size"], frozenset({"onnx"}), frozenset()),
    (["--opset", "18"], frozenset({"onnx", "triton", "kserve"}), frozenset()),  # not openvino
    (["--exporter", "legacy"], frozenset({"onnx"}), frozenset()),
    (["--exporter", "auto"], FROM_ONNX, frozenset()),  # what openvino/triton/kserve always use
    (["--jit", "script"], frozenset({"torchscript"}), frozenset()),
    (["--jit", "trace"], frozenset({"torchscript"}), frozenset()),  # typed at its default
    (["--data", "photos"], FROM_ONNX, frozenset()),  # torchscript/pt2: seeded noise only
    (["--allow-mismatch"], frozenset({"onnx", "openvino"}), frozenset()),
    (["--no-allow-mismatch"], EVERY, frozenset()),  # what every other format always does
    (["--max-batch", "8"], frozenset({"triton", "kserve"}), frozenset()),
    (["--max-batch", "32"], frozenset({"triton", "kserve"}), frozenset()),  # typed at default
    (["--precision", "fp32"], EVERY, frozenset()),  # the others export fp32 and nothing else
    (["--precision", "fp16"], frozenset({"onnx"}), frozenset({"openvino"})),
    (["--calib", "photos"], frozenset(), frozenset({"openvino"})),  # openvino: with int8
    (["--min-agreement", "0.9"], frozenset(), frozenset({"openvino"})),  # with bf16/int8
    (["--slim"], frozenset({"onnx"}), frozenset()),
    (["--embed-preprocessing"], frozenset({"onnx", "triton", "kserve"}), frozenset()),
    (["--fp16-io"], frozenset(), frozenset({"onnx"})),  # onnx: with --precision fp16
    (["--kserve-runtime", "triton"], frozenset({"kserve"}), frozenset()),  # typed at default
    (["--storage-uri", "s3://bucket/models"], frozenset({"kserve"}), frozenset()),
    (["--image", "zoo:1"], frozenset(), frozenset({"kserve"})),  # kserve: with runtime zoo
    # one model file to register: not a repository or IR folder, not a manifest
    (["--register", "digits"], frozenset({"onnx", "torchscript", "pt2"}), frozenset()),
]
UNIVERSAL = {"model", "fmt", "output", "weights", "as_json"}  # every format uses these
# The formats a refusal names as the ones that use the option.
USED_BY = {
    "--static-batch": {"onnx"},
    "--dynamic-batch": {"onnx"},
    "--dynamic-size": {"onnx"},
    "--opset": {"onnx", "triton", "kserve"},
    "--exporter": {"onnx"},
    "--jit": {"torchscript"},
    "--data": FROM_ONNX,
    "--allow-mismatch": {"onnx", "openvino"},
    "--max-batch": {"triton", "kserve"},
    "--precision": {"onnx", "openvino"},
    "--calib": {"openvino"},
    "--min-agreement": {"openvino"},
    "--slim": {"onnx"},
    "--embed-preprocessing": {"onnx", "triton", "kserve"},
    "--fp16-io": {"onnx"},
    "--kserve-runtime": {"kserve"},
    "--storage-uri": {"kserve"},
    "--image": {"kserve"},
    "--register": {"onnx", "torchscript", "pt2"},
}

CASES = [
    pytest.param(args, fmt, fmt in takes, id=f"{' '.join(args)}-{fmt}")
    for args, takes, skip in OPTIONS
    for fmt in FORMATS
    if fmt not in skip
]


class Reached(Exception):
    """``run_export`` was called: every check of the options passed."""


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder, where default outputs would land."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def no_export(monkeypatch: pytest.MonkeyPatch) -> list:
    """``run_export`` replaced: the options it is handed are recorded and it raises
    :class:`Reached`, so an accepted command exports nothing."""
    seen: list = []

    def fake(options: object) -> None:
        seen.append(options)
        raise Reached

    monkeypatch.setattr("zoo.deploy.export.run.run_export", fake)
    return seen


def _export(*args: str, model: str = "simple_cnn") -> Result:
    return CliRunner().invoke(app, ["export", model, *args])


def _said(r: Result) -> str:
    """The output, its panel borders and line wrapping undone."""
    return " ".join(r.output.replace("│", " ").split())


def _formats_named(said: str, flag: str) -> set[str]:
    """The formats ``FLAG applies to --format …, not …`` names."""
    assert f"{flag} applies to --format " in said, said
    listed = said.split(f"{flag} applies to --format ", 1)[1].split(", not ", 1)[0]
    return set(re.findall(r"[a-z0-9]+", listed)) & EVERY


@pytest.mark.parametrize(("args", "fmt", "taken"), CASES)
def test_an_option_the_format_ignores_is_a_usage_error(
    args: list[str], fmt: str, taken: bool, cwd: Path, no_export: list
) -> None:
    r = _export("--format", fmt, *args)
    if taken:
        # past every option check: at the export (--register: at its tracked-run check)
        assert r.exit_code != 2 and "applies to --format" not in r.output, r.output
        if args[0] != "--register":
            assert isinstance(r.exception, Reached), r.output
        return
    assert r.exit_code == 2, (r.exit_code, r.output)
    said, flag = _said(r), args[0]
    assert f"not '{fmt}'" in said, said
    assert _formats_named(said, flag) == USED_BY[flag], said
    assert not no_export and not list(cwd.iterdir()), "refused before anything is written"


def test_every_option_has_a_row_in_the_table() -> None:
    """An option added to ``zoo export`` without saying which formats use it fails here."""
    from zoo.deploy.export.options import OPTION_FORMATS

    command = typer.main.get_command(app).commands["export"]  # type: ignore[attr-defined]
    params = {p.name for p in command.params} - UNIVERSAL
    named = {"register_name": "register"}
    assert {named.get(p, p) for p in params} == set(OPTION_FORMATS)
    for uses in OPTION_FORMATS.values():
        assert set(uses.formats) <= EVERY and set(uses.implied) <= EVERY - set(uses.formats)


def test_the_library_refuses_what_the_cli_refuses() -> None:
    """ExportOptions built directly (no CLI): an option other than its default is given."""
    from zoo.deploy.export.options import ExportOptions

    with pytest.raises(UsageError, match=r"--jit applies to --format torchscript, not 'onnx'"):
        ExportOptions("simple_cnn", format="onnx", jit="script")
    with pytest.raises(UsageError, match=r"--max-batch applies to --format triton or kserve"):
        ExportOptions("simple_cnn", format="onnx", max_batch=8)
    ExportOptions("simple_cnn", format="torchscript", precision="fp32")  # what it does anyway


REFUSED_OUTPUTS = [
    ("onnx", "model.pt", ".onnx"),  # the user's: an ONNX graph named as a PyTorch file
    ("onnx", "model", ".onnx"),
    ("onnx", "model.ts", ".onnx"),
    ("onnx", "model.ONNX", ".onnx"),  # zoo predict and serve know an ONNX file by .onnx
    ("torchscript", "model.onnx", ".ts"),
    ("torchscript", "model.pt2", ".ts"),
    ("pt2", "model.pt", ".pt2"),
    ("pt2", "model.onnx", ".pt2"),
    ("kserve", "isvc.json", ".yaml"),
    ("kserve", "model.onnx", ".yaml"),
    ("triton", "model.onnx", "a folder"),
    ("triton", "isvc.yaml", "a folder"),
    ("openvino", "model.xml", "a folder"),
    ("openvino", "model.onnx", "a folder"),
]


@pytest.mark.parametrize(("fmt", "name", "says"), REFUSED_OUTPUTS)
def test_an_output_named_as_another_format_is_a_usage_error(
    fmt: str, name: str, says: str, cwd: Path, no_export: list
) -> None:
    r = _export("--format", fmt, "-o", name)
    assert r.exit_code == 2, (r.exit_code, r.output)
    said = _said(r)
    assert f"-o {name}: --format {fmt} writes" in said and says in said, said
    assert not no_export and not list(cwd.iterdir()), "refused before anything is written"


ACCEPTED_OUTPUTS = [
    ("onnx", "model.onnx"),
    ("onnx", "sub/r18.b8.onnx"),
    ("torchscript", "model.ts"),  # zoo's default
    ("torchscript", "model.pt"),  # PyTorch's docs'
    ("torchscript", "model.torchscript"),  # Ultralytics'
    ("pt2", "model.pt2"),
    ("kserve", "isvc.yaml"),
    ("kserve", "isvc.yml"),
    ("kserve", "digits.isvc.yaml"),
    ("triton", "model_repository"),
    ("triton", "repo.v2"),  # a dot in a folder's name is no file suffix
    ("openvino", "mnv2_ov"),
    ("openvino", "resnet18.tv_in1k_openvino"),
]


@pytest.mark.parametrize(("fmt", "name"), ACCEPTED_OUTPUTS)
def test_an_output_named_as_its_format_writes_it_passes(
    fmt: str, name: str, cwd: Path, no_export: list
) -> None:
    r = _export("--format", fmt, "-o", name)
    assert isinstance(r.exception, Reached), r.output
    (options,) = no_export
    assert options.destination(ModelRef.parse("simple_cnn")) == Path(name)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "pt2", "kserve"])
def test_a_folder_where_a_file_goes_is_refused_naming_it(
    fmt: str, cwd: Path, no_export: list
) -> None:
    (cwd / "out").mkdir()
    r = _export("--format", fmt, "-o", "out")
    assert r.exit_code == 1 and isinstance(r.exception, InputError), r.output
    assert f"-o out is a folder; --format {fmt} writes" in str(r.exception)
    assert not no_export and not list((cwd / "out").iterdir())


DEFAULTS = [
    *((fmt, []) for fmt in FORMATS),
    ("onnx", ["--precision", "fp16"]),  # a run's variants/fp16.onnx
    ("onnx", ["--static-batch", "2", "--slim"]),
    ("onnx", ["--embed-preprocessing"]),
    ("openvino", ["--precision", "bf16"]),  # a run's variants/openvino-bf16 folder
    ("triton", ["--embed-preprocessing"]),
]


@pytest.mark.parametrize(("fmt", "variant"), DEFAULTS)
def test_each_formats_default_output_passes_its_own_check(
    fmt: str, variant: list[str], cwd: Path, no_export: list
) -> None:
    """Without -o, for a registry model and a run (whose variants go to model/variants/):
    accepted, and the default path passes the check a typed -o gets."""
    run = cwd / "runs" / "r"
    (run / "model").mkdir(parents=True)
    for model in ("simple_cnn", str(run)):
        no_export.clear()
        r = _export("--format", fmt, *variant, model=model)
        assert isinstance(r.exception, Reached), r.output
        (options,) = no_export
        default = options.destination(ModelRef.parse(model))
        dataclasses.replace(options, output=default)  # checked again, as if typed
    assert sorted(p.name for p in cwd.iterdir()) == ["runs"], "nothing written"


def test_the_users_commands_are_refused_before_any_export(cwd: Path) -> None:
    """Unpatched, as typed: an ONNX graph named model.pt, and --jit / --max-batch with onnx,
    each exit 2 and leave nothing behind (they used to export and write the file)."""
    r = _export("--format", "onnx", "-o", "model.pt")
    assert r.exit_code == 2, r.output
    assert "named .onnx (.pt is --format torchscript's): e.g. -o model.onnx" in _said(r)
    for args in (["--jit", "script"], ["--max-batch", "8"]):
        r = _export("--format", "onnx", "-o", "model.onnx", *args)
        assert r.exit_code == 2 and f"{args[0]} applies to --format" in _said(r), r.output
    assert not list(cwd.iterdir())


def test_dynamic_size_on_a_model_of_a_fixed_size_exits_1_naming_the_size(cwd: Path) -> None:
    """Unpatched, as typed: simple_cnn's head is a linear layer over its 32 px features, so
    its graph cannot take other sizes. Refused before export (exit 1), nothing written."""
    r = _export("--dynamic-size", "-o", "m.onnx")
    assert r.exit_code == 1 and isinstance(r.exception, InputError), r.output
    said = str(r.exception)
    assert "simple_cnn does not take 16x16 inputs (mat1 and mat2 shapes cannot be" in said
    assert "export it without --dynamic-size, at 32x32." in said
    assert not list(cwd.iterdir())
