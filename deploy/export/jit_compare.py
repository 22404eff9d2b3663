"""``zoo compare-jit``: torch.jit.trace vs torch.jit.script vs torch.export against eager.

``trace`` records one execution path: ``if``/loops that depend on the data are frozen at
the example input. ``script`` compiles the Python (control flow kept, less Python
supported). ``torch.export`` captures a full graph with guards and is the forward path;
TorchScript is deprecated upstream.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from zoo.deploy.export.parity import compare

NOTE = (
    "TorchScript (trace/script) is deprecated upstream; torch.export is the path forward "
    "(and what the ONNX dynamo exporter uses)."
)


@dataclass
class PathResult:
    path: str
    built: bool
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.built and all(c["passed"] for c in self.checks)


def _build(
    path: str, model: nn.Module, example: torch.Tensor
) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[str]]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if path == "trace":
            fn: Any = torch.jit.trace(model, example)
        elif path == "script":
            fn = torch.jit.script(model)
        else:
            fn = _export_most_dynamic(model, example).module()
    msgs = [
        f"{type(m.message).__name__}: {str(m.message).splitlines()[0][:200]}"
        for m in w
        if "TracerWarning" in type(m.message).__name__ or "jit" in str(m.message).lower()
    ]
    return fn, list(dict.fromkeys(msgs))  # each distinct warning once


def _export_most_dynamic(model: nn.Module, example: torch.Tensor) -> Any:
    """torch.export with dynamic batch and H/W if the model allows, else batch, else static."""
    batch = torch.export.Dim("batch", min=1)
    attempts: list[Any] = []
    if example.ndim == 4:
        auto = torch.export.Dim.AUTO  # let export derive the constraints (e.g. H % 32)
        attempts.append(({0: auto, 2: auto, 3: auto},))
    attempts += [({0: batch},), None]
    for dyn in attempts[:-1]:
        try:
            return torch.export.export(model, (example,), dynamic_shapes=dyn)
        except Exception:  # this model specialises that dimension; try fewer dynamic dims
            continue
    return torch.export.export(model, (example,))


def compare_jit(model: nn.Module, input_shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    """Build each path from the first shape, then compare against eager on every shape."""
    model = model.eval()
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=gen) for s in input_shapes]
    results = []
    with torch.no_grad():
        for path in ("trace", "script", "export"):
            r = PathResult(path=path, built=False)
            try:
                fn, r.warnings = _build(path, model, inputs[0])
                r.built = True
            except Exception as exc:  # each path supports a different subset of Python
                r.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                results.append(r)
                continue
            for x in inputs:
                ref = model(x)
                try:
                    got = fn(x)
                    d = compare(ref.numpy(), got.numpy())
                    r.checks.append(
                        {"shape": list(x.shape), "max_abs": d.max_abs, "passed": d.passed}
                    )
                except Exception as exc:  # e.g. a guard or a baked shape rejects this input
                    r.checks.append(
                        {
                            "shape": list(x.shape),
                            "max_abs": float("inf"),
                            "passed": False,
                            "error": str(exc).strip().splitlines()[0][:200],
                        }
                    )
            results.append(r)
    return {
        "note": NOTE,
        "shapes": [list(s) for s in input_shapes],
        "paths": [{**asdict(r), "passed": r.passed} for r in results],
    }
