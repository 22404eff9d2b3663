"""``zoo finetune``, ``zoo eval``, ``zoo check``, ``zoo example``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zoo.cli.common import (
    JsonOpt,
    VariantOpt,
    choice,
    choice_argument,
    err,
    interrupt_exits,
    out,
    print_json,
    with_variant,
)
from zoo.samples import Example
from zoo.train.config import (
    AmpDtype,
    ClassWeights,
    ImageCacheMode,
    Monitor,
    OptimizerName,
    SamplerName,
    ScheduleName,
    Strategy,
    option_defaults,
)
from zoo.tta import Tta

if TYPE_CHECKING:
    from zoo.train.config import TrainConfig

# Every default and choice comes from TrainConfig; only the help text and spelling live here.
D = option_defaults()

# Option names whose CLI spelling differs from the TrainConfig field.
_FIELD = {"arch": "model"}


def _lr(value: str | None) -> float | str | None:
    """``--lr``: a positive number or ``auto`` (a usage error otherwise)."""
    if value is None or value == "auto":
        return value
    try:
        lr = float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is neither a number nor 'auto'") from None
    if not (math.isfinite(lr) and lr > 0):
        raise typer.BadParameter(f"{value} must be a finite number above 0")
    return lr


def _unit(value: float | None, *, closed: bool) -> float | None:
    """A rate in (0, 1) (``closed``: (0, 1]); a usage error otherwise."""
    if value is not None and not (0 < value < 1 or (closed and value == 1)):
        raise typer.BadParameter(f"{value} must be in (0, 1{']' if closed else ')'}")
    return value


def _policy(value: str | None) -> str | None:
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

    values = {_FIELD.get(k, k): v for k, v in params.items()}
    values["model"] = values.get("model") or ""
    values["data"] = values.get("data") or ""
    if values["data"]:
        values["data"] = str(Path(values["data"]).expanduser().resolve())
    if values["model"]:
        from zoo.ref import ModelRef

        ref = ModelRef.parse(values["model"])  # the same precedence as every other command
        if ref.is_path:
            values["model"] = str(ref.path.resolve())
    return TrainConfig.from_dict(values)


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
    weights: Annotated[
        str | None,
        typer.Option(
            help="'none' for random init, or a safetensors file/folder; default: the entry's own"
        ),
    ] = D["weights"],
    strategy: Annotated[
        Strategy | None,
        choice(
            Strategy,
            "--strategy",
            help="default: gradual when pretrained, full from scratch (random weights)",
        ),
    ] = D["strategy"],
    epochs: Annotated[int, typer.Option(min=1)] = D["epochs"],
    freeze_epochs: Annotated[
        int, typer.Option(min=0, help="gradual: epochs with the backbone frozen")
    ] = D["freeze_epochs"],
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1, help="per process")] = D[
        "batch_size"
    ],
    lr: Annotated[
        str | None,
        typer.Option(
            metavar="<float|auto>",
            callback=lambda v: _lr(v),
            help="head learning rate (default 1e-3 AdamW, 0.1 SGD); auto: zoo lr-find's "
            "suggestion, found first and kept in the run's lr_find.json",
        ),
    ] = D["lr"],
    backbone_lr_mult: Annotated[float, typer.Option(help="backbone LR = lr × this")] = D[
        "backbone_lr_mult"
    ],
    weight_decay: float = D["weight_decay"],
    optimizer: Annotated[OptimizerName, choice(OptimizerName, "--optimizer")] = D["optimizer"],
    schedule: Annotated[
        ScheduleName, choice(ScheduleName, "--schedule", help="LR schedule, stepped per batch")
    ] = D["schedule"],
    momentum: Annotated[float, typer.Option(help="SGD momentum (Nesterov)")] = D["momentum"],
    warmup_epochs: float = D["warmup_epochs"],
    label_smoothing: float = D["label_smoothing"],
    class_weights: Annotated[
        ClassWeights,
        choice(
            ClassWeights, "--class-weights", help="auto: weigh the loss by inverse class frequency"
        ),
    ] = D["class_weights"],
    sampler: Annotated[
        SamplerName,
        choice(SamplerName, "--sampler", help="balanced: draw every class equally often"),
    ] = D["sampler"],
    multi_label: Annotated[
        bool,
        typer.Option(help="DIR/labels.csv (path,labels) → BCEWithLogits, per-class thresholds"),
    ] = D["multi_label"],
    clip_grad_norm: Annotated[float | None, typer.Option(help="e.g. 1.0")] = D["clip_grad_norm"],
    amp: Annotated[AmpDtype | None, choice(AmpDtype, "--amp", help="mixed precision on CUDA")] = D[
        "amp"
    ],
    channels_last: bool = D["channels_last"],
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the model")] = D[
        "compile"
    ],
    val_fraction: Annotated[
        float, typer.Option(help="flat folders: share held out for validation")
    ] = D["val_fraction"],
    seed: int = D["seed"],
    device: str = D["device"],
    num_workers: Annotated[int | None, typer.Option(help="DataLoader workers (default: auto)")] = D[
        "num_workers"
    ],
    augment: Annotated[bool, typer.Option(help="online augmentation in training")] = D["augment"],
    auto_augment: Annotated[
        str | None,
        typer.Option(
            metavar="<randaugment|trivialaugment|timm policy>",
            callback=lambda v: _policy(v),
            help="timm's auto-augment on each crop (no colour jitter beside it), e.g. "
            "randaugment or rand-m7-mstd0.5",
        ),
    ] = D["auto_augment"],
    random_erasing: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="timm's Random Erasing: probability per image")
    ] = D["random_erasing"],
    mixup: Annotated[float, typer.Option(min=0.0, help="timm's Mixup α (e.g. 0.2); 0: off")] = D[
        "mixup"
    ],
    cutmix: Annotated[
        float, typer.Option(min=0.0, help="timm's CutMix α (e.g. 1.0); with --mixup: one per batch")
    ] = D["cutmix"],
    ema: Annotated[
        bool,
        typer.Option(help="timm's model EMA, validated each epoch; shipped when it scores better"),
    ] = D["ema"],
    ema_decay: Annotated[
        float, typer.Option(callback=lambda v: _unit(v, closed=False), help="with --ema")
    ] = D["ema_decay"],
    layer_decay: Annotated[
        float | None,
        typer.Option(
            callback=lambda v: _unit(v, closed=True),
            help="backbone layer-wise LR decay (e.g. 0.75): each layer down, LR × this",
        ),
    ] = D["layer_decay"],
    cache_features: Annotated[
        bool, typer.Option(help="linear: train the head on cached backbone features")
    ] = D["cache_features"],
    image_cache: Annotated[
        ImageCacheMode,
        choice(
            ImageCacheMode,
            "--image-cache",
            help="decode each image once into a shared uint8 cache ($ZOO_CACHE, default "
            "~/.cache/zoo; zoo cache ls|clear); auto: when it fits half the free disk",
        ),
    ] = D["image_cache"],
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
        int | None, typer.Option(help="early stopping after N epochs without improvement")
    ] = D["patience"],
    save_every_steps: Annotated[int | None, typer.Option(help="also checkpoint every N steps")] = D[
        "save_every_steps"
    ],
    top_k_checkpoints: int = D["top_k_checkpoints"],
    strict_data: Annotated[
        bool, typer.Option(help="unreadable images are fatal instead of quarantined")
    ] = D["strict_data"],
    max_nonfinite: Annotated[
        int,
        typer.Option(
            min=1, help="non-finite losses in a row (each step skipped) before a rollback"
        ),
    ] = D["max_nonfinite"],
    max_rollbacks: Annotated[
        int,
        typer.Option(min=0, help="rollbacks to the last checkpoint with half the LR, then stop"),
    ] = D["max_rollbacks"],
    image_size: Annotated[int | None, typer.Option(help="override the model's input size")] = D[
        "image_size"
    ],
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
    extend: Annotated[int, typer.Option(min=0, help="with --resume: add N epochs")] = D["extend"],
    nproc: Annotated[
        int, typer.Option(min=1, help="processes via torch.distributed.run (DDP)")
    ] = 1,
    progress: Annotated[bool, typer.Option(help="rich progress bar")] = D["progress"],
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
    if nproc > 1:
        from zoo.train.launch import launch

        raise typer.Exit(launch(nproc))
    # What the user typed: --resume compares exactly these against the run's config.
    explicit = frozenset(
        _FIELD.get(k, k)
        for k in params
        # typer vendors its own click: compare the enum by name, not identity
        if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"
    )
    del params["nproc"]  # how many processes run it, not part of the run's config
    del params["report"]  # what is written after the run, not part of it
    cfg = train_config(params)
    from zoo.train.trainer import fit

    with interrupt_exits():
        run = fit(cfg, explicit=explicit)
    from zoo.train.console import is_main_process

    if run is not None and is_main_process():  # None: --dry-run writes no run folder
        if report:
            with interrupt_exits(
                f"interrupted while writing report.html: {run} is complete; write the report "
                f"with: zoo eval {run} --report"
            ):
                _run_report(run, cfg.device, cfg.batch_size)
        out.print(str(run))


def _run_report(run: Path, device: str, batch_size: int) -> None:
    """The finished run's report.html; a model the report cannot cover only gets a note."""
    from zoo.errors import DataError, InputError
    from zoo.train.evaluate import evaluate_split
    from zoo.train.report import write_report

    try:
        ev = evaluate_split(
            str(run), data=None, split="val", batch_size=batch_size, device=device, num_workers=0
        )
        info = write_report(ev, run / "report.html", run)
    except (InputError, DataError) as exc:  # the run itself is complete: never fail it here
        err.print(f"report: none ({exc})")
        return
    err.print(f"report: {info['path']} ({info['images']} images embedded)")


def _variant_forward(model: str, variant: str | None) -> tuple[Any, str | None]:
    """``--variant``: the derived file run by its runtime as the evaluation's forward pass
    (the same preprocessed batches as the PyTorch model), and its path for the result."""
    if variant is None:
        return None, None
    import torch

    from zoo.deploy.runtimes.loader import load_classifier

    path = with_variant(model, variant)
    clf = load_classifier(path)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(clf.run(x.cpu().numpy()))

    return forward, path


def eval_cmd(
    model: Annotated[str, typer.Argument(help="run folder, model folder or registry name")],
    data: Annotated[
        str | None, typer.Option("--data", help="image folder (default: the run's own data)")
    ] = None,
    split: Annotated[
        str,
        typer.Option(
            help="train | val | test | all (a folder the model did not train on: all its images)"
        ),
    ] = "val",
    batch_size: int = 64,
    device: str = "auto",
    num_workers: int = 0,
    report: Annotated[
        bool,
        typer.Option(
            "--report",
            help="also write report.html: per-class metrics, confusion matrix with its images, "
            "top losses with Grad-CAM, calibration, training curves (into a run folder)",
        ),
    ] = False,
    tta: Annotated[
        Tta,
        choice(
            Tta,
            "--tta",
            help="test-time augmentation: the metrics of the views' mean, and the gain over "
            "the plain crop (measured in the same pass)",
        ),
    ] = "none",
    report_out: Annotated[
        Path | None,
        typer.Option(
            "--report-out", help="--report: where (default: RUN/report.html, or ./report.html)"
        ),
    ] = None,
    variant: VariantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a model on an image folder: top-1/top-5, per-class metrics, confusion matrix."""
    from zoo.ref import ModelRef
    from zoo.train.evaluate import evaluate_split

    if report_out is not None and not report:
        raise typer.BadParameter("--report-out applies to --report only.")
    forward, scored_by = _variant_forward(model, variant)
    ev = evaluate_split(
        model, data=data, split=split, batch_size=batch_size, device=device,
        num_workers=num_workers, tta=tta, forward=forward, scored_by=scored_by,
    )  # fmt: skip
    result = ev.result
    if report:
        from zoo.train.report import write_report

        ref = ModelRef.parse(model)
        run = ref.path if ref.kind == "run" else None
        dest = report_out or (run / "report.html" if run is not None else Path("report.html"))
        result = {**result, "report": write_report(ev, dest, run)}
        err.print(f"report: {dest} ({result['report']['images']} images embedded)")
    if as_json:
        print_json(result)
        return
    out.print(
        f"{result['model']} on {result['data']} [{result['split']}]: {result['n']} images"
        + (f", scored by {result['scored_by']}" if "scored_by" in result else ""),
        markup=False,
    )
    names = {  # multi-label: exact-match accuracy, no top-5 or balanced accuracy
        "acc": "top-1" if "top5" in result else "exact-match",
        "balanced_acc": "balanced",
        "top5": "top-5",
        "loss": "loss",
        "macro_f1": "macro-F1",
    }
    out.print("  ".join(f"{label} {result[k]:.4f}" for k, label in names.items() if k in result))
    if "tta" in result:
        t, plain = result["tta"], result["tta"]["without"]
        out.print(
            f"test-time augmentation {t['mode']} ({t['views']} views): {names['acc']} "
            f"{result['acc']:.4f} vs {plain['acc']:.4f} without ({result['acc'] - plain['acc']:+.4f})"
        )
    met = [r for r in result["per_class"] if r["support"] or r.get("predicted", 1)]
    for row in met:
        pr = f"P {row['precision']:.3f} R {row['recall']:.3f} " if "recall" in row else ""
        out.print(f"  {row['class']:<24} {pr}F1 {row['f1']:.3f} n={row['support']}", markup=False)
    if len(met) < len(result["per_class"]):
        out.print(
            f"  ({len(result['per_class']) - len(met)} of the model's classes neither occur "
            "here nor were predicted: not listed, and not in macro-F1)"
        )


def check_cmd(
    data: Annotated[str, typer.Argument(help="image folder")],
    val_fraction: float = 0.2,
    seed: int = 0,
    as_json: JsonOpt = False,
    strict: Annotated[
        bool, typer.Option(help="exit 1 when any image is unreadable or leaks across splits")
    ] = False,
    cache_for: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL",
            help="also fill the decode-once image cache for this model (as zoo finetune would)",
        ),
    ] = None,
    image_size: Annotated[
        int | None, typer.Option(help="with --cache-for: the size zoo finetune will train at")
    ] = None,
) -> None:
    """Preflight an image folder: corrupt files, tiny images, odd modes, leaks, imbalance."""
    from zoo.train.check import check_splits, format_report
    from zoo.train.data import scan

    cache = None
    if cache_for:
        from zoo.train.build import cache_spec
        from zoo.train.image_cache import ImageCache

        spec = cache_spec(cache_for, image_size)
        if spec is None:
            raise typer.BadParameter(f"{cache_for} does not take images", param_hint="--cache-for")
        cache = ImageCache(spec)
    splits = scan(data, val_fraction=val_fraction, seed=seed)
    report = check_splits(splits, image_cache=cache)
    if cache is not None:  # files checked before (results cached) may still need decoding
        bad = set(report.quarantined)
        paths = [splits.root / r for items in splits.files.values() for r, _ in items]
        built = cache.build([p for p in paths if str(p.relative_to(splits.root)) not in bad])
        err.print(
            f"image cache: {cache.spec.tag} at {cache.root} ({built} decoded after the check)"
        )
    if as_json:
        print_json(report.to_dict())
    else:
        for line in format_report(report):
            out.print(line)
    if strict and report.problems():
        err.print(f"{report.problems()} problem(s) found")
        raise typer.Exit(1)


def example_cmd(
    name: Annotated[Example, choice_argument(Example, "name", help="built-in data set")],
    dest: Annotated[Path, typer.Argument(help="folder to write the image folder into")],
    size: Annotated[int, typer.Option(help="digits: image side in pixels")] = 32,
    per_class: Annotated[
        int | None, typer.Option(min=1, help="images per class (default: all digits / 300 photos)")
    ] = None,
) -> None:
    """Write a built-in real data set as an image folder.

    digits: scikit-learn's 1,797 real handwritten digits (10 classes, 32×32 PNG).
    photos: 2,100 JPEGs (300–640 px) cut from scikit-image's 7 colour photographs, one class each.
    """
    from zoo.samples import write_digits_folder, write_photo_folder

    if name == "photos":
        out.print(str(write_photo_folder(dest, per_class=per_class or 300)))
    else:
        out.print(str(write_digits_folder(dest, size=size, per_class=per_class)))


def register(app: typer.Typer) -> None:
    app.command("finetune")(finetune_cmd)
    app.command("eval")(eval_cmd)
    app.command("check")(check_cmd)
    app.command("example")(example_cmd)
