"""``zoo export --precision fp16``: weights and compute in float16, inputs and outputs kept
float32 (clients and the parity gate feed the same arrays as for fp32) unless ``--fp16-io``
asks for float16 there too (half the bytes over the wire), by onnxruntime's own converter;
the export's gate then judges the converted graph with the fp16 tolerances."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from zoo.errors import ExportError, first_line


def to_fp16_file(path: Path, *, fp16_io: bool = False) -> dict[str, Any]:
    """Convert the ONNX file at ``path`` to fp16 in place (float32 inputs/outputs kept unless
    ``fp16_io``).

    Returns:
        ``bytes_before``, ``bytes_after`` and the converter's warnings (e.g. weights clipped
        to the fp16 range): what the export reports.

    Raises:
        ExportError: the converter failed on this graph.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    before = path.stat().st_size
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = convert_float_to_float16(onnx.load(str(path)), keep_io_types=not fp16_io)
        except Exception as exc:  # the converter's errors vary by op; keep the cause
            raise ExportError(f"fp16 conversion failed: {exc}") from exc
    # the converter appends the input Casts after the nodes that read them; onnx_ir (shipped
    # with onnxscript, the dynamo exporter's dependency) puts the graph back in order
    import onnx_ir as ir
    from onnx_ir.passes.common import TopologicalSortPass

    graph = ir.from_proto(converted)
    TopologicalSortPass()(graph)
    onnx.save(ir.to_proto(graph), str(path))
    return {
        "bytes_before": before,
        "bytes_after": path.stat().st_size,
        "warnings": sorted({first_line(w.message, 200) for w in caught}),
    }
