"""Grad-CAM (Selvaraju et al., 2017) with torch hooks: where in the image a class's score comes
from, for the registry's CNNs and timm's. Written by hand in a few lines: the kept library
(pytorch-grad-cam) would bring OpenCV and matplotlib for what two hooks do here."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from zoo.errors import InputError


def cam_layer(model: nn.Module, x: torch.Tensor) -> str:
    """The module whose output is the model's last spatial feature map: the last module to
    finish, in a forward pass of ``x``, with an ``(N, C, H, W)`` output and ``H·W > 1`` (for a
    ResNet ``layer4``, for torchvision's MobileNetV2 ``features``).

    Raises:
        InputError: the model has no such feature map (an MLP, a sequence model).
    """
    finished: list[str] = []
    names = {m: n for n, m in model.named_modules() if n}

    def note(m: nn.Module, _i: object, out: object) -> None:
        if isinstance(out, torch.Tensor) and out.ndim == 4 and out.shape[-1] * out.shape[-2] > 1:
            finished.append(names[m])

    hooks = [m.register_forward_hook(note) for m in names]
    try:
        with torch.inference_mode():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    if not finished:
        raise InputError(
            "Grad-CAM needs a spatial feature map (N, C, H, W), and this model has none (an "
            "MLP or a sequence model): the report shows no heat maps for it."
        )
    return finished[-1]


def grad_cam(model: nn.Module, layer: str, x: torch.Tensor, target: int) -> np.ndarray:
    """The Grad-CAM of class ``target`` for one image.

    Args:
        model: in eval mode; its parameters' gradients are not touched.
        layer: a module name (see :func:`cam_layer`).
        x: ``(1, C, H, W)``, preprocessed.
        target: the class index.

    Returns:
        ``(H, W)`` float32 in [0, 1] at the input's size (all zeros where no location raises
        the score).
    """
    acts: list[torch.Tensor] = []
    hook = model.get_submodule(layer).register_forward_hook(lambda _m, _i, out: acts.append(out))
    try:
        with torch.enable_grad():  # x needs a graph even when every parameter is frozen
            score = model(x.detach().requires_grad_(True))[0, target]
            (grad,) = torch.autograd.grad(score, acts[0])
    finally:
        hook.remove()
    act = acts[0].detach()
    weights = grad.mean(dim=(2, 3), keepdim=True)  # one weight per channel: pooled gradients
    cam = F.relu((weights * act).sum(1, keepdim=True))
    cam = F.interpolate(cam, size=x.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
    top = float(cam.max())
    return (cam / top if top > 0 else cam).float().cpu().numpy()


HEAT = np.array([[0, 0, 0], [120, 0, 160], [230, 60, 30], [255, 220, 40]], np.float64)


def overlay(image: np.ndarray, cam: np.ndarray, alpha: float = 0.5) -> Image.Image:
    """``image`` (``(H, W, 3)`` uint8) with ``cam`` drawn over it as heat (dark → yellow),
    more opaque where the map is higher."""
    stops = np.linspace(0, 1, len(HEAT))
    heat = np.stack([np.interp(cam, stops, HEAT[:, c]) for c in range(3)], axis=-1)
    a = alpha * cam[..., None]
    return Image.fromarray((image * (1 - a) + heat * a).round().astype(np.uint8))


def unnormalize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """A preprocessed ``(C, H, W)`` tensor back to ``(H, W, 3)`` uint8 RGB (grey repeated)."""
    m = torch.tensor(mean)[:, None, None]
    s = torch.tensor(std)[:, None, None]
    rgb = (x.cpu() * s + m).clamp(0, 1).mul(255).round().byte().permute(1, 2, 0).numpy()
    return np.repeat(rgb, 3, axis=2) if rgb.shape[2] == 1 else rgb


__all__ = ["cam_layer", "grad_cam", "overlay", "unnormalize"]
