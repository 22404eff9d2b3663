"""``zoo finetune``: fine-tune a model on a folder of images (the run itself:
:func:`zoo.train.trainer.fit`; the options: :mod:`zoo.cli.train_options`)."""

from __future__ import annotations

from typing import Annotated

import typer

from zoo.cli.common import choice
from zoo.cli.train_options import (
    FIELD,
    AcceptanceOpt,
    AmpOpt,
    AutoAugmentOpt,
    BackboneLrMultOpt,
    BatchSizeOpt,
    CacheFeaturesOpt,
    ClassWeightsOpt,
    CutmixOpt,
    D,
    EmaDecayOpt,
    FreezeEpochsOpt,
    ImageCacheOpt,
    ImageSizeOpt,
    LabelSmoothingOpt,
    LayerDecayOpt,
    LrOpt,
    MixupOpt,
    MultiLabelOpt,
    NumWorkersOpt,
    RandomErasingOpt,
    RejectOpt,
    SaveEveryStepsOpt,
    StrategyOpt,
    StrictDataOpt,
    TrackOpt,
    ValFractionOpt,
    WarmupEpochsOpt,
    WeightDecayOpt,
    WeightsOpt,
    in_range,
    train_config,
)
from zoo.train.config import (
    Monitor,
    OptimizerName,
    SamplerName,
    ScheduleName,
)


def finetune_cmd(
    ctx: typer.Context,
    arch: Annotated[
        str | None,
        typer.Argument(help="registry name, timm:<name>, or a model folder; omit with --resume"),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option("--data", help="image folder: DIR/<class>/… or DIR/train|val/<class>/…"),
    ] = None,
    weights: WeightsOpt = D["weights"],
    strategy: StrategyOpt = D["strategy"],
    epochs: Annotated[int, typer.Option(**in_range("epochs"))] = D["epochs"],
    freeze_epochs: FreezeEpochsOpt = D["freeze_epochs"],
    batch_size: BatchSizeOpt = D["batch_size"],
    lr: LrOpt = D["lr"],
    backbone_lr_mult: BackboneLrMultOpt = D["backbone_lr_mult"],
    weight_decay: WeightDecayOpt = D["weight_decay"],
    optimizer: Annotated[OptimizerName, choice(OptimizerName, "--optimizer")] = D["optimizer"],
    schedule: Annotated[
        ScheduleName, choice(ScheduleName, "--schedule", help="LR schedule, stepped per batch")
    ] = D["schedule"],
    momentum: Annotated[float, typer.Option(**in_range("momentum", "SGD momentum (Nesterov)"))] = D[
        "momentum"
    ],
    warmup_epochs: WarmupEpochsOpt = D["warmup_epochs"],
    label_smoothing: LabelSmoothingOpt = D["label_smoothing"],
    class_weights: ClassWeightsOpt = D["class_weights"],
    sampler: Annotated[
        SamplerName,
        choice(SamplerName, "--sampler", help="balanced: draw every class equally often"),
    ] = D["sampler"],
    multi_label: MultiLabelOpt = D["multi_label"],
    clip_grad_norm: Annotated[
        float | None, typer.Option(**in_range("clip_grad_norm", "e.g. 1.0"))
    ] = D["clip_grad_norm"],
    amp: AmpOpt = D["amp"],
    channels_last: bool = D["channels_last"],
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the model")] = D[
        "compile"
    ],
    val_fraction: ValFractionOpt = D["val_fraction"],
    seed: int = D["seed"],
    device: str = D["device"],
    num_workers: NumWorkersOpt = D["num_workers"],
    augment: Annotated[bool, typer.Option(help="online augmentation in training")] = D["augment"],
    auto_augment: AutoAugmentOpt = D["auto_augment"],
    random_erasing: RandomErasingOpt = D["random_erasing"],
    mixup: MixupOpt = D["mixup"],
    cutmix: CutmixOpt = D["cutmix"],
    ema: Annotated[
        bool,
        typer.Option(help="timm's model EMA, validated each epoch; shipped when it scores better"),
    ] = D["ema"],
    ema_decay: EmaDecayOpt = D["ema_decay"],
    layer_decay: LayerDecayOpt = D["layer_decay"],
    cache_features: CacheFeaturesOpt = D["cache_features"],
    image_cache: ImageCacheOpt = D["image_cache"],
    monitor: Annotated[
        Monitor | None,
        choice(
            Monitor,
            "--monitor",
            help="picks the best checkpoint, drives --patience (default: val/acc; "
            "val/macro_f1 with --multi-label)",
        ),
    ] = D["monitor"],
    patience: Annotated[
        int | None,
        typer.Option(**in_range("patience", "early stopping after N epochs without improvement")),
    ] = D["patience"],
    save_every_steps: SaveEveryStepsOpt = D["save_every_steps"],
    top_k_checkpoints: Annotated[int, typer.Option(**in_range("top_k_checkpoints"))] = D[
        "top_k_checkpoints"
    ],
    reject: RejectOpt = D["reject"],
    acceptance: AcceptanceOpt = D["acceptance"],
    strict_data: StrictDataOpt = D["strict_data"],
    max_nonfinite: Annotated[
        int,
        typer.Option(
            **in_range(
                "max_nonfinite", "non-finite losses in a row (each step skipped) before a rollback"
            ),
        ),
    ] = D["max_nonfinite"],
    max_rollbacks: Annotated[
        int,
        typer.Option(
            **in_range(
                "max_rollbacks", "rollbacks to the last checkpoint with half the LR, then stop"
            ),
        ),
    ] = D["max_rollbacks"],
    image_size: ImageSizeOpt = D["image_size"],
    sync_bn: bool = D["sync_bn"],
    detect_anomaly: bool = D["detect_anomaly"],
    log_grad_norms: bool = D["log_grad_norms"],
    dry_run: Annotated[
        bool, typer.Option(help="check shapes, count parameters, estimate time; no training")
    ] = D["dry_run"],
    runs_root: Annotated[str, typer.Option("--runs", help="where run folders go")] = D["runs_root"],
    name: Annotated[
        str | None, typer.Option(help="run name (default: ARCH-DATA, auto-incremented)")
    ] = D["name"],
    resume: Annotated[
        str | None, typer.Option(help="continue RUN_DIR exactly where it stopped")
    ] = D["resume"],
    extend: Annotated[int, typer.Option(**in_range("extend", "with --resume: add N epochs"))] = D[
        "extend"
    ],
    nproc: Annotated[
        int, typer.Option(min=1, help="processes via torch.distributed.run (DDP)")
    ] = 1,
    progress: Annotated[bool, typer.Option(help="rich progress bar")] = D["progress"],
    track: TrackOpt = D["track"],
    report: Annotated[
        bool,
        typer.Option(
            envvar="ZOO_FINETUNE_REPORT",
            help="at the end, write report.html (zoo eval RUN --report) into the run",
        ),
    ] = True,
) -> None:
    """Fine-tune a model on a folder of images (e.g. zoo finetune resnet18 --data ./fish)."""
    if resume is None and (arch is None or data is None):
        raise typer.BadParameter("give ARCH and --data (or --resume RUN_DIR)")
    if extend and resume is None:
        raise typer.BadParameter("--extend only makes sense with --resume RUN_DIR")
    params = dict(ctx.params)
    if nproc > 1 and lr == "auto":
        raise typer.BadParameter(
            "--lr auto runs in one process: run `zoo lr-find` first, then pass --lr VALUE",
            param_hint="--lr",
        )
    # What the user typed: --resume compares exactly these against the run's config.
    explicit = frozenset(
        FIELD.get(k, k)
        for k in params
        # typer vendors its own click: compare the enum by name, not identity
        if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"
    )
    del params["nproc"]  # how many processes run it, not part of the run's config
    del params["report"]  # what is written after the run, not part of it
    cfg = train_config(params)
    from zoo.cli.train_run import run_training

    run_training(cfg, explicit, nproc=nproc, report=report)


def register(app: typer.Typer) -> None:
    app.command("finetune")(finetune_cmd)
