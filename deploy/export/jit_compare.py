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

from zoo.deploy.export.parity_report import compare
from zoo.deploy.export.result import JIT_DEPRECATED, TORCHSCRIPT_NOTE
from zoo.errors import first_line


@dataclass(frozen=True)
class ShapeCheck:
    """One path's output on one input shape against eager (``error``: the path rejected it)."""

    shape: list[int]
    max_abs: float
    passed: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return d if self.error is not None else {k: v for k, v in d.items() if k != "error"}


@dataclass
class PathResult:
    """One way of building a graph (``trace``, ``script`` or ``export``) and how it fared."""

    path: str
    built: bool
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    checks: list[ShapeCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.built and all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "built": self.built,
            "error": self.error,
            "warnings": list(self.warnings),
            "checks": [c.to_dict() for c in self.checks],
            "passed": self.passed,
        }

    def lines(self) -> list[str]:
        status = "pass" if self.passed else ("not built" if not self.built else "FAIL")
        lines = [f"{self.path:<7} {status}" + (f" ({self.error})" if self.error else "")]
        lines += [
            f"   shape {c.shape}: max abs {c.max_abs:.2e} {'pass' if c.passed else 'FAIL'}"
            for c in self.checks
        ]
        return lines + [f"   warning: {w}" for w in self.warnings]


@dataclass(frozen=True)
class JitReport:
    """What ``zoo compare-jit`` found: each path on each shape, and the note on TorchScript.

    Attributes:
        note: TorchScript's deprecation, said on stderr.
        shapes: the input shapes compared (the first one built each path).
        paths: ``trace``, ``script`` and ``export``, in that order.
    """

    note: str
    shapes: list[list[int]]
    paths: tuple[PathResult, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``--json``)."""
        return {
            "note": self.note,
            "shapes": self.shapes,
            "paths": [p.to_dict() for p in self.paths],
        }

    def lines(self) -> list[str]:
        """The summary ``zoo compare-jit`` prints: each path's verdict, shapes and warnings."""
        return [line for p in self.paths for line in p.lines()]

    def path(self, name: str) -> PathResult:
        """The result of path ``name`` (``trace``, ``script`` or ``export``)."""
        return next(p for p in self.paths if p.path == name)


def _build(
    path: str, model: nn.Module, example: torch.Tensor
) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[str]]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", JIT_DEPRECATED, FutureWarning)  # the report's note
        if path == "trace":
            fn: Any = torch.jit.trace(model, example)
        elif path == "script":
            fn = torch.jit.script(model)
        else:
            fn = _export_most_dynamic(model, example).module()
    msgs = [
        f"{type(m.message).__name__}: {first_line(m.message, 200)}"
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


def compare_jit_model(name: str) -> JitReport:
    """:func:`compare_jit` on the model ``name`` (a model reference) at its own input size: a
    batch of 2, then 1 and 3, and a resolution 32 px larger where the input is an image.

    Raises:
        Everything :func:`zoo.create_model` raises.
    """
    from zoo.factory import create_model, info_of

    net = create_model(name)
    size = info_of(net).input_size
    shapes: list[tuple[int, ...]] = [(b, *size) for b in (2, 1, 3)]
    if len(size) == 3 and size[1] >= 64:  # and another resolution
        shapes.append((2, size[0], size[1] + 32, size[2] + 32))
    return compare_jit(net, shapes)


def compare_jit(model: nn.Module, input_shapes: list[tuple[int, ...]]) -> JitReport:
    """Build each path from the first shape, then compare against eager on every shape.

    Args:
        model: the module (put in eval mode).
        input_shapes: the shapes to compare on; the first builds each path.

    Returns:
        Each path's verdict; a path that cannot be built, or rejects a shape, fails without
        raising.
    """
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
                r.error = f"{type(exc).__name__}: {first_line(exc)}"
                results.append(r)
                continue
            for x in inputs:
                ref = model(x)
                try:
                    got = fn(x)
                    d = compare(ref.numpy(), got.numpy())
                    r.checks.append(ShapeCheck(list(x.shape), d.max_abs, d.passed))
                except Exception as exc:  # e.g. a guard or a baked shape rejects this input
                    error = first_line(exc, 200)
                    r.checks.append(ShapeCheck(list(x.shape), float("inf"), False, error))
            results.append(r)
    return JitReport(TORCHSCRIPT_NOTE, [list(s) for s in input_shapes], tuple(results))


__all__ = ["JitReport", "PathResult", "ShapeCheck", "compare_jit", "compare_jit_model"]
