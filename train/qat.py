"""Quantization-aware fine-tuning (``zoo distill RUN --qat``): the model trains through the
rounding that int8 will apply, distilled from its own fp32 self, so that post-training
quantization of the result keeps its answers.

The fake quantization is the one ``zoo quantize --engine ort`` applies (onnxruntime's QDQ,
U8S8): per output channel symmetric int8 weights (±127 at their largest magnitude), and
per-tensor uint8 activations at every conv and linear layer's input and at the logits, with
the min/max calibration range (zero included). After training, the fake-quant model's logits
are several times nearer onnxruntime's int8 than its fp32 logits are (tests/test_qat.py).
The activation ranges are calibrated once on the fp32 model, on a seeded sample of the
training images, and stay fixed: so the run's only state is its weights, and a resume
recomputes the same ranges (exact resume comes free). BatchNorm stays
in eval mode throughout (its statistics are what the exported graph folds into the convs; per
channel weight scales commute with that folding, so quantizing the unfolded weights here is
quantizing the folded ones there).

Why by hand (a line each): torch.ao's eager QAT needs per-architecture fusion lists and stubs,
its FX and PT2E modes now live in torchao and change the state dict; NNCF's torch QAT exports a
custom FakeQuantize op that onnxruntime refuses. Here the ops are torch's own
``fake_quantize_per_{channel,tensor}_affine`` (straight-through gradients), the state dict keys
stay the architecture's, and ``zoo export`` ships the weights as any fp32 run's.
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zoo.preprocessing import Preprocessing

QUANT_LAYERS = (nn.Conv2d, nn.Linear)
OUTPUT = ""  # the model's own output (the logits), in the ranges beside the layers' names
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


def input_ranges(model: nn.Module, batches: Iterable[torch.Tensor]) -> dict[str, Range]:
    """Each quantized layer's input range, and the model's output range (at :data:`OUTPUT`),
    over ``batches`` (the model in eval mode, fp32)."""
    seen: dict[str, tuple[float, float]] = {}

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(_: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].detach()
            lo, hi = seen.get(name, (0.0, 0.0))
            seen[name] = (min(lo, float(x.min())), max(hi, float(x.max())))

        return hook

    def record_output(_: nn.Module, __: object, y: object) -> None:
        if not isinstance(y, torch.Tensor):  # not a classifier's logits: left alone
            return
        lo, hi = seen.get(OUTPUT, (0.0, 0.0))
        seen[OUTPUT] = (min(lo, float(y.min())), max(hi, float(y.max())))

    was_training = model.training
    model.eval()
    handles = [m.register_forward_pre_hook(record(n)) for n, m in layers(model)]
    handles.append(model.register_forward_hook(record_output))
    try:
        with torch.inference_mode():
            for x in batches:
                model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {n: Range(*v) for n, v in seen.items()}


def fake_weight(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per output channel in [-127, 127] (scale: the channel's largest magnitude
    / 127), as onnxruntime quantizes weights."""
    dims = tuple(range(1, w.dim()))
    scale = (w.detach().abs().amax(dim=dims) / 127.0).clamp_min(1e-12).float()
    zero = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(w, scale, zero, 0, -127, 127)


def prepare(model: nn.Module, ranges: dict[str, Range]) -> int:
    """Put fake quantization into ``model``'s conv and linear layers, in place: their weights
    per channel and their inputs at ``ranges``, and its output (the logits) at
    ``ranges[OUTPUT]``. The parameters and state dict are unchanged.
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
                return self._conv_forward(x, fake_weight(self.weight), self.bias)

            m.forward = types.MethodType(conv, m)  # type: ignore[method-assign]
        else:

            def linear(
                self: nn.Linear, x: torch.Tensor, s: float = scale, z: int = zero
            ) -> torch.Tensor:
                x = torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255)
                return F.linear(x, fake_weight(self.weight), self.bias)

            m.forward = types.MethodType(linear, m)
        done += 1
    if OUTPUT in ranges:  # the logits: onnxruntime quantizes the last layer's output too
        s_out, z_out = ranges[OUTPUT].qparams()
        model.register_forward_hook(
            lambda _m, _x, y: torch.fake_quantize_per_tensor_affine(y, s_out, z_out, 0, 255)
        )
    return done


def prepare_for_run(
    model: nn.Module, pre: Preprocessing, images: Sequence[Path], device: torch.device
) -> str:
    """Calibrate ``model``'s activation ranges on a seeded sample of ``images`` (the training
    split, through the eval transform) and :func:`prepare` it; returns the line to print."""
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
    n = prepare(model, input_ranges(model, batches))
    own = own_forward(model)
    return (
        f"qat: {n} conv/linear layers train through int8 rounding (weights int8 per channel, "
        f"inputs uint8 at ranges from {len(sample)} training images, as zoo quantize --engine "
        "ort quantizes them); BatchNorm frozen"
        + (
            f"; {len(own)} with a forward of their own left float in training "
            f"({', '.join(own[:3])}{', …' if len(own) > 3 else ''})"
            if own
            else ""
        )
    )


def freeze_batchnorm(model: nn.Module) -> None:
    """Every BatchNorm layer in eval mode (call after ``model.train()``)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()


__all__ = [
    "CALIBRATION_IMAGES",
    "OUTPUT",
    "Range",
    "fake_weight",
    "freeze_batchnorm",
    "input_ranges",
    "own_forward",
    "prepare",
    "prepare_for_run",
]
