"""Strict state-dict loading with a declared, re-initialisable classifier head."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from zoo.errors import StateDictMismatchError

log = logging.getLogger(__name__)


@dataclass
class LoadReport:
    """What a load did: which tensors came from the weights and which did not."""

    source: str
    loaded: list[str] = field(default_factory=list)
    reinitialised: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    unused: list[str] = field(
        default_factory=list
    )  # left out on purpose (ModelInfo.unused_weights)

    def summary(self) -> str:
        s = f"loaded {len(self.loaded)} tensors from {self.source}"
        if self.reinitialised:
            s += f"; re-initialised head: {', '.join(self.reinitialised)}"
        if self.unused:
            s += f"; left out {len(self.unused)} tensors this architecture does not have"
        return s

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _under(key: str, path: str | None) -> bool:
    """``key`` is the module path ``path`` or a tensor under it."""
    return path is not None and (key == path or key.startswith(path + "."))


def load_strict(
    model: nn.Module,
    state_dict: dict[str, torch.Tensor],
    *,
    head: str | None,
    source: str,
    adapt_head: bool,
    unused: tuple[str, ...] = (),
    fresh_head: bool = False,
) -> LoadReport:
    """Load ``state_dict`` into ``model``.

    With ``adapt_head``, head tensors (under the module path ``head``) whose shapes differ
    are skipped and left at their fresh initialisation. With ``fresh_head`` (a headless entry,
    :attr:`ModelInfo.headless`: its weights hold no head for it) every head tensor is, whether
    the weights hold one of that shape or none. Tensors under the module paths ``unused``
    (:attr:`ModelInfo.unused_weights`: blocks a network cut short does not have) are skipped
    and listed in the report; the model having a tensor under one of them is an error. Anything
    else missing, unexpected or mis-shaped raises :class:`StateDictMismatchError` in plain words.
    """
    own = model.state_dict()
    report = LoadReport(source=source)
    to_load: dict[str, torch.Tensor] = {}
    shape_errors = []
    shadowed = [k for k in own if any(_under(k, path) for path in unused)]
    for key, tensor in state_dict.items():
        if any(_under(key, path) for path in unused):
            report.unused.append(key)
        elif key not in own:
            report.unexpected.append(key)
        elif fresh_head and _under(key, head):
            report.reinitialised.append(key)
        elif own[key].shape != tensor.shape:
            if adapt_head and _under(key, head):
                report.reinitialised.append(key)
            else:
                shape_errors.append(
                    f"{key}: weights {tuple(tensor.shape)} vs model {tuple(own[key].shape)}"
                )
        else:
            to_load[key] = tensor
    absent = [k for k in own if k not in state_dict]
    report.reinitialised += [k for k in absent if fresh_head and _under(k, head)]
    report.missing = [k for k in absent if k not in report.reinitialised]
    problems = []
    if shadowed:
        problems.append(
            "the model has tensors under the paths declared left out of these weights: "
            + ", ".join(shadowed[:8])
        )
    if shape_errors:
        problems.append("shape mismatch: " + "; ".join(shape_errors[:5]))
    if report.missing:
        problems.append(f"missing from the weights: {', '.join(report.missing[:8])}")
    if report.unexpected:
        problems.append(f"not in the model: {', '.join(report.unexpected[:8])}")
    if problems:
        hint = ""
        head_w = f"{head}.weight"
        theirs, ours = state_dict.get(head_w), own.get(head_w)
        if (
            not (adapt_head or fresh_head)
            and theirs is not None
            and ours is not None
            and theirs.shape[0] != ours.shape[0]
        ):
            hint = (
                f" The classifier head has {theirs.shape[0]} outputs in the weights but the "
                f"model expects {ours.shape[0]} classes: pass num_classes to re-initialise it, "
                "or fix the class list that goes with these weights."
            )
        raise StateDictMismatchError(
            f"Weights from {source} do not fit the model ({'; '.join(problems)}).{hint}"
        )
    model.load_state_dict(to_load, strict=False)
    report.loaded = sorted(to_load)
    log.info(report.summary())
    return report
