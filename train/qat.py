"""Quantization-aware fine-tuning (``zoo distill RUN --qat``): the model trains through the
rounding that int8 will apply, distilled from its own fp32 self, so that post-training
quantization of the result keeps its answers.

The fake quantization is the one ``zoo quantize --engine ort`` applies (onnxruntime's QDQ,
U8S8): per output channel symmetric int8 weights (±127 at their largest magnitude), and
per-tensor uint8 activations (the min/max calibration range, zero included) wherever
onnxruntime puts them: every conv and linear layer's input, each layer's output (after its
BatchNorm, and after a ReLU/ReLU6 that onnxruntime fuses into it), the sum of a residual
block (torchvision's ``InvertedResidual``) and the logits. On the ImageNet MobileNetV2 the fake
quantization then agrees with onnxruntime's int8 as often as fp32 does (0.79 and 0.80 of
held-out photo crops); with the layers' inputs alone it claimed 0.87. After training, the
fake-quant model's logits are several times nearer onnxruntime's int8 than its fp32 logits
are (tests/test_qat.py).

BatchNorm is folded into the conv before it (the conv's weights and bias become those the
exported graph computes; the BatchNorm keeps its keys and is left as the identity plus the
folded bias), so the steps act on the weights onnxruntime quantizes, not on weights that a
1/σ (large where a channel's running variance is tiny) multiplies afterwards; per channel
weight scales commute with the fold, so the int8 weights are the same either way. The model
trains in eval mode (no dropout: the student matches its fp32 self, not a dropped-out copy).
On the ImageNet MobileNetV2 (2 epochs at lr 1e-5, photo crops) the two together moved the
fp32 answers on 6 % of held-out crops instead of 16 %.
The activation ranges are calibrated once on the folded fp32 model, on a seeded sample of the
training images, and stay fixed: so the run's only state is its weights, and a resume
recomputes the same ranges (exact resume comes free; folding the folded weights changes
nothing).

Why by hand (a line each): torch.ao's eager QAT needs per-architecture fusion lists and stubs,
its FX and PT2E modes now live in torchao and change the state dict; NNCF's torch QAT exports a
custom FakeQuantize op that onnxruntime refuses. Here the ops are torch's own
``fake_quantize_per_{channel,tensor}_affine`` (straight-through gradients), the state dict keys
stay the architecture's, and ``zoo export`` ships the weights as any fp32 run's.
"""

from __future__ import annotations

import itertools
import random
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zoo.errors import some_of
from zoo.preprocessing import Preprocessing

QUANT_LAYERS = (nn.Conv2d, nn.Linear)
OUTPUT = ""  # the model's own output (the logits), in the ranges beside the layers' names
# activations onnxruntime fuses into the layer before them: the layer's output is quantized
# after them (ReLU6 is a Hardtanh)
FUSED_ACTIVATIONS = (nn.ReLU, nn.Hardtanh)
CALIBRATION_IMAGES = 256  # the seeded training sample the activation ranges come from


@dataclass(frozen=True)
class Range:
    """One activation's calibrated range (zero included, as onnxruntime's minmax does)."""

    low: float
    high: float

    def qparams(self) -> tuple[float, int]:
        """uint8 scale and zero point, as onnxruntime computes them for U8 activations."""
        scale = max(self.high - self.low, 1e-8) / 255.0
        return scale, min(255, max(0, round(-self.low / scale)))


STOCK_FORWARD = (nn.Conv2d.forward, nn.Linear.forward)


def layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers int8 quantizes and this module emulates, by name: every conv and linear layer
    whose forward is torch's own (:func:`prepare` replaces it)."""
    return [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, QUANT_LAYERS) and type(m).forward in STOCK_FORWARD
    ]


def own_forward(model: nn.Module) -> list[str]:
    """Conv and linear layers with a forward of their own (timm's ``Conv2dSame`` pads first):
    left float in training, since replacing their forward would drop what it adds."""
    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, QUANT_LAYERS) and type(m).forward not in STOCK_FORWARD
    ]


def after(name: str) -> str:
    """The ranges' key of the output of the module called ``name``."""
    return f"{name}:output"


def output_points(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules whose output onnxruntime's QDQ quantizes besides the layers' inputs, by
    name: in a ``Sequential``, each conv or linear layer's output (after a BatchNorm that
    follows it, and after a ReLU/ReLU6 that follows that); and the sum of each of
    torchvision's residual ``InvertedResidual`` blocks."""
    from torchvision.models.mobilenetv2 import InvertedResidual

    points: dict[str, nn.Module] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, InvertedResidual) and mod.use_res_connect:
            points[name] = mod
        if not isinstance(mod, nn.Sequential):
            continue
        kids = list(mod.named_children())
        for i, (_, m) in enumerate(kids):
            if not isinstance(m, QUANT_LAYERS):
                continue
            j = i
            if j + 1 < len(kids) and type(kids[j + 1][1]) is nn.BatchNorm2d:
                j += 1
            if j + 1 < len(kids) and isinstance(kids[j + 1][1], FUSED_ACTIVATIONS):
                j += 1
            points[f"{name}.{kids[j][0]}" if name else kids[j][0]] = kids[j][1]
    return list(points.items())


def activation_ranges(model: nn.Module, batches: Iterable[torch.Tensor]) -> dict[str, Range]:
    """Each quantized layer's input range (at its name), each :func:`output_points` module's
    output range (at :func:`after` its name; left out where the module is called more than
    once a pass, as a ReLU reused in a block is) and the model's output range (at
    :data:`OUTPUT`), over ``batches`` (the model in eval mode, fp32)."""
    seen: dict[str, tuple[float, float]] = {}
    calls: dict[str, int] = {}

    def widen(key: str, x: torch.Tensor) -> None:
        lo, hi = seen.get(key, (0.0, 0.0))
        seen[key] = (min(lo, float(x.min())), max(hi, float(x.max())))

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(_: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            widen(name, args[0].detach())

        return hook

    def record_after(name: str) -> Callable[[nn.Module, object, object], None]:
        def hook(_: nn.Module, __: object, y: object) -> None:
            if isinstance(y, torch.Tensor):
                calls[name] = calls.get(name, 0) + 1
                widen(after(name), y.detach())

        return hook

    def record_output(_: nn.Module, __: object, y: object) -> None:
        if isinstance(y, torch.Tensor):  # not a classifier's logits: left alone
            widen(OUTPUT, y)

    was_training = model.training
    model.eval()
    handles = [m.register_forward_pre_hook(record(n)) for n, m in layers(model)]
    handles += [m.register_forward_hook(record_after(n)) for n, m in output_points(model)]
    handles.append(model.register_forward_hook(record_output))
    batch_count = 0
    try:
        with torch.inference_mode():
            for x in batches:
                model(x)
                batch_count += 1
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    reused = {after(n) for n, c in calls.items() if c > batch_count}
    return {n: Range(*v) for n, v in seen.items() if n not in reused}


def fold_batchnorm(model: nn.Module) -> int:
    """Fold each BatchNorm that follows a conv in a ``Sequential`` into that conv, in place:
    the conv's weight becomes ``W·γ/σ`` and the BatchNorm the identity plus the folded bias
    (γ 1, mean 0, variance 1 − eps), so the model computes what it did and the state dict
    keeps its keys. Folding again changes nothing but float rounding. Returns how many were
    folded."""
    done = 0
    for mod in model.modules():
        if not isinstance(mod, nn.Sequential):
            continue
        kids = list(mod.children())
        for conv, bn in itertools.pairwise(kids):
            if not (isinstance(conv, nn.Conv2d) and type(bn) is nn.BatchNorm2d):
                continue
            if not bn.track_running_stats or bn.running_var is None or bn.running_mean is None:
                continue
            with torch.no_grad():
                gamma = bn.weight if bn.affine else torch.ones_like(bn.running_var)
                beta = bn.bias if bn.affine else torch.zeros_like(bn.running_var)
                k = gamma / torch.sqrt(bn.running_var + bn.eps)
                conv_bias = conv.bias if conv.bias is not None else 0.0
                bias = beta + (conv_bias - bn.running_mean) * k
                conv.weight.mul_(k.view(-1, *([1] * (conv.weight.dim() - 1))))
                if conv.bias is not None:
                    conv.bias.zero_()
                if bn.affine:
                    bn.weight.fill_(1.0)
                    bn.bias.copy_(bias)
                else:  # no bias of its own to hold the folded one: the mean holds it
                    bn.running_mean.copy_(-bias)
                    bn.running_var.fill_(1.0 - bn.eps)
                    done += 1
                    continue
                bn.running_mean.zero_()
                bn.running_var.fill_(1.0 - bn.eps)
            done += 1
    return done


WEIGHT_LEVELS = {8: 127, 7: 64}
"""The largest int8 weight level by weight bits: onnxruntime's symmetric [-127, 127], and with
``reduce_range`` (7 bits, :func:`zoo.system.int8_weight_bits`) [-64, 64]."""


def fake_weight(w: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Symmetric int8 per output channel in [-q, q], q = :data:`WEIGHT_LEVELS` [``bits``]
    (scale: the channel's largest magnitude / q), as onnxruntime quantizes weights."""
    q = WEIGHT_LEVELS[bits]
    dims = tuple(range(1, w.dim()))
    scale = (w.detach().abs().amax(dim=dims) / q).clamp_min(1e-12).float()
    zero = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(w, scale, zero, 0, -q, q)


def prepare(model: nn.Module, ranges: dict[str, Range], weight_bits: int = 8) -> int:
    """Put fake quantization into ``model``'s conv and linear layers, in place: their weights
    per channel (``weight_bits``: 8, or 7 as ``reduce_range``) and their inputs at ``ranges``, the :func:`output_points` outputs at theirs,
    and its output (the logits) at ``ranges[OUTPUT]``. The parameters and state dict are unchanged.
    Returns how many layers were prepared."""
    done = 0
    for name, m in layers(model):
        if name not in ranges:  # a layer calibration never reached (an unused branch)
            continue
        scale, zero = ranges[name].qparams()
        if isinstance(m, nn.Conv2d):

            def conv(
                self: nn.Conv2d, x: torch.Tensor, s: float = scale, z: int = zero
            ) -> torch.Tensor:
                x = torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255)
                return self._conv_forward(x, fake_weight(self.weight, weight_bits), self.bias)

            m.forward = types.MethodType(conv, m)  # type: ignore[method-assign]
        else:

            def linear(
                self: nn.Linear, x: torch.Tensor, s: float = scale, z: int = zero
            ) -> torch.Tensor:
                x = torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255)
                return F.linear(x, fake_weight(self.weight, weight_bits), self.bias)

            m.forward = types.MethodType(linear, m)
        done += 1
    for name, m in output_points(model):
        if after(name) in ranges:
            quantize_output(m, ranges[after(name)])
    if OUTPUT in ranges:  # the logits: onnxruntime quantizes the last layer's output too
        quantize_output(model, ranges[OUTPUT])
    return done


def quantize_output(module: nn.Module, at: Range) -> None:
    """Fake-quantize ``module``'s output to uint8 at the range ``at`` (a forward hook)."""
    scale, zero = at.qparams()
    module.register_forward_hook(
        lambda _m, _x, y: torch.fake_quantize_per_tensor_affine(y, scale, zero, 0, 255)
    )


def prepare_for_run(
    model: nn.Module,
    pre: Preprocessing,
    images: Sequence[Path],
    device: torch.device,
    weight_bits: int = 8,
) -> str:
    """Fold ``model``'s BatchNorm into its convs, calibrate its activation ranges on a seeded
    sample of ``images`` (the training split, through the eval transform) and :func:`prepare`
    it with ``weight_bits`` weights; returns the line to print. The run then trains it in eval
    mode."""
    from zoo.images import open_image
    from zoo.transforms import eval_transform

    sample = sorted(images)
    random.Random(0).shuffle(sample)
    sample = sample[:CALIBRATION_IMAGES]
    transform = eval_transform(pre)
    batches = (
        torch.stack([transform(open_image(p)) for p in sample[i : i + 64]]).to(device)
        for i in range(0, len(sample), 64)
    )
    folded = fold_batchnorm(model)
    ranges = activation_ranges(model, batches)
    n = prepare(model, ranges, weight_bits)
    outputs = sum(after(name) in ranges for name, _ in output_points(model))
    own = own_forward(model)
    return (
        f"qat: {n} conv/linear layers train through int8 rounding (weights int8 per channel"
        + (
            ", 7 bits as onnxruntime's reduce_range on CPUs without VNNI"
            if weight_bits == 7
            else ""
        )
        + f"; their inputs and {outputs} outputs uint8 at ranges from {len(sample)} training "
        f"images, as zoo quantize --engine ort quantizes them); {folded} BatchNorm folded into "
        "their convs and frozen; no dropout"
        + (
            f"; {len(own)} with a forward of their own left float in training ({some_of(own, 3)})"
            if own
            else ""
        )
    )


__all__ = [
    "CALIBRATION_IMAGES",
    "OUTPUT",
    "Range",
    "activation_ranges",
    "after",
    "fake_weight",
    "fold_batchnorm",
    "output_points",
    "own_forward",
    "prepare",
    "prepare_for_run",
]
