"""Runs side by side, from their folders alone (no server): what ``zoo runs ls`` and
``zoo runs compare`` print.

A run folder says everything needed: ``config.json`` (what was asked), ``metrics.jsonl`` (each
finished epoch), ``report.json`` (written last: the run is done), ``checkpoints/last.pt`` (an
epoch was committed: a run without a report stopped and can be resumed) and ``tracking.json``
(its MLflow run). Reads JSON only; never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from rich.cells import cell_len, set_cell_size

from zoo.artifact import read_config
from zoo.errors import InputError, UsageError, ZooError
from zoo.tracking import TrackingRecord, read_record
from zoo.train.config import RUNTIME_KEYS
from zoo.train.tune.book import BOOK

RunState = Literal["done", "interrupted", "failed"]
"""``done``: ``report.json`` is written; ``interrupted``: a committed epoch and no report
(``zoo finetune --resume RUN`` goes on); ``failed``: stopped before its first commit."""
CELL_WIDTH = 24
"""The widest value ``zoo runs compare`` prints (``--json`` has them whole)."""
BEST_KEYS = ("val/acc", "val/loss", "val/macro_f1", "val/balanced_acc", "val/top5")
# Keys that name where or how a run ran, not what it learned: never a "difference".
_NOT_COMPARED = RUNTIME_KEYS | {"run_dir", "runs_root"}


@dataclass(frozen=True)
class RunSummary:
    """One run folder, read.

    Attributes:
        path: the run folder.
        config: its ``config.json``.
        state: done, interrupted or failed (:data:`RunState`).
        history: each finished epoch's row (``metrics.jsonl``), epoch 1 first.
        monitor: the metric that picked the best epoch.
        best_epoch: the epoch whose weights ship (None: no epoch finished).
        best: the best epoch's validation metrics (``val/acc``…; the shipped weights' for a
            done run).
        seconds: the epoch loop's time (a done run's report), else the epochs' sum.
        tracking: its MLflow run, if tracked.
        search: the ``zoo tune`` search folder it is a trial of, when listed from the folder
            the search is in (its line names it ``SEARCH/trial-000``).
    """

    path: Path
    config: dict[str, Any]
    state: RunState
    history: tuple[dict[str, Any], ...]
    monitor: str
    best_epoch: int | None
    best: dict[str, float]
    seconds: float
    tracking: TrackingRecord | None
    search: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.search.name}/{self.path.name}" if self.search else self.path.name

    @property
    def arch(self) -> str:
        """The architecture: the run's model folder's (finished), else that of the run or
        model folder it started from, else the registry name it was given."""
        given = str(self.config.get("model", "?"))
        for folder in (self.path / "model", Path(given) / "model", Path(given)):
            try:
                arch = read_config(folder).arch
            except (ZooError, OSError):  # absent, torn, not a model folder
                continue
            if arch:
                return arch
        return given.rstrip("/").split("/")[-1]

    @property
    def data(self) -> str:
        return Path(str(self.config.get("data", "?"))).name

    @property
    def epochs(self) -> str:
        """``finished/planned``, e.g. ``3/5``."""
        return f"{len(self.history)}/{self.config.get('epochs', '?')}"

    @property
    def best_value(self) -> float | None:
        return self.best.get(self.monitor)

    def line(self) -> str:
        """One line of ``zoo runs ls``."""
        value = "-" if self.best_value is None else f"{self.best_value:.4f}"
        at = f" (epoch {self.best_epoch})" if self.best_epoch else ""
        return (
            f"{_pad(self.name, 24, left=True)} {_pad(self.arch, 18, left=True)} "
            f"{_pad(self.data, 14, left=True)} {self.monitor} {value}{at:<11} "
            f"epochs {self.epochs:<7} {_duration(self.seconds):>7}  {self.state}"
            + ("  [mlflow]" if self.tracking else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": str(self.path),
            "arch": self.arch,
            "data": self.data,
            "state": self.state,
            "epochs": len(self.history),
            "epochs_planned": self.config.get("epochs"),
            "monitor": self.monitor,
            "best_epoch": self.best_epoch,
            "best": self.best,
            "seconds": round(self.seconds, 2),
            "tracking": self.tracking.to_dict() if self.tracking else None,
            "search": str(self.search) if self.search else None,
        }


def is_run(path: Path) -> bool:
    """A zoo run folder: it has ``config.json`` and ``checkpoints/``."""
    return (path / "config.json").is_file() and (path / "checkpoints").is_dir()


def read_run(path: Path) -> RunSummary:
    """Read a run folder.

    Raises:
        InputError: ``path`` is not a zoo run folder (named, with what one holds).
    """
    path = Path(path)
    if not is_run(path):
        raise InputError(
            f"{path} is not a zoo run folder (one holds config.json and checkpoints/, as "
            "`zoo finetune` writes under runs/): `zoo runs ls` lists them."
        )
    config = json.loads((path / "config.json").read_text())
    jsonl = path / "metrics.jsonl"
    history = tuple(
        json.loads(line)
        for line in (jsonl.read_text().splitlines() if jsonl.is_file() else [])
        if line.strip()
    )
    monitor = config.get("monitor") or ("val/macro_f1" if config.get("multi_label") else "val/acc")
    report_path = path / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    if report is not None:
        state: RunState = "done"
        best_epoch = report["best"].get("epoch")
        best = {k: float(v) for k, v in report["best"].items() if k in BEST_KEYS and v is not None}
        seconds = float(report.get("timing", {}).get("total_s", 0.0))
    else:
        state = "interrupted" if (path / "checkpoints" / "last.pt").is_file() else "failed"
        best_row = _best_row(history, monitor)
        best_epoch = int(best_row["epoch"]) if best_row else None
        best = {
            k: float(best_row[k]) for k in BEST_KEYS if best_row and best_row.get(k) is not None
        }
        seconds = sum(float(r.get("epoch_s", 0.0)) for r in history)
    return RunSummary(
        path, config, state, history, monitor, best_epoch, best, seconds, read_record(path)
    )


def _best_row(history: tuple[dict[str, Any], ...], monitor: str) -> dict[str, Any] | None:
    """The first epoch with the best ``monitor`` (an EMA's score counts, as the loop judged)."""
    sign = -1.0 if monitor == "val/loss" else 1.0

    def score(row: dict[str, Any]) -> float:
        values = [row.get(monitor), row.get(f"ema/{monitor}")]
        return max((sign * float(v) for v in values if v is not None), default=float("-inf"))

    return max(history, key=score, default=None)  # max keeps the first of equals


def is_search(path: Path) -> bool:
    """A ``zoo tune`` search folder: it holds the search's record (``tune.json``) beside its
    trials' run folders."""
    return (path / BOOK).is_file()


def list_runs(root: Path) -> list[RunSummary]:
    """Every run folder directly under ``root`` (or ``root`` itself), by name; a ``zoo tune``
    search folder under ``root`` lists its trials' run folders in its place (one level down,
    each named ``SEARCH/trial-000``).

    Raises:
        InputError: ``root`` is not a folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(
            f"{root} is not a folder: give the folder the runs are in (zoo finetune --runs DIR; "
            "default runs/)."
        )
    if is_run(root):
        return [read_run(root)]
    found = []
    for p in sorted(root.iterdir()):
        if p.is_dir() and is_run(p):
            found.append(read_run(p))
        elif p.is_dir() and is_search(p):
            found += [
                replace(read_run(t), search=p)
                for t in sorted(p.iterdir())
                if t.is_dir() and is_run(t)
            ]
    return found


@dataclass(frozen=True)
class Comparison:
    """Runs side by side: the config keys whose values differ, and the best metrics."""

    runs: tuple[RunSummary, ...]
    differences: dict[str, tuple[Any, ...]]  # key → each run's value, in the runs' order

    def lines(self) -> list[str]:
        """The table ``zoo runs compare`` prints: one column a run, each value at most
        :data:`CELL_WIDTH` terminal columns wide (a wide character takes two; a longer value ends
        in ``…``), two spaces between."""
        width = min(CELL_WIDTH, max(12, *(cell_len(r.name) for r in self.runs)))

        def row(label: str, values: Any) -> str:
            return f"  {_pad(label, 20, left=True)}" + "".join(
                f"  {_fit(_cell(v), width)}" for v in values
            )

        head = f"{'':<22}" + "".join(f"  {_fit(r.name, width)}" for r in self.runs)
        rows = [head, "config that differs:" if self.differences else "config: the same"]
        for key, values in self.differences.items():
            rows.append(row(key, values))
        rows.append("best (the shipped epoch):")
        keys = [k for k in BEST_KEYS if any(k in r.best for r in self.runs)]
        for key in keys:
            rows.append(row(key, [r.best.get(key) for r in self.runs]))
        for label, get in (
            ("best epoch", lambda r: r.best_epoch),
            ("epochs", lambda r: r.epochs),
            ("time", lambda r: _duration(r.seconds)),
            ("state", lambda r: r.state),
        ):
            rows.append(row(label, [get(r) for r in self.runs]))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [r.to_dict() for r in self.runs],
            "differences": {k: list(v) for k, v in self.differences.items()},
        }


def compare_runs(paths: list[Path]) -> Comparison:
    """Read the runs and find the config keys whose values differ among them.

    Raises:
        UsageError: fewer than two runs, or one run given twice.
        InputError: a path that is not a run folder.
    """
    if len(paths) < 2:
        raise UsageError(
            "compare needs two runs or more: zoo runs compare RUN_A RUN_B [...]",
            param_hint="RUNS",
        )
    twice = [
        p
        for i, p in enumerate(paths)
        if Path(p).resolve() in {Path(q).resolve() for q in paths[:i]}
    ]
    if twice:
        raise UsageError(
            f"{twice[0]} is given twice: compare different runs (zoo runs ls lists them).",
            param_hint="RUNS",
        )
    runs = tuple(read_run(p) for p in paths)
    keys = dict.fromkeys(k for r in runs for k in r.config if k not in _NOT_COMPARED)
    differences = {
        k: tuple(r.config.get(k) for r in runs)
        for k in keys
        if len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1
    }
    return Comparison(runs, differences)


def plot_comparison(comparison: Comparison, out: Path) -> Path:
    """The runs' validation curves in one PNG (:func:`zoo.train.plots.plot_runs_curves`).

    Raises:
        UsageError: ``out`` is not a ``.png`` file.
    """
    from zoo.train.plots import plot_runs_curves

    check_plot_path(out)
    plot_runs_curves([(r.name, list(r.history)) for r in comparison.runs], out)
    return out


def check_plot_path(out: Path) -> None:
    """Refuse a ``--plot`` file that is not a PNG (checked before any work).

    Raises:
        UsageError: ``out``'s suffix is not ``.png``.
    """
    if Path(out).suffix.lower() != ".png":
        raise UsageError(
            f"--plot {out}: the curves are drawn as a PNG: give a file ending in .png.",
            param_hint="--plot",
        )


def _pad(text: str, width: int, *, left: bool = False) -> str:
    """``text`` padded to ``width`` terminal cells (rich's ``cell_len``: a CJK character takes
    two, so ``str`` padding would misalign the columns), right-aligned unless ``left``."""
    pad = " " * max(0, width - cell_len(text))
    return text + pad if left else pad + text


def _fit(text: str, width: int) -> str:
    """:func:`_pad` to ``width`` cells, right-aligned; a longer text cut to end in ``…``."""
    if cell_len(text) > width:
        text = set_cell_size(text, width - 1).rstrip() + "…"
    return _pad(text, width)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


__all__ = [
    "BEST_KEYS",
    "Comparison",
    "RunState",
    "RunSummary",
    "check_plot_path",
    "compare_runs",
    "is_run",
    "is_search",
    "list_runs",
    "plot_comparison",
    "read_run",
]
