"""The options of a training run, shared by ``zoo finetune`` and ``zoo lr-find``.

Every default and choice comes from :class:`~zoo.train.config.TrainConfig` (``D``, and a test
fails on drift); only the help text, the spelling and the command-line checks live here, as an
``Annotated`` alias per option that has more than a type. :func:`train_config` maps a
command's options to the config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zoo.calibration import RejectMode
from zoo.cli.common import choice
from zoo.tracking import Track
from zoo.train.config import (
    BOUNDS,
    AmpDtype,
    ClassWeights,
    ImageCacheMode,
    Strategy,
    option_defaults,
)

if TYPE_CHECKING:
    from zoo.train.config import TrainConfig

# Every default and choice comes from TrainConfig; only the help text and spelling live here.
D = option_defaults()

# Option names whose CLI spelling differs from the TrainConfig field.
FIELD = {"arch": "model"}


def check_lr(value: str | None) -> float | str | None:
    """``--lr``: a number in ``BOUNDS["lr"]`` or ``auto`` (a usage error otherwise)."""
    if value is None or value == "auto":
        return value
    try:
        lr = float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is neither a number nor 'auto'") from None
    return bounded("lr")(lr)


def bounded(name: str) -> Callable[[Any], Any]:
    """A typer callback that holds an option to :data:`zoo.train.config.BOUNDS` ``[name]``
    (a usage error naming the range otherwise); ``None`` passes (chosen later)."""
    bounds = BOUNDS[name]

    def check(value: Any) -> Any:
        if value is not None and not bounds.holds(value):
            raise typer.BadParameter(f"{value} is out of range: it must be {bounds.rule()}")
        return value

    return check


def in_range(name: str, help: str = "") -> dict[str, Any]:
    """``typer.Option`` arguments for an option with a range: the check (:func:`bounded`) and
    the help, the range appended (``[a whole number ≥ 1]``)."""
    rule = f"[{BOUNDS[name].rule(hint=False)}]"
    return {"callback": bounded(name), "help": f"{help} {rule}" if help else rule}


def check_policy(value: str | None) -> str | None:
    """``--auto-augment``: a shorthand or a policy timm knows (a usage error otherwise)."""
    if value is not None:
        from zoo.errors import InputError
        from zoo.train.recipes import policy

        try:
            policy(value, 32, (0.5, 0.5, 0.5), "bilinear")
        except InputError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def train_config(params: dict[str, Any]) -> TrainConfig:
    """The :class:`TrainConfig` of a command's training options (CLI spellings mapped to the
    fields, the data folder and a model folder made absolute)."""
    from zoo.train.config import TrainConfig

    values = {FIELD.get(k, k): v for k, v in params.items()}
    values["model"] = values.get("model") or ""
    values["data"] = values.get("data") or ""
    if values["data"]:
        from zoo.system import expand_home

        values["data"] = str(expand_home(values["data"], what="--data").resolve())
    if values["model"]:
        from zoo.ref import ModelRef

        ref = ModelRef.parse(values["model"])  # the same precedence as every other command
        if ref.is_path:
            values["model"] = str(ref.path.resolve())
    return TrainConfig.from_dict(values)


WeightsOpt = Annotated[
    str | None,
    typer.Option(
        help="'none' for random init, or a safetensors file/folder; default: the entry's own"
    ),
]
StrategyOpt = Annotated[
    Strategy | None,
    choice(
        Strategy,
        "--strategy",
        help="default: gradual when pretrained, full from scratch (random weights)",
    ),
]
FreezeEpochsOpt = Annotated[
    int,
    typer.Option(**in_range("freeze_epochs", "gradual: epochs with the backbone frozen")),
]
BatchSizeOpt = Annotated[
    int, typer.Option("--batch-size", "-b", **in_range("batch_size", "per process"))
]
LrOpt = Annotated[
    str | None,
    typer.Option(
        metavar="<float|auto>",
        callback=lambda v: check_lr(v),
        help="head learning rate (default 1e-3 AdamW, 0.1 SGD); auto: zoo lr-find's "
        "suggestion, found first and kept in the run's lr_find.json",
    ),
]
BackboneLrMultOpt = Annotated[
    float | None,
    typer.Option(
        **in_range(
            "backbone_lr_mult",
            "backbone LR = lr × this (default 0.1; 1 for a network cut short, mobilenet_v2_s16)",
        )
    ),
]
ClassWeightsOpt = Annotated[
    ClassWeights,
    choice(ClassWeights, "--class-weights", help="auto: weigh the loss by inverse class frequency"),
]
MultiLabelOpt = Annotated[
    bool,
    typer.Option(help="DIR/labels.csv (path,labels) → BCEWithLogits, per-class thresholds"),
]
AmpOpt = Annotated[AmpDtype | None, choice(AmpDtype, "--amp", help="mixed precision on CUDA")]
ValFractionOpt = Annotated[
    float, typer.Option(**in_range("val_fraction", "flat folders: share held out for validation"))
]
NumWorkersOpt = Annotated[
    int | None, typer.Option(**in_range("num_workers", "DataLoader workers (default: auto)"))
]
AutoAugmentOpt = Annotated[
    str | None,
    typer.Option(
        metavar="<randaugment|trivialaugment|timm policy>",
        callback=lambda v: check_policy(v),
        help="timm's auto-augment on each crop (no colour jitter beside it), e.g. "
        "randaugment or rand-m7-mstd0.5",
    ),
]
RandomErasingOpt = Annotated[
    float,
    typer.Option(**in_range("random_erasing", "timm's Random Erasing: probability per image")),
]
MixupOpt = Annotated[float, typer.Option(**in_range("mixup", "timm's Mixup α (e.g. 0.2); 0: off"))]
CutmixOpt = Annotated[
    float,
    typer.Option(**in_range("cutmix", "timm's CutMix α (e.g. 1.0); with --mixup: one per batch")),
]
EmaDecayOpt = Annotated[float, typer.Option(**in_range("ema_decay", "with --ema"))]
LayerDecayOpt = Annotated[
    float | None,
    typer.Option(
        **in_range(
            "layer_decay", "backbone layer-wise LR decay (e.g. 0.75): each layer down, LR × this"
        ),
    ),
]
CacheFeaturesOpt = Annotated[
    bool, typer.Option(help="linear: train the head on cached backbone features")
]
ImageCacheOpt = Annotated[
    ImageCacheMode,
    choice(
        ImageCacheMode,
        "--image-cache",
        help="decode each image once into a shared uint8 cache ($ZOO_CACHE, default "
        "~/.cache/zoo; zoo cache ls|clear); auto: when it fits half the free disk",
    ),
]
StrictDataOpt = Annotated[
    bool, typer.Option(help="unreadable images are fatal instead of quarantined")
]
WeightDecayOpt = Annotated[float, typer.Option(**in_range("weight_decay"))]
WarmupEpochsOpt = Annotated[float, typer.Option(**in_range("warmup_epochs"))]
LabelSmoothingOpt = Annotated[float, typer.Option(**in_range("label_smoothing"))]
SaveEveryStepsOpt = Annotated[
    int | None, typer.Option(**in_range("save_every_steps", "also checkpoint every N steps"))
]
ImageSizeOpt = Annotated[
    int | None, typer.Option(**in_range("image_size", "override the model's input size"))
]


def _track_option() -> Any:
    option = choice(
        Track,
        "--track",
        help="also log the run to MLflow (pip install 'zoo[mlflow]'; MLFLOW_TRACKING_URI, "
        "default: MLflow's local store): params, epochs, data, artifacts; zoo export, "
        "quantize and bench of the run log into it too",
    )
    option.envvar = "ZOO_TRACK"  # choice() takes no envvar; the value is checked the same
    return option


TrackOpt = Annotated[Track, _track_option()]
RejectOpt = Annotated[
    RejectMode,
    choice(
        RejectMode,
        "--reject",
        help="also fit on validation a threshold below which predict and serve answer "
        "'unknown' (images from outside the classes): auto (the measured best score: knn), "
        "knn (closeness of the image's embedding to the training images', built into the "
        "export), msp (calibrated top-1 probability) or energy (logsumexp of the logits); "
        "off: never",
    ),
]
AcceptanceOpt = Annotated[
    float,
    typer.Option(
        **in_range(
            "acceptance", "with --reject: the share of validation images the threshold accepts"
        ),
    ),
]
