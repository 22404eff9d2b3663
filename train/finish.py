"""End of a run: best weights → plots, the ``model/`` artifact folder and ``report.json``.

Order for crash consistency: the plots (each atomic), then ``model/`` (built in a hidden
folder and swapped in whole: a kill leaves the old complete folder, none, or the new one),
then ``report.json``, the finishing step's commit. It names the checkpoint it finished
(``global_step``); ``--resume`` finishes any run whose report does not.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from zoo import durable
from zoo.artifact import WEIGHTS_FILE, save_model_folder
from zoo.cards import finetuned_card
from zoo.metadata import WeightSource
from zoo.model_config import ModelConfig
from zoo.profile import count_gflops
from zoo.train.plots import plot_confusion, plot_curves
from zoo.train.recipes import policy_string
from zoo.weights import sha256_file

if TYPE_CHECKING:
    from zoo.calibration import Calibration
    from zoo.knn import KnnBank
    from zoo.train.build import RunData, RunParts
    from zoo.train.config import TrainConfig
    from zoo.train.run_dir import RunDir
    from zoo.train.state import LoopState


@dataclass(frozen=True)
class RunResult:
    """What a finished loop hands to :func:`finish_run`."""

    parts: RunParts  # the model holds the best weights (the ones shipped)
    run: RunDir
    val: dict[str, Any]  # the shipped weights' validation metrics (per class too)
    total_s: float  # the epoch loop's wall-clock time (a resumed run's earlier epochs added)
    estimate: dict[str, Any]  # the preflight's

    @property
    def cfg(self) -> TrainConfig:
        return self.parts.cfg

    @property
    def data(self) -> RunData:
        return self.parts.data

    @property
    def state(self) -> LoopState:
        return self.parts.state


def model_config(r: RunResult, calibration: Calibration | None = None) -> ModelConfig:
    """config.json of the model folder: architecture, classes, preprocessing, lineage, metrics,
    and the calibration fitted on validation (None: multi-label, whose thresholds are its own)."""
    parts, val = r.parts, r.val
    entry, parent_folder = parts.parent
    base = entry.info.parent if parent_folder is not None else entry.info.name
    lineage = [entry.info.parent or entry.info.name]
    parent_weights = entry.info.weights
    if parent_folder is not None:
        from zoo.artifact import read_config

        pc = read_config(parent_folder)
        lineage = [*pc.lineage, pc.tag or parent_folder.name]
    splits = r.data.splits
    config = {
        "base": base,
        "arch": parts.info.arch,
        "tag": f"ft-{r.run.path.name}",
        "num_classes": len(r.data.classes),
        "class_names": r.data.classes,
        "multi_label": r.cfg.multi_label,
        "thresholds": val.get("thresholds"),
        "calibration": calibration.to_dict() if calibration is not None else None,
        "params": sum(p.numel() for p in parts.model.parameters()),
        # measured at the run's own input size (--image-size), not the registry's 224 px
        "gflops": float(f"{count_gflops(parts.model, parts.info.input_size):.6g}"),
        "preprocessing": parts.info.preprocessing().to_dict(),
        "parent_weights": parent_weights.describe()
        if parts.load_report
        else "random initialisation",
        "parent_weights_sha256": parent_weights.sha256,
        "lineage": lineage,
        "data": {
            "name": splits.root.name,
            "fingerprint": splits.fingerprint(),
            "num_images": sum(len(v) for v in r.data.samples.values()),
            "layout": splits.layout,
        },
        "metrics": {
            "val/acc": round(val["acc"], 6),
            **({"val/top5": round(val["top5"], 6)} if "top5" in val else {}),
            **(
                {"val/balanced_acc": round(val["balanced_acc"], 6)} if "balanced_acc" in val else {}
            ),
            "val/loss": round(val["loss"], 6),
            "val/macro_f1": round(val["macro_f1"], 6),
        },
        "train": {
            "strategy": r.cfg.strategy,
            "class_weights": r.cfg.class_weights,
            "sampler": r.cfg.sampler,
            "epochs": r.state.epoch,
            "shipped_epoch": r.state.epoch - r.state.epochs_since_best,  # whose weights these are
            "optimizer": r.cfg.optimizer,
            "lr": r.cfg.lr,
            "batch_size": r.cfg.batch_size,
            "seed": r.cfg.seed,
            "world_size": parts.comm.world,
            "recipes": recipes_used(r.cfg),
            # zoo distill --qat: weights trained through onnxruntime's int8 rounding, which
            # zoo quantize --engine auto then keeps (in the folder, so a copy keeps it too)
            "quantization_aware": bool(r.cfg.distill is not None and r.cfg.distill.qat),
            "qat_weight_bits": r.cfg.distill.weight_bits
            if r.cfg.distill is not None and r.cfg.distill.qat
            else None,
        },
    }
    return ModelConfig(config)


def fit_run_calibration(r: RunResult) -> tuple[Calibration, KnnBank | None]:
    """The shipped weights' temperature (and with ``--reject`` their threshold), fitted on
    the run's validation split, said on stderr; with a ``knn`` rule also its bank of training
    embeddings (:mod:`zoo.train.knn_fit`)."""
    from zoo.calibration import score_kind
    from zoo.train.calibrate import fit_calibration, val_logits

    logits, targets = val_logits(r.parts)
    reject = r.cfg.reject if len(logits) else "off"
    if reject != r.cfg.reject:
        print("warning: no validation images: no rejection threshold fitted", file=sys.stderr)
    bank, knn = None, None
    if score_kind(reject) == "knn":
        from zoo.train.knn_fit import run_bank_and_scores

        bank, knn = run_bank_and_scores(
            r.parts.model, r.parts.info, r.data.samples["train"],
            [p for p, _ in r.data.samples["val"]], device=r.parts.device, seed=r.cfg.seed,
        )  # fmt: skip
    cal = fit_calibration(logits, targets, reject=reject, acceptance=r.cfg.acceptance, knn=knn)
    rule = (
        f"; rejects below {cal.reject.score} {cal.reject.threshold:.4g} "
        f"(accepts {cal.reject.acceptance:.0%} of them)"
        if cal.reject is not None
        else ""
    )
    print(f"calibration: {cal.temperature_line()}{rule}", file=sys.stderr, flush=True)
    return cal, bank


def recipes_used(cfg: TrainConfig) -> dict[str, Any]:
    """The timm recipes a run used (off ones left out): what the model card and config say."""
    used = {
        "auto_augment": policy_string(cfg.auto_augment) if cfg.auto_augment else None,
        "random_erasing": cfg.random_erasing or None,
        "mixup": cfg.mixup or None,
        "cutmix": cfg.cutmix or None,
        "label_smoothing": cfg.label_smoothing or None,
        "ema_decay": cfg.ema_decay if cfg.ema else None,
        "layer_decay": cfg.layer_decay,
    }
    return {k: v for k, v in used.items() if v is not None}


def finish_run(r: RunResult) -> None:
    """Rank 0 only: write what the run produced (``r.val``: the shipped weights' metrics)."""
    state, val, data = r.state, r.val, r.data
    last_val = state.history[-1] if state.history else {}
    best_row = state.history[-1 - state.epochs_since_best] if state.history else {}
    calibration, bank = (None, None) if r.cfg.multi_label else fit_run_calibration(r)
    config = model_config(r, calibration)
    info = replace(
        r.parts.info,
        tag=config.tag or r.parts.info.tag,
        parent=config.base,
        weights=WeightSource(kind="local"),
        gflops=config.gflops if config.gflops is not None else r.parts.info.gflops,
    )
    card = finetuned_card(info, config)
    run = r.run.path
    if state.history:
        plot_curves(state.history, run / "curves.png")
    if "confusion_matrix" in val:  # single-label only
        plot_confusion(val["confusion_matrix"], data.classes, run / "confusion_matrix.png")
    model_dir = save_model_folder(
        r.parts.model, run / "model", config, card, label="model", knn=bank
    )
    weights_sha256 = sha256_file(model_dir / WEIGHTS_FILE)
    load_report = r.parts.load_report
    report = {
        "run": str(run),
        "model_dir": str(model_dir),
        "weights_sha256": weights_sha256,
        "epochs": state.epoch,
        "global_step": state.global_step,  # the checkpoint this report finished (see --resume)
        "final": {
            k: last_val.get(k)
            for k in ("val/acc", "val/loss", "val/top5", "train/acc", "train/loss")
        },
        "best": {
            "epoch": state.epoch - state.epochs_since_best,
            "val/acc": val["acc"],
            "val/balanced_acc": val.get("balanced_acc"),
            "val/top5": val.get("top5"),
            "val/loss": val["loss"],
            "val/macro_f1": val["macro_f1"],
            "monitor": r.cfg.monitor,
            # --ema: whether the shipped weights are the average ("ema") or the model's
            "weights": best_row.get("shipped", "model"),
        },
        "per_class": val["per_class"],
        "confusion_matrix": val.get("confusion_matrix"),
        "thresholds": val.get("thresholds"),
        "calibration": calibration.to_dict() if calibration is not None else None,
        "classes": data.classes,
        "quarantined": data.check.corrupt,
        "data_check": data.check.to_dict(),
        "nonfinite_skipped": state.nonfinite_skipped,
        "rollbacks": state.rollbacks,
        "timing": {
            "total_s": round(r.total_s, 2),
            "estimate": r.estimate,
            "epochs": [round(h["epoch_s"], 2) for h in state.history],
        },
        "load_report": load_report.to_dict() if load_report else None,
    }
    distill = r.parts.distill
    if distill is not None:  # zoo distill: teacher vs student on the same validation images
        report["distill"] = distill.summary(
            r.parts.model, val["acc"], data.samples["val"], r.cfg.model
        ).to_dict()
    durable.write_json(run / "report.json", report, label="report.json")
    best_epoch = state.epoch - state.epochs_since_best
    print(
        f"done: {shipped_summary(state.history, best_epoch, r.cfg.monitor or 'val/acc')} "
        f"→ {model_dir}",
        file=sys.stderr,
        flush=True,
    )
    from zoo.variants import stale_exports

    for export in stale_exports(model_dir):  # carried over from the folder this run replaced
        print(f"warning: {export.warning()}", file=sys.stderr, flush=True)


def row_metric(row: dict[str, Any], monitor: str) -> float:
    """The monitored value of one epoch's row, higher is better: the model's or, with
    ``--ema``, the better of it and the average's (as the loop judged it)."""
    sign = -1.0 if monitor == "val/loss" else 1.0
    values = [row.get(monitor), row.get(f"ema/{monitor}")]
    return max(sign * float(v) for v in values if v is not None)


def shipped_summary(history: list[dict[str, Any]], best_epoch: int, monitor: str) -> str:
    """Which epoch's weights ship and why, for the last line of a run: e.g. ``shipped epoch 2
    (val/acc 0.925; epoch 3 tied and the earlier epoch is kept)``.

    Args:
        history: the run's epoch rows (``LoopState.history``), epoch 1 first.
        best_epoch: the epoch whose weights ship (1-based; the first to reach the best value:
            a later epoch must beat it, a tie keeps the earlier one).
        monitor: the metric that picked it (``val/acc``, ``val/loss``...).
    """
    if not history or not 1 <= best_epoch <= len(history):
        return f"shipped the weights of epoch {best_epoch}"
    row = history[best_epoch - 1]
    best = row_metric(row, monitor)
    sign = -1.0 if monitor == "val/loss" else 1.0
    who = " (the EMA's weights)" if row.get("shipped") == "ema" else ""
    later = history[best_epoch:]
    tied = [int(h["epoch"]) for h in later if row_metric(h, monitor) == best]
    lower = [int(h["epoch"]) for h in later if row_metric(h, monitor) != best]
    why = [f"{monitor} {sign * best:.4g}{who}"]
    if tied:
        why.append(f"{_epochs(tied)} tied and the earlier epoch is kept")
    if lower:
        why.append(f"{_epochs(lower)} scored {'higher' if sign < 0 else 'lower'}")
    if not later:
        why.append("the last epoch")
    return f"shipped epoch {best_epoch} ({'; '.join(why)})"


def _epochs(numbers: list[int]) -> str:
    return f"epoch {numbers[0]}" if len(numbers) == 1 else f"epochs {', '.join(map(str, numbers))}"
