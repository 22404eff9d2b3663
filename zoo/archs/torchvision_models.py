"""ResNet-18/34/50 and MobileNetV2 built by torchvision.

Two weight tags per ResNet: ``tv_in1k`` (torchvision's IMAGENET1K_V1 files, loaded through
torch hub's cache) and ``a1_in1k`` (timm's "ResNet strikes back" A1 recipe, resolved through
the Hugging Face Hub; timm's ResNet uses the same parameter names as torchvision's, and the
load is strict, so any difference is reported). Fine-tuned variants replace ``fc``.
The metadata is static data; the builders import torchvision when they are called.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.metadata import ModelInfo, WeightSource
from zoo.registry import register_model

if TYPE_CHECKING:
    from torch import nn

_TV_RECIPE = "https://github.com/pytorch/vision/tree/main/references/classification"


@cache
def imagenet_categories() -> tuple[str, ...]:
    """The 1,000 ImageNet-1k class names, in index order (torchvision's list, copied into
    ``imagenet_classes.txt`` so that listing models does not import torchvision)."""
    text = (Path(__file__).with_name("imagenet_classes.txt")).read_text(encoding="utf-8")
    return tuple(text.splitlines())


def _tv_weights(filename: str, sha256: str | None = None) -> WeightSource:
    return WeightSource(
        kind="torchvision",
        url=f"https://download.pytorch.org/models/{filename}",
        filename=filename,
        sha256=sha256,
        hash_prefix=filename.rsplit("-", 1)[1].split(".")[0],
    )


def _tv_info(
    arch: str,
    filename: str,
    params: int,
    gflops: float,
    top1: float,
    top5: float,
    paper: str,
    sha256: str | None = None,
    classifier: str = "fc",
) -> ModelInfo:
    return ModelInfo(
        arch=arch,
        tag="tv_in1k",
        input_size=(3, 224, 224),
        num_classes=1000,
        params=params,
        gflops=gflops,
        crop_pct=0.875,
        interpolation="bilinear",
        label_names=imagenet_categories(),
        license="bsd-3-clause",
        paper=paper,
        source=_TV_RECIPE,
        description=f"{arch} trained on ImageNet-1k by torchvision (IMAGENET1K_V1).",
        weights=_tv_weights(filename, sha256),
        metrics=(("imagenet-1k/top1", top1), ("imagenet-1k/top5", top5)),
        metrics_source="torchvision Weights.meta (IMAGENET1K_V1)",
        classifier=classifier,
    )


def _timm_a1_info(arch: str, params: int, gflops: float) -> ModelInfo:
    return ModelInfo(
        arch=arch,
        tag="a1_in1k",
        input_size=(3, 224, 224),
        num_classes=1000,
        params=params,
        gflops=gflops,
        crop_pct=0.95,
        interpolation="bicubic",
        label_names=imagenet_categories(),
        license="apache-2.0",
        paper="arXiv:2110.00476",
        source="https://huggingface.co/timm/" + f"{arch}.a1_in1k",
        description=(
            f"{arch} trained on ImageNet-1k with timm's A1 recipe (ResNet strikes back). "
            "The Hub revision is not pinned: the default branch is used."
        ),
        weights=WeightSource(
            kind="hub", repo_id=f"timm/{arch}.a1_in1k", filename="model.safetensors", revision=None
        ),
        classifier="fc",
    )


_RESNET_PAPER = "arXiv:1512.03385"


@register_model(
    _tv_info("resnet18", "resnet18-f37072fd.pth", 11_689_512, 1.814, 69.758, 89.078, _RESNET_PAPER),
    _timm_a1_info("resnet18", 11_689_512, 1.814),
)
def resnet18(num_classes: int = 1000, **kw: object) -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(num_classes=num_classes, **kw)


@register_model(
    _tv_info("resnet34", "resnet34-b627a593.pth", 21_797_672, 3.664, 73.314, 91.42, _RESNET_PAPER),
    _timm_a1_info("resnet34", 21_797_672, 3.664),
)
def resnet34(num_classes: int = 1000, **kw: object) -> nn.Module:
    import torchvision

    return torchvision.models.resnet34(num_classes=num_classes, **kw)


@register_model(
    _tv_info("resnet50", "resnet50-0676ba61.pth", 25_557_032, 4.089, 76.13, 92.862, _RESNET_PAPER),
    _timm_a1_info("resnet50", 25_557_032, 4.089),
)
def resnet50(num_classes: int = 1000, **kw: object) -> nn.Module:
    import torchvision

    return torchvision.models.resnet50(num_classes=num_classes, **kw)


@register_model(
    _tv_info(
        "mobilenet_v2",
        "mobilenet_v2-b0353104.pth",
        3_504_872,
        0.301,
        71.878,
        90.286,
        "arXiv:1801.04381",
        sha256="b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889",
        classifier="classifier.1",
    )
)
def mobilenet_v2(num_classes: int = 1000, **kw: object) -> nn.Module:
    import torchvision

    return torchvision.models.mobilenet_v2(num_classes=num_classes, **kw)


MOBILENET_V2_S16_BLOCKS = 14
"""``mobilenet_v2_s16`` keeps MobileNetV2's first 14 of 19 feature blocks: through the
96-channel stage, the last one at output stride 16."""


@register_model(
    ModelInfo(
        arch="mobilenet_v2_s16",
        tag="tv_in1k",
        input_size=(3, 224, 224),
        num_classes=0,
        params=542_528,  # the backbone; a head adds 97 per class
        gflops=0.21,
        license="bsd-3-clause",
        paper="arXiv:1801.04381",
        source=_TV_RECIPE,
        description=(
            "MobileNetV2 cut after its stride-16 stage: the first 14 of its 19 feature blocks "
            "(96 channels out) with torchvision's ImageNet-1k weights (IMAGENET1K_V1), then "
            "average pooling and a new linear head. A pretrained backbone without a head of "
            "its own: fine-tune it or distil into it, a small, fast student. Its blocks end in "
            "mid-level features, so zoo trains all of it at the head's learning rate unless "
            "told otherwise (--strategy full --backbone-lr-mult 1)."
        ),
        weights=_tv_weights(
            "mobilenet_v2-b0353104.pth",
            "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889",
        ),
        classifier="classifier.1",
        unused_weights=tuple(f"features.{i}" for i in range(MOBILENET_V2_S16_BLOCKS, 19)),
    )
)
def mobilenet_v2_s16(num_classes: int, **kw: object) -> nn.Module:
    import torch
    import torchvision

    model = torchvision.models.mobilenet_v2(num_classes=num_classes, **kw)
    model.features = model.features[:MOBILENET_V2_S16_BLOCKS]
    # initialised as torchvision's MobileNetV2 head
    head = torch.nn.Linear(model.features[-1].out_channels, num_classes)
    torch.nn.init.normal_(head.weight, 0, 0.01)
    torch.nn.init.zeros_(head.bias)
    model.classifier[1] = head
    return model
