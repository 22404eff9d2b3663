"""The run folder: ``runs/<name>/`` with config, split, classes, metrics (CSV + JSONL),
TensorBoard events, checkpoints, the model folder, the report and plots.

Crash consistency, by design: ``checkpoints/last.pt`` is the run's commit point. It is
written atomically, last, and carries everything the rest is derived from (the metrics rows
in ``history``, whether the epoch was the best, the early stop). After a commit at an epoch's
end, ``best.pt`` and the top-k checkpoints are byte copies of it and the metrics files are
rewritten from its history; :meth:`RunDir.recover` redoes exactly that on resume, so a kill
between the commit and those writes loses nothing. TensorBoard scalars are written and
flushed *before* the commit; a resumed writer opens with ``purge_step`` at the first
uncommitted epoch (step), so TensorBoard drops whatever a killed attempt wrote past the commit.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from zoo import durable
from zoo.errors import CheckpointError
from zoo.train.checkpoint import save_checkpoint
from zoo.train.config import TrainConfig

TB_DIR = "tensorboard"
GRAD_DIR = "grad_norms"  # its own TensorBoard run: global steps, not epochs, on the x axis
TOP_K_GLOB = "epoch*-acc*.pt"


def top_k_rows(history: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The epochs whose checkpoints ``--top-k-checkpoints k`` keeps, from the history alone.

    An epoch enters while fewer than ``k`` are kept or when its ``val/acc`` beats the lowest
    kept one; then the lowest goes (among equals, the newest: the earliest stays).
    """
    kept: list[dict[str, Any]] = []
    for row in history if k > 0 else []:
        if len(kept) < k or min(r["val/acc"] for r in kept) < row["val/acc"]:
            kept.append(row)
        if len(kept) > k:
            kept.remove(min(kept, key=lambda r: (r["val/acc"], -r["epoch"])))
    return kept


def top_k_name(row: dict[str, Any]) -> str:
    return f"epoch{row['epoch']:03d}-acc{row['val/acc']:.4f}.pt"


def metrics_files(history: list[dict[str, Any]]) -> dict[str, str]:
    """``metrics.jsonl`` and ``metrics.csv``: one row per finished epoch."""
    table = io.StringIO()
    columns = list(dict.fromkeys(k for row in history for k in row))  # first seen, first
    writer = csv.DictWriter(table, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    return {
        "metrics.jsonl": "".join(json.dumps(row) + "\n" for row in history),
        "metrics.csv": table.getvalue(),
    }


def at_epoch_end(state: dict[str, Any]) -> bool:
    """Whether a checkpoint is an epoch's commit (not a ``--save-every-steps`` save)."""
    return int(state["epoch"]) > 0 and int(state["step_in_epoch"]) == 0


class RunDir:
    def __init__(self, path: Path, *, top_k: int = 0) -> None:
        self.path = path
        self.top_k = top_k
        self._writers: dict[str, Any] = {}
        self._purge: dict[str, int] = {}
        self._pending: list[tuple[str, str, float, int]] = []  # (writer, tag, value, step)

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def last_path(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    @property
    def best_path(self) -> Path:
        return self.path / "checkpoints" / "best.pt"

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    # ---------------------------------------------------------------- TensorBoard
    def _writer(self, name: str) -> Any:
        if name not in self._writers:
            from torch.utils.tensorboard import SummaryWriter

            logdir = self.path / TB_DIR / (GRAD_DIR if name == "grad" else "")
            purge = self._purge.pop(name, None)
            if purge is not None:
                _wait_past_event_files(logdir)
            self._writers[name] = SummaryWriter(str(logdir), purge_step=purge)
        return self._writers[name]

    def log_epoch_scalars(self, row: dict[str, Any]) -> None:
        """Queue the epoch's scalars; they reach TensorBoard just before the epoch's commit."""
        for k, v in row.items():
            if isinstance(v, int | float) and k not in ("epoch", "step"):
                self._pending.append(("epoch", k, float(v), int(row["epoch"])))

    def log_grad_norms(self, model: nn.Module, step: int) -> None:
        for name, p in model.named_parameters():
            if p.grad is not None:
                norm = float(p.grad.detach().norm())
                self._pending.append(("grad", f"grad_norm/{name}", norm, step))

    def drop_pending(self) -> None:
        """A rollback: scalars logged since the last commit are logged again by the replay."""
        self._pending.clear()

    def _flush_scalars(self) -> None:
        if not self._pending:
            return
        for writer, tag, value, step in self._pending:
            self._writer(writer).add_scalar(tag, value, step)
        self._pending.clear()
        durable.inside()  # events queued, some perhaps written: a torn TensorBoard write
        for w in self._writers.values():
            w.flush()
        durable.boundary(TB_DIR)

    def close(self) -> None:
        self._flush_scalars()
        for w in self._writers.values():
            w.close()
        self._writers.clear()

    # ---------------------------------------------------------------- the commit point
    def commit(self, state: dict[str, Any]) -> None:
        """Scalars, then ``last.pt`` (the commit), then what derives from it."""
        self._flush_scalars()
        save_checkpoint(state, self.last_path)
        if at_epoch_end(state):
            self.derive(state)

    def derive(self, state: dict[str, Any]) -> None:
        """Everything a committed ``last.pt`` implies; idempotent (rerun on resume)."""
        ckpts, history = self.path / "checkpoints", state["history"]
        if at_epoch_end(state) and state["best"] is not None and state["epochs_since_best"] == 0:
            durable.copy_file(self.last_path, self.best_path, label="checkpoints/best.pt")
        kept = [top_k_name(r) for r in top_k_rows(history, self.top_k)]
        if at_epoch_end(state) and top_k_name(history[-1]) in kept:
            name = top_k_name(history[-1])
            durable.copy_file(self.last_path, ckpts / name, label=f"checkpoints/{name}")
        for p in sorted(ckpts.glob(TOP_K_GLOB)):
            if p.name not in kept:
                durable.remove(p, label=f"checkpoints/{p.name}")
        for name, text in (metrics_files(history) if history else {}).items():
            path = self.path / name
            if not path.exists() or path.read_bytes() != text.encode():
                durable.write_text(path, text, label=name)

    def recover(self, state: dict[str, Any] | None) -> list[Path]:
        """On resume: remove what a killed process left half-done, redo what the last
        commit implies, and have TensorBoard forget scalars logged past that commit.

        Returns:
            The stale temporary files and folders removed.
        """
        stale = durable.remove_stale_temps(self.path)
        if state is not None:
            self.derive(state)
        epochs_done = len(state["history"]) if state else 0
        self._purge = {"epoch": epochs_done + 1, "grad": int(state["global_step"]) if state else 0}
        for name, sub in (("epoch", ""), ("grad", GRAD_DIR)):
            if (self.path / TB_DIR / sub).is_dir():
                self._writer(name)  # writes the purge marker now
        return stale


def _wait_past_event_files(logdir: Path) -> None:
    """TensorBoard reads a run's event files in name order, and names start with the
    creation second: a purging writer must not share its second with an older file."""
    stamps = []
    for p in logdir.glob("events.out.tfevents.*"):
        parts = p.name.split(".")
        if len(parts) > 3 and parts[3].isdigit():
            stamps.append(int(parts[3]))
    while stamps and time.time() < max(stamps) + 1:
        time.sleep(0.05)


LOCK_FILE = ".zoo-run.lock"
"""Locked (``flock``) by the process training into the run: a second ``--resume`` of a run in
training is refused. The OS drops the lock when that process ends, ``kill -9`` included."""
_held: dict[Path, Any] = {}  # run → this process's lock (one fit() at a time holds it)


def hold_run(path: Path) -> None:
    """Lock ``path`` for this process until :func:`release_runs` (or the process ends); under
    torchrun rank 0 holds it for the group (the ranks of one run are one trainer).

    Raises:
        CheckpointError: another process is training into the run.
    """
    from filelock import FileLock, Timeout

    key = path.resolve()
    if key in _held or int(os.environ.get("RANK", "0")) != 0:
        return
    lock = FileLock(key / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise CheckpointError(
            f"{path} is being trained by another process (the run itself, or another "
            "--resume of it): wait for it to finish or stop it, then resume. Two processes "
            "writing one run would mix their checkpoints and metrics."
        ) from None
    _held[key] = lock


def release_runs() -> None:
    """Release every run this process holds (:func:`zoo.train.fit` ends: trained or not)."""
    while _held:
        _held.popitem()[1].release()


def _auto_name(cfg: TrainConfig) -> str:
    arch = cfg.model.rstrip("/").split("/")[-1].split(".")[0].replace(":", "_")
    if cfg.distill is not None and cfg.distill.qat:  # the same model: runs/digits → digits-qat
        return f"{arch}-qat"
    return f"{arch}-{Path(cfg.data).resolve().name}"


def publish_run_dir(cfg: TrainConfig, files: dict[str, Any]) -> Path:
    """Create ``runs/<name>`` (or ``<name>-2``, … the first free one) complete or not at all,
    held by this process (:func:`hold_run`).

    ``config.json`` (with ``run_dir`` set) and ``files`` (name → JSON value, e.g. the split)
    are written into a hidden temporary folder that is then renamed into place.

    Returns:
        The run folder.
    """
    root = Path(cfg.runs_root)
    base = cfg.name or _auto_name(cfg)
    root.mkdir(parents=True, exist_ok=True)
    tmp = durable.temp_path(root / base, folder=True)
    try:
        (tmp / "checkpoints").mkdir()
        for name, value in files.items():
            (tmp / name).write_text(json.dumps(value, indent=2) + "\n")
        i = 1
        while True:
            path = root / (base if i == 1 else f"{base}-{i}")
            if not path.exists():
                config = replace(cfg, run_dir=str(path)).to_dict()
                (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
                if durable.publish_dir(tmp, path, label="."):
                    hold_run(path)  # (rank 0 publishes) before any other process can resume it
                    return path
            i += 1
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
