"""``tune.json``: a search's own record, in its folder beside the trials' run folders.

It holds what the search is (:class:`SearchSpec`: the model, data, shared options, space,
scheduler, metric), every trial (:class:`TrialRecord`: its settings, status, run folder, the
run's metrics per epoch, the epoch each attempt started from) and the best run. It is
rewritten atomically (``zoo/durable.py``) at every trial event, and is what ``zoo tune
--resume`` continues from: a trial's run folder is the truth about its epochs (its
``metrics.jsonl`` is re-read at each event), so a record that lags behind a kill is caught up.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from zoo import durable
from zoo.errors import CheckpointError, UsageError
from zoo.train.config import Monitor, TrainConfig, TuneScheduler, option_defaults
from zoo.train.epoch_row import EpochRow
from zoo.train.tune.space import Dimension, Space

BOOK = "tune.json"
VERSION = 1
Scheduler = TuneScheduler  # defined beside the other options' choices: `zoo --help` needs it
TrialStatus = Literal["pending", "running", "done", "stopped", "failed"]
# the options a re-run leaves out: where the run folder goes is the user's choice
_NOT_RERUN = ("runs_root", "name", "resume", "run_dir", "progress", "num_workers")


@dataclass(frozen=True)
class SearchSpec:
    """What a search is; fixed when it starts (``--resume`` reads it back)."""

    base: TrainConfig  # the options every trial shares (epochs: --max-epochs, monitor: metric)
    space: Space
    trials: int
    scheduler: Scheduler
    metric: Monitor
    trial_cpus: float
    trial_gpus: float
    max_concurrent: int | None
    seed: int  # draws the trials (the trials themselves train with base.seed)
    baseline: bool = False  # trial-000 trains with the defaults (records before it: none did)

    @property
    def mode(self) -> Literal["max", "min"]:
        return "min" if self.metric == "val/loss" else "max"

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["base"] = self.base.to_dict()
        d["space"] = {k: dim.to_dict() for k, dim in self.space.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchSpec:
        """Read what :meth:`to_dict` wrote.

        Raises:
            CheckpointError: the recorded space is one this zoo refuses (a range recorded by
                an older zoo that checked less).
        """
        try:
            space = {k: Dimension.parse(k, v) for k, v in d["space"].items()}
        except UsageError as exc:
            raise CheckpointError(
                f"This search's recorded space is refused now: {exc}. Its finished trials stay "
                "as they are; start a new search with a space in range."
            ) from None
        return cls(**{**d, "base": TrainConfig.from_dict(d["base"]), "space": space})


@dataclass(frozen=True)
class TrialRecord:
    """One trial: its settings over the shared options, and what became of it."""

    name: str  # trial-000: also its run folder's name in the search folder
    params: dict[str, Any]
    status: TrialStatus = "pending"
    epochs: tuple[EpochRow, ...] = ()  # the run's metrics.jsonl
    attempts: tuple[int, ...] = ()  # the epoch each attempt started from (0: from scratch)
    threads: int | None = None  # torch's CPU threads in the trial (bitwise re-runs need them)
    node: str | None = None  # the Ray node the trial last ran on
    error: str | None = None
    baseline: bool = False  # the search's baseline: zoo finetune's own settings

    def config(self, spec: SearchSpec, folder: Path) -> TrainConfig:
        """The trial's training options: the shared ones, its settings, its run folder."""
        run = folder / self.name
        return replace(
            spec.base,
            **self.params,
            runs_root=str(folder),
            name=self.name,
            resume=str(run) if (run / "config.json").exists() else None,
        )

    def best(self, spec: SearchSpec) -> EpochRow | None:
        """The epoch its run ships (the best by the search's metric; the first of equals)."""
        sign = -1 if spec.mode == "min" else 1
        return max(self.epochs, key=lambda r: sign * metric_value(r, spec.metric), default=None)

    def rerun(self, spec: SearchSpec) -> str:
        """The ``zoo finetune`` command that trains this trial again, bitwise on the CPU
        (with the trial's thread count: float sums depend on it)."""
        cfg = replace(spec.base, **self.params).to_dict()
        defaults = option_defaults()
        args = ["zoo", "finetune", cfg.pop("model"), "--data", cfg.pop("data")]
        for key, value in cfg.items():
            if (
                key in _NOT_RERUN
                or value == defaults.get(key, value)
                or key in ("schedule_segments",)
            ):
                continue
            flag = "--" + {"runs_root": "runs"}.get(key, key).replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            else:
                args += [flag, str(value)]
        env = f"OMP_NUM_THREADS={self.threads} " if self.threads else ""
        return env + shlex.join(args)

    def to_dict(self, spec: SearchSpec, folder: Path) -> dict[str, Any]:
        best = self.best(spec)
        return {
            "name": self.name,
            "params": self.params,
            "status": self.status,
            "run": str(folder / self.name),
            "best": best.to_dict() if best else None,
            "epochs": [r.to_dict() for r in self.epochs],
            "attempts": list(self.attempts),
            "threads": self.threads,
            "node": self.node,
            "error": self.error,
            "baseline": self.baseline,
            "rerun": self.rerun(spec),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialRecord:
        return cls(
            name=d["name"],
            params=d["params"],
            status=d["status"],
            epochs=tuple(EpochRow.from_dict(r) for r in d["epochs"]),
            attempts=tuple(d["attempts"]),
            threads=d["threads"],
            node=d["node"],
            error=d["error"],
            baseline=d.get("baseline", False),  # records before baselines lack the key
        )


@dataclass
class SearchBook:
    """The search folder's record, kept in memory by the driver and written at each event."""

    folder: Path
    spec: SearchSpec
    trials: dict[str, TrialRecord] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: Path) -> SearchBook:
        """A search folder's record (``zoo tune --resume``).

        Raises:
            CheckpointError: not a search folder, or a record this zoo cannot read.
        """
        if folder.name == BOOK and folder.is_file():  # the record itself, given for its folder
            folder = folder.parent
        if not folder.exists():
            raise CheckpointError(
                f"{folder} does not exist; give the search folder `zoo tune` printed"
            )
        path = folder / BOOK
        try:
            d = json.loads(path.read_text())
        except (FileNotFoundError, NotADirectoryError):
            raise CheckpointError(
                f"{folder} is not a zoo tune search folder (no {BOOK}); give the folder "
                "`zoo tune` printed"
            ) from None
        except ValueError as exc:
            raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
        if d.get("version") != VERSION:
            raise CheckpointError(f"{path}: version {d.get('version')!r}, this zoo reads {VERSION}")
        trials = (TrialRecord.from_dict(t) for t in d["trials"])
        return cls(folder, SearchSpec.from_dict(d["search"]), {t.name: t for t in trials})

    def run_of(self, name: str) -> Path:
        return self.folder / name

    def complete(self, name: str) -> bool:
        """Whether the trial's run finished (its ``report.json``: the finishing step's commit)."""
        return (self.run_of(name) / "report.json").exists()

    def update(self, name: str, **changes: Any) -> TrialRecord:
        """Apply ``changes``, catch the epochs up with the run folder, and write the record."""
        rec = replace(self.trials[name], **changes)
        metrics = self.run_of(name) / "metrics.jsonl"
        if metrics.exists():
            lines = metrics.read_text().splitlines()
            rec = replace(rec, epochs=tuple(EpochRow.from_dict(json.loads(x)) for x in lines))
        self.trials[name] = rec
        self.write()
        return rec

    def finished(self, name: str) -> TrialRecord:
        """Record a trial whose run finished: ``done`` with every epoch, else ``stopped``
        (by the scheduler)."""
        rec = self.update(name)
        status = "done" if len(rec.epochs) >= self.spec.base.epochs else "stopped"
        return self.update(name, status=status)

    def best(self) -> TrialRecord | None:
        """The trial whose run ships the best metric (of equals, the lower validation loss,
        then the earliest)."""
        scored = [
            (rank(row, self.spec.metric), t)
            for t in self.trials.values()
            if (row := t.best(self.spec)) is not None
        ]
        # max keeps the first of equals: the earliest trial
        return max(scored, key=lambda st: st[0])[1] if scored else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        row = best.best(self.spec) if best else None
        return {
            "version": VERSION,
            "search": self.spec.to_dict(),
            "best": None
            if best is None or row is None
            else {
                "trial": best.name,
                "run": str(self.run_of(best.name)),
                "epoch": row.epoch,
                self.spec.metric: metric_value(row, self.spec.metric),
                "rerun": best.rerun(self.spec),
            },
            "trials": [t.to_dict(self.spec, self.folder) for t in self.trials.values()],
        }

    def write(self) -> None:
        durable.write_json(self.folder / BOOK, self.to_dict(), label=BOOK)


# how far the validation loss may move a rank: under one image of any validation split
# below a million images, so it only ever orders equals
TIE_BREAK = 1e-6


def rank(row: EpochRow, metric: str) -> float:
    """What ASHA and the best trial go by, higher is better: the metric, its equals ordered by
    the lower validation loss. ASHA cannot rank equals: on the photos every trial reached
    100% val/acc and it stopped none (docs/bench/tune_cost.json at 69c0c8d)."""
    value = row.val.monitored(metric)
    if metric == "val/loss":
        return value
    return value - TIE_BREAK * row.val.loss / (1.0 + row.val.loss)


def metric_value(row: EpochRow, metric: str) -> float:
    """The metric's value as measured (``val/loss`` not negated)."""
    value = row.val.monitored(metric)
    return -value if metric == "val/loss" else value
