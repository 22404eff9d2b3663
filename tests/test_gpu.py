"""CUDA paths of the trainer and of deploy. Skipped, with the reason, where there is no GPU;
run on a lent GPU machine with `pytest -m gpu` (see docs/benchmarks.md for the figures)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import zoo
from tests.conftest import run_zoo
from zoo.samples import sample_image_paths
from zoo.transforms import eval_transform

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


def _real_batch() -> torch.Tensor:
    tf = eval_transform(zoo.model_info("mobilenet_v2"))
    return torch.stack([tf(Image.open(p)) for p in sample_image_paths()])


def test_cuda_paths_match_cpu_eager(mobilenet_weights: Path) -> None:
    cpu = zoo.create_model("mobilenet_v2")
    x = _real_batch()
    with torch.no_grad():
        ref = cpu(x)
        gpu = zoo.create_model("mobilenet_v2").cuda()
        paths = {
            "eager": gpu,
            "channels_last": zoo.create_model("mobilenet_v2")
            .cuda()
            .to(memory_format=torch.channels_last),
            "torchscript": torch.jit.trace(gpu, x.cuda()),
            "compile": torch.compile(zoo.create_model("mobilenet_v2").cuda()),
        }
        for name, fn in paths.items():
            out = fn(x.cuda()).float().cpu()
            # TF32 convolutions: ~1e-3 relative; top-1 must agree exactly
            torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2, msg=name)
            assert torch.equal(out.argmax(1), ref.argmax(1)), name


def test_finetune_bf16_channels_last_compile_on_cuda(
    small_digits: Path, tmp_path: Path, mobilenet_weights: Path
) -> None:
    r = run_zoo(
        "finetune",
        "mobilenet_v2",
        "--data",
        str(small_digits),
        "--strategy",
        "full",
        "--epochs",
        "2",
        "--image-size",
        "64",
        "--amp",
        "bf16",
        "--channels-last",
        "--compile",
        "--device",
        "cuda",
        "--runs",
        str(tmp_path),
        "--name",
        "gpu",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(np.isfinite(row["train/loss"]) for row in rows)
    assert 0.0 <= rows[-1]["data_wait"] <= 1.0


def test_fp16_uses_the_grad_scaler(small_digits: Path, tmp_path: Path) -> None:
    r = run_zoo(
        "finetune",
        "simple_cnn",
        "--data",
        str(small_digits),
        "--epochs",
        "1",
        "--amp",
        "fp16",
        "--device",
        "cuda",
        "--runs",
        str(tmp_path),
        "--name",
        "fp16",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    state = torch.load(tmp_path / "fp16" / "checkpoints" / "last.pt", weights_only=True)
    assert state["scaler"], "fp16 runs with an enabled GradScaler (a disabled one saves {})"


def test_cuda_bench_rows_never_fall_back_silently() -> None:
    import onnxruntime as ort

    r = run_zoo(
        "bench",
        "simple_cnn",
        "--devices",
        "cuda",
        "--backends",
        "eager,compile,torchscript,ort_fp32",
        "--batch-sizes",
        "1,64",
        "--seconds",
        "0.2",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rows = {(x["backend"], x["batch"]): x for x in json.loads(r.stdout)["rows"]}
    for b in ("eager", "compile", "torchscript"):
        big = rows[(b, 64)]
        assert rows[(b, 1)]["status"] == big["status"] == "✅"
        assert big["img_per_s"] == round(64 * 1000 / big["p50_ms"], 1)
    ort_row = rows[("ort_fp32", 1)]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert ort_row["status"] == "✅"
    else:
        assert ort_row["status"] == "❌" and "CUDAExecutionProvider" in ort_row["reason"]


def test_ort_cuda_session_is_asserted(mobilenet_onnx: Path) -> None:
    import onnxruntime as ort

    from zoo.deploy.runtimes.loader import make_session

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime here has no CUDA provider (covered by test_deploy's error test)")
    assert make_session(mobilenet_onnx, device="cuda").get_providers()[0] == "CUDAExecutionProvider"


def test_image_cache_path_augments_on_the_gpu(tmp_path: Path, mobilenet_weights: Path) -> None:
    """--image-cache on with a CUDA device: uint8 crops from the workers, jittered and
    normalised on the GPU; the batched finish there agrees with the CPU's on the same batch."""
    from torch.utils.data import default_collate

    from zoo.samples import write_photo_folder
    from zoo.train.augment import Augment, CachedImageDataset, finish_batch
    from zoo.train.image_cache import CacheSpec, ImageCache

    photos = write_photo_folder(tmp_path / "photos", per_class=12)
    r = run_zoo(
        "finetune", "mobilenet_v2", "--data", str(photos), "--epochs", "1", "-b", "16",
        "--amp", "bf16", "--device", "cuda", "--image-cache", "on",
        "--runs", str(tmp_path), "--name", "cached", "--no-progress",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "normalised on the GPU in batches" in r.stderr
    assert json.loads((tmp_path / "cached" / "config.json").read_text())["image_cache"] == "on"
    pre = zoo.model_info("mobilenet_v2").preprocessing()
    ds = CachedImageDataset(
        [(p, 0) for p in sorted(photos.rglob("*.jpg"))[:16]],
        ImageCache(CacheSpec.for_model(pre), tmp_path / "store"),
        Augment.for_model(pre, train=True),
    )
    (x, rows), _, _ = default_collate([ds[i] for i in range(len(ds))])
    on_cpu = finish_batch(ds.aug, x, rows)
    on_gpu = finish_batch(ds.aug, x.cuda(), rows.cuda()).cpu()
    torch.testing.assert_close(on_gpu, on_cpu, atol=2e-3, rtol=0)


def test_fp16_through_torch_cuda_passes_the_fp16_gate(mobilenet_weights: Path) -> None:
    """`--precision fp16`'s tolerances, checked where fp16 really computes in fp16: the model
    halved on the GPU (ONNX Runtime here has no CUDA provider), against fp32 CPU eager, by
    the export gate itself; fp32's bounds must reject it (the fp16 bounds are not vacuous)."""
    import copy

    from zoo.deploy.export.parity import FP16, FP32, check_parity
    from zoo.factory import info_of

    model = zoo.create_model("mobilenet_v2").eval()
    half = copy.deepcopy(model).half().cuda()

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return half(torch.from_numpy(x).cuda().half()).float().cpu().numpy()

    kw = dict(export_batch=4, dynamic_batch=True, dynamic_size=False, images=sample_image_paths())
    report = check_parity(model, info_of(model), run, tolerances=FP16, **kw)
    assert report.passed, report.failures()
    print("fp16 on CUDA vs fp32 CPU:", report.tensors)
    assert not check_parity(model, info_of(model), run, tolerances=FP32, **kw).passed
