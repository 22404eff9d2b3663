"""The second step of a run: from a resolved configuration to the parts the loop uses —
process group, data, model, loaders, optimizer, schedule and the loop's state — each built
once, in this order, with every check done before the run folder exists.

Two choices are made here and nowhere else: distributed execution (``comm``: one process or
a torchrun group, see ``comm.py``) and the feature cache (``--cache-features``: the head is
what trains, on pooled backbone outputs computed once; the loop only sees ``trained``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from zoo.errors import DataError
from zoo.factory import create_model_with_report, resolve
from zoo.loading import LoadReport
from zoo.metadata import ModelInfo
from zoo.preprocessing import Preprocessing
from zoo.registry import Entry
from zoo.system import available_cpus
from zoo.train import data as data_mod
from zoo.train.augment import Augment, CachedImageDataset, DeviceBatches
from zoo.train.check import CheckReport, check_splits, format_report
from zoo.train.comm import Single, join
from zoo.train.config import TrainConfig
from zoo.train.console import say
from zoo.train.distill import Distiller
from zoo.train.ema import Ema
from zoo.train.features import FeatureDataset, head_module, load_or_extract
from zoo.train.image_cache import CacheSpec, ImageCache
from zoo.train.imbalance import imbalance_hint, sample_weights
from zoo.train.optim import build_loss, build_optimizer
from zoo.train.qat import prepare_for_run
from zoo.train.recipes import BatchRecipe, batch_recipe, mixes, policy
from zoo.train.resolve import Resolved, cache_spec_for
from zoo.train.rng import seed_everything
from zoo.train.schedule import build_scheduler
from zoo.train.state import LoopState
from zoo.train.strategy import ParamGroups, set_backbone_frozen, split_head
from zoo.transforms import eval_transform, train_transform


@dataclass(frozen=True)
class RunData:
    """The images a run trains on, after the data check."""

    splits: data_mod.Splits
    samples: dict[str, list[tuple[Path, Any]]]  # per split, quarantined files left out
    check: CheckReport

    @property
    def classes(self) -> list[str]:
        return self.splits.classes


@dataclass
class RunParts:
    """Everything the loop uses. Built by :func:`build_run`; only :attr:`state` (and the
    modules' and optimizer's own state) changes while the run trains."""

    cfg: TrainConfig
    comm: Single
    data: RunData
    info: ModelInfo  # effective metadata (class count, labels, input size as trained)
    parent: tuple[Entry, Path | None]  # the registry entry (and model folder) fine-tuned
    load_report: LoadReport | None  # None: random initialisation
    model: nn.Module  # the whole model: what is checkpointed and shipped
    trained: nn.Module  # what trains, unwrapped: the model, or its head over cached features
    train_forward: nn.Module  # ``trained`` behind DDP / torch.compile when asked
    groups: ParamGroups | None
    train_set: Any
    val_set: Any
    train_sampler: data_mod.ResumableSampler
    train_loader: Any  # a DataLoader, or DeviceBatches over one
    val_loader: Any
    workers: int  # loader workers for images (0 over cached features)
    steps_per_epoch: int
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    loss_fn: nn.Module
    state: LoopState
    recipe: BatchRecipe | None = None  # --random-erasing, --mixup/--cutmix on each batch
    ema: Ema | None = None  # --ema
    distill: Distiller | None = None  # zoo distill: the teacher and the batch's KD loss

    @property
    def device(self) -> torch.device:
        return self.comm.device

    def model_input(self, x: torch.Tensor) -> torch.Tensor:
        """A training batch (after any recipe) as the model takes it: a distilling teacher's
        larger views scaled down (:meth:`Distiller.student_view`), else ``x`` itself."""
        return x if self.distill is None else self.distill.student_view(x)


def build_run(resolved: Resolved) -> RunParts:
    """Build every part of the run, fresh (``fit`` then restores a ``--resume``'s checkpoint
    into them: ``loop.restore``).

    Raises:
        DataError: no usable images in a split, unreadable images with ``--strict-data``, or
            not one batch of training images.
        TrainingError / InputError / weights errors: as :func:`zoo.create_model` raises.
    """
    cfg = resolved.cfg
    comm = join(cfg.device)
    if comm.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes
    seed_everything(cfg.seed)
    entry = resolved.parent[0]
    # resolve_config decided --image-cache (on or off) and recorded it: a resume keeps it
    spec = cache_spec_for(entry.info, cfg.image_size) if cfg.image_cache == "on" else None
    data, cache = _data(cfg, resolved.splits, ImageCache(spec) if spec is not None else None)
    model, info, report = create_model_with_report(
        entry, num_classes=len(data.classes), weights=cfg.weights, label_names=data.classes
    )
    if entry.info.cut_short and report is not None:
        whole = (cfg.strategy, cfg.backbone_lr_mult) == ("full", 1.0)
        say(
            f"note: {entry.info.name} is a network cut short, ending in mid-level features: "
            f"--strategy {cfg.strategy}, backbone LR × {cfg.backbone_lr_mult:g}"
            + (" (its defaults: every layer trains from the start)" if whole else "")
        )
    if cfg.image_size:
        info = replace(info, input_size=(info.input_size[0], cfg.image_size, cfg.image_size))
    if cfg.sync_bn and comm.world > 1:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(comm.device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if cfg.distill is not None and cfg.distill.qat:  # before DDP wraps it; a resume recalibrates
        say(
            prepare_for_run(
                model,
                info.preprocessing(),
                [p for p, _ in data.samples["train"]],
                comm.device,
                cfg.distill.weight_bits,
            )
        )
    groups = (
        split_head(model, info.classifier) if cfg.strategy != "full" or info.classifier else None
    )
    if cfg.strategy == "linear":
        assert groups is not None  # split_head raised otherwise
        set_backbone_frozen(groups, True)

    workers = cfg.num_workers if cfg.num_workers is not None else auto_workers(comm.device)
    if cache is not None and cache.spec != CacheSpec.for_model(info.preprocessing()):
        cache = ImageCache(CacheSpec.for_model(info.preprocessing()))  # read-through
    distill = (
        Distiller.build(
            cfg.distill, resolved.teacher, data.samples["train"], info.preprocessing(), comm.device
        )
        if cfg.distill is not None and resolved.teacher is not None
        else None
    )
    views = info.preprocessing() if distill is None else distill.views(info.preprocessing())
    train_set, val_set = _datasets(cfg, info, views, data, cache)
    trained = model
    if cfg.cache_features:
        assert info.classifier  # linear strategy: split_head found it
        train_set, val_set = _feature_cache(
            model, info.classifier, (train_set, val_set), cfg, workers
        )
        trained, workers = head_module(model, info.classifier), 0
    train_forward = comm.wrap(trained, find_unused=cfg.strategy == "gradual")
    if cfg.compile:
        train_forward = torch.compile(train_forward)  # type: ignore[assignment]

    bs = cfg.batch_size
    labels = [int(y) for _, y in data.samples["train"]] if not cfg.multi_label else []
    # zoo distill has neither option: its student learns the teacher's answers as they fall
    hint = (
        None
        if cfg.distill
        else imbalance_hint(data.check, cfg.class_weights, cfg.sampler, cfg.monitor)
    )
    if hint:
        say(hint)
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    sampler = data_mod.ResumableSampler(
        len(train_set),
        shuffle=True,
        seed=cfg.seed,
        batch_size=bs,
        # BatchNorm: no batch of one; mixing: every batch even (full; the batch size is even)
        drop_last=(has_bn or mixes(cfg)) and len(train_set) >= bs * comm.world,
        rank=comm.rank,
        world_size=comm.world,
        weights=sample_weights(labels, len(data.classes)) if cfg.sampler == "balanced" else None,
    )
    steps = sampler.batches_per_epoch()
    if steps == 0:
        raise DataError(
            f"Not one batch of {bs} from {len(train_set)} training images: lower --batch-size."
        )
    val_shard = list(range(comm.rank, len(val_set), comm.world))  # disjoint shards, no padding
    say(
        f"data: {len(train_set)} train / {len(val_set)} val images, {len(data.classes)} "
        f"classes, batch {bs} per process × {comm.world} = {bs * comm.world} global, "
        f"{steps} steps/epoch; loader: {workers} workers (auto: cpus-1 on CUDA, else "
        f"min(4, cpus-1); raise it while the data-wait share stays high)"
        + (f", prefetch {PREFETCH} batches each, persistent, " if workers else ", ")
        + _augmented_where(train_set, comm.device)
    )

    optimizer = build_optimizer(cfg, model, groups, pretrained=report is not None)
    state = LoopState()
    return RunParts(
        cfg=cfg,
        comm=comm,
        data=data,
        info=info,
        parent=resolved.parent,
        load_report=report,
        model=model,
        trained=trained,
        train_forward=train_forward,
        groups=groups,
        train_set=train_set,
        val_set=val_set,
        train_sampler=sampler,
        train_loader=loader(train_set, sampler, bs, workers, cfg.seed, comm.device),
        val_loader=loader(val_set, val_shard, bs * 2, workers, cfg.seed, comm.device),
        workers=workers,
        steps_per_epoch=steps,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg, steps, lambda: state.lr_scale),
        scaler=torch.amp.GradScaler("cuda", enabled=cfg.amp == "fp16"),
        loss_fn=build_loss(cfg, labels, len(data.classes), comm.device),
        state=state,
        recipe=batch_recipe(cfg, len(data.classes), comm.device),
        ema=Ema.build(model, cfg.ema_decay, info.classifier if cfg.cache_features else None)
        if cfg.ema
        else None,
        distill=distill,
    )


PREFETCH = 4  # batches each loader worker keeps ready


def auto_workers(device: torch.device) -> int:
    """Loader workers when ``--num-workers`` is not given: every CPU but one feeding a GPU;
    on the CPU the model's own threads need cores too, so at most 4."""
    cpus = available_cpus()
    return max(0, cpus - 1) if device.type == "cuda" else min(4, max(0, cpus - 1))


def loader(
    dataset: Any, sampler: Any, batch_size: int, workers: int, seed: int, device: torch.device
) -> Any:
    """The run's loader settings: pinned memory on CUDA, persistent prefetching workers; the
    image cache's uint8 batches are finished on ``device`` (:class:`DeviceBatches`)."""
    cached = isinstance(dataset, CachedImageDataset)
    dl = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=PREFETCH if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )
    return DeviceBatches(dl, dataset, device) if cached else dl


def cache_spec(model: str, image_size: int | None = None) -> CacheSpec | None:
    """How ``model`` (trained at ``image_size``) wants its images stored (its eval resize);
    None for a model that does not take images (``zoo check --cache-for``)."""
    return cache_spec_for(resolve(model)[0].info, image_size)


def _augmented_where(dataset: Any, device: torch.device) -> str:
    if isinstance(dataset, FeatureDataset):
        return "cached backbone features (the images were read once, for them)"
    if not isinstance(dataset, CachedImageDataset):
        return "PIL images decoded and augmented in the workers"
    where = "on the GPU" if device.type == "cuda" else "in this process"
    if dataset.aug.policy:
        return (
            f"cached uint8 images cropped and auto-augmented ({dataset.aug.policy}) in the "
            f"workers; normalised {where} in batches"
        )
    return f"cached uint8 images cropped in the workers; jittered and normalised {where} in batches"


def _datasets(
    cfg: TrainConfig,
    info: ModelInfo,
    views: Preprocessing,
    data: RunData,
    cache: ImageCache | None,
) -> tuple[Any, Any]:
    """Train and val datasets: from the image cache (cropped in the workers, finished where
    the model runs), or decoded by PIL each epoch. Training views are rendered with
    ``views`` (the model's preprocessing, or a distilling teacher's size of it:
    :meth:`Distiller.views`), validation images with the model's own."""
    augment = cfg.augment and not cfg.cache_features
    pre = info.preprocessing()
    if cache is not None:
        spec = CacheSpec.for_model(views)
        train_cache = cache
        if spec != cache.spec:  # views at a distilling teacher's size: its own entries
            t0 = time.perf_counter()
            train_cache = ImageCache(spec)
            built = train_cache.build([p for p, _ in data.samples["train"]], progress=cfg.progress)
            say(
                f"image cache: {len(data.samples['train'])} training images ready at the "
                f"views' {views.crop_size} px in {time.perf_counter() - t0:.1f}s ({built} "
                f"decoded; {spec.tag})"
            )
        return (
            CachedImageDataset(
                data.samples["train"],
                train_cache,
                Augment.for_model(
                    views, train=augment, policy=cfg.auto_augment if augment else None
                ),
                seed=cfg.seed,
            ),
            CachedImageDataset(
                data.samples["val"], cache, Augment.for_model(pre, train=False), seed=cfg.seed
            ),
        )
    aa = (
        policy(cfg.auto_augment, views.crop_size, tuple(views.mean), views.interpolation)
        if cfg.auto_augment
        else None
    )
    train_set = data_mod.ImageFolderDataset(
        data.samples["train"], train_transform(views, augment=augment, policy=aa), seed=cfg.seed
    )
    val_set = data_mod.ImageFolderDataset(data.samples["val"], eval_transform(pre), seed=cfg.seed)
    return train_set, val_set


def _data(
    cfg: TrainConfig, splits: data_mod.Splits, cache: ImageCache | None
) -> tuple[RunData, ImageCache | None]:
    """The splits checked, unreadable files quarantined (left out of the splits the run
    keeps: the report lists them); and the image cache, filled (the check stores what it
    decodes; the rest is decoded now)."""
    t0 = time.perf_counter()
    report = check_splits(splits, image_cache=cache)
    for line in format_report(report):
        say(f"data: {line}")
    if report.corrupt and cfg.strict_data:
        raise DataError(
            f"{len(report.corrupt)} unreadable image(s) with --strict-data, e.g. "
            f"{report.corrupt[0]['path']} ({report.corrupt[0]['error']}). Fix or remove them, "
            "or drop --strict-data to have them quarantined."
        )
    bad = set(report.quarantined)
    if bad:  # out of the run's splits, so of its split.json: eval, the report, export's gate
        files = {k: [(rel, c) for rel, c in v if rel not in bad] for k, v in splits.files.items()}
        splits = replace(splits, files=files)
    samples = {split: splits.samples(split) for split in splits.files}
    for split in ("train", "val"):
        if not samples.get(split):
            raise DataError(f"The {split} split has no readable images.")
    if cache is not None:
        built = cache.build(
            [p for split in samples.values() for p, _ in split], progress=cfg.progress
        )
        say(
            f"image cache: {sum(map(len, samples.values()))} images ready in "
            f"{time.perf_counter() - t0:.1f}s ({built} decoded after the check; {cache.spec.tag} "
            f"at {cache.root}: zoo cache ls)"
        )
    return RunData(splits, samples, report), cache


def _feature_cache(
    model: nn.Module, head: str, sets: tuple[Any, Any], cfg: TrainConfig, workers: int
) -> tuple[FeatureDataset, FeatureDataset]:
    """The head's inputs for every train and val image, computed once (eval transform)."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device

    def batches(ds: Any) -> Callable[[], Any]:
        return lambda: loader(
            ds, list(range(len(ds))), cfg.batch_size * 2, workers, cfg.seed, device
        )

    (train, hit_train), (val, hit_val) = (
        load_or_extract(model, head, ds, batches(ds), device) for ds in sets
    )
    where = "read from" if hit_train and hit_val else "computed into"
    say(
        f"features: {len(train)} + {len(val)} pooled backbone outputs "
        f"({tuple(train.feats.shape[1:])}) {where} the feature cache in "
        f"{time.perf_counter() - t0:.1f}s"
    )
    return train, val
