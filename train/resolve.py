"""The first step of a run: every default, derived value and check of the configuration, before
anything is built or written. What comes out is frozen; the rest of the run only reads it.

The splits are read here (a new run's data folder scanned, a resumed run's ``split.json``),
because one default depends on them: ``--image-cache auto`` becomes ``on`` or ``off`` from
how much of the data set the cache would have to hold, and the choice is recorded in the run's
config so that a resume keeps it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zoo.device import pick_device
from zoo.errors import CheckpointError, DataError, InputError, UsageError
from zoo.factory import require_weights, resolve, weight_source
from zoo.metadata import ModelInfo
from zoo.registry import Entry
from zoo.run_images import find_run
from zoo.train import data as data_mod
from zoo.train.config import (
    ImageCacheMode,
    TrainConfig,
    check_bounds,
    default_backbone_lr_mult,
    default_lr,
    default_strategy,
)
from zoo.train.console import say
from zoo.train.distill import Teacher, label_by_teacher, resolve_teacher
from zoo.train.image_cache import CacheSpec, ImageCache, estimate_bytes, fits
from zoo.train.recipes import check_recipes
from zoo.train.resume import prepare_resume
from zoo.train.run_dir import RunDir


@dataclass(frozen=True)
class Resolved:
    """A run's resolved configuration, its resolved model and, for ``--resume``, where it
    continues from."""

    cfg: TrainConfig
    parent: tuple[Entry, Path | None]  # cfg.model resolved once: its entry (and model folder)
    splits: data_mod.Splits  # read once: the run's own split.json, else a scan of cfg.data
    run: RunDir | None = None  # --resume: the run's folder (a new run's appears once it trains)
    checkpoint: dict[str, Any] | None = None  # --resume: its last commit (None: killed before one)
    extended: bool = False  # --resume --extend N: config.json gets the new segment on repair
    teacher: Teacher | None = None  # zoo distill: cfg.distill.teacher resolved once


def resolve_config(options: TrainConfig, explicit: frozenset[str] = frozenset()) -> Resolved:
    """Fill in every "choose for me" option and check the combination.

    Args:
        options: what the user asked for (``None`` fields: the default).
        explicit: the options the user typed; ``--resume`` refuses a change to any of them.

    Returns:
        The resolved configuration (``--resume``: the run's own, with the runtime options
        applied; ``image_cache`` decided, ``on`` or ``off``), the model it names (resolved here
        once, carried through the run), the splits (read once) and the run to continue, if any.

    Raises:
        InputError: an impossible combination (a frozen backbone with random weights, a
            feature cache without ``--strategy linear``, ``--amp`` without CUDA, imbalance
            options or balanced accuracy with ``--multi-label``, a recipe it cannot
            honour: :func:`zoo.train.recipes.check_recipes`).
        CheckpointError: ``--resume`` of something that is not a run, a changed option, or
            a run that already finished.
        UnknownModelError / ModelRefError: the model reference does not resolve.
        WeightsNotFoundError: the pretrained weights are neither here nor downloadable
            (checked before any data work; the message names the entries usable here and
            ``--weights none``). WeightsIntegrityError: they fail their pinned hash.
        DataError: the data folder holds no usable split (see :func:`zoo.train.data.scan`).
        InputError / CheckpointError (``zoo distill``): as
            :func:`zoo.train.distill.resolve_teacher` raises (the teacher's classes are not
            the data's, its weights changed since the resumed run started...).
    """
    check_bounds(options)  # before any work, --resume's checks included
    if options.lr == "auto":  # fit() turns it into lr-find's suggestion before this step
        raise InputError("lr='auto' is resolved by zoo.train.fit (zoo finetune --lr auto)")
    run = checkpoint = None
    cfg = options
    if options.resume:
        inside = find_run(options.resume)
        if inside is not None and inside != Path(options.resume).resolve():  # its model folder
            raise CheckpointError(
                f"{options.resume} is inside the run {inside}, not a run folder; resume the "
                f"run: zoo finetune --resume {inside}"
            )
        cfg, run, checkpoint = prepare_resume(options, explicit)
    parent = resolve(cfg.model)  # the only resolution of the model in a run
    source = weight_source(parent[0].info, cfg.weights)
    require_weights(source)  # here, before the data check: missing weights fail in seconds
    pretrained = source.kind != "none"
    cut_short = pretrained and parent[0].info.cut_short
    strategy = cfg.strategy or default_strategy(pretrained, cut_short)
    if not pretrained and strategy != "full":
        raise InputError(
            f"--strategy {strategy} freezes a backbone, but {cfg.model} has random weights "
            "(--weights none or no pretrained weights): random-init models train fully. "
            "Use --strategy full."
        )
    if "freeze_epochs" in explicit and strategy != "gradual":  # else read by nothing
        raise UsageError(
            f"--freeze-epochs applies to --strategy gradual (the backbone frozen that many "
            f"epochs, then trained); this run's strategy is {strategy}: drop it, or add "
            "--strategy gradual.",
            param_hint="--freeze-epochs",
        )
    frozen_all = strategy == "gradual" and cfg.freeze_epochs >= cfg.epochs
    if frozen_all and "freeze_epochs" in explicit and not cfg.resume:
        say(
            f"note: --freeze-epochs {cfg.freeze_epochs} ≥ --epochs {cfg.epochs}: the backbone "
            "stays frozen the whole run, a linear probe (--strategy linear; --resume RUN "
            "--extend N would train it)"
        )
    if cfg.cache_features and strategy != "linear":
        raise InputError(
            "--cache-features needs --strategy linear (a backbone that never changes)."
        )
    if cfg.multi_label and (cfg.class_weights != "none" or cfg.sampler != "shuffle"):
        raise InputError(
            "--class-weights and --sampler balanced work on single-label folders; with "
            "--multi-label an image holds several classes, so neither applies. Drop them."
        )
    if cfg.multi_label and cfg.monitor == "val/balanced_acc":
        raise InputError(
            "--monitor val/balanced_acc is for single-label runs; use val/macro_f1 with "
            "--multi-label."
        )
    check_recipes(cfg, pretrained=pretrained, strategy=strategy)
    if cfg.amp and pick_device(cfg.device).type != "cuda":
        raise InputError(f"--amp {cfg.amp} needs CUDA; this run is on the CPU. Drop --amp.")
    splits = read_splits(cfg, run.path if run else None)
    distill, teacher = resolve_teacher(cfg, splits) if cfg.distill else (None, None)
    resolved = replace(
        cfg,
        image_cache=image_cache_mode(cfg, parent[0].info, splits),
        strategy=strategy,
        backbone_lr_mult=cfg.backbone_lr_mult
        if cfg.backbone_lr_mult is not None
        else default_backbone_lr_mult(cut_short),
        monitor=cfg.monitor or ("val/macro_f1" if cfg.multi_label else "val/acc"),
        lr=cfg.lr if cfg.lr is not None else default_lr(cfg.optimizer),
        schedule_segments=cfg.schedule_segments
        or ({"from_step": 0, "epochs": cfg.epochs, "kind": cfg.schedule},),
        distill=distill,
    )
    return Resolved(
        resolved, parent, splits, run, checkpoint, extended=bool(options.extend), teacher=teacher
    )


def read_splits(cfg: TrainConfig, run: Path | None) -> data_mod.Splits:
    """The run's splits: a resumed run's own ``split.json``, else ``cfg.data`` scanned (a new
    run writes its ``split.json`` with the run folder, once every check has passed);
    ``zoo distill --unlabelled``: labelled by the teacher (:func:`label_by_teacher`).

    Raises:
        DataError: as :func:`zoo.train.data.scan` raises for an unusable data folder.
    """
    if run is not None and (run / "split.json").exists():
        splits = data_mod.Splits.from_json(json.loads((run / "split.json").read_text()))
        _check_present(splits, run, cfg.model)
        return splits
    if cfg.distill is not None and cfg.distill.unlabelled:
        return label_by_teacher(cfg)
    scan = data_mod.scan_multilabel if cfg.multi_label else data_mod.scan
    return scan(cfg.data, val_fraction=cfg.val_fraction, seed=cfg.seed)


def _check_present(splits: data_mod.Splits, run: Path, started_from: str) -> None:
    """A resumed run goes on with exactly the images it started with (its ``split.json``,
    every split).

    Raises:
        DataError: some of them are gone (moved, renamed or deleted), named with their root,
            and the new run to start instead (from this run once it has a model, else from
            what it started from).
    """
    gone = splits.missing()
    if gone:
        start = run if (run / "model" / "config.json").is_file() else started_from
        raise DataError(
            f"{len(gone)} of the images {run} was trained on are gone from {splits.root} "
            f"(e.g. {gone[0]}): a resumed run goes on with exactly the images of its "
            f"split.json. Put them back, or start a new run on the folder as it is now: "
            f"zoo finetune {start} --data DIR"
        )


def cache_spec_for(info: ModelInfo, image_size: int | None) -> CacheSpec | None:
    """How a model (trained at ``image_size``) wants its images stored in the decode-once
    cache (its eval resize); None for a model that does not take images."""
    if image_size:
        info = replace(info, input_size=(info.input_size[0], image_size, image_size))
    try:
        return CacheSpec.for_model(info.preprocessing())
    except ValueError:  # not an image model
        return None


def image_cache_mode(cfg: TrainConfig, info: ModelInfo, splits: data_mod.Splits) -> ImageCacheMode:
    """``--image-cache`` decided: ``off`` when asked, for a model that does not take images, or
    (``auto``) when the images not cached yet would not fit the budget (half the free disk
    where the cache lives); else ``on``."""
    spec = cache_spec_for(info, cfg.image_size) if cfg.image_cache != "off" else None
    if spec is None:
        return "off"
    if cfg.image_cache == "auto":
        cache = ImageCache(spec)
        todo = cache.missing(
            splits.root / rel for items in splits.files.values() for rel, _ in items
        )
        need = estimate_bytes(len(todo), spec)
        ok, budget = fits(need)
        if not ok:
            say(
                f"image cache: off: {len(todo)} images need ≈{need / 1e9:.1f} GB, over the "
                f"budget of {budget / 1e9:.1f} GB (half the free disk at {cache.root}); "
                "free space, set $ZOO_CACHE elsewhere, or pass --image-cache on"
            )
            return "off"
    return "on"
