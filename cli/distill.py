"""``zoo distill``: train a small student on a teacher's soft targets (Hinton et al.) with the
trainer's own run (:func:`zoo.train.trainer.fit` with a :class:`~zoo.train.config.DistillConfig`;
the loss and the teacher's logits: :mod:`zoo.train.distill`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from zoo.calibration import RejectMode
from zoo.cli.common import choice, err
from zoo.cli.train_options import (
    FIELD,
    AutoAugmentOpt,
    BackboneLrMultOpt,
    BatchSizeOpt,
    CutmixOpt,
    D,
    ImageCacheOpt,
    ImageSizeOpt,
    LabelSmoothingOpt,
    LrOpt,
    MixupOpt,
    NumWorkersOpt,
    RandomErasingOpt,
    SaveEveryStepsOpt,
    StrategyOpt,
    TrackOpt,
    ValFractionOpt,
    WarmupEpochsOpt,
    WeightDecayOpt,
    WeightsOpt,
    in_range,
    train_config,
)
from zoo.train.config import OptimizerName, QatWeights, ScheduleName, TeacherLogits

KD_OPTIONS = (
    "temperature",
    "alpha",
    "teacher_logits",
    "qat",
    "qat_weights",
    "unlabelled",
)  # DistillConfig's, not TrainConfig's
# --qat's defaults, where not typed: measured on the fine-tuned MobileNetV2 of the digits
# (bench/qat.py): a short, gentle fine-tune of every layer
QAT_DEFAULTS: dict[str, Any] = {
    "strategy": "full",
    "backbone_lr_mult": 1.0,
    "epochs": 2,
    "lr": 1e-4,
    "temperature": 1.0,
    "alpha": 0.5,
}
# --qat --unlabelled's, over those: measured on the ImageNet MobileNetV2 and photo crops without
# labels (bench/qat_photos.py), --qat's lr and augmentation moved the fp32 answers on other
# photographs (int8 agreement 37 points under post-training int8's); soft targets alone at a
# tenth of the lr, on the teacher's own views, lost 2
UNLABELLED_QAT_DEFAULTS: dict[str, Any] = {"alpha": 1.0, "lr": 1e-5, "augment": False}


def _spelled(defaults: dict[str, Any]) -> str:
    return ", ".join(
        f"--no-{k}" if v is False else f"--{k} {v:g}" if not isinstance(v, str) else f"--{k} {v}"
        for k, v in defaults.items()
    ).replace("_", "-")


QAT_DEFAULTS_HELP = _spelled(QAT_DEFAULTS)


def distill_cmd(
    ctx: typer.Context,
    teacher: Annotated[
        str | None,
        typer.Argument(help="the teacher: a run, a model folder or a registry entry"),
    ] = None,
    student: Annotated[
        str | None,
        typer.Option("--student", help="the student: a registry name, timm:<name> or folder"),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="image folder: DIR/<class>/… or DIR/train|val/<class>/… (--unlabelled: any)",
        ),
    ] = None,
    temperature: Annotated[
        float, typer.Option("--temperature", "-T", help="softens both models' probabilities")
    ] = 4.0,
    alpha: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="the soft targets' share of the loss (0: labels only)"),
    ] = 0.5,
    qat: Annotated[
        bool,
        typer.Option(
            "--qat",
            help="quantization-aware: train the teacher's own weights through int8 rounding, "
            "distilled from its fp32 self, for zoo quantize --engine ort (student: the teacher; "
            f"defaults {QAT_DEFAULTS_HELP})",
        ),
    ] = False,
    qat_weights: Annotated[
        QatWeights,
        choice(
            QatWeights,
            "--qat-weights",
            help="--qat: the int8 weights' bits to train for, as zoo quantize will make them on "
            "the CPU that quantizes (and runs) the model: 8 with VNNI, 7 (onnxruntime's "
            "reduce_range) without, which also gives a model trained for 8 only 7; auto: this "
            "CPU's",
        ),
    ] = "auto",
    unlabelled: Annotated[
        bool,
        typer.Option(
            "--unlabelled",
            help="DIR holds images without labels, in any layout (DIR/train + DIR/val kept as "
            "split): the teacher's top-1 answers are the labels, so val acc is agreement with "
            f"the teacher (with --qat: {_spelled(UNLABELLED_QAT_DEFAULTS)} where not typed)",
        ),
    ] = False,
    reject: Annotated[
        RejectMode | None,
        choice(
            RejectMode,
            "--reject",
            help="the threshold below which predict and serve answer 'unknown' (images from "
            "outside the classes), fitted on validation at the end as zoo finetune --reject "
            "does: default the teacher's own rule (its score, refitted on this run's weights; "
            "none where the teacher has none); off: never",
        ),
    ] = None,
    acceptance: Annotated[
        float | None,
        typer.Option(
            **in_range(
                "acceptance",
                "the share of validation images the rejection threshold accepts (default: the "
                "teacher's)",
            )
        ),
    ] = None,
    teacher_logits: Annotated[
        TeacherLogits,
        choice(
            TeacherLogits,
            "--teacher-logits",
            help="cached: once per image (deterministic views); online: on every training "
            "view; auto: online when the views are random (augmentation, recipes)",
        ),
    ] = "auto",
    weights: WeightsOpt = D["weights"],
    strategy: StrategyOpt = D["strategy"],
    epochs: Annotated[int, typer.Option(**in_range("epochs"))] = D["epochs"],
    batch_size: BatchSizeOpt = D["batch_size"],
    lr: LrOpt = D["lr"],
    backbone_lr_mult: BackboneLrMultOpt = D["backbone_lr_mult"],
    optimizer: Annotated[OptimizerName, choice(OptimizerName, "--optimizer")] = D["optimizer"],
    schedule: Annotated[ScheduleName, choice(ScheduleName, "--schedule")] = D["schedule"],
    warmup_epochs: WarmupEpochsOpt = D["warmup_epochs"],
    weight_decay: WeightDecayOpt = D["weight_decay"],
    label_smoothing: LabelSmoothingOpt = D["label_smoothing"],
    augment: Annotated[bool, typer.Option(help="online augmentation in training")] = D["augment"],
    auto_augment: AutoAugmentOpt = D["auto_augment"],
    random_erasing: RandomErasingOpt = D["random_erasing"],
    mixup: MixupOpt = D["mixup"],
    cutmix: CutmixOpt = D["cutmix"],
    ema: Annotated[bool, typer.Option(help="timm's model EMA, shipped when better")] = D["ema"],
    image_size: ImageSizeOpt = D["image_size"],
    image_cache: ImageCacheOpt = D["image_cache"],
    val_fraction: ValFractionOpt = D["val_fraction"],
    patience: Annotated[
        int | None, typer.Option(**in_range("patience", "early stopping after N epochs"))
    ] = D["patience"],
    save_every_steps: SaveEveryStepsOpt = D["save_every_steps"],
    seed: int = D["seed"],
    device: str = D["device"],
    num_workers: NumWorkersOpt = D["num_workers"],
    runs_root: Annotated[str, typer.Option("--runs", help="where run folders go")] = D["runs_root"],
    name: Annotated[
        str | None, typer.Option(help="run name (default: STUDENT-DATA; --qat: TEACHER-qat)")
    ] = D["name"],
    resume: Annotated[
        str | None, typer.Option(help="continue RUN_DIR exactly where it stopped")
    ] = D["resume"],
    nproc: Annotated[
        int, typer.Option(min=1, help="processes via torch.distributed.run (DDP)")
    ] = 1,
    progress: Annotated[bool, typer.Option(help="rich progress bar")] = D["progress"],
    track: TrackOpt = D["track"],
    report: Annotated[
        bool,
        typer.Option(envvar="ZOO_FINETUNE_REPORT", help="at the end, write report.html"),
    ] = True,
) -> None:
    """Distill a teacher into a smaller student (e.g. zoo distill runs/resnet18-fish
    --student mobilenet_v3_small --data ./fish)."""
    params = dict(ctx.params)
    typed = {
        k for k in params if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"
    }
    if resume is not None:
        given = sorted({"teacher", "student", "data", *KD_OPTIONS} & typed)
        if given:
            raise typer.BadParameter(
                f"--resume continues with the run's own teacher, student, data and KD settings: "
                f"drop {', '.join('--' + k.replace('_', '-') for k in given)}"
            )
    elif "qat_weights" in typed and not qat:
        raise typer.BadParameter(
            "--qat-weights is the int8 weights --qat trains for: add --qat, or drop it",
            param_hint="--qat-weights",
        )
    elif qat and student is not None:
        raise typer.BadParameter(
            "--qat trains the teacher's own weights: drop --student", param_hint="--student"
        )
    elif teacher is None or (student is None and not qat) or data is None:
        raise typer.BadParameter("give TEACHER, --student and --data (or --resume RUN_DIR)")
    if nproc > 1 and lr == "auto":
        raise typer.BadParameter(
            "--lr auto runs in one process: run `zoo lr-find` first, then pass --lr VALUE",
            param_hint="--lr",
        )
    from zoo.train.config import DistillConfig

    for k in ("teacher", "report", "nproc", *KD_OPTIONS):
        del params[k]
    params["model"] = params.pop("student")
    where = None
    if resume is None:
        from zoo.ref import ModelRef

        assert teacher is not None
        ref = ModelRef.parse(teacher)  # a folder made absolute: a resume finds it from anywhere
        where = str(ref.path.resolve()) if ref.is_path else teacher
    if where is not None and (reject is None or acceptance is None):
        # the teacher's rejection rule, refitted on this run's weights, where not typed
        from zoo.calibration import DEFAULT_ACCEPTANCE
        from zoo.train.distill import teacher_rejection

        rule = teacher_rejection(where)
        if reject is None:
            params["reject"] = rule.score if rule is not None else "off"
        if acceptance is None:
            params["acceptance"] = rule.acceptance if rule is not None else DEFAULT_ACCEPTANCE
    for k in ("reject", "acceptance"):  # --resume: the run's own
        if params[k] is None:
            del params[k]
    if qat and where is not None:  # the student is the teacher; --qat's own defaults
        params["model"] = where
        defaults = QAT_DEFAULTS | (UNLABELLED_QAT_DEFAULTS if unlabelled else {})
        chosen = {k: v for k, v in defaults.items() if k not in typed}
        temperature = float(chosen.pop("temperature", temperature))
        alpha = float(chosen.pop("alpha", alpha))
        params.update(chosen)
    cfg = train_config(params)
    if where is not None:
        from dataclasses import replace

        from zoo.system import int8_weight_bits

        kd = DistillConfig(
            where,
            temperature=temperature,
            alpha=alpha,
            logits=teacher_logits,
            qat=qat,
            unlabelled=unlabelled,
            weight_bits=(int8_weight_bits() if qat_weights == "auto" else int(qat_weights))
            if qat
            else DistillConfig.weight_bits,  # a plain distill's stays the default: unread
        )
        cfg = replace(cfg, distill=kd)
    # what the user typed: --resume compares exactly these against the run's config
    explicit = frozenset(FIELD.get(k, k) for k in typed - {"report", "student", "nproc"})
    from zoo.cli.train_run import run_training

    def show_summary(run: Path) -> None:  # teacher vs student, before the report
        summary = json.loads((run / "report.json").read_text()).get("distill")
        if summary is not None:
            from zoo.train.distill import DistillSummary

            for line in DistillSummary.from_dict(summary).lines():
                err.print(line, markup=False, highlight=False)

    run_training(cfg, explicit, nproc=nproc, report=report, after=show_summary)


def register(app: typer.Typer) -> None:
    app.command("distill")(distill_cmd)
