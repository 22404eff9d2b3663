"""``zoo export --format triton``: a Triton model repository for scale-out.

``REPO/<name>/config.pbtxt`` (onnxruntime_onnx, max_batch_size, dynamic_batching,
instance_group, dims without the batch dim, labels on the output), ``REPO/<name>/1/model.onnx``
and ``REPO/<name>/labels.txt``. The config is built and validated with Triton's own protobuf
schema (``model_config_pb2`` from the ``tritonclient`` package). The same KServe v2 client
that talks to ``zoo serve`` talks to Triton.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from zoo import durable
from zoo.deploy.export.onnx_export import export_onnx
from zoo.deploy.export.result import ExportResult
from zoo.deploy.triton_schema import model_config_pb2
from zoo.errors import ExportError, InputError, UsageError
from zoo.ref import ModelRef
from zoo.system import mib

_PURPOSE = "Writing a Triton repository"


def build_config(
    name: str,
    *,
    input_dims: list[int],
    num_classes: int,
    max_batch: int,
    instances: int = 1,
    kind: str = "KIND_CPU",
    pixels: bool = False,
    knn: bool = False,
) -> str:
    """``config.pbtxt`` text; ``pixels``: the graph preprocesses itself and takes
    ``pixels``, uint8 ``[height, width, C]`` of any size (``input_dims`` ``[-1, -1, C]``);
    ``knn``: the graph's second output, one kNN score per image (:data:`zoo.knn.KNN_OUTPUT`,
    shape ``[batch]``: Triton's ``dims [1]`` reshaped to a scalar per image)."""
    from google.protobuf import text_format

    pb = model_config_pb2(_PURPOSE)
    cfg = pb.ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=max_batch)
    if pixels:
        cfg.input.add(name="pixels", data_type=pb.TYPE_UINT8, dims=input_dims)
    else:
        cfg.input.add(name="input", data_type=pb.TYPE_FP32, dims=input_dims)
    cfg.output.add(
        name="logits", data_type=pb.TYPE_FP32, dims=[num_classes], label_filename="labels.txt"
    )
    if knn:
        from zoo.knn import KNN_OUTPUT

        out = cfg.output.add(name=KNN_OUTPUT, data_type=pb.TYPE_FP32, dims=[1])
        out.reshape.SetInParent()  # shape [] per image
    cfg.dynamic_batching.SetInParent()  # Triton's default: no added queue delay
    cfg.instance_group.add(count=instances, kind=getattr(pb.ModelInstanceGroup, kind))
    return str(text_format.MessageToString(cfg))


def validate_config(text: str) -> Any:
    """Parse ``config.pbtxt`` text with Triton's schema; raises on any unknown field or type."""
    from google.protobuf import text_format

    pb = model_config_pb2(_PURPOSE)
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise ExportError(f"config.pbtxt does not match Triton's schema: {exc}") from exc


def export_triton(
    model: str | ModelRef,
    repo: Path,
    *,
    max_batch: int = 32,
    opset: int = 18,
    data: str | None = None,
    name: str | None = None,
    weights: str | None = None,
    embed_preprocessing: bool = False,
) -> ExportResult:
    """A Triton repository of the model's ONNX export (``embed_preprocessing``: clients send
    uint8 pixels of any size; :mod:`zoo.deploy.export.graph_preprocess`).

    ``REPO/<name>/`` is built in a hidden folder beside it and swapped in whole
    (:func:`zoo.durable.replace_dir`): a kill leaves the old model folder or the new one.
    """
    from zoo.onnx_meta import read_metadata, read_preprocessing

    if max_batch < 1:  # 0 is Triton's "no batch axis", which zoo's batched graph always has
        raise UsageError(
            f"--max-batch {max_batch}: give at least 1 (the largest batch Triton may form; the "
            "exported graph always takes a batch axis).",
            param_hint="--max-batch",
        )
    if repo.exists() and not repo.is_dir():
        raise InputError(
            f"-o {repo} is a file; --format triton writes a model repository, a folder: name a "
            "new folder or an existing repository."
        )
    repo.mkdir(parents=True, exist_ok=True)
    # a hidden scratch folder (a kill leaves no model Triton would load; resume-style sweeps
    # remove it), on the repository's file system so that the model folder swaps in whole
    scratch = durable.temp_path(repo / (name or "model"), folder=True)
    try:
        onnx_path = scratch / "model.onnx"
        result = export_onnx(
            model,
            onnx_path,
            dynamic_batch=True,
            opset=opset,
            data=data,
            weights=weights,
            embed_preprocessing=embed_preprocessing,
            mismatch_hint="a Triton repository holds only a graph that matches (--format onnx "
            "--allow-mismatch writes the ONNX file anyway, to inspect)",
        )
        meta = read_metadata(onnx_path)
        name = name or f"{meta['arch']}.{meta['tag']}".replace(":", "_").replace("/", "_")
        stage = scratch / name
        (stage / "1").mkdir(parents=True)
        shutil.move(str(onnx_path), stage / "1" / "model.onnx")
        pre = read_preprocessing(meta, onnx_path)
        text = build_config(
            name,
            input_dims=[-1, -1, pre.channels] if embed_preprocessing else list(pre.input_size),
            num_classes=meta["num_classes"],
            max_batch=max_batch,
            pixels=embed_preprocessing,
            knn=result.parity is not None and result.parity.knn is not None,
        )
        validate_config(text)
        (stage / "config.pbtxt").write_text(text)
        labels = meta["class_names"] or [str(i) for i in range(meta["num_classes"])]
        (stage / "labels.txt").write_text("\n".join(labels) + "\n")
        durable.replace_dir(stage, repo / name, label=name)  # the old model or the new one
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.path, result.format = str(repo / name), "triton"
    result.size_mb = mib((repo / name / "1" / "model.onnx").stat().st_size)
    return result
