"""What an export wrote and the evidence it passed: :class:`ExportResult`, which renders the
summary ``zoo export`` prints (:meth:`ExportResult.lines`) and its ``--json``
(:meth:`ExportResult.to_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.deploy.export.parity_report import ParityReport
from zoo.system import mib

TORCHSCRIPT_NOTE = (
    "TorchScript (trace/script) is deprecated upstream; torch.export is the path forward "
    "(and what the ONNX dynamo exporter uses)."
)
"""Said once by ``zoo export --format torchscript`` and ``zoo compare-jit``, in place of
torch's FutureWarning on each ``torch.jit`` call (:data:`JIT_DEPRECATED`)."""
JIT_DEPRECATED = r"`torch\.jit\.\w+` is deprecated"
"""torch's FutureWarning on each ``torch.jit`` call (a regex for ``warnings.filterwarnings``)."""


@dataclass
class ExportResult:
    """One export: the file (or folder) written and the checks it passed.

    Filled in by the exporter as its steps finish (:func:`zoo.deploy.export.onnx_export.export_onnx`,
    :func:`zoo.deploy.export.torch_export.export_torch`, the Triton and OpenVINO exports).

    Attributes:
        path: the file written (Triton: the model's folder; OpenVINO: its ``model.xml``).
        format: ``onnx``, ``torchscript``, ``pt2``, ``triton`` or ``openvino``.
        model: the model reference as shown to people.
        opset, exporter: the ONNX opset and the exporter that made the graph.
        dynamic_batch, static_batch, dynamic_size: the graph's axes.
        attempts: each exporter tried, with its warnings, lint and verdict (or error).
        lint: the graph lint's findings (empty: clean).
        parity: the gate's report (None until it ran).
        size_mb: the size written, in MiB (:func:`zoo.system.mib`).
        slim: ``--slim``: node counts and sizes before and after, onnxslim's version.
        precision: onnx: weights and compute (I/O fp32); openvino: inference.
        embedded_preprocessing: onnx: uint8 NHWC pixels in (:mod:`zoo.deploy.export.graph_preprocess`).
        fp16_io: onnx, fp16: float16 inputs and outputs too.
    """

    path: str
    format: str
    model: str
    opset: int | None = None
    exporter: str | None = None
    dynamic_batch: bool = True
    static_batch: int | None = None
    dynamic_size: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    lint: list[str] = field(default_factory=list)
    parity: ParityReport | None = None
    size_mb: float = 0.0
    slim: dict[str, Any] | None = None
    precision: str = "fp32"
    embedded_preprocessing: bool = False
    fp16_io: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``--json``); ``parity`` as :meth:`ParityReport.to_dict` (``{}``: none)."""
        return {**self.__dict__, "parity": self.parity.to_dict() if self.parity else {}}

    def lines(self) -> list[str]:
        """The summary ``zoo export`` prints: what was written, the slimming, and each level
        of the gate (tensors, predictions, the real images, every other shape)."""
        batch = (
            f", batch {self.static_batch or 'dynamic'}, {self.precision}"
            if self.format in ("onnx", "openvino")
            else ""
        )
        lines = [
            f"wrote {self.path} ({self.size_mb} MiB, {self.format}, exporter {self.exporter}{batch})"
        ]
        if sl := self.slim:
            lines.append(
                f"slim (onnxslim {sl['onnxslim']}): {sl['nodes_before']} → {sl['nodes_after']} "
                f"nodes, {mib(sl['bytes_before'])} → {mib(sl['bytes_after'])} MiB"
            )
        p = self.parity
        if p is None:
            return lines
        if (t := p.tensors) is not None:
            lines.append(
                f"parity tensors: max abs {t.max_abs:.2e}, max rel {t.max_rel:.2e}, cosine "
                f"{t.cosine:.7f} → {'pass' if t.passed else 'FAIL'}"
            )
        if (q := p.predictions) is not None:
            lines.append(
                f"parity predictions: top-1 agreement {q.agreement:.1%} on {q.n_images} "
                f"real images (needs {p.tolerances.min_agreement:.1%})"
            )
        if p.images:  # which real images judged it: the bundled photos, --data, the run's
            lines.append("parity images: " + p.describe_images())
        for d in p.dynamic:
            lines.append(
                f"parity dynamic: {d.where} → "
                + (f"rejected: {d.error}" if d.error else f"max abs {d.diff.max_abs:.2e}")
                + f" {'pass' if d.passed else 'FAIL'}"
            )
        if p.knn is not None:
            lines.append(p.knn.line())
        return lines

    def warnings(self) -> list[str]:
        """What ``zoo export`` says on stderr (with or without ``--json``): a failed gate whose
        file was written anyway (``--allow-mismatch``); TorchScript's deprecation, once."""
        said = [f"note: {TORCHSCRIPT_NOTE}"] if self.format == "torchscript" else []
        if self.parity is not None and not self.parity.passed:
            said.append("warning: parity FAILED (written because of --allow-mismatch)")
        return said


__all__ = ["ExportResult"]
