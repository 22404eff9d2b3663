"""The trainer: transfer learning on an image folder, with the field guide's habits as
defaults. Reads top to bottom: set-up (data, model, optimizer: every check before anything is
written), preflight, the run folder, the epoch loop (train → validate → commit), and the final
model folder + report. What a kill at any point leaves, and how a resume completes it, is
described in ``run_dir.py``.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from zoo.device import move_to, pick_device
from zoo.errors import DataError, InputError, TrainingError
from zoo.factory import create_model_with_report, resolve
from zoo.metadata import ModelInfo
from zoo.profile import count_params
from zoo.system import available_cpus
from zoo.train import data as data_mod
from zoo.train.check import check_splits, format_report
from zoo.train.checkpoint import load_checkpoint
from zoo.train.config import TrainConfig
from zoo.train.console import say
from zoo.train.evaluate import collect_logits, gather_by_index
from zoo.train.features import FeatureDataset, extract_features, head_module
from zoo.train.metrics import summarize, summarize_multilabel
from zoo.train.resume import gather_epoch_stats, own_epoch_stats, prepare_resume, repair_run
from zoo.train.rng import get_rng_state, seed_everything, set_rng_state
from zoo.train.run_dir import RunDir, create_run_dir
from zoo.train.schedule import build_scheduler
from zoo.train.strategy import (
    ParamGroups,
    param_groups,
    set_backbone_frozen,
    split_head,
    train_mode,
)
from zoo.transforms import eval_transform, train_transform

log = logging.getLogger("zoo.train")


class Trainer:
    def __init__(self, cfg: TrainConfig, *, explicit: frozenset[str] = frozenset()) -> None:
        """``explicit``: the options the user typed; ``--resume`` compares exactly these."""
        self.cfg = cfg
        self.explicit = explicit
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.is_main = self.rank == 0
        self._run: RunDir | None = None

    @property
    def run(self) -> RunDir:
        """The run folder: it exists only once every check has passed and training starts."""
        if self._run is None:
            raise RuntimeError("internal: the run folder is created when training starts")
        return self._run

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        cfg = self.cfg
        if self.world > 1 and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() and cfg.device != "cpu" else "gloo"
            dist.init_process_group(backend)
        self.device = pick_device(cfg.device)
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        if cfg.amp and self.device.type != "cuda":
            raise InputError(
                f"--amp {cfg.amp} needs CUDA; this run is on {self.device}. Drop --amp."
            )
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed input shapes
        self.resume_state: dict[str, Any] | None = None
        if cfg.resume:
            self.cfg, self._run, self.resume_state = prepare_resume(cfg, self.explicit)
        seed_everything(self.cfg.seed)
        self._setup_data()
        self._setup_model()
        self._setup_loaders()
        self._setup_optim()
        if self._run is not None:  # --resume (a new run's folder is created in fit)
            if self.resume_state is not None:
                self._restore(self.resume_state)
            repair_run(
                self.run,
                self.cfg,
                self.resume_state,
                extended=bool(cfg.extend),
                is_main=self.is_main,
                world=self.world,
            )

    def _setup_data(self) -> None:
        cfg = self.cfg
        if self._run is not None and (self._run.path / "split.json").exists():
            self.splits = data_mod.Splits.from_json(self._run.read_json("split.json"))
        else:  # written with the run folder, once every check has passed
            scan = data_mod.scan_multilabel if cfg.multi_label else data_mod.scan
            self.splits = scan(cfg.data, val_fraction=cfg.val_fraction, seed=cfg.seed)
        self.classes = self.splits.classes
        report = check_splits(self.splits)
        self.check_report = report
        for line in format_report(report):
            say(f"data: {line}")
        if report.corrupt and cfg.strict_data:
            raise DataError(
                f"{len(report.corrupt)} unreadable image(s) with --strict-data, e.g. "
                f"{report.corrupt[0]['path']} ({report.corrupt[0]['error']}). Fix or remove them, "
                "or drop --strict-data to have them quarantined."
            )
        bad = set(report.quarantined)
        self.samples = {
            split: [
                (p, y)
                for p, y in self.splits.samples(split)
                if str(p.relative_to(self.splits.root)) not in bad
            ]
            for split in self.splits.files
        }
        for split in ("train", "val"):
            if not self.samples.get(split):
                raise DataError(f"The {split} split has no readable images.")

    def _setup_model(self) -> None:
        cfg = self.cfg
        model, info, report = create_model_with_report(
            cfg.model, num_classes=len(self.classes), weights=cfg.weights, label_names=self.classes
        )
        pretrained = report is not None
        if cfg.strategy is None:
            cfg.strategy = "gradual" if pretrained else "full"
        if not pretrained and cfg.strategy != "full":
            raise InputError(
                f"--strategy {cfg.strategy} freezes a backbone, but {cfg.model} has random weights "
                "(--weights none or no pretrained weights): random-init models train fully. "
                "Use --strategy full."
            )
        if cfg.monitor is None:
            cfg.monitor = "val/macro_f1" if cfg.multi_label else "val/acc"
        if cfg.cache_features and cfg.strategy != "linear":
            raise InputError(
                "--cache-features needs --strategy linear (a backbone that never changes)."
            )
        if cfg.image_size:
            info = replace(info, input_size=(info.input_size[0], cfg.image_size, cfg.image_size))
        self.info: ModelInfo = info
        self.parent = resolve(cfg.model)
        self.load_report = report
        if cfg.sync_bn and self.world > 1:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model = model.to(self.device)
        if cfg.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.groups: ParamGroups | None = (
            split_head(self.model, info.classifier)
            if cfg.strategy != "full" or info.classifier
            else None
        )
        if cfg.strategy == "linear":
            assert self.groups is not None
            set_backbone_frozen(self.groups, True)
        self.has_bn = any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.model.modules()
        )
        self.forward_model: nn.Module = self.model
        if self.world > 1:
            self.forward_model = nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=cfg.strategy == "gradual",
            )
        if cfg.compile:
            self.forward_model = torch.compile(self.forward_model)  # type: ignore[assignment]

    def _loader(self, dataset: Any, sampler: Any, batch_size: int, workers: int) -> DataLoader[Any]:
        cuda = self.device.type == "cuda"
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=workers,
            pin_memory=cuda,
            persistent_workers=workers > 0,
            prefetch_factor=4 if workers > 0 else None,
            generator=torch.Generator().manual_seed(self.cfg.seed),
        )

    def _setup_loaders(self) -> None:
        cfg = self.cfg
        self.workers = (
            cfg.num_workers if cfg.num_workers is not None else min(4, max(0, available_cpus() - 1))
        )
        train_tf = train_transform(self.info, augment=cfg.augment and not cfg.cache_features)
        eval_tf = eval_transform(self.info)
        self.train_set: Any = data_mod.ImageFolderDataset(
            self.samples["train"], train_tf, seed=cfg.seed
        )
        self.val_set: Any = data_mod.ImageFolderDataset(self.samples["val"], eval_tf, seed=cfg.seed)
        if cfg.cache_features:
            self._build_feature_cache(eval_tf)
        bs = cfg.batch_size
        drop_last = self.has_bn and len(self.train_set) >= bs * self.world
        self.train_sampler = data_mod.ResumableSampler(
            len(self.train_set),
            shuffle=True,
            seed=cfg.seed,
            batch_size=bs,
            drop_last=drop_last,
            rank=self.rank,
            world_size=self.world,
        )
        workers = 0 if cfg.cache_features else self.workers
        self.train_loader = self._loader(self.train_set, self.train_sampler, bs, workers)
        val_idx = list(
            range(self.rank, len(self.val_set), self.world)
        )  # disjoint shards, no padding
        self.val_loader = self._loader(self.val_set, val_idx, bs * 2, workers)
        self.steps_per_epoch = self.train_sampler.batches_per_epoch()
        if self.steps_per_epoch == 0:
            raise DataError(
                f"Not one batch of {bs} from {len(self.train_set)} training images: lower --batch-size."
            )
        say(
            f"data: {len(self.train_set)} train / {len(self.val_set)} val images, {len(self.classes)} "
            f"classes, batch {bs} per process × {self.world} = {bs * self.world} global, "
            f"{self.steps_per_epoch} steps/epoch, num_workers={workers} (auto picks "
            f"min(4, cpus-1); raise it while the data-wait share stays high)"
        )
        if self.world > 1:
            say(
                f"distributed: {self.world} processes ({dist.get_backend()}); the LR is not rescaled "
                f"automatically: with the per-process batch fixed, the linear scaling rule suggests "
                f"--lr × {self.world}"
            )

    def _build_feature_cache(self, eval_tf: Any) -> None:
        assert self.info.classifier
        t0 = time.perf_counter()
        cache = {}
        for split, ds in (("train", self.train_set), ("val", self.val_set)):
            batches = self._loader(ds, list(range(len(ds))), self.cfg.batch_size * 2, self.workers)
            cache[split] = FeatureDataset(
                *extract_features(self.model, self.info.classifier, batches, self.device)
            )
        self.train_set, self.val_set = cache["train"], cache["val"]
        self.head = head_module(self.model, self.info.classifier)
        say(
            f"features: cached {len(self.train_set)} + {len(self.val_set)} pooled backbone outputs "
            f"({tuple(self.train_set.feats.shape[1:])}) in {time.perf_counter() - t0:.1f}s"
        )

    def _setup_optim(self) -> None:
        cfg = self.cfg
        lr = cfg.lr if cfg.lr is not None else (1e-3 if cfg.optimizer == "adamw" else 0.1)
        cfg.lr = lr
        if self.groups is None or (cfg.strategy == "full" and self.load_report is None):
            groups = [
                {
                    "params": list(self.model.parameters()),
                    "lr": lr,
                    "name": "all",
                    "weight_decay": cfg.weight_decay,
                }
            ]
        else:
            groups = param_groups(
                self.groups, cfg.strategy or "full", lr, cfg.backbone_lr_mult, cfg.weight_decay
            )
        if cfg.optimizer == "adamw":
            self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(groups, lr=lr)
        else:
            self.optimizer = torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=True)
        self.lr_scale = 1.0
        self.scheduler = build_scheduler(
            self.optimizer, cfg, self.steps_per_epoch, lambda: self.lr_scale
        )
        self.scaler = torch.amp.GradScaler("cuda", enabled=cfg.amp == "fp16")
        # Raw logits in both cases: softmax/sigmoid live inside the loss, never in the head.
        self.loss_fn: nn.Module = (
            nn.BCEWithLogitsLoss()
            if cfg.multi_label
            else nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        )
        self.epoch, self.global_step, self.step_in_epoch = 0, 0, 0
        self.best: float | None = None
        self.epochs_since_best = 0
        self.nonfinite_skipped = 0
        self.rollbacks = 0
        self.stopped = False  # early stopping: part of the committed state
        self.consecutive_nonfinite = 0
        self.epoch_stats = {"loss": 0.0, "correct": 0, "n": 0}
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ state
    def state(self, epoch_stats: list[dict[str, Any]]) -> dict[str, Any]:
        """Everything a resume needs; ``epoch_stats``: every rank's running sums."""
        return {
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "global_step": self.global_step,
            "step_in_epoch": self.step_in_epoch,
            "best": self.best,
            "epochs_since_best": self.epochs_since_best,
            "stopped": self.stopped,
            "lr_scale": self.lr_scale,
            "nonfinite_skipped": self.nonfinite_skipped,
            "rollbacks": self.rollbacks,
            "epoch_stats": epoch_stats,
            "history": self.history,
            "rng": get_rng_state(),
            "world_size": self.world,
            "global_batch": self.cfg.batch_size * self.world,
        }

    def _restore(self, s: dict[str, Any]) -> None:
        self.model.load_state_dict(s["model"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        self.scaler.load_state_dict(s["scaler"])
        self.epoch, self.global_step, self.step_in_epoch = (
            s["epoch"],
            s["global_step"],
            s["step_in_epoch"],
        )
        self.best, self.epochs_since_best = s["best"], s["epochs_since_best"]
        self.lr_scale, self.nonfinite_skipped, self.rollbacks = (
            s["lr_scale"],
            s["nonfinite_skipped"],
            s["rollbacks"],
        )
        self.epoch_stats = own_epoch_stats(s["epoch_stats"], self.rank, self.world)
        self.history = list(s["history"])
        self.stopped = bool(s.get("stopped", False))
        set_rng_state(s["rng"])
        saved_world = int(s.get("world_size", 1))
        if saved_world != self.world and self.step_in_epoch:
            # Same samples seen so far, counted in this run's global batches.
            seen = self.step_in_epoch * int(
                s.get("global_batch", self.cfg.batch_size * saved_world)
            )
            self.step_in_epoch = min(
                self.steps_per_epoch, round(seen / (self.cfg.batch_size * self.world))
            )
            say(
                f"warning: this run was saved with {saved_world} process(es) and resumes with "
                f"{self.world}: the rest of epoch {self.epoch} is reshuffled across ranks, so the result is "
                "not bitwise equal to an uninterrupted run"
            )
        say(
            f"resumed {self.run.path} at epoch {self.epoch}, step {self.step_in_epoch}/"
            f"{self.steps_per_epoch} (global step {self.global_step})"
        )

    def save(self) -> None:
        """Commit the run's state to last.pt (best/top-k/metrics follow from it at an epoch's
        end). Every rank calls it at the same step; only rank 0 writes."""
        stats = gather_epoch_stats(self.epoch_stats, self.world, self.device)
        if self.is_main:
            self.run.commit(self.state(stats))

    # ------------------------------------------------------------------ preflight
    def preflight(self) -> dict[str, Any]:
        """One dummy batch for shapes, parameter counts and an epoch-time estimate from a few
        timed steps, run on copies so the real run's state and RNG are untouched."""
        self._set_phase(self.epoch)
        total, trainable = count_params(self.model), count_params(self.model, trainable_only=True)
        x, _, _ = next(
            iter(
                self._loader(
                    self.train_set,
                    [(i, 0) for i in range(min(len(self.train_set), self.cfg.batch_size))],
                    self.cfg.batch_size,
                    0,
                )
            )
        )
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            model = copy.deepcopy(self.head if self.cfg.cache_features else self.model)
            opt = torch.optim.AdamW(
                [p for p in model.parameters() if p.requires_grad] or [nn.Parameter(torch.zeros(1))]
            )
            x = x.to(self.device)
            out = model(x)
            if out.shape != (x.shape[0], len(self.classes)):
                raise TrainingError(
                    f"Model output {tuple(out.shape)} ≠ (batch, {len(self.classes)} classes)."
                )
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                model(x).float().logsumexp(1).mean().backward()
                opt.step()
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        step = sorted(times)[len(times) // 2]
        est = step * self.steps_per_epoch
        say(
            f"model: {self.info.name} → {len(self.classes)} classes, {total:,} parameters "
            f"({trainable:,} trainable now), output {tuple(out.shape)}; strategy {self.cfg.strategy}"
        )
        if self.load_report:
            say(f"weights: {self.load_report.summary()}")
        say(
            f"estimate: {step * 1000:.0f} ms/step (compute only) → ~{est:.0f}s per epoch, "
            f"{est * self.cfg.epochs / 60:.1f} min for {self.cfg.epochs} epochs"
        )
        return {"params": total, "trainable": trainable, "step_s": step, "epoch_estimate_s": est}

    # ------------------------------------------------------------------ loop
    def _set_phase(self, epoch: int) -> bool:
        """Frozen backbone for linear and the first ``freeze_epochs`` of gradual."""
        frozen = self.cfg.strategy == "linear" or (
            self.cfg.strategy == "gradual" and epoch < self.cfg.freeze_epochs
        )
        if self.groups is not None and self.cfg.strategy != "full":
            set_backbone_frozen(self.groups, frozen)
        return frozen

    def _forward(self, x: torch.Tensor, *, wrapped: bool = True) -> torch.Tensor:
        """Training goes through the DDP/compiled wrapper; evaluation uses the plain module
        (a DDP forward is a collective, and ranks may hold different numbers of val batches)."""
        if self.cfg.cache_features:
            module = self.head
        else:
            module = self.forward_model if wrapped else self.model
        if self.cfg.amp:
            dtype = torch.bfloat16 if self.cfg.amp == "bf16" else torch.float16
            with torch.autocast(self.device.type, dtype=dtype):
                return module(x)
        return module(x)

    def _all_finite(self, loss: float) -> bool:
        if self.world == 1:
            return math.isfinite(loss)
        finite = torch.tensor(
            [1.0 if math.isfinite(loss) else 0.0], device=self.device
        )  # NCCL: on GPU
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # every rank takes the same decision
        return bool(finite.item() > 0)

    def _handle_nonfinite(self, idx: torch.Tensor) -> None:
        self.nonfinite_skipped += 1
        self.consecutive_nonfinite += 1
        if self.consecutive_nonfinite < self.cfg.max_nonfinite:
            return
        files = (
            [str(self.samples["train"][int(i)][0]) for i in idx[:5]]
            if not self.cfg.cache_features
            else []
        )
        where = f"epoch {self.epoch}, step {self.step_in_epoch} (global {self.global_step})"
        ckpt = self.run.last_path
        if self.rollbacks >= self.cfg.max_rollbacks or not ckpt.exists():
            raise TrainingError(
                f"Loss is not finite at {where} after {self.rollbacks} rollback(s) with halved LR. "
                f"Files in the offending batch: {', '.join(files) or 'n/a'}. Try: --lr {(self.cfg.lr or 1e-3) / 10:g} "
                "(10× lower), check the labels and that inputs hold no NaN, --clip-grad-norm 1.0, "
                "or --detect-anomaly to find the op that produced it."
            )
        if self.world > 1:
            dist.barrier()
        state = load_checkpoint(ckpt)
        rollbacks = self.rollbacks + 1
        self._restore(state)
        if self.is_main:
            self.run.drop_pending()  # the replay logs these steps again
        self.rollbacks = rollbacks
        self.lr_scale *= 0.5
        self.consecutive_nonfinite = 0
        say(
            f"warning: {self.cfg.max_nonfinite} non-finite losses in a row at {where}: rolled back to "
            f"the last checkpoint with LR × {self.lr_scale:g}"
        )
        raise _Rollback

    def train_epoch(self, progress: Any) -> dict[str, float]:
        cfg = self.cfg
        frozen = self._set_phase(self.epoch)
        if cfg.cache_features:
            self.head.train()
        else:
            train_mode(self.model, self.groups, frozen)
        self.train_sampler.set_epoch(self.epoch)
        self.train_sampler.set_position(self.step_in_epoch)
        if hasattr(self.train_set, "set_epoch"):
            self.train_set.set_epoch(self.epoch)
        self.consecutive_nonfinite = 0
        wait = compute = 0.0
        seen = 0
        t_epoch = time.perf_counter()
        t_ready = time.perf_counter()
        for x, y, idx in self.train_loader:
            t_got = time.perf_counter()
            wait += t_got - t_ready
            x, y = move_to((x, y), self.device, non_blocking=True)
            if cfg.channels_last and x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            self.optimizer.zero_grad(set_to_none=True)
            logits = self._forward(x)
            loss = self.loss_fn(logits.float(), y)
            self.scaler.scale(loss).backward()
            # One host sync per step, after backward is queued: loss, correct count, finiteness.
            hits = ((logits > 0) == (y > 0.5)).all(1) if cfg.multi_label else logits.argmax(1) == y
            loss_v, correct = torch.stack([loss.detach(), hits.sum().float()]).tolist()
            if not self._all_finite(
                loss_v
            ):  # skip the step: NaN/inf gradients never reach the weights
                self._handle_nonfinite(idx)
            else:
                self.consecutive_nonfinite = 0
                if cfg.clip_grad_norm:
                    self.scaler.unscale_(self.optimizer)
                    nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad_norm)
                if cfg.log_grad_norms and self.is_main and self.global_step % 50 == 0:
                    self.run.log_grad_norms(self.model, self.global_step)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.epoch_stats["loss"] += loss_v * len(y)  # a float: no graph kept alive
                self.epoch_stats["correct"] += int(correct)
                self.epoch_stats["n"] += len(y)
            self.scheduler.step()
            self.global_step += 1
            self.step_in_epoch += 1
            seen += len(y)
            t_ready = time.perf_counter()
            compute += t_ready - t_got
            if cfg.save_every_steps and self.global_step % cfg.save_every_steps == 0:
                self.save()
            if progress is not None:
                n = max(1, self.epoch_stats["n"])
                progress.update(
                    self.task,
                    advance=1,
                    info=f"loss {self.epoch_stats['loss'] / n:.4f} acc {self.epoch_stats['correct'] / n:.3f} "
                    f"{seen * self.world / max(1e-9, t_ready - t_epoch):.0f} img/s data-wait "
                    f"{wait / max(1e-9, wait + compute):.0%}",
                )
        totals = torch.tensor(
            [self.epoch_stats["loss"], self.epoch_stats["correct"], self.epoch_stats["n"]],
            dtype=torch.float64,
            device=self.device,
        )
        if self.world > 1:  # log the whole global batch, not rank 0's shard
            dist.all_reduce(totals)
        n = max(1.0, float(totals[2]))
        share = wait / max(1e-9, wait + compute)
        return {
            "train/loss": float(totals[0]) / n,
            "train/acc": float(totals[1]) / n,
            "data_wait": share,
            "img_per_s": seen * self.world / max(1e-9, time.perf_counter() - t_epoch),
            "epoch_s": time.perf_counter() - t_epoch,
        }

    def validate(self) -> dict[str, Any]:
        module = self.head if self.cfg.cache_features else self.model
        if self.world > 1:  # every shard judged with rank 0's BatchNorm statistics: the saved ones
            for b in module.buffers():
                dist.broadcast(b, src=0)
        was = module.training
        module.eval()
        try:
            logits, targets = gather_by_index(
                *collect_logits(
                    lambda x: self._forward(x, wrapped=False),
                    self.val_loader,
                    self.device,
                    channels_last=self.cfg.channels_last,
                )
            )
        finally:
            module.train(was)
        if self.cfg.multi_label:  # exact-match accuracy, per-class thresholds tuned on val
            return summarize_multilabel(logits, targets, self.classes)
        return summarize(logits, targets, self.classes)

    def fit(self) -> Path | None:
        """Train, then write the model folder and report.

        Returns:
            The run folder; None for ``--dry-run``, which writes nothing.
        """
        from zoo.train.finish import finish_run
        from zoo.train.progress import make_progress

        self.setup()
        cfg = self.cfg  # after setup: --resume replaces it with the run's own
        estimate = self.preflight()
        if cfg.dry_run:
            say("dry run: stopping before training (no run folder written)")
            return None
        if self._run is None:  # every check passed: the run folder appears, complete
            files = {"split.json": self.splits.to_json(), "classes.json": self.classes}
            self._run = create_run_dir(cfg, files, is_main=self.is_main, world=self.world)
        t_start = time.perf_counter()
        with make_progress(enabled=self.is_main and cfg.progress) as progress:
            while self.epoch < cfg.epochs and not self.stopped:
                self.task = (
                    progress.add_task(
                        f"epoch {self.epoch + 1}/{cfg.epochs}",
                        total=self.steps_per_epoch,
                        completed=self.step_in_epoch,
                        info="",
                    )
                    if progress
                    else None
                )
                try:
                    train_metrics = self.train_epoch(progress)
                except _Rollback:
                    if progress is not None and self.task is not None:
                        progress.remove_task(self.task)
                    continue
                val = self.validate()
                row = {
                    "epoch": self.epoch + 1,
                    "step": self.global_step,
                    **train_metrics,
                    "val/loss": val["loss"],
                    "val/acc": val["acc"],
                    "val/top5": val.get("top5"),
                    "val/macro_f1": val["macro_f1"],
                    "lr": self.optimizer.param_groups[-1]["lr"],
                    "nonfinite_skipped": self.nonfinite_skipped,
                }
                self.history.append(row)
                metric = (
                    -val["loss"]
                    if cfg.monitor == "val/loss"
                    else val[(cfg.monitor or "val/acc").split("/")[1]]
                )
                improved = self.best is None or metric > self.best
                if improved:
                    self.best, self.epochs_since_best = metric, 0
                else:
                    self.epochs_since_best += 1
                self.epoch += 1
                self.step_in_epoch = 0
                self.epoch_stats = {"loss": 0.0, "correct": 0, "n": 0}
                self.stopped = cfg.patience is not None and self.epochs_since_best >= cfg.patience
                if self.is_main:
                    self.run.log_epoch_scalars(row)
                # The epoch's commit: last.pt carries the row, the best flag and the stop.
                self.save()
                say(
                    f"epoch {row['epoch']}/{cfg.epochs}: train loss {row['train/loss']:.4f} acc "
                    f"{row['train/acc']:.3f} | val loss {val['loss']:.4f} acc {val['acc']:.3f} "
                    f"| {row['img_per_s']:.0f} img/s, data-wait {row['data_wait']:.0%}"
                    + (" (best)" if improved else "")
                )
                if row["data_wait"] > 0.3 and self.epoch == 1 and not cfg.cache_features:
                    say(
                        f"hint: {row['data_wait']:.0%} of the time went to waiting for data: the loader is "
                        f"the bottleneck. Raise --num-workers (now {self.workers}) or lower the image size."
                    )
                if self.stopped:
                    say(
                        f"early stopping: no improvement of {cfg.monitor} for {cfg.patience} epoch(s)"
                    )
        total_s = time.perf_counter() - t_start
        if self.world > 1:
            dist.barrier()  # rank 0 has written best.pt
        if self.run.best_path.exists():
            self.model.load_state_dict(load_checkpoint(self.run.best_path)["model"])
        val = self.validate()  # per-class metrics of the weights we ship (collective under DDP)
        if self.is_main:
            finish_run(self, val, total_s, estimate)
            self.run.close()
        if self.world > 1:
            dist.barrier()
        return self.run.path


class _Rollback(Exception):
    """Internal: the epoch restarts from the restored checkpoint."""


def fit(cfg: TrainConfig, explicit: frozenset[str] = frozenset()) -> Path | None:
    trainer = Trainer(cfg, explicit=explicit)
    ctx = torch.autograd.detect_anomaly() if cfg.detect_anomaly else nullcontext()
    try:
        with ctx:
            return trainer.fit()
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


__all__ = ["Trainer", "fit"]
