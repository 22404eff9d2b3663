"""The driver of ``zoo tune``: draw the trials, write the search folder, warm the image cache
once for every trial, and run the trials on Ray Tune (a local Ray, or a cluster's), keeping
``tune.json`` at every event. ``--resume`` runs what the record says is not finished."""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zoo import durable
from zoo.errors import (
    BackendUnavailableError,
    InputError,
    Interrupted,
    TrainingError,
    UsageError,
)
from zoo.train.config import Monitor, TrainConfig
from zoo.train.console import say
from zoo.train.tune.book import (
    BOOK,
    Scheduler,
    SearchBook,
    SearchSpec,
    TrialRecord,
    metric_value,
)
from zoo.train.tune.space import Space, default_space, read_space, sample_trials
from zoo.train.tune.track import TrialTracking


@dataclass(frozen=True)
class TuneOptions:
    """A new search (``spec``, in ``runs_root/name``; default name ``tune-ARCH-DATA``) or
    the continuation of one (``resume``: its folder); ``address``: a Ray cluster to join
    (default: a local Ray for the search's length); ``track``: log the search to MLflow, a
    parent run with each trial nested (None: as the resumed folder's ``tracking.json`` says)."""

    spec: SearchSpec | None = None
    runs_root: str = "runs"
    name: str | None = None
    resume: str | None = None
    address: str | None = None
    track: bool | None = None


@dataclass(frozen=True)
class SearchResult:
    """A finished search: its folder, its trials, and the best one."""

    folder: Path
    trials: tuple[TrialRecord, ...]
    best: TrialRecord | None
    spec: SearchSpec
    tracking: str | None = None  # with --track: where the search is in MLflow, or what is not

    def record(self) -> dict[str, Any]:
        """The search's ``tune.json``."""
        record: dict[str, Any] = json.loads((self.folder / BOOK).read_text())
        return record

    def lines(self) -> list[str]:
        """The summary for people: a line per trial, then the best run and its re-run."""
        metric = self.spec.metric
        out = []
        for t in self.trials:
            row = t.best(self.spec)
            score = f"{metric} {_fmt(row, metric)} (epoch {row.epoch})" if row else "-"
            params = ", ".join(f"{k}={_short(v)}" for k, v in t.params.items())
            if t.baseline:
                params = ", ".join(filter(None, ["zoo finetune's defaults", params]))
            out.append(f"{t.name}: {t.status}, {len(t.epochs)} epoch(s), {score} | {params}")
        if self.best is not None:
            row = self.best.best(self.spec)
            what = self._against_baseline(self.best)
            out.append(
                f"best: {self.best.name} ({metric} {_fmt(row, metric)}{what}) → "
                f"{self.folder / self.best.name}"
            )
            out.append(f"re-run it: {self.best.rerun(self.spec)}")
        if self.tracking:
            out.append(self.tracking)
        return out

    def _against_baseline(self, best: TrialRecord) -> str:
        """How the best trial stands against the baseline, for the best line."""
        base = next((t for t in self.trials if t.baseline), None)
        base_row = base.best(self.spec) if base is not None else None
        if base is None or base_row is None:
            return ""  # no baseline trained (--no-baseline, or it failed)
        if best.baseline:
            drawn = any(not t.baseline and t.best(self.spec) for t in self.trials)
            return (
                ", the baseline: no drawn setting beat the defaults"
                if drawn
                else ", the baseline: no drawn trial trained to compare with"
            )
        cut = "" if base.status == "done" else f" ({base.status} after {len(base.epochs)} epoch(s))"
        return f"; the defaults: {_fmt(base_row, self.spec.metric)}{cut}"


def plan_search(
    base: TrainConfig,
    *,
    space_file: Path | None,
    trials: int,
    scheduler: Scheduler,
    metric: Monitor,
    trial_cpus: float,
    trial_gpus: float,
    max_concurrent: int | None,
    baseline: bool = True,
) -> SearchSpec:
    """The search ``zoo tune`` asks for: the default space for the model (with its
    backbone's dimensions only when it is pretrained), ``space_file`` over it.

    Args:
        base: the options every trial shares (``epochs``: the most a trial trains).
        baseline: the first of the ``trials`` trains with the trainer's defaults (the space's
            fixed values only), so the record holds what a plain ``zoo finetune`` reaches.

    Raises:
        UsageError: a refused space (:func:`zoo.train.tune.space.read_space`).
        UnknownModelError / WeightsNotFoundError / InputError: as
            :func:`zoo.train.resolve.resolve_config` raises for ``base``.
    """
    from zoo.train.resolve import resolve_config

    base = replace(base, monitor=metric, progress=False)
    resolve_config(base)  # the shared options, checked before any trial's
    space = default_space(_starts_from(base)[0])
    if space_file is not None:
        space = read_space(space_file, space)
    return SearchSpec(
        base=base,
        space=space,
        trials=trials,
        scheduler=scheduler,
        metric=metric,
        trial_cpus=trial_cpus,
        trial_gpus=trial_gpus,
        max_concurrent=max_concurrent,
        seed=base.seed,
        baseline=baseline,
    )


def run_search(options: TuneOptions) -> SearchResult:
    """Run (or continue) a search and return its record.

    Raises:
        BackendUnavailableError: Ray Tune is not installed.
        UsageError / InputError / ConfigError: a refused space or trial setting (every trial
            is checked before the first starts), a cluster that cannot be reached or lacks
            the resources one trial asks for.
        TrainingError: every trial failed (the first error is named).
        Interrupted: Ctrl-C; the message names the ``--resume`` command.
        TrackingError: with ``track``, the MLflow server does not answer at the start (before
            any trial; a new search writes no folder).
    """
    try:
        from zoo.train.tune import ray_run  # Ray Tune, checked before any work
    except ImportError as exc:
        raise BackendUnavailableError("zoo tune needs Ray Tune: pip install 'zoo[tune]'") from exc
    from zoo.train.tune import track

    book: SearchBook | None = None
    if options.resume:
        book = SearchBook.read(Path(options.resume).resolve())
        say(f"resuming the search in {book.folder}")
        tracked = track.recorded(book.folder) if options.track is None else options.track
        spec = book.spec
    else:
        if options.spec is None:
            raise UsageError("give a search to run, or --resume DIR")
        tracked = bool(options.track)
        if tracked:  # an unreachable server: refused before the search folder is written
            track.check_server()
        spec = options.spec
        trials = _draw(spec)  # refused settings: before Ray, before any folder
    # Ray joined (or started) and asked for one trial's resources before a new search's
    # folder is written; a resumed search with nothing left to train starts none
    work = book is None or not all(book.complete(t) for t in book.trials)
    with ray_run.session(options.address, spec) if work else contextlib.nullcontext():
        if book is None:
            book = _publish(spec, trials, Path(options.runs_root), options.name)
        parent = track.open_parent(book) if tracked else None
        status, line = "KILLED", None
        try:
            result = _run(book, track.trial_tracking(parent) if parent else None)
            status = "FINISHED"
        except Interrupted:
            raise  # KILLED: --resume continues the parent run
        except Exception:
            status = "FAILED"
            raise
        finally:
            if parent is not None:
                line = track.close_parent(parent, book, book.best(), status)
                if status != "FINISHED":
                    say(line)
    return replace(result, tracking=line)


def _run(book: SearchBook, tracked: TrialTracking | None) -> SearchResult:
    from zoo.train.tune import ray_run

    for rec in list(book.trials.values()):  # a run that finished is final, whatever the record
        if book.complete(rec.name) and rec.status not in ("done", "stopped"):
            book.finished(rec.name)
    todo = [t for t in book.trials.values() if not book.complete(t.name)]
    if todo:
        _warm_image_cache(book.spec.base)
        ray_run.run_trials(book, todo, tracked)
    failed = [t for t in book.trials.values() if t.status == "failed"]
    unfinished = [
        t for t in book.trials.values() if not book.complete(t.name) and t.status != "failed"
    ]
    if unfinished:
        raise Interrupted(
            f"interrupted: {len(unfinished)} trial(s) unfinished; {book.folder} keeps every "
            f"run's last checkpoint; continue with: zoo tune --resume {book.folder}"
        )
    best = book.best()
    if best is None:
        raise TrainingError(
            f"every trial failed; {failed[0].name}: {failed[0].error} (the record: "
            f"{book.folder / BOOK})"
            if failed
            else "no trial trained an epoch"
        )
    return SearchResult(book.folder, tuple(book.trials.values()), best, book.spec)


def _starts_from(base: TrainConfig) -> tuple[bool, bool]:
    """Whether the search's model starts from pretrained weights (its space then varies how
    the backbone trains), and whether it is a pretrained network cut short (the trainer's
    defaults for it differ: :func:`zoo.train.config.default_strategy`)."""
    from zoo.factory import resolve, weight_source

    info = resolve(base.model)[0].info
    pretrained = weight_source(info, base.weights).kind != "none"
    return pretrained, pretrained and info.cut_short


def _draw(spec: SearchSpec) -> dict[str, TrialRecord]:
    """The search's trials, drawn and each checked as its run would be.

    Raises:
        UsageError: the space holds too few distinct settings, or a trial's setting is
            refused (named, with the trainer's reason).
    """
    from zoo.train.resolve import resolve_config

    pretrained, cut_short = _starts_from(spec.base)
    draws = sample_trials(
        spec.space,
        spec.trials,
        spec.seed,
        baseline=spec.baseline,
        base=spec.base,
        pretrained=pretrained,
        cut_short=cut_short,
    )
    width = max(3, len(str(spec.trials - 1)))
    trials = {
        f"trial-{i:0{width}d}": TrialRecord(
            f"trial-{i:0{width}d}", params, baseline=spec.baseline and i == 0
        )
        for i, params in enumerate(draws)
    }
    for rec in trials.values():  # refused combinations fail here, not in a trial an hour in
        try:
            resolve_config(replace(spec.base, **rec.params))
        except InputError as exc:
            raise UsageError(
                f"{rec.name}'s setting {rec.params} is refused: {exc}",
                param_hint="--space",
            ) from None
    return trials


def _publish(
    spec: SearchSpec, trials: dict[str, TrialRecord], root: Path, name: str | None
) -> SearchBook:
    """The search folder, published with its ``tune.json``: complete, or not at all."""
    base = name or f"tune-{_auto_name(spec.base)}"
    root.mkdir(parents=True, exist_ok=True)
    i = 1
    while True:  # the folder appears complete, with its record, or not at all
        folder = (root / (base if i == 1 else f"{base}-{i}")).resolve()
        if not folder.exists():
            tmp = durable.temp_path(folder, folder=True)
            SearchBook(tmp, spec, trials).write()
            if durable.publish_dir(tmp, folder, label="."):
                book = SearchBook(folder, spec, trials)
                book.write()  # its paths name the published folder
                say(f"search: {len(trials)} trials in {folder}")
                return book
            shutil.rmtree(tmp, ignore_errors=True)
        i += 1


def _auto_name(cfg: TrainConfig) -> str:
    arch = cfg.model.rstrip("/").split("/")[-1].split(".")[0].replace(":", "_")
    return f"{arch}-{Path(cfg.data).name}"


def _warm_image_cache(cfg: TrainConfig) -> None:
    """Decode every image once into the shared cache, here, before any trial starts: the
    trials' data checks then find every entry (N trials, one decode per image)."""
    if cfg.image_cache == "off":
        return
    from zoo.train.build import cache_spec
    from zoo.train.check import check_splits
    from zoo.train.data import scan, scan_multilabel
    from zoo.train.image_cache import ImageCache, estimate_bytes, fits

    spec = cache_spec(cfg.model, cfg.image_size)
    if spec is None:
        return
    splits = (scan_multilabel if cfg.multi_label else scan)(
        cfg.data, val_fraction=cfg.val_fraction, seed=cfg.seed
    )
    cache = ImageCache(spec)
    paths = [splits.root / rel for items in splits.files.values() for rel, _ in items]
    if cfg.image_cache == "auto" and not fits(estimate_bytes(len(cache.missing(paths)), spec))[0]:
        return  # the trials will find it does not fit either, and say so
    check_splits(splits, image_cache=cache)  # what the check decodes goes into the cache
    built = cache.build(paths)
    say(f"image cache: {len(paths)} images ready for every trial ({built} decoded now)")


def _fmt(row: Any, metric: str) -> str:
    return f"{metric_value(row, metric):.4f}"


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


__all__ = ["SearchResult", "Space", "TuneOptions", "run_search"]
