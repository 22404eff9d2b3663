"""``--resume RUN_DIR``: the run's own configuration and last checkpoint, refusing changes the
user typed, and ``--extend N`` as an explicit new schedule segment."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zoo import durable
from zoo.errors import CheckpointError
from zoo.train.checkpoint import load_checkpoint
from zoo.train.config import RUNTIME_KEYS, TrainConfig
from zoo.train.console import say
from zoo.train.run_dir import RunDir, hold_run

STAT_KEYS = ("loss", "correct", "n")  # an epoch's running sums, per rank


def prepare_resume(
    cfg: TrainConfig, explicit: frozenset[str]
) -> tuple[TrainConfig, RunDir, dict[str, Any] | None]:
    """(the run's config with runtime options applied, its folder, its last checkpoint — None
    when the run was killed before its first one: it then starts over in the same folder).

    Raises:
        CheckpointError: not a run folder, a changed option, or a run that already finished.
    """
    path = Path(cfg.resume or "")
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path} is not a zoo run folder (no config.json).")
    saved = TrainConfig.from_dict(json.loads((path / "config.json").read_text()))
    run = RunDir(path, top_k=saved.top_k_checkpoints)
    hold_run(path)  # before anything reads or repairs it: one process trains a run
    # Only what the user typed is compared; everything else comes from the run itself.
    before, asked = saved.to_dict(), cfg.to_dict()
    diff = {
        k: (before.get(k), asked[k])
        for k in explicit
        if k in asked and k not in RUNTIME_KEYS and before.get(k) != asked[k]
    }
    if diff:
        lines = ", ".join(f"{k}: run has {a!r}, asked {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(
            f"--resume refuses a changed configuration ({lines}). Resume with the same "
            "settings, use --extend N to add epochs, or start a new run."
        )
    saved = replace(saved, resume=str(run.path), num_workers=cfg.num_workers, progress=cfg.progress)
    state = load_checkpoint(run.last_path) if run.last_path.exists() else None
    if state is None:
        if cfg.extend:
            raise CheckpointError(
                f"Run {run.path} has no checkpoint yet, so there is nothing to extend: resume it "
                "without --extend first."
            )
        return saved, run, None
    if cfg.extend:
        segment = {
            "from_step": int(state["global_step"]),
            "epochs": cfg.extend,
            "kind": "cosine",
            "peak_scale": 0.1,
        }
        saved = replace(
            saved,
            schedule_segments=(*saved.schedule_segments, segment),
            epochs=saved.epochs + cfg.extend,
        )
        say(
            f"extending the run by {cfg.extend} epoch(s) to {saved.epochs}; the new schedule is "
            "recorded in config.json"
        )
    segments = saved.schedule_segments
    if (
        state.get("stopped")
        and len(segments) > 1
        and segments[-1]["from_step"] >= state["global_step"]
    ):
        state["stopped"] = False  # an extension recorded after the early stop overrides it
    done = state["epoch"] >= saved.epochs or bool(state.get("stopped"))
    if done and _finished(run, state):
        raise CheckpointError(
            f"Run {run.path} already finished ({state['epoch']} of {saved.epochs} epochs"
            f"{', stopped early' if state.get('stopped') else ''}). Use --extend N to train longer."
        )
    return saved, run, state


def repair_run(
    run: RunDir,
    cfg: TrainConfig,
    state: dict[str, Any] | None,
    *,
    extended: bool,
    is_main: bool,
    world: int,
) -> None:
    """Once the resumed state is restored: record an ``--extend`` (``extended``) in the run's
    config.json, and (rank 0) make the folder what its last commit implies
    (:meth:`RunDir.recover`)."""
    if extended:
        if world > 1:
            dist.barrier()  # every rank has read the run's config before rank 0 rewrites it
        if is_main:  # the new schedule segment and epoch count
            durable.write_json(run.config_path, cfg.to_dict(), label="config.json")
    if state is None:
        say(f"resuming {run.path} from its start: it stopped before its first checkpoint")
    if is_main:
        stale = run.recover(state)
        if stale:
            say(f"removed {len(stale)} temporary file(s) a killed process left in {run.path}")


def _finished(run: RunDir, state: dict[str, Any]) -> bool:
    """Whether the finishing step (model folder, then report.json naming the checkpoint it
    finished, as its commit) completed for this checkpoint; if not, resuming finishes it."""
    try:
        report = run.read_json("report.json")
    except (OSError, ValueError):
        return False
    if "global_step" not in report:  # a run from before report.json named its checkpoint
        return (run.path / "model").exists()
    return bool(report["global_step"] == state["global_step"])


def gather_epoch_stats(
    stats: dict[str, Any], world: int, device: torch.device
) -> list[dict[str, Any]]:
    """Every rank's running sums of the epoch so far, for the checkpoint. A collective under
    DDP: every rank saves at the same step."""
    if world == 1:
        return [dict(stats)]
    mine = torch.tensor([float(stats[k]) for k in STAT_KEYS], dtype=torch.float64, device=device)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine)
    return [{"loss": float(r[0]), "correct": int(r[1]), "n": int(r[2])} for r in rows]


def own_epoch_stats(
    saved: list[dict[str, Any]] | dict[str, Any], rank: int, world: int
) -> dict[str, Any]:
    """This rank's running sums from a checkpoint: its own row when the world size is the
    same (the epoch's totals then add up in the same order as without the interruption);
    otherwise rank 0 takes their sum and the others start from zero."""
    rows = saved if isinstance(saved, list) else [saved]  # a checkpoint from before per-rank sums
    if len(rows) == world:
        return dict(rows[rank])
    if rank > 0:
        return {"loss": 0.0, "correct": 0, "n": 0}
    return {k: sum(r[k] for r in rows) for k in STAT_KEYS}
