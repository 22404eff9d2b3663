"""``zoo export`` to ONNX: always in eval mode under no-grad, checked, linted, parity-proven,
stamped with zoo's metadata (:mod:`zoo.deploy.export.graph_metadata`) and written atomically
(nothing is left behind on failure). TorchScript and torch.export are
:mod:`zoo.deploy.export.torch_export`; the result is :class:`zoo.deploy.export.result.ExportResult`."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from zoo import durable
from zoo.deploy.choices import EXPORTERS, ONNX_PRECISIONS, Exporter, Precision
from zoo.deploy.export.graph_metadata import export_metadata
from zoo.deploy.export.lint import lint_graph
from zoo.deploy.export.parity import (
    TOLERANCES,
    ParityReport,
    check_embedded_parity,
    check_parity,
    gate_images,
    other_sizes,
)
from zoo.deploy.export.result import ExportResult
from zoo.errors import ChoiceError, ExportError, InputError, ParityError, first_line
from zoo.factory import create_model, info_of
from zoo.knn import rule_bank
from zoo.metadata import ModelInfo
from zoo.ref import ModelRef
from zoo.system import mib

DEFAULT_OPSET = 18  # tested with both exporters on torch 2.14 / onnxruntime 1.32
MIN_OPSET, MAX_OPSET = 13, 23
EXPORT_BATCH = 2  # the example batch of a dynamic-batch export (checked again at 1, 2, 5)


@contextmanager
def atomic_output(out: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``out``; it replaces ``out`` (fsynced, with the umask's
    modes: :func:`zoo.durable.file_output`) only if the block succeeds."""
    try:
        with durable.file_output(out) as tmp:
            yield tmp
    finally:  # external data an exporter may have written beside the temporary file
        for stray in out.parent.glob(f".{out.name}.*.data"):
            stray.unlink(missing_ok=True)


def _refuse_a_fixed_size(model: nn.Module, info: ModelInfo, name: str) -> None:
    """--dynamic-size on a model whose own layers fix the input size (a flatten into a linear
    layer): say so before exporting, not as a parity failure of the graph."""
    c, h, w = info.input_size
    sizes = other_sizes(h, w)
    for hi, wi in sizes:
        try:
            with torch.inference_mode():
                model(torch.zeros(1, c, hi, wi))
        except Exception as exc:  # the model's own error says which layer
            first = first_line(exc, 200)
            both = " and ".join(f"{b}x{a}" for a, b in sizes)
            raise InputError(
                f"{name} does not take {wi}x{hi} inputs ({first}), one of the two sizes "
                f"--dynamic-size proves a graph at ({both}, width x height): export it "
                f"without --dynamic-size, at {w}x{h}."
            ) from exc


def load_for_export(
    name: str | ModelRef, weights: str | None = None
) -> tuple[nn.Module, ModelInfo, str | None]:
    """The model in eval mode, its metadata and the sha256 of its source weights."""
    model = create_model(name, weights=weights)
    info = info_of(model)
    sha = info.weights.sha256
    if sha is None and info.weights.kind != "none":
        from zoo.weights import fetch_weights, sha256_file

        try:
            sha = sha256_file(fetch_weights(info.weights))
        except Exception:  # informational only; the load itself was verified
            sha = None
    return model.eval(), info, sha


@contextmanager
def out_of_place(model: nn.Module) -> Iterator[nn.Module]:
    """The model with its in-place activations (``ReLU6(inplace=True)``, ``Dropout(inplace=…)``)
    switched to out-of-place while it is traced, then restored. Same values in eval mode; the
    dynamo exporter turns each in-place op into a functional op plus a copy under symbolic
    shapes, which took MobileNetV2's 35 ReLU6 from 7 to 11 s of tracing on 2 cores."""
    switched = [m for m in model.modules() if getattr(m, "inplace", None) is True]
    for m in switched:
        m.inplace = False  # type: ignore[assignment]
    try:
        yield model
    finally:
        for m in switched:
            m.inplace = True  # type: ignore[assignment]


def bn_folded(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """A copy of the eval-mode ``model`` with each BatchNorm folded into the conv (or linear
    layer) before it (torch.fx's ``fuse``: exact ``nn.Conv*``/``nn.Linear``/``nn.BatchNorm*``
    types, so a QAT conv is left alone), or ``model`` itself when it has no BatchNorm, does not
    trace symbolically, or the copy does not compute what it does on ``x`` (``fuse`` folds a
    conv called twice into both BatchNorms; a weight-norm hook undoes a fold). The ONNX graph
    is the same (onnxscript's optimizer folds them anyway), but dynamo traces and decomposes
    half the ops: MobileNetV2's ``torch.onnx.export`` took 6.7 → 3.5 s on 2 cores. The gate
    still judges the graph against ``model``."""
    from torch.fx.experimental.optimization import fuse

    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model
    try:
        folded = fuse(model)
        with torch.no_grad():
            same = torch.allclose(folded(x), model(x), rtol=1e-4, atol=1e-4)
    except Exception:  # symbolic tracing refuses control flow on inputs: export it unfolded
        return model
    return folded if same else model


def dummy_input(info: ModelInfo, batch: int) -> torch.Tensor:
    """A seeded random batch of the model's input size: what the exporters trace with."""
    return torch.randn(batch, *info.input_size, generator=torch.Generator().manual_seed(0))


def _onnx_once(
    model: nn.Module,
    x: torch.Tensor,
    path: Path,
    *,
    exporter: str,
    opset: int,
    dynamic_batch: bool,
    dynamic_size: bool,
) -> list[str]:
    axes: dict[int, str] = {}
    if dynamic_batch:
        axes[0] = "batch"
    if dynamic_size:
        axes.update({2: "height", 3: "width"})
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as w, torch.no_grad(), out_of_place(model):
        warnings.simplefilter("always")
        if exporter == "dynamo":
            (hs, ws), _ = other_sizes(*x.shape[2:])  # dynamo may take what the gate checks
            low = {0: 1, 2: min(16, hs), 3: min(16, ws)}
            dims = {k: torch.export.Dim(v, min=low[k]) for k, v in axes.items()}
            torch.onnx.export(
                bn_folded(model, x),
                (x,),
                str(path),
                dynamo=True,
                external_data=False,
                input_names=["input"],
                output_names=["logits"],
                opset_version=opset,
                dynamic_shapes=({**dims},) if dims else None,
                optimize=True,
                verbose=False,
            )
        else:
            dyn = {"input": axes, "logits": {0: "batch"} if dynamic_batch else {}} if axes else None
            torch.onnx.export(
                model,
                (x,),
                str(path),
                dynamo=False,
                input_names=["input"],
                output_names=["logits"],
                opset_version=opset,
                dynamic_axes=dyn,
                do_constant_folding=True,
            )
        caught = [
            first_line(m.message, 200)
            for m in w
            if "legacy TorchScript-based ONNX export" not in str(m.message)
        ]
    return caught


def _ort_runner(sess: Any) -> Any:
    """The graph as the gate calls it: float32 (or uint8 pixels) in, float32 logits out, cast
    at the boundary of an ``--fp16-io`` graph."""
    inp = sess.get_inputs()[0]  # "input", or "pixels" with --embed-preprocessing
    half = inp.type == "tensor(float16)"
    return lambda a: sess.run(None, {inp.name: a.astype(np.float16) if half else a})[0].astype(
        np.float32
    )


def export_onnx(
    name: str | ModelRef,
    out: Path,
    *,
    static_batch: int | None = None,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
    opset: int = DEFAULT_OPSET,
    exporter: Exporter = "auto",
    data: str | None = None,
    allow_mismatch: bool = False,
    mismatch_hint: str = "--allow-mismatch writes it anyway",
    model: nn.Module | None = None,
    weights: str | None = None,
    slim: bool = False,
    precision: Precision = "fp32",
    embed_preprocessing: bool = False,
    fp16_io: bool = False,
) -> ExportResult:
    """Export to ONNX, check, lint, prove parity with PyTorch, embed zoo's metadata, and write
    ``out`` atomically (nothing is written when any step fails).

    Args:
        name: what to export, a model reference (:class:`zoo.ref.ModelRef` or its text):
            a registry, ``timm:`` or Hub name, or a run / model folder.
        out: the ``.onnx`` file to write.
        static_batch: fix the batch dimension at this size (``zoo predict`` and ``zoo serve``
            pad and chunk to it); None (default) exports a dynamic batch axis.
        dynamic_batch: kept for callers of the old API; the batch is dynamic unless
            ``static_batch`` is given, and False without ``static_batch`` is refused.
        dynamic_size: dynamic height and width too.
        slim: simplify the graph with onnxslim first; the checks judge the slimmed graph.
        precision: ``fp32`` or ``fp16`` (weights and compute; inputs and outputs stay fp32),
            judged by that precision's parity tolerances (:data:`zoo.deploy.export.parity.FP16`).
        embed_preprocessing: the graph takes decoded ``uint8 (N, H, W, C)`` pixels of any
            size and resizes, crops and normalises them itself
            (:mod:`zoo.deploy.export.graph_preprocess`); judged end to end from pixels to logits
            (:func:`zoo.deploy.export.parity.check_embedded_parity`).
        fp16_io: with ``precision="fp16"``, float16 inputs and outputs too (the gate and
            :class:`zoo.deploy.runtimes.loader.OnnxClassifier` cast at the boundary).
        data: real images for the gate (``--data DIR``); None: the bundled photos and, for a
            run or its model folder, a seeded sample of the run's own validation images
            (:func:`zoo.deploy.export.parity.gate_images`; the report's ``images`` names them).
        opset, exporter, allow_mismatch, model, weights: see ``zoo export --help``.
        mismatch_hint: what the parity error offers instead (a format that takes no
            ``--allow-mismatch`` names another way).

    Returns:
        What was written and the evidence: lint findings, parity report, attempts.

    Raises:
        InputError: contradictory or out-of-range options.
        ModelRefError / UnknownModelError: ``name`` does not parse, or is an ONNX file.
        Everything :func:`zoo.create_model` raises while loading the model.
        DataError: the run's validation images are gone (pass ``data``).
        ExportError: every exporter failed, or the graph failed lint.
        ParityError: the graph does not match PyTorch (unless ``allow_mismatch``).
    """
    import onnx
    import onnxruntime as ort

    from zoo.onnx_meta import set_metadata

    if static_batch is not None and static_batch < 1:
        raise InputError(f"--static-batch {static_batch}: use a batch size of 1 or more.")
    if not dynamic_batch and static_batch is None:
        raise InputError("dynamic_batch=False needs static_batch=N (the fixed batch size).")
    dynamic_batch = static_batch is None
    export_batch = static_batch or EXPORT_BATCH
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputError(
            f"--opset {opset} is outside the supported range {MIN_OPSET}–{MAX_OPSET} "
            f"(default {DEFAULT_OPSET})."
        )
    ChoiceError.check("exporter", exporter, EXPORTERS)
    ChoiceError.check("precision", precision, ONNX_PRECISIONS)
    if fp16_io and (precision != "fp16" or embed_preprocessing):
        raise InputError(
            "--fp16-io makes an fp16 graph's inputs and outputs float16: it needs --precision "
            "fp16"
            + (
                " and takes float arrays, not --embed-preprocessing's uint8 pixels."
                if embed_preprocessing
                else "."
            )
        )
    if embed_preprocessing and (static_batch is not None or dynamic_size):
        raise InputError(
            "--embed-preprocessing takes images of any size in a dynamic batch: drop "
            + ("--static-batch." if static_batch is not None else "--dynamic-size.")
        )
    ref = ModelRef.parse(name)
    name = ref.shown
    src_model, info, weights_sha = load_for_export(ref, weights)
    model = model if model is not None else src_model
    model.eval()  # always export the inference graph
    if dynamic_size:
        _refuse_a_fixed_size(model, info, name)
    images = gate_images(ref, data)
    # a knn rule: the export builds its score into the graph, so the file needs nothing beside it
    bank = rule_bank(info.calibration, info.multi_label, lambda: ref.model_folder)
    result = ExportResult(
        path=str(out),
        format="onnx",
        model=name,
        opset=opset,
        dynamic_batch=dynamic_batch,
        static_batch=static_batch,
        dynamic_size=dynamic_size,
        precision=precision,
        embedded_preprocessing=embed_preprocessing,
        fp16_io=fp16_io,
    )
    order = ["dynamo", "legacy"] if exporter == "auto" else [exporter]
    x = dummy_input(info, export_batch)
    with atomic_output(out) as tmp:
        export_once = partial(
            _onnx_once,
            model,
            x,
            tmp,
            opset=opset,
            dynamic_batch=dynamic_batch,
            dynamic_size=dynamic_size,
        )

        def write(exporter: str) -> dict[str, Any]:  # the graph every check below judges
            done: dict[str, Any] = {"warnings": export_once(exporter=exporter)}
            if slim:
                from zoo.deploy.export.slim import slim_file

                done["slim"] = slim_file(tmp)
            if precision == "fp16":
                from zoo.deploy.export.fp16 import to_fp16_file

                done["fp16"] = to_fp16_file(tmp, fp16_io=fp16_io)
            if embed_preprocessing:
                from zoo.deploy.export.graph_preprocess import embed_file

                done["input"] = embed_file(tmp, info.preprocessing())
            if bank is not None:  # the kNN rule's score as a second output (zoo/knn.py)
                from zoo.deploy.export.knn import add_knn_file

                done["knn"] = add_knn_file(tmp, bank)
            return done

        chosen: tuple[str, list[str], ParityReport] | None = None
        for exp in order:
            attempt: dict[str, Any] = {"exporter": exp}
            result.attempts.append(attempt)
            try:
                attempt.update(write(exporter=exp))
                onnx.checker.check_model(str(tmp), full_check=True)
                graph = onnx.load(str(tmp))
                lint = lint_graph(graph, dynamic_batch=dynamic_batch, export_batch=export_batch)
                sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
                if embed_preprocessing:  # pixels in: judged with the preprocessing
                    parity = check_embedded_parity(model, info, _ort_runner(sess), images)
                else:
                    parity = check_parity(
                        model,
                        info,
                        _ort_runner(sess),
                        export_batch=export_batch,
                        dynamic_batch=dynamic_batch,
                        dynamic_size=dynamic_size,
                        images=images,
                        tolerances=TOLERANCES[precision],
                    )
                if bank is not None:
                    from zoo.deploy.export.knn import check_knn

                    knn = check_knn(
                        model, info, sess, images, bank, export_batch=export_batch,
                        static=static_batch is not None,
                        kind="embedded" if embed_preprocessing else precision,
                    )  # fmt: skip
                    parity = replace(parity, knn=knn)
            except InputError:  # the gate's images, not the exporter: no retry, no relabel
                raise
            except Exception as exc:  # exporter/check failures: record, maybe fall back
                attempt["error"] = f"{type(exc).__name__}: {first_line(exc, 400)}"
                continue
            attempt.update({"lint": lint, "parity_passed": parity.passed})
            chosen = (exp, lint, parity)
            if not lint and parity.passed:
                break
        if chosen is None:
            errors = "; ".join(f"{a['exporter']}: {a.get('error')}" for a in result.attempts)
            raise ExportError(f"ONNX export of {name} failed ({errors}).")
        exp, lint, parity = chosen
        if "error" in result.attempts[-1]:  # a later failed attempt overwrote the file
            write(exporter=exp)
        result.exporter, result.lint, result.parity = exp, lint, parity
        result.slim = next(a.get("slim") for a in result.attempts if a["exporter"] == exp)
        if lint:
            raise ExportError(f"Graph lint failed for {name}: " + "; ".join(lint))
        if not parity.passed and not allow_mismatch:
            raise ParityError(
                f"Exported {name} does not match PyTorch: "
                + "; ".join(parity.failures())
                + f". Nothing was written; {mismatch_hint}."
            )
        graph = onnx.load(str(tmp))
        set_metadata(graph, export_metadata(info, ref, result, weights_sha))
        onnx.save(graph, str(tmp))
    result.size_mb = mib(out.stat().st_size)
    return result
