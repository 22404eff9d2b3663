"""The run folder: ``runs/<name>/`` with config, split, classes, metrics (CSV + JSONL),
TensorBoard events, checkpoints, the model folder, the report and plots."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from zoo.artifact import write_json
from zoo.train.checkpoint import save_checkpoint
from zoo.train.config import TrainConfig


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._tb: Any = None

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    @property
    def tb(self) -> Any:
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tensorboard"))
        return self._tb

    def log_epoch(
        self,
        row: dict[str, Any],
        val: dict[str, Any],
        *,
        keep_top_k: int,
        state: Callable[[], dict[str, Any]],
    ) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        csv_path = self.path / "metrics.csv"
        new = not csv_path.exists()
        with open(csv_path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            if new:
                w.writeheader()
            w.writerow(row)
        for k, v in row.items():
            if isinstance(v, int | float) and k not in ("epoch", "step"):
                self.tb.add_scalar(k, v, row["epoch"])
        self.tb.flush()
        if keep_top_k > 0:
            self._keep_top_k(row, keep_top_k, state)

    def _keep_top_k(self, row: dict[str, Any], k: int, state: Callable[[], dict[str, Any]]) -> None:
        ckpts = self.path / "checkpoints"
        name = f"epoch{row['epoch']:03d}-acc{row['val/acc']:.4f}.pt"
        existing = sorted(ckpts.glob("epoch*-acc*.pt"), key=lambda p: float(p.stem.split("acc")[1]))
        if len(existing) < k or float(existing[0].stem.split("acc")[1]) < row["val/acc"]:
            save_checkpoint(state(), ckpts / name)
            existing = sorted(
                ckpts.glob("epoch*-acc*.pt"), key=lambda p: float(p.stem.split("acc")[1])
            )
            for p in existing[: max(0, len(existing) - k)]:
                p.unlink()

    def log_grad_norms(self, model: nn.Module, step: int) -> None:
        for name, p in model.named_parameters():
            if p.grad is not None:
                self.tb.add_scalar(f"grad_norm/{name}", float(p.grad.detach().norm()), step)


def _auto_name(cfg: TrainConfig) -> str:
    arch = cfg.model.rstrip("/").split("/")[-1].split(".")[0].replace(":", "_")
    return f"{arch}-{Path(cfg.data).resolve().name}"


def create_run_dir(cfg: TrainConfig, *, is_main: bool, world: int) -> RunDir:
    """``runs/<name>``, ``runs/<name>-2``, … (the first free one). Under DDP rank 0 picks
    the name and the others wait for its config.json."""
    root = Path(cfg.runs_root)
    base = cfg.name or _auto_name(cfg)
    if world > 1:
        import torch.distributed as dist

        holder: list[Any] = [None]
        if is_main:
            holder[0] = str(_first_free(root, base))
        dist.broadcast_object_list(holder, src=0)
        path = Path(holder[0])
    else:
        path = _first_free(root, base)
    run = RunDir(path)
    if is_main:
        (path / "checkpoints").mkdir(parents=True, exist_ok=True)
        cfg.run_dir = str(path)
        write_json(run.config_path, cfg.to_dict())
    return run


def _first_free(root: Path, base: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    i = 1
    while True:
        path = root / (base if i == 1 else f"{base}-{i}")
        try:
            os.mkdir(path)  # atomic: two runs never share a folder
            return path
        except FileExistsError:
            i += 1
