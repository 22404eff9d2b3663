"""``zoo tune``: a hyper-parameter search on Ray Tune whose trials are ordinary runs (the
search itself: :mod:`zoo.train.tune`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import JsonOpt, choice, err, interrupt_exits, out, print_json
from zoo.cli.train_options import (
    BatchSizeOpt,
    D,
    ImageCacheOpt,
    ImageSizeOpt,
    TrackOpt,
    ValFractionOpt,
    WeightsOpt,
    in_range,
    train_config,
)
from zoo.train.config import Monitor, TuneScheduler

# `--resume DIR` continues the search as tune.json records it: these may change on the way
RESUME_OPTIONS = {"resume", "address", "as_json", "track"}


def tune_cmd(
    ctx: typer.Context,
    arch: Annotated[
        str | None,
        typer.Argument(help="registry name, timm:<name>, or a model folder; omit with --resume"),
    ] = None,
    data: Annotated[str | None, typer.Option(help="image folder, as zoo finetune's")] = None,
    trials: Annotated[int, typer.Option(min=1, help="how many settings to try")] = 8,
    baseline: Annotated[
        bool,
        typer.Option(
            help="the first trial trains with zoo finetune's defaults, the rest are drawn "
            "(--no-baseline: all drawn)"
        ),
    ] = True,
    space: Annotated[
        Path | None,
        typer.Option(
            help="YAML/JSON: option → {loguniform|uniform: [lo, hi]} | {randint: [lo, hi]} "
            "(both ends included) | {choice: [...]} | a value | null (removed), over the "
            "default space; keys as the trainer's fields: lr, backbone_lr_mult, weight_decay, "
            "strategy, freeze_epochs, label_smoothing, auto_augment, random_erasing, mixup"
        ),
    ] = None,
    scheduler: Annotated[
        str,
        choice(
            TuneScheduler,
            "--scheduler",
            help="asha: stop weak trials at epoch ends; fifo: every trial to the end",
        ),
    ] = "asha",
    max_epochs: Annotated[
        int, typer.Option(**in_range("epochs", "epochs of a trial run to its end"))
    ] = D["epochs"],
    metric: Annotated[
        str,
        choice(
            Monitor,
            "--metric",
            help="what ranks trials, equals by the lower val/loss (and picks each best epoch)",
        ),
    ] = "val/acc",
    address: Annotated[
        str | None,
        typer.Option(help="join a Ray cluster (HOST:PORT, auto, ray://…); default: a local Ray"),
    ] = None,
    trial_cpus: Annotated[float, typer.Option(min=0.01, help="CPUs each trial holds")] = 1.0,
    trial_gpus: Annotated[
        float, typer.Option(min=0.0, help="GPUs each trial holds (0: trains on the CPU)")
    ] = 0.0,
    max_concurrent: Annotated[
        int | None, typer.Option(min=1, help="trials at once (default: as resources allow)")
    ] = None,
    seed: Annotated[int, typer.Option(help="draws the trials; every trial trains with it")] = D[
        "seed"
    ],
    weights: WeightsOpt = D["weights"],
    batch_size: BatchSizeOpt = D["batch_size"],
    image_size: ImageSizeOpt = D["image_size"],
    num_workers: Annotated[
        int | None, typer.Option(help="loader workers per trial (default: its CPUs - 1)")
    ] = None,
    val_fraction: ValFractionOpt = D["val_fraction"],
    image_cache: ImageCacheOpt = D["image_cache"],
    runs_root: Annotated[str, typer.Option("--runs", help="where the search folder goes")] = D[
        "runs_root"
    ],
    name: Annotated[
        str | None, typer.Option(help="search folder name (default: tune-ARCH-DATA)")
    ] = None,
    resume: Annotated[
        str | None, typer.Option(help="continue the search in DIR (its tune.json)")
    ] = None,
    track: TrackOpt = D["track"],
    as_json: JsonOpt = False,
) -> None:
    """Search hyper-parameters on Ray Tune; every trial is a zoo run in the search folder."""
    from zoo.train.tune.search import TuneOptions, run_search

    if resume is not None:
        typed = {
            k
            for k in ctx.params
            if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"
        }
        if typed - RESUME_OPTIONS:
            raise typer.BadParameter(
                "--resume continues the search as its tune.json records it; drop "
                + ", ".join(_spelled(ctx, typed - RESUME_OPTIONS))
            )
        # a tracked search goes on in its parent run unless --track none is typed (finetune's rule)
        on = True if track == "mlflow" else (False if "track" in typed else None)
        options = TuneOptions(resume=resume, address=address, track=on)
    else:
        if arch is None or data is None:
            raise typer.BadParameter("give ARCH and --data (or --resume DIR)")
        from zoo.train.tune.search import plan_search

        base = train_config(
            {
                "arch": arch,
                "data": data,
                "weights": weights,
                "epochs": max_epochs,
                "batch_size": batch_size,
                "image_size": image_size,
                "val_fraction": val_fraction,
                "image_cache": image_cache,
                "seed": seed,
                "runs_root": runs_root,
                "device": "cuda" if trial_gpus > 0 else "cpu",
                "num_workers": num_workers
                if num_workers is not None
                else max(0, int(trial_cpus) - 1),
            }
        )
        spec = plan_search(
            base,
            space_file=space,
            trials=trials,
            scheduler=scheduler,  # type: ignore[arg-type]
            metric=metric,  # type: ignore[arg-type]
            trial_cpus=trial_cpus,
            trial_gpus=trial_gpus,
            max_concurrent=max_concurrent,
            baseline=baseline,
        )
        options = TuneOptions(
            spec=spec, runs_root=runs_root, name=name, address=address, track=track == "mlflow"
        )
    with interrupt_exits():
        result = run_search(options)
    for line in result.lines():
        err.print(line, markup=False)
    if as_json:
        print_json(result.record())
    else:
        out.print(str(result.folder))


def _spelled(ctx: typer.Context, names: set[str]) -> list[str]:
    """The parameters ``names`` as typed on the command line (``ARCH``, ``--max-epochs``)."""
    return [
        (p.name or "").upper()
        if p.param_type_name == "argument"
        else "/".join(o for o in [*p.opts, *getattr(p, "secondary_opts", [])] if o[:2] == "--")
        for p in ctx.command.params
        if p.name in names
    ]


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_cmd)
