"""``zoo export --format torchscript|pt2``: TorchScript (trace or script) or torch.export, in eval
mode under no-grad, compared with eager on seeded noise, and written atomically."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from zoo.deploy.choices import JIT_MODES, JitMode
from zoo.deploy.export.onnx_export import EXPORT_BATCH, atomic_output, dummy_input, load_for_export
from zoo.deploy.export.parity_report import ParityReport, compare
from zoo.deploy.export.result import JIT_DEPRECATED, ExportResult
from zoo.errors import ChoiceError, ParityError
from zoo.ref import ModelRef
from zoo.system import mib


def export_torch(
    name: str | ModelRef, out: Path, *, fmt: str, jit: JitMode = "trace", weights: str | None = None
) -> ExportResult:
    """TorchScript (trace or script) or torch.export (``.pt2``), with an eager parity check.

    Args:
        name: what to export, a model reference (as for :func:`export_onnx`).
        out: the file to write (atomically).
        fmt: ``torchscript`` or ``pt2``.
        jit: ``trace`` or ``script`` (TorchScript only).
        weights: as for :func:`zoo.create_model`.

    Returns:
        What was written, with the eager-vs-exported comparison.

    Raises:
        ChoiceError: an unknown ``fmt`` or ``jit``.
        ModelRefError / UnknownModelError: ``name`` does not parse, or is an ONNX file.
        ParityError: the exported module differs from eager (nothing is written).
    """
    ChoiceError.check("format", fmt, ("torchscript", "pt2"))
    ChoiceError.check("jit", jit, JIT_MODES)
    ref = ModelRef.parse(name)
    name = ref.shown
    model, info, _ = load_for_export(ref, weights)
    x = dummy_input(info, EXPORT_BATCH)
    result = ExportResult(
        path=str(out),
        format=fmt,
        model=name,
        exporter=jit if fmt == "torchscript" else "torch.export",
    )
    with atomic_output(out) as tmp, torch.no_grad(), warnings.catch_warnings():
        if fmt == "torchscript":  # torch warns on each jit call: result.warnings() says it once
            warnings.filterwarnings("ignore", JIT_DEPRECATED, FutureWarning)
            built = torch.jit.trace(model, x) if jit == "trace" else torch.jit.script(model)
            torch.jit.save(built, str(tmp))
            loaded: Any = torch.jit.load(str(tmp))
        else:
            ep = torch.export.export(model, (x,))
            # as open files: given a path, torch warns unless it ends in .pt2, which the
            # atomic write's scratch name does not
            with open(tmp, "wb") as f:
                torch.export.save(ep, f)
            with open(tmp, "rb") as f:
                loaded = torch.export.load(f).module()
        d = compare(model(x).numpy(), loaded(x).numpy())
        result.parity = ParityReport(tensors=d)  # eager vs exported on seeded noise
        if not d.passed:
            raise ParityError(
                f"{fmt} export of {name} differs from eager: max abs {d.max_abs:.3g}."
            )
    result.size_mb = mib(out.stat().st_size)
    return result


__all__ = ["export_torch"]
