"""``--resume RUN_DIR``: the run's own configuration and last checkpoint, refusing changes the
user typed, and ``--extend N`` as an explicit new schedule segment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.errors import CheckpointError
from zoo.train.checkpoint import load_checkpoint
from zoo.train.config import RUNTIME_KEYS, TrainConfig
from zoo.train.console import say
from zoo.train.run_dir import RunDir


def prepare_resume(
    cfg: TrainConfig, explicit: frozenset[str]
) -> tuple[TrainConfig, RunDir, dict[str, Any]]:
    """(the run's config with runtime options applied, its folder, its last checkpoint)."""
    run = RunDir(Path(cfg.resume or ""))
    if not run.config_path.exists():
        raise CheckpointError(f"{run.path} is not a zoo run folder (no config.json).")
    saved = TrainConfig.from_dict(run.read_json("config.json"))
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
    saved.resume, saved.num_workers, saved.progress = str(run.path), cfg.num_workers, cfg.progress
    state = load_checkpoint(run.path / "checkpoints" / "last.pt")
    if cfg.extend:
        saved.schedule_segments.append(
            {
                "from_step": int(state["global_step"]),
                "epochs": cfg.extend,
                "kind": "cosine",
                "peak_scale": 0.1,
            }
        )
        saved.epochs += cfg.extend
        say(
            f"extending the run by {cfg.extend} epoch(s) to {saved.epochs}; the new schedule is "
            "recorded in config.json"
        )
    elif state["epoch"] >= saved.epochs and (run.path / "model").exists():
        # (epochs done but no model/: the run died while finishing; resuming finishes it)
        raise CheckpointError(
            f"Run {run.path} already finished its {saved.epochs} epochs. Use --extend N to train longer."
        )
    return saved, run, state
