"""Choices are defined once (a ``Literal``) and refused at the command line: exit code 2, the
near miss suggested, nothing written; the library refuses them too when called directly."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from tests.conftest import run_zoo
from zoo.deploy import choices
from zoo.deploy.quantize.options import QuantizeOptions
from zoo.errors import ChoiceError, ConfigError

BAD_CHOICES = [
    (["export", "mlp", "--format", "onnnx"], "--format", "Did you mean 'onnx'?"),
    (["export", "mlp", "--exporter", "dynamoo"], "--exporter", "Did you mean 'dynamo'?"),
    (["export", "mlp", "-f", "torchscript", "--jit", "scrpt"], "--jit", "Did you mean 'script'?"),
    (["quantize", "m.onnx", "--mode", "statc"], "--mode", "Did you mean 'static'?"),
    (["quantize", "m.onnx", "--method", "entropi"], "--method", "Did you mean 'entropy'?"),
    (["bench", "mlp", "--backends", "eager,ort_fp33"], "--backends", "Did you mean 'ort_fp32'?"),
    (["bench", "mlp", "--batch-sizes", "1,x"], "--batch-sizes", "positive integers"),
    (["example", "digit", "out"], "name", "Did you mean 'digits'?"),
]


@pytest.mark.parametrize(("args", "option", "hint"), BAD_CHOICES)
def test_bad_choice_is_a_usage_error(
    args: list[str], option: str, hint: str, tmp_path: Path
) -> None:
    r = run_zoo(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"Invalid value for '{option}'" in r.stderr
    assert hint in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir()), "nothing written"


@pytest.mark.parametrize(
    ("command", "option", "literal"),
    [
        ("export", "--format", choices.Format),
        ("export", "--exporter", choices.Exporter),
        ("export", "--jit", choices.JitMode),
        ("quantize", "--mode", choices.QuantMode),
        ("quantize", "--method", choices.CalibMethod),
        ("bench", "--backends", choices.Backend),
    ],
)
def test_help_lists_the_one_definition(command: str, option: str, literal: object) -> None:
    r = run_zoo(command, "--help")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if option in x)
    assert "|".join(get_args(literal)) in line


def test_every_defined_value_passes_the_parser() -> None:
    import typer

    from zoo.cli.common import choice

    for literal in (
        choices.Format,
        choices.Exporter,
        choices.JitMode,
        choices.QuantMode,
        choices.CalibMethod,
    ):
        parse = choice(literal, "--x").parser
        for value in get_args(literal):
            assert parse(value) == value
        with pytest.raises(typer.BadParameter, match="is not one of"):
            parse("nope")
    assert choice(choices.Backend, "--b", many=True).parser(",".join(choices.BACKENDS))


def test_library_calls_are_checked_too(tmp_path: Path) -> None:
    from zoo.deploy.bench.options import BenchOptions
    from zoo.deploy.bench.table import run_bench
    from zoo.deploy.export.onnx_export import export_onnx
    from zoo.deploy.export.torch_export import export_torch

    with pytest.raises(ChoiceError, match=r"exporter 'dynamoo'.*Did you mean 'dynamo'"):
        export_onnx("mlp", tmp_path / "m.onnx", exporter="dynamoo")  # type: ignore[arg-type]
    with pytest.raises(ChoiceError, match=r"jit 'scrpt'"):
        export_torch("mlp", tmp_path / "m.ts", fmt="torchscript", jit="scrpt")  # type: ignore[arg-type]
    with pytest.raises(ChoiceError, match=r"backend 'ort_fp33'"):
        run_bench(BenchOptions("mlp", backends=("ort_fp33",)))
    assert not list(tmp_path.iterdir())
    assert isinstance(ChoiceError("x", "y", ["z"]), ValueError)


def test_quantize_library_checks_mode_and_method(tmp_path: Path) -> None:

    for kwargs, match in (
        ({"mode": "statc"}, "mode 'statc'"),
        ({"mode": "static", "method": "x"}, "method 'x'"),
    ):
        with pytest.raises(ChoiceError, match=match):
            QuantizeOptions(tmp_path / "m.onnx", tmp_path / "q.onnx", **kwargs)  # type: ignore[arg-type]


def test_train_config_refuses_unknown_keys() -> None:
    from zoo.train.config import TrainConfig

    cfg = TrainConfig(model="mlp", data="/data")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(
        ConfigError, match=r"Unknown training config key 'epoch'\. Did you mean 'epochs'"
    ):
        TrainConfig.from_dict({**cfg.to_dict(), "epoch": 3})
    with pytest.raises(ConfigError, match=r"lacks the required key 'data'"):
        TrainConfig.from_dict({"model": "mlp"})


def test_finetune_options_are_the_train_config_fields_with_its_defaults() -> None:
    """One source: a field added to TrainConfig without an option, or an option whose default
    drifts from the config's, fails here."""
    import typer.main

    from zoo.cli.app import app
    from zoo.train.config import TrainConfig, option_defaults

    command = typer.main.get_command(app).commands["finetune"]  # type: ignore[attr-defined]
    params = {p.name: p for p in command.params}
    # written by the run itself, never typed; distill: zoo distill's own options
    internal = {"schedule_segments", "run_dir", "distill"}
    fields = set(TrainConfig.__dataclass_fields__) - internal - {"model"}
    assert fields <= set(params), sorted(fields - set(params))
    # the model, how many processes, and the report written after the run
    assert set(params) - fields == {"arch", "nproc", "report"}
    for name, default in option_defaults().items():
        if name not in internal:
            assert params[name].default == default, name


def test_a_training_choice_typo_exits_2_with_a_did_you_mean(tmp_path: Path) -> None:
    r = run_zoo("finetune", "mlp", "--data", str(tmp_path), "--optimizer", "adamm")
    assert r.returncode == 2, r.stderr
    assert "optimizer 'adamm'" in r.stderr and "adamw" in r.stderr
    r = run_zoo("finetune", "mlp", "--data", str(tmp_path), "--monitor", "val/f1")
    assert r.returncode == 2 and "val/macro_f1" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_help_shows_each_range_from_its_one_definition() -> None:
    """The ranges in `--help` are BOUNDS' own words (in this process: start-up not tested)."""
    from tests.conftest import zoo_here
    from zoo.train.config import BOUNDS

    r = zoo_here("finetune", "--help")
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.replace("│", " ").split())
    for name in ("epochs", "label_smoothing", "val_fraction", "mixup", "ema_decay"):
        assert f"[{BOUNDS[name].rule(hint=False)}]" in said, name
    bad = zoo_here("finetune", "mlp", "--data", ".", "--label-smoothing", "1")
    assert (
        bad.returncode == 2
        and "1.0 is out of range: it must be in [0, 1) (usually 0.1)"
        in " ".join(bad.stderr.split())
    )
