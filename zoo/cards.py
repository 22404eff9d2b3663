"""Hugging Face-style model cards, built with huggingface_hub's card data classes.

Registry cards live in ``model_cards/<arch>.<tag>.md``; fine-tuned folders get a card with
the metrics zoo measured. Numbers in the front matter come from the same metadata the
registry serves, and a test keeps the two equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# the data classes only: ``huggingface_hub.ModelCard`` pulls in the Hub client (~0.3 s at the
# end of every fine-tuning run); the text it would hold is the front matter + body made here
from huggingface_hub.repocard_data import EvalResult, ModelCardData

from zoo.errors import ArtifactError
from zoo.metadata import ModelInfo

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

    from zoo.model_config import ModelConfig

_USAGE = """```python
import zoo

model = zoo.create_model("{name}")  # eval mode, weights verified and loaded strictly
# different label set: the head is re-initialised, everything else loads strictly
model = zoo.create_model("{name}", num_classes=5)
```

```bash
zoo info {name}
zoo finetune {name} --data ./my_images
zoo export {name} -o {safe}.onnx
```"""

_USAGE_HEADLESS = """```python
import zoo

# a backbone without a head: a class count builds a fresh one on the pretrained blocks
model = zoo.create_model("{name}", num_classes=5)
```

```bash
zoo info {name}
zoo finetune {name} --data ./my_images
zoo distill runs/MY_RUN --student {name} --data ./my_images
```"""


def _card_data(
    info: ModelInfo, *, eval_results: list[EvalResult] | None, extra: dict[str, Any]
) -> ModelCardData:
    return ModelCardData(
        model_name=info.name,
        license=info.license if info.license != "unknown" else None,
        library_name="zoo",
        pipeline_tag="image-classification",
        tags=["image-classification", "zoo", info.arch.removeprefix("timm:")],
        datasets=["imagenet-1k"] if info.label_names and len(info.label_names) == 1000 else None,
        base_model=info.parent,
        eval_results=eval_results or None,
        zoo_name=info.name,
        params=info.params,
        gflops=info.gflops,
        input_size=list(info.input_size),
        num_classes=info.num_classes,
        preprocessing=info.preprocessing().to_dict(),
        weights_source=info.weights.describe(),
        weights_pinned=info.weights.pinned,
        weights_sha256=info.weights.sha256,
        **extra,
    )


def _published_results(info: ModelInfo) -> list[EvalResult]:
    results = []
    for key, value in info.metrics:
        dataset, _, metric = key.partition("/")
        results.append(
            EvalResult(
                task_type="image-classification",
                dataset_type=dataset,
                dataset_name=dataset,
                dataset_split="validation",
                metric_type="accuracy",
                metric_name=metric,
                metric_value=value,
                source_name=info.metrics_source,
                source_url=info.source,
            )
        )
    return results


def registry_card(info: ModelInfo) -> str:
    pre = info.preprocessing()
    acc = "\n".join(f"| {k} | {v} |" for k, v in info.metrics) or "| (none published) | |"
    body = f"""
# {info.name}

{info.description}

## Architecture and input
- Architecture: `{info.arch}`, weight tag `{info.tag}`
- Parameters: {info.params:,} {"without a head" if info.headless else f"at {info.num_classes} classes"}
- GFLOPs: {info.gflops:g} at {"×".join(map(str, info.input_size))}, batch 1 (1 multiply-add = 1 FLOP, torchvision's convention)
- Input: {"×".join(map(str, info.input_size))}; preprocessing: resize short side to {pre.resize_size} ({pre.interpolation}), center crop {pre.crop_size} (crop pct {pre.crop_pct}), scale to [0, 1], normalise with mean {list(pre.mean)} and std {list(pre.std)}
- Output: {"none until trained: its weights hold no head (fine-tune it or distil into it)" if info.headless else f"raw logits for {info.num_classes} classes (no softmax in the head)"}

## Weights
- Source: {info.weights.describe()}
- Pinned: {"yes" if info.weights.pinned else "no"}
- License: {info.license}
- Paper / source: {info.paper or "—"} / {info.source or "—"}

## Published accuracy
| metric | value |
| --- | --- |
{acc}

Source: {info.metrics_source or "—"}

## How to use with zoo
{(_USAGE_HEADLESS if info.headless else _USAGE).format(name=info.name, safe=info.name.replace(":", "_"))}
"""
    data = _card_data(info, eval_results=_published_results(info), extra={})
    return f"---\n{data.to_yaml()}\n---\n{body}"


def finetuned_card(info: ModelInfo, config: ModelConfig) -> str:
    """Card of a fine-tuned model folder, with the metrics measured by zoo and its lineage."""
    metrics, data = config.metrics, config.data
    results = [
        EvalResult(
            task_type="image-classification",
            dataset_type="imagefolder",
            dataset_name=data.name or "imagefolder",
            dataset_split="validation",
            metric_type=k.split("/")[-1],
            metric_name=k,
            metric_value=v,
        )
        for k, v in metrics.items()
    ]
    lineage = " → ".join([*config.lineage, info.name])
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in metrics.items()) or "| (none) | |"
    classes = ", ".join(config.class_names[:20]) + (" …" if len(config.class_names) > 20 else "")
    num_images = data.num_images if data.num_images is not None else "?"
    body = f"""
# {info.name}

Fine-tuned by zoo from `{config.base}` on {num_images} images ({config.num_classes} classes: {classes}).

## Lineage
{lineage}

- Parent weights: {config.parent_weights or "—"}
- Training data fingerprint: `{data.fingerprint or "—"}`
- Strategy: {config.strategy or "—"}, epochs: {config.epochs if config.epochs is not None else "—"}
- Compute: {info.gflops:.4g} GFLOPs at {"×".join(map(str, info.input_size))}, batch 1 (the size it was trained at; 1 multiply-add = 1 FLOP)

## Measured results (validation split)
| metric | value |
| --- | --- |
{rows}

## How to use with zoo
```python
import zoo
model = zoo.create_model("path/to/this/folder")
```
```bash
zoo predict path/to/this/folder image.jpg
zoo export path/to/this/folder -o model.onnx
```
"""
    card = _card_data(info, eval_results=results, extra={"zoo_lineage": list(config.lineage)})
    return f"---\n{card.to_yaml()}\n---\n{body}"


def validate_card_locally(text: str) -> ModelCard:
    """Parse a card back with huggingface_hub and check the fields zoo relies on (no network)."""
    from huggingface_hub import ModelCard

    try:
        card = ModelCard(text)
    except Exception as exc:  # huggingface_hub raises ValueError/YAMLError variants
        raise ArtifactError(f"Model card does not parse: {exc}") from exc
    data = card.data.to_dict()
    for key in ("library_name", "zoo_name", "params", "num_classes", "preprocessing"):
        if key not in data:
            raise ArtifactError(f"Model card lacks the front-matter field {key!r}.")
    for result in getattr(card.data, "eval_results", None) or []:
        if result.metric_value is None:
            raise ArtifactError(f"Model card eval result {result.metric_type!r} has no value.")
    return card
