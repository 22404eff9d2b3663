"""``zoo export``'s entry point: :func:`run_export` takes the :class:`ExportOptions` and hands
them to the exporter of their format."""

from __future__ import annotations

from zoo.deploy.export.options import ExportOptions
from zoo.deploy.export.result import ExportResult


def run_export(options: ExportOptions) -> ExportResult:
    """Export ``options.model`` in ``options.format``: checked, parity-proven against PyTorch
    and written atomically to :meth:`ExportOptions.destination`.

    Args:
        options: what to export and how (their checks already ran).

    Returns:
        What was written and the gate's evidence (``lines()`` renders it, ``to_dict()`` is the
        ``--json``).

    Raises:
        ModelRefError / UnknownModelError: ``options.model`` does not parse or names nothing.
        ExportError: every exporter failed, or the graph failed lint.
        ParityError: the export does not match PyTorch (unless ``allow_mismatch``).
        Everything the exporter of the format raises
        (:func:`zoo.deploy.export.onnx_export.export_onnx`,
        :func:`zoo.deploy.export.openvino.export_openvino`,
        :func:`zoo.deploy.export.triton.export_triton`,
        :func:`zoo.deploy.export.kserve.export_kserve`,
        :func:`zoo.deploy.export.torch_export.export_torch`).
    """
    from zoo.deploy.export.onnx_export import DEFAULT_OPSET, export_onnx
    from zoo.ref import ModelRef

    o = options
    ref = ModelRef.parse(o.model)
    path = o.destination(ref)
    if o.format == "onnx":
        return export_onnx(
            ref,
            path,
            static_batch=o.static_batch,
            dynamic_size=o.dynamic_size,
            opset=o.opset or DEFAULT_OPSET,
            exporter=o.exporter,
            data=o.data,
            allow_mismatch=o.allow_mismatch,
            weights=o.weights,
            slim=o.slim,
            precision=o.precision,
            embed_preprocessing=o.embed_preprocessing,
            fp16_io=o.fp16_io,
        )
    if o.format == "openvino":
        from zoo.deploy.export.openvino import export_openvino

        return export_openvino(
            ref,
            path,
            precision=o.precision,
            data=o.data,
            calib=o.calib,
            min_agreement=o.min_agreement,
            allow_mismatch=o.allow_mismatch,
            weights=o.weights,
        )
    if o.format == "triton":
        from zoo.deploy.export.triton import export_triton

        return export_triton(
            ref,
            path,
            max_batch=o.max_batch,
            opset=o.opset or DEFAULT_OPSET,
            data=o.data,
            weights=o.weights,
            embed_preprocessing=o.embed_preprocessing,
        )
    if o.format == "kserve":
        from zoo.deploy.export.kserve import export_kserve

        return export_kserve(
            ref,
            path,
            runtime=o.kserve_runtime,
            storage_uri=o.storage_uri,
            image=o.image,
            max_batch=o.max_batch,
            opset=o.opset or DEFAULT_OPSET,
            data=o.data,
            weights=o.weights,
            embed_preprocessing=o.embed_preprocessing,
        )
    from zoo.deploy.export.torch_export import export_torch

    return export_torch(ref, path, fmt=o.format, jit=o.jit, weights=o.weights)


__all__ = ["ExportOptions", "ExportResult", "run_export"]
