"""``zoo eval``: a model's metrics on an image folder, optionally scored by a derived file
(``--variant``) and written up as ``report.html``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.cells import cell_len

from zoo import durable
from zoo.cli.common import JsonOpt, VariantOpt, choice, err, out, print_json, with_variant
from zoo.deploy.index import KNN_K
from zoo.run_images import Split
from zoo.tta import Tta

if TYPE_CHECKING:
    from zoo.train.evaluate import EvalForward


def _knn_bank(model: str, info: Any) -> Any:
    """The model folder's kNN bank when its rejection rule is ``knn`` (None otherwise, and for
    a file outside a model folder)."""
    from zoo.knn import rule_bank
    from zoo.ref import ModelRef

    ref = ModelRef.parse(model)
    if ref.kind not in ("run", "model-folder"):
        return None
    return rule_bank(info.calibration, info.multi_label, lambda: ref.model_folder)


def _variant_scorer(model: str, variant: str | None) -> EvalForward | None:
    """``--variant``: the derived file run by its runtime as the evaluation's forward pass, on
    the batches it takes (:class:`zoo.train.evaluate.EvalForward`; None: no variant)."""
    if variant is None:
        return None
    import torch

    from zoo.deploy.runtimes.loader import load_classifier
    from zoo.train.evaluate import EvalForward

    path = with_variant(model, variant)
    clf = load_classifier(path)
    if clf.embedded:  # decoded pixels, resized by the graph itself: a list of arrays
        from functools import partial

        from zoo.deploy.export.graph_preprocess import pixels

        def run_pixels(xs: list[Any]) -> torch.Tensor:
            return torch.from_numpy(clf.split(clf.run_each(xs))[0])

        # (a plain function for the loader's workers, not a method of the session's holder)
        return EvalForward(run_pixels, path, prepare=partial(pixels, channels=clf.pre.channels))

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(clf.run(x.cpu().numpy()))

    return EvalForward(forward, path)


def eval_cmd(
    model: Annotated[str, typer.Argument(help="run folder, model folder or registry name")],
    data: Annotated[
        str | None, typer.Option("--data", help="image folder (default: the run's own data)")
    ] = None,
    split: Annotated[
        Split | None,
        choice(
            Split,
            "--split",
            help="which images (default: val; a flat folder the model did not train on: all)",
        ),
    ] = None,
    batch_size: int = 64,
    device: str = "auto",
    num_workers: int = 0,
    report: Annotated[
        bool,
        typer.Option(
            "--report",
            help="also write report.html: per-class metrics, confusion matrix with its images, "
            "top losses with Grad-CAM, calibration, training curves (into a run folder)",
        ),
    ] = False,
    tta: Annotated[
        Tta,
        choice(
            Tta,
            "--tta",
            help="test-time augmentation: the metrics of the views' mean, and the gain over "
            "the plain crop (measured in the same pass)",
        ),
    ] = "none",
    report_out: Annotated[
        Path | None,
        typer.Option(
            "--report-out", help="--report: where (default: RUN/report.html, or ./report.html)"
        ),
    ] = None,
    ood: Annotated[
        Path | None,
        typer.Option(
            "--ood",
            help="a folder of images from outside the classes: AUROC and FPR at 95% TPR of "
            "each score (and what the model's --reject rule accepts), in the JSON and report",
        ),
    ] = None,
    knn: Annotated[
        bool,
        typer.Option(
            "--knn",
            help="--ood: add the kNN score (distance to the k-th nearest training embedding), "
            "the run's training images embedded on the fly",
        ),
    ] = False,
    index: Annotated[
        Path | None,
        typer.Option("--index", help="--ood: the kNN score against this `zoo index` instead"),
    ] = None,
    knn_k: Annotated[int, typer.Option("--knn-k", min=1, help="the kNN score's k")] = KNN_K,
    variant: VariantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a model on an image folder: top-1 (top-5 over 6+ classes), per-class metrics,
    confusion matrix."""
    from zoo.ref import ModelRef
    from zoo.run_images import find_run
    from zoo.train.check import left_out_note
    from zoo.train.evaluate import evaluate_split

    if report_out is not None and not report:
        raise typer.BadParameter("--report-out applies to --report only.")
    if report_out is not None:  # refused before the evaluation's work
        durable.refuse_folder(
            report_out,
            flag="--report-out",
            writes="--report writes one HTML page",
            name="report.html",
        )
    if (knn or index is not None) and ood is None:
        raise typer.BadParameter("--knn and --index apply to --ood only.")
    scorer = _variant_scorer(model, variant)
    scored_by = scorer.name if scorer is not None else None
    if index is not None:  # another model's index is refused before the evaluation
        from zoo.deploy.index.query import check_index

        check_index(index, scored_by or model)
    ev = evaluate_split(
        model, data=data, split=split, batch_size=batch_size, device=device,
        num_workers=num_workers, tta=tta, scorer=scorer,
    )  # fmt: skip
    result = ev.result
    separation = None
    if ood is not None:
        from zoo.train.ood import ExternalScore, evaluate_ood

        more: tuple[ExternalScore, ...] = ()
        if knn or index is not None:  # embeddings: the deploy side's index (train never imports it)
            from zoo.deploy.index.query import knn_ood

            inside = [p for p, _ in ev.samples]
            pos, neg = knn_ood(
                scored_by or model, inside, ood, index=index, k=knn_k, batch_size=batch_size,
                device=device,
            )  # fmt: skip
            more = (ExternalScore("knn", pos, neg),)
        separation = evaluate_ood(
            ev, ood, scorer=scorer, batch_size=batch_size, num_workers=num_workers, more=more,
            bank=_knn_bank(model, ev.info),
        )  # fmt: skip
        result = {**result, "ood": separation.to_dict()}
    if report:
        from zoo.train.report import write_report

        ref = ModelRef.parse(model)
        run = find_run(ref.path) if ref.is_path else None  # a run, its model folder …
        dest = report_out or (run / "report.html" if run is not None else Path("report.html"))
        result = {**result, "report": write_report(ev, dest, run, ood=separation)}
        err.print(f"report: {dest} ({result['report']['images']} images embedded)")
    if as_json:
        print_json(result)
        return
    out.print(
        f"{result['model']} on {result['data']} [{result['split']}]: {result['n']} images"
        + (f", scored by {result['scored_by']}" if "scored_by" in result else ""),
        markup=False,
    )
    if result.get("missing"):
        n = result["missing"]
        err.print(
            f"note: {n} of the run's {result['split']} images {'is' if n == 1 else 'are'} no "
            "longer on disk (moved or deleted since the run) and "
            f"{'is' if n == 1 else 'are'} left out",
            markup=False,
        )
    for note in (
        left_out_note(ev.unreadable, f"the {result['split']} images"),
        left_out_note(separation.unreadable, "the --ood images") if separation else None,
    ):
        if note:
            err.print(note, markup=False)
    names = metric_names(multi_label=ev.info.multi_label)
    out.print("  ".join(f"{label} {result[k]:.4f}" for k, label in names.items() if k in result))
    if "tta" in result:
        t, plain = result["tta"], result["tta"]["without"]
        out.print(
            f"test-time augmentation {t['mode']} ({t['views']} views): {names['acc']} "
            f"{result['acc']:.4f} vs {plain['acc']:.4f} without ({result['acc'] - plain['acc']:+.4f})"
        )
    if "calibration" in result:
        c = result["calibration"]
        out.print(
            f"calibration: temperature {c['temperature']:.4g}, expected calibration error "
            f"{c['ece_before']:.4f} raw → {c['ece_after']:.4f} calibrated"
        )
    for line in separation.lines() if separation is not None else []:
        out.print(line, markup=False)
    for line in per_class_lines(result["per_class"]):
        out.print(line, markup=False)


def metric_names(*, multi_label: bool) -> dict[str, str]:
    """The summary line's labels by result key, in print order. Multi-label accuracy is
    exact-match, with no top-5 or balanced accuracy; a single-label result holds ``top5``
    only among more than five classes (:data:`zoo.train.metrics.TOP5_MIN_CLASSES`), so its
    absence says nothing about the kind of model."""
    return {
        "acc": "exact-match" if multi_label else "top-1",
        "balanced_acc": "balanced",
        "top5": "top-5",
        "loss": "loss",
        "macro_f1": "macro-F1",
    }


CLASS_COLUMN = 24  # terminal cells the class name column takes (a longer name pushes on)


def per_class_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The per-class table ``zoo eval`` prints: the classes that occur or were predicted, one
    line each, then a note on those left out. Names are padded by terminal cells (rich's
    :func:`~rich.cells.cell_len`), not characters: a CJK character takes two cells, so
    ``str.ljust`` would push the figures after ``猫`` one cell right of an ASCII name's."""
    met = [r for r in rows if r["support"] or r.get("predicted", 1)]
    lines = []
    for row in met:
        name = str(row["class"])
        pad = " " * max(0, CLASS_COLUMN - cell_len(name))
        pr = f"P {row['precision']:.3f} R {row['recall']:.3f} " if "recall" in row else ""
        lines.append(f"  {name}{pad} {pr}F1 {row['f1']:.3f} n={row['support']}")
    if len(met) < len(rows):
        lines.append(
            f"  ({len(rows) - len(met)} of the model's classes neither occur "
            "here nor were predicted: not listed, and not in macro-F1)"
        )
    return lines


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
