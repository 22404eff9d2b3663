"""End of a run: best weights → plots, the ``model/`` artifact folder and ``report.json``.

Order for crash consistency: the plots (each atomic), then ``model/`` (built in a hidden
folder and swapped in whole: a kill leaves the old complete folder, none, or the new one),
then ``report.json``, the finishing step's commit. It names the checkpoint it finished
(``global_step``); ``--resume`` finishes any run whose report does not.
"""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING, Any

from zoo import durable
from zoo.artifact import save_model_folder
from zoo.cards import finetuned_card
from zoo.train.plots import plot_confusion, plot_curves
from zoo.weights import sha256_file

if TYPE_CHECKING:
    from zoo.train.trainer import Trainer


def model_config(t: Trainer, val: dict[str, Any]) -> dict[str, Any]:
    """config.json of the model folder: architecture, classes, preprocessing, lineage, metrics."""
    entry, parent_folder = t.parent
    base = entry.info.parent if parent_folder is not None else entry.info.name
    lineage = [entry.info.parent or entry.info.name]
    parent_weights = entry.info.weights
    if parent_folder is not None:
        from zoo.artifact import read_config

        pc = read_config(parent_folder)
        lineage = [*pc.get("lineage", [pc["base"]]), pc.get("tag") or parent_folder.name]
    return {
        "base": base,
        "arch": t.info.arch,
        "tag": f"ft-{t.run.path.name}",
        "num_classes": len(t.classes),
        "class_names": t.classes,
        "multi_label": t.cfg.multi_label,
        "thresholds": val.get("thresholds"),
        "params": sum(p.numel() for p in t.model.parameters()),
        "preprocessing": t.info.preprocessing().to_dict(),
        "parent_weights": parent_weights.describe() if t.load_report else "random initialisation",
        "parent_weights_sha256": parent_weights.sha256,
        "lineage": lineage,
        "data": {
            "name": t.splits.root.name,
            "fingerprint": t.splits.fingerprint(),
            "num_images": sum(len(v) for v in t.samples.values()),
            "layout": t.splits.layout,
        },
        "metrics": {
            "val/acc": round(val["acc"], 6),
            **({"val/top5": round(val["top5"], 6)} if "top5" in val else {}),
            "val/loss": round(val["loss"], 6),
            "val/macro_f1": round(val["macro_f1"], 6),
        },
        "train": {
            "strategy": t.cfg.strategy,
            "epochs": t.epoch,
            "optimizer": t.cfg.optimizer,
            "lr": t.cfg.lr,
            "batch_size": t.cfg.batch_size,
            "seed": t.cfg.seed,
            "world_size": t.world,
        },
    }


def finish_run(t: Trainer, val: dict[str, Any], total_s: float, estimate: dict[str, Any]) -> None:
    """Rank 0 only: write what the run produced (``val``: the shipped weights' metrics)."""
    last_val = t.history[-1] if t.history else {}
    config = model_config(t, val)
    from dataclasses import replace

    from zoo.metadata import WeightSource

    info = replace(
        t.info, tag=config["tag"], parent=config["base"], weights=WeightSource(kind="local")
    )
    card = finetuned_card(info, config)
    run = t.run.path
    if t.history:
        plot_curves(t.history, run / "curves.png")
    if "confusion_matrix" in val:  # single-label only
        plot_confusion(val["confusion_matrix"], t.classes, run / "confusion_matrix.png")
    model_dir = run / "model"
    staging = durable.temp_path(model_dir, folder=True)
    try:
        built = save_model_folder(t.model, staging / "model", config, str(card))
        weights_sha256 = sha256_file(built / "model.safetensors")
        durable.replace_dir(built, model_dir, label="model")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report = {
        "run": str(run),
        "model_dir": str(model_dir),
        "weights_sha256": weights_sha256,
        "epochs": t.epoch,
        "global_step": t.global_step,  # the checkpoint this report finished (see --resume)
        "final": {
            k: last_val.get(k)
            for k in ("val/acc", "val/loss", "val/top5", "train/acc", "train/loss")
        },
        "best": {
            "epoch": t.epoch - t.epochs_since_best,
            "val/acc": val["acc"],
            "val/top5": val.get("top5"),
            "val/loss": val["loss"],
            "val/macro_f1": val["macro_f1"],
            "monitor": t.cfg.monitor,
        },
        "per_class": val["per_class"],
        "confusion_matrix": val.get("confusion_matrix"),
        "thresholds": val.get("thresholds"),
        "classes": t.classes,
        "quarantined": t.check_report.corrupt,
        "data_check": t.check_report.to_dict(),
        "nonfinite_skipped": t.nonfinite_skipped,
        "rollbacks": t.rollbacks,
        "timing": {
            "total_s": round(total_s, 2),
            "estimate": estimate,
            "epochs": [round(h["epoch_s"], 2) for h in t.history],
        },
        "load_report": t.load_report.to_dict() if t.load_report else None,
    }
    durable.write_json(run / "report.json", report, label="report.json")
    print(f"done: val acc {val['acc']:.4f} (best) → {model_dir}", file=sys.stderr, flush=True)
