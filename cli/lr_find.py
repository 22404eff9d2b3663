"""``zoo lr-find``: the learning-rate range test, with ``zoo finetune``'s options that shape a
training step (the same spellings, defaults and choices: the signature is built from
``finetune``'s, so the two cannot drift)."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Annotated, Any

import typer

from zoo import durable
from zoo.cli.common import JsonOpt, err, interrupt_exits, out, print_json
from zoo.cli.finetune import finetune_cmd
from zoo.cli.train_options import train_config

# finetune's options that change a step; the ones about a whole run (epochs, schedule,
# checkpoints, resume, ...) have no meaning for a range test and are not offered
STEP_OPTIONS = (
    "arch", "data", "weights", "strategy", "freeze_epochs", "batch_size", "backbone_lr_mult",
    "weight_decay", "optimizer", "momentum", "label_smoothing", "class_weights", "multi_label",
    "amp", "channels_last", "val_fraction", "seed", "device", "num_workers", "augment",
    "cache_features", "image_cache", "strict_data", "image_size", "auto_augment",
    "random_erasing", "mixup", "cutmix", "layer_decay",
)  # fmt: skip


def _lr_find(
    ctx: typer.Context,
    start: Annotated[float, typer.Option(min=0, help="lowest learning rate")] = 1e-7,
    end: Annotated[float, typer.Option(min=0, help="highest learning rate")] = 10.0,
    steps: Annotated[int, typer.Option(min=2, help="steps per sweep")] = 100,
    sweeps: Annotated[int, typer.Option(min=1, help="seeded sweeps averaged")] = 3,
    plot: Annotated[Path, typer.Option(help="PNG of the curve")] = Path("lr_find.png"),
    as_json: JsonOpt = False,
    **training: Any,
) -> None:
    """Learning-rate range test: sweeps on copies, averaged; prints `suggested lr: …`."""
    from zoo.errors import InputError
    from zoo.train.lr_find import NEXT_STEP, find_lr, plot_lr_find

    if training.get("arch") is None or training.get("data") is None:
        raise typer.BadParameter("give ARCH and --data")
    if not 0 < start < end:
        raise typer.BadParameter(f"--start {start:g} must be above 0 and below --end {end:g}")
    if plot.suffix.lower() != ".png":
        raise InputError(f"--plot {plot}: give a .png file")
    durable.refuse_folder(plot, flag="--plot", writes="lr-find draws one PNG", name="lr_find.png")
    with interrupt_exits(
        "interrupted: zoo lr-find writes nothing before its sweeps end (they train copies); "
        "run it again (fewer --steps or --sweeps take less time)"
    ):
        result = find_lr(train_config(training), start=start, end=end, steps=steps, sweeps=sweeps)
    plot_lr_find(result, plot)
    if not result.turned:  # loud, on stderr; --json carries `turned` and `problem` too
        err.print(
            f"WARNING: the suggestion {result.suggested:.3g} is not reliable: {result.problem}. "
            f"{NEXT_STEP[0].upper()}{NEXT_STEP[1:]}.",
            markup=False,
        )
    if as_json:
        print_json({**result.to_dict(), "plot": str(plot)})
        return
    out.print(
        f"lr range test: {len(result.sweeps)} sweeps × up to {steps} steps, "
        f"{result.lrs[0]:.1e} → {result.lrs[-1]:.1e} (plot: {plot})"
    )
    out.print(f"rule: {result.rule}")
    out.print(
        f"suggested lr: {result.suggested:.3g}"
        + ("" if result.turned else " (not reliable: the curve did not turn; see the warning)")
    )


def _signature() -> inspect.Signature:
    """``_lr_find``'s own options, then finetune's step options (annotations resolved, since
    the copied parameters leave their module's namespace)."""
    own = inspect.signature(_lr_find)
    hints = typing.get_type_hints(_lr_find, include_extras=True)
    ft = typing.get_type_hints(finetune_cmd, include_extras=True)
    mine = [
        p.replace(annotation=hints[p.name])
        for p in own.parameters.values()
        if p.kind != p.VAR_KEYWORD
    ]
    ft["arch"] = Annotated[
        str | None, typer.Argument(help="registry name, timm:<name>, or a model folder")
    ]
    theirs = [
        p.replace(annotation=ft[p.name], kind=p.KEYWORD_ONLY)
        for p in inspect.signature(finetune_cmd).parameters.values()
        if p.name in STEP_OPTIONS
    ]
    return own.replace(parameters=[*mine, *theirs], return_annotation=None)


def lr_find_cmd(**kwargs: Any) -> None:
    _lr_find(**kwargs)


lr_find_cmd.__signature__ = _signature()  # type: ignore[attr-defined]
lr_find_cmd.__doc__ = _lr_find.__doc__


def register(app: typer.Typer) -> None:
    app.command("lr-find")(lr_find_cmd)
