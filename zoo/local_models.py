"""Fine-tuned variants as registry rows: local runs and pulled Hub folders, with lineage."""

from __future__ import annotations

import json
from pathlib import Path

from zoo.artifact import info_from_config, is_model_folder, read_config
from zoo.catalog import get_entry
from zoo.errors import ZooError
from zoo.metadata import ModelInfo


def _info(folder: Path) -> ModelInfo | None:
    try:
        config = read_config(folder)
        return info_from_config(folder, config, get_entry(config.base).info)
    except (ZooError, OSError, json.JSONDecodeError):
        return None  # not a valid zoo folder: not listed


def unreadable_runs(runs_root: str | Path = "runs") -> list[tuple[str, str]]:
    """(run, what is wrong) for runs under ``runs_root`` whose model folder exists but breaks
    the contract (a stray file, a bad config): listed with the problem, never dropped."""
    root = Path(runs_root)
    if not root.is_dir():
        return []
    found = []
    for run in sorted(root.iterdir()):
        if is_model_folder(run / "model"):
            try:
                config = read_config(run / "model")
                get_entry(config.base)
            except (ZooError, OSError) as exc:
                found.append((str(run), str(exc)))
    return found


def discover(runs_root: str | Path = "runs") -> list[tuple[str, ModelInfo]]:
    """(name to load it by, metadata) for runs under ``runs_root`` and zoo folders in the HF cache."""
    found: list[tuple[str, ModelInfo]] = []
    root = Path(runs_root)
    if root.is_dir():
        for run in sorted(root.iterdir()):
            if is_model_folder(run / "model") and (info := _info(run / "model")):
                found.append((str(run), info))
    try:
        from huggingface_hub import scan_cache_dir

        cache = scan_cache_dir()
    except Exception:  # no cache yet, or an unreadable one: nothing pulled
        return found
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        for rev in repo.revisions:
            snap = Path(rev.snapshot_path)
            if is_model_folder(snap) and (info := _info(snap)):
                found.append((f"hf:{repo.repo_id}@{rev.commit_hash}", info))
    return found
