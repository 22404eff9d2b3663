"""``zoo predict``: top-k labels from an ONNX file (metadata only, no model code) or from a
registry entry / run through PyTorch."""

from __future__ import annotations

from typing import Any

import torch

from zoo.deploy.preprocess import scores
from zoo.images import open_image
from zoo.ref import ModelRef


def predict(
    model: str | ModelRef, images: list[str], *, k: int = 5, device: str = "cpu"
) -> list[dict[str, Any]]:
    """Top-``k`` labels of each image.

    Args:
        model: a model reference: an ``.onnx`` file runs in ONNX Runtime from its embedded
            metadata alone; anything else is built with :func:`zoo.create_model`.
        images: image files.
        k: labels per image.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.

    Returns:
        One ``{"image", "top": [{"label", "index", "score"}, ...]}`` per image, in order.

    Raises:
        ModelRefError / UnknownModelError: the reference does not parse.
        InputError: an image is missing or unreadable.
        Everything :func:`zoo.create_model` or ``OnnxClassifier`` raises.
    """
    ref = ModelRef.parse(model)
    if ref.kind == "onnx":
        from zoo.deploy.runtime import OnnxClassifier

        clf = OnnxClassifier(str(ref.path), device=device)
        preds = clf.classify([open_image(p) for p in images], k=k)
        return [
            {"image": img, "top": [p.__dict__ for p in ps]}
            for img, ps in zip(images, preds, strict=True)
        ]
    from zoo.device import pick_device
    from zoo.factory import create_model, info_of
    from zoo.transforms import eval_transform

    dev = pick_device(device)
    net = create_model(ref).to(dev)
    info = info_of(net)
    tf = eval_transform(info)
    x = torch.stack([tf(open_image(p)) for p in images]).to(dev)
    with torch.inference_mode():
        probs = scores(net(x).float().cpu().numpy(), info.multi_label)
    labels = list(info.label_names or [])
    out = []
    for img, row in zip(images, probs, strict=True):
        top = row.argsort()[::-1][:k]
        out.append(
            {
                "image": img,
                "top": [
                    {
                        "label": labels[i] if i < len(labels) else str(i),
                        "index": int(i),
                        "score": float(row[i]),
                    }
                    for i in top
                ],
            }
        )
    return out
