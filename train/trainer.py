"""``zoo finetune``: transfer learning on an image folder, with the field guide's habits as
defaults. A run is four steps, each in its own module:

1. :func:`resolve_config` (``resolve.py``): every default and check; the config is frozen after.
2. :func:`build_run` (``build.py``): process group, data, model, loaders, optimizer, schedule;
   a ``--resume`` restores its checkpoint into them. Nothing is written before this succeeds.
3. The epoch loop below (train → validate → commit to ``last.pt``), steps in ``loop.py``.
4. :func:`finish_run` (``finish.py``): the best weights' plots, model folder and report.

What a kill at any point leaves, and how ``--resume`` completes it, is described in
``run_dir.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zoo.errors import Interrupted
from zoo.train.build import RunParts, build_run
from zoo.train.checkpoint import load_checkpoint
from zoo.train.config import TrainConfig
from zoo.train.console import say
from zoo.train.ema import better, shipped_weights
from zoo.train.epoch_row import EpochRow, ValScores
from zoo.train.finish import RunResult, finish_run
from zoo.train.loop import commit, restore, train_epoch, validate
from zoo.train.observe import RunObserver, RunStatus, notify
from zoo.train.preflight import preflight
from zoo.train.progress import make_progress
from zoo.train.resolve import Resolved, resolve_config
from zoo.train.resume import repair_run
from zoo.train.run_dir import RunDir, publish_run_dir, release_runs


def fit(
    options: TrainConfig,
    explicit: frozenset[str] = frozenset(),
    observers: Sequence[RunObserver] = (),
) -> Path | None:
    """Fine-tune as ``options`` ask: resolve, build, train, finish.

    Args:
        options: the training options (``None`` fields: zoo's defaults).
        explicit: the options the user typed; ``--resume`` refuses a change to any of them.
        observers: told (on rank 0) when the run folder opens, after each epoch's commit and
            when the run ends (see :mod:`zoo.train.observe`: an MLflow tracker, a search's
            reporter).

    Returns:
        The run folder; None for ``--dry-run``, which writes nothing.

    Raises:
        ZooError: bad options or data, weights unavailable, a refused resume, or training
            that cannot go on (see :func:`resolve_config`, :func:`build_run`,
            :func:`zoo.train.loop.train_epoch`). The run folder appears only after every
            check before training passed.
        Interrupted: Ctrl-C; the message says what was kept and how to continue
            (``zoo finetune --resume RUN``).
    """
    try:
        files: dict[str, Any] = {}
        if options.lr == "auto" and options.dry_run:  # no training, so no range test either
            say("dry run: --lr auto would run the LR range test first; checking with lr=None")
            options = replace(options, lr=None)
        elif options.lr == "auto":  # the range test first; the run records what it found
            from zoo.train.lr_find import auto_lr

            options, found = auto_lr(options)
            files["lr_find.json"] = found.to_dict()
        resolved = resolve_config(options, explicit)
        anomaly = torch.autograd.detect_anomaly() if resolved.cfg.detect_anomaly else nullcontext()
        with anomaly:
            return _train(resolved, build_run(resolved), files, observers)
    except Interrupted:
        raise
    except KeyboardInterrupt:  # before _train: checking options and data, or --lr auto
        raise Interrupted(
            resume_hint(Path(options.resume))
            if options.resume
            else "interrupted before the run folder was written: nothing was saved; run the "
            "command again"
        ) from None
    finally:
        release_runs()  # a refusal after the run was locked (a changed option…) keeps none
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def resume_hint(run: Path) -> str:
    """What Ctrl-C leaves once a run folder exists (its last checkpoint, or, before the
    first one, only its settings), and the command that continues it."""
    if (run / "checkpoints" / "last.pt").is_file():
        kept = "keeps its last checkpoint; continue where it stopped with"
    else:
        kept = "has no checkpoint yet (it stopped before the first); start it over with"
    return f"interrupted: {run} {kept}: zoo finetune --resume {run}"


def _train(
    resolved: Resolved, parts: RunParts, files: dict[str, Any], observers: Sequence[RunObserver]
) -> Path | None:
    opened = _open_run(resolved, parts, files)
    if opened is None:  # --dry-run
        return None
    run, estimate = opened
    observers = observers if parts.comm.is_main else ()
    history = [EpochRow.from_dict(r) for r in parts.state.history]
    notify(observers, "run_started", run.path, parts.cfg, history)
    status: RunStatus = "failed"
    try:
        path = _loop(parts, run, estimate, observers)
        status = "done"
        return path
    except KeyboardInterrupt:  # the run folder exists: what it keeps, and how to go on
        status = "interrupted"
        raise Interrupted(resume_hint(run.path)) from None
    finally:
        notify(observers, "run_ended", run.path, status)


def _open_run(
    resolved: Resolved, parts: RunParts, files: dict[str, Any]
) -> tuple[RunDir, dict[str, Any]] | None:
    """The run folder to train into (a resumed one restored and repaired, a new one published
    once the preflight passed) and the preflight's estimate; None for ``--dry-run``."""
    cfg, comm = parts.cfg, parts.comm
    run = resolved.run
    if run is not None:  # --resume
        if resolved.checkpoint is not None:
            restore(parts, resolved.checkpoint, str(run.path))
        repair_run(
            run,
            cfg,
            resolved.checkpoint,
            extended=resolved.extended,
            is_main=comm.is_main,
            world=comm.world,
        )
    estimate = preflight(parts)
    if cfg.dry_run:
        say("dry run: stopping before training (no run folder written)")
        return None
    if run is None:  # every check passed: the run folder appears, complete
        files = {
            "split.json": parts.data.splits.to_json(),
            "classes.json": parts.data.classes,
            **files,
        }
        path = comm.share(lambda: str(publish_run_dir(cfg, files)))
        run = RunDir(Path(path), top_k=cfg.top_k_checkpoints)
        if cfg.name and run.path.name != cfg.name:  # --name taken: said, never silent
            taken = Path(cfg.runs_root) / cfg.name
            say(
                f"note: {taken} is another run, so this one is {run.path} (--resume {taken} "
                "continues that one instead)"
            )
    return run, estimate


def _loop(
    parts: RunParts, run: RunDir, estimate: dict[str, Any], observers: Sequence[RunObserver]
) -> Path:
    """Train the remaining epochs (train → validate → commit), then finish the run."""
    cfg, comm, state = parts.cfg, parts.comm, parts.state
    monitor = cfg.monitor or "val/acc"
    sign = -1 if monitor == "val/loss" else 1  # ValScores.monitored(): higher is better

    # a resumed run's epochs before this process count too: the run's time, not this part's
    earlier_s = sum(float(h["epoch_s"]) for h in state.history)
    t_start = time.perf_counter()
    with make_progress(enabled=comm.is_main and cfg.progress) as progress:
        while state.epoch < cfg.epochs and not state.stopped:
            train = train_epoch(parts, run, progress)
            if train is None:  # rolled back to the last checkpoint: go again
                continue
            val = ValScores.of(validate(parts))
            metric = model_metric = ema_metric = val.monitored(monitor)
            ema = shipped = None
            if parts.ema is not None:  # the average, judged on the same images
                ema = ValScores.of(validate(parts, parts.ema.trained))
                ema_metric = ema.monitored(monitor)
                shipped = better(model_metric, ema_metric)
                metric = max(model_metric, ema_metric)
            row = EpochRow(
                epoch=state.epoch + 1,
                step=state.global_step,
                train=train,
                val=val,
                lr=parts.optimizer.param_groups[-1]["lr"],
                nonfinite_skipped=state.nonfinite_skipped,
                ema=ema,
                shipped=shipped,
            )
            improved = state.end_epoch(row.to_dict(), metric, cfg.patience)
            if comm.is_main:
                run.log_epoch_scalars(row.to_dict())
            commit(parts, run)  # the epoch's commit: last.pt carries the row, best flag, stop
            say(
                f"epoch {row.epoch}/{cfg.epochs}: train loss {train.loss:.4f} acc "
                f"{train.acc:.3f} | val loss {val.loss:.4f} acc {val.acc:.3f} "
                f"| {train.img_per_s:.0f} img/s, data-wait {train.data_wait:.0%}"
                + (
                    f" | EMA {monitor} {sign * ema_metric:.3f} vs the model's "
                    f"{sign * model_metric:.3f}"
                    if parts.ema is not None
                    else ""
                )
                + (
                    f" | best so far: the {'EMA' if shipped == 'ema' else 'model'}'s weights"
                    if improved and parts.ema is not None
                    else " (best)"
                    if improved
                    else f" (ties the best, epoch {state.epoch - state.epochs_since_best}: the "
                    "earlier epoch is kept)"
                    if metric == state.best
                    else ""
                )
            )
            if train.data_wait > 0.3 and state.epoch == 1 and not cfg.cache_features:
                say(
                    f"hint: {train.data_wait:.0%} of the time went to waiting for data: the "
                    f"loader is the bottleneck. Raise --num-workers (now {parts.workers}) or "
                    "lower the image size."
                )
            if _epoch_ended(parts, run, row, observers):
                say(f"stopped after epoch {row.epoch}: asked by {_names(observers)}")
            elif state.stopped:
                say(f"early stopping: no improvement of {monitor} for {cfg.patience} epoch(s)")
    total_s = earlier_s + time.perf_counter() - t_start

    comm.barrier()  # rank 0 has written best.pt
    if run.best_path.exists():  # the best epoch's weights: the model's or its EMA's
        parts.model.load_state_dict(shipped_weights(load_checkpoint(run.best_path)))
    val_full = validate(parts)  # per-class metrics of the weights we ship (a collective under DDP)
    if comm.is_main:
        finish_run(RunResult(parts, run, val_full, total_s, estimate))
        run.close()
    comm.barrier()
    return run.path


def _epoch_ended(
    parts: RunParts, run: RunDir, row: EpochRow, observers: Sequence[RunObserver]
) -> bool:
    """Tell the observers (rank 0) that ``row`` is committed. When one asks to stop, every
    rank stops after this epoch, committed as an early stop (a resume does not train on).
    Returns whether the run stops because of them."""
    comm, state = parts.comm, parts.state
    stop = bool(observers) and comm.is_main and notify(observers, "epoch_ended", run.path, row)
    if not comm.share(lambda: stop) or state.stopped:
        return False
    state.stopped = True
    commit(parts, run)
    return True


def _names(observers: Sequence[RunObserver]) -> str:
    return ", ".join(type(o).__name__ for o in observers) or "an observer"


__all__ = ["fit"]
