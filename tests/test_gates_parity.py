"""The export parity gate on plain arrays and a tiny eager model (seconds, no ONNX export):
each tolerance is probed just inside and just outside its limit, so a loosened gate fails here.
The end-to-end export tests (real MobileNetV2, real onnxruntime) live in test_deploy.py."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from zoo.deploy.choices import PRECISIONS
from zoo.deploy.export import parity
from zoo.deploy.export.parity import (
    DynamicCheck,
    ParityReport,
    PredictionCheck,
    TensorDiff,
    check_parity,
    compare,
    real_images,
)
from zoo.metadata import ModelInfo
from zoo.samples import sample_image_paths


def test_tolerances_are_the_documented_ones() -> None:
    assert (parity.ATOL, parity.RTOL, parity.MIN_COSINE, parity.MIN_AGREEMENT) == (
        1e-4,
        1e-3,
        0.99999,
        1.0,
    )
    assert ParityReport().to_dict()["tolerances"] == {
        "atol": 1e-4,
        "rtol": 1e-3,
        "min_cosine": 0.99999,
        "min_agreement": 1.0,
        "range_atol": 0.0,
    }
    assert parity.Tolerances(range_atol=0.02, min_cosine=0.9999) == parity.FP16
    assert parity.Tolerances(range_atol=0.1, min_cosine=0.99, min_agreement=0.98) == parity.BF16
    assert parity.Tolerances(range_atol=0.5, min_cosine=0.9, min_agreement=0.98) == parity.INT8
    assert parity.TOLERANCES == {
        "fp32": parity.FP32,
        "fp16": parity.FP16,
        "bf16": parity.BF16,
        "int8": parity.INT8,
    }
    assert tuple(parity.TOLERANCES) == PRECISIONS  # a bound for every --precision


def _fp16_case() -> tuple[np.ndarray, np.ndarray]:
    """Logits of range 20 and their fp16 image: the error fp16 rounding leaves (0.3 % of the
    range), with a few near-zero logits whose relative error is large."""
    rng = np.random.default_rng(3)
    ref = rng.uniform(-20, 20, (4, 100)).astype(np.float32)
    ref[0, :3] = [1e-4, -2e-4, 0.0]
    return ref, ref + rng.uniform(-0.06, 0.06, ref.shape).astype(np.float32)


def test_fp16_rounding_passes_fp16_bounds_but_not_fp32_ones() -> None:
    ref, out = _fp16_case()
    tol = parity.FP16
    kw = {"atol": tol.atol, "rtol": tol.rtol, "min_cosine": tol.min_cosine}
    assert compare(ref, out, **kw, range_atol=tol.range_atol).passed
    assert not compare(ref, out).passed


@pytest.mark.parametrize("off, passes", [(0.39, True), (0.41, False)])
def test_fp16_bound_is_two_percent_of_the_output_range(off: float, passes: bool) -> None:
    ref = np.array([[20.0, -5.0, 0.0]], np.float32)  # range 20: bound 1e-4 + 0.4 (+ rtol)
    out = ref.copy()
    out[0, 2] += off  # at the zero logit: only atol + range_atol·20 = 0.4001 allows it
    assert compare(ref, out, min_cosine=0.999, range_atol=0.02).passed is passes


def test_a_five_percent_weight_error_fails_the_fp16_bounds() -> None:
    ref, _ = _fp16_case()
    tol = parity.FP16
    scaled = ref * 1.05  # a classifier weight off by 5 %: logits off by 5 % of themselves
    assert not compare(ref, scaled, range_atol=tol.range_atol, min_cosine=tol.min_cosine).passed


def test_identical_tensors_pass_with_exact_figures() -> None:
    ref = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    d = compare(ref, ref.copy())
    assert d == TensorDiff([3, 4], 0.0, 0.0, pytest.approx(1.0, abs=1e-15), True)


def test_shape_mismatch_fails_with_infinite_error() -> None:
    d = compare(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert d == TensorDiff([3, 2], float("inf"), float("inf"), 0.0, False)


def _ones_with(value_at_0: float, out_at_0: float, n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    ref = np.ones(n)
    ref[0] = value_at_0
    out = ref.copy()
    out[0] = out_at_0
    return ref, out


@pytest.mark.parametrize(
    ("delta", "passed"), [(0.9e-4, True), (1e-4, True), (1.1e-4, False), (2e-3, False)]
)
def test_absolute_tolerance_where_the_reference_is_zero(delta: float, passed: bool) -> None:
    # at a zero reference only atol applies; the cosine stays ~1, so atol alone decides
    ref, out = _ones_with(0.0, delta)
    d = compare(ref, out)
    assert d.passed is passed and d.cosine > 0.9999999
    assert d.max_abs == pytest.approx(delta) and d.max_rel == pytest.approx(delta / 1e-6)


@pytest.mark.parametrize(
    ("delta", "passed"), [(0.1, True), (-0.1, True), (0.102, False), (-0.102, False), (0.5, False)]
)
def test_relative_tolerance_on_a_large_value(delta: float, passed: bool) -> None:
    # |ref| = 100: the limit is atol + rtol * 100 = 0.1001
    ref, out = _ones_with(100.0, 100.0 + delta, n=100_000)
    d = compare(ref, out)
    assert d.passed is passed and d.cosine > 0.99999
    assert d.max_rel == pytest.approx(abs(delta) / 100)


def test_relative_tolerance_uses_the_reference_not_the_output() -> None:
    # ref -100 → out -99.95: within 1e-4 + 1e-3·100; against |out| it would also pass, against
    # the signed reference it would fail
    ref, out = _ones_with(-100.0, -99.95, n=100_000)
    assert compare(ref, out).passed


def test_cosine_gate_alone() -> None:
    # every element within atol, but the direction is off by ~5% noise: cosine ≈ 0.9987
    rng = np.random.default_rng(0)
    ref = rng.choice([-1e-3, 1e-3], 10_000)
    out = ref + rng.choice([-5e-5, 5e-5], 10_000)
    d = compare(ref, out)
    assert np.all(np.abs(out - ref) <= 1e-4)
    assert 0.998 < d.cosine < 0.9995 and d.passed is False
    close = ref + rng.choice([-2e-6, 2e-6], 10_000)  # cosine ≈ 0.999998
    assert compare(ref, close).passed


def test_cosine_is_computed_in_float64() -> None:
    # float32 dot products of 1e6 values near 1 lose the last digits that the gate needs
    rng = np.random.default_rng(1)
    ref = (1 + rng.standard_normal(1_000_000) * 1e-3).astype(np.float32)
    out = ref + np.float32(1e-5)
    d = compare(ref, out)
    r64, o64 = ref.astype(np.float64), out.astype(np.float64)
    expected = r64 @ o64 / (np.linalg.norm(r64) * np.linalg.norm(o64))
    assert d.cosine == pytest.approx(expected, abs=1e-12) and d.passed


def test_zero_tensors_and_empty_tensors() -> None:
    z = np.zeros((2, 5), np.float32)
    assert compare(z, z) == TensorDiff([2, 5], 0.0, 0.0, 1.0, True)
    e = np.zeros((0, 5), np.float32)
    assert compare(e, e) == TensorDiff([0, 5], 0.0, 0.0, 1.0, True)


def test_custom_tolerances_are_honoured() -> None:
    ref, out = _ones_with(0.0, 0.01)
    assert not compare(ref, out).passed
    assert compare(ref, out, atol=0.02).passed
    ref, out = _ones_with(10.0, 10.5, n=100_000)
    assert not compare(ref, out, atol=0.0).passed
    assert compare(ref, out, atol=0.0, rtol=0.06).passed


# ---- the report ---------------------------------------------------------------------------


def _report(tensors: bool = True, predictions: bool | None = True, dynamic=()) -> ParityReport:
    return ParityReport(
        tensors=TensorDiff([2, 4], 0.25, 1.5, 0.9, tensors),
        predictions=None if predictions is None else PredictionCheck(4, 0.5, predictions),
        dynamic=tuple(
            DynamicCheck(b, s, TensorDiff([b, 4], 0.125, 0.5, 0.99, ok)) for b, s, ok in dynamic
        ),
    )


def test_report_passes_only_when_every_level_passes() -> None:
    assert _report().passed and _report().failures() == []
    assert _report(predictions=None).passed  # no prediction check ran
    assert not _report(tensors=False).passed
    assert not ParityReport().passed  # nothing checked is not a pass
    assert not _report(predictions=False).passed
    assert _report(dynamic=[(1, 224, True), (5, 224, True)]).passed
    assert not _report(dynamic=[(1, 224, True), (5, 224, False)]).passed


def test_report_without_a_prediction_check_lists_only_real_failures() -> None:
    r = _report(tensors=False, predictions=None)
    assert r.failures() == ["tensors differ: max abs 0.25, max rel 1.5, cosine 0.900000"]


def test_report_failures_name_each_broken_level() -> None:
    r = _report(tensors=False, predictions=False, dynamic=[(1, 224, True), (5, 192, False)])
    assert r.failures() == [
        "tensors differ: max abs 0.25, max rel 1.5, cosine 0.900000",
        "top-1 agreement 50.0% on 4 real images (needs 100.0%)",
        "dynamic check failed at batch 5, 192 px: max abs 0.125",
    ]
    d = r.to_dict()
    assert d["passed"] is False and d["tolerances"]["atol"] == 1e-4
    assert d["dynamic"][1]["size"] == 192 and d["predictions"]["n_images"] == 4


def test_report_judges_and_names_the_knn_score_output() -> None:
    from dataclasses import replace

    from zoo.deploy.export.parity_report import KnnCheck

    ok, bad = KnnCheck(12, 1e-6, 1e-5), KnnCheck(12, 2e-5, 1e-5)
    assert ok.passed and not bad.passed and KnnCheck(3, 1e-5, 1e-5).passed  # the bound included
    assert bad.line() == "parity knn_score: max abs 2.00e-05 on 12 real images (bound 1e-05) → FAIL"
    assert ok.line().endswith("(bound 1e-05) → pass")
    assert ok.to_dict() == {"images": 12, "max_abs": 1e-6, "bound": 1e-5, "passed": True}
    assert bad.to_dict()["passed"] is False
    r = replace(_report(), knn=bad)
    assert not r.passed and r.failures() == [bad.line()]
    assert r.to_dict()["knn"] == bad.to_dict() and r.to_dict()["passed"] is False
    assert replace(_report(), knn=ok).passed and replace(_report(), knn=ok).failures() == []
    assert _report().to_dict()["knn"] is None  # no kNN rule: nothing to judge


# ---- images for the prediction check ------------------------------------------------------


def test_real_images_defaults_to_the_bundled_photos() -> None:
    assert real_images(None) == sample_image_paths()


def _tiny_images(folder: Path, n: int, suffix: str = ".PNG") -> list[Path]:
    for i in range(n):
        (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4)).save(folder / f"c{i % 2}" / f"{i:03d}{suffix}")
    return sorted(folder.rglob(f"*{suffix}"))


def test_real_images_spreads_over_the_folder(tmp_path: Path) -> None:
    _tiny_images(tmp_path, 10)
    (tmp_path / "c0" / "notes.txt").write_text("not an image")
    files = sorted(tmp_path.rglob("*.PNG"))
    assert real_images(tmp_path, limit=3) == [files[0], files[3], files[6]]
    assert real_images(str(tmp_path), limit=64) == files
    assert real_images(tmp_path, limit=10) == files
    assert real_images(tmp_path, limit=6) == files[:6]


def test_real_images_takes_64_by_default(tmp_path: Path) -> None:
    files = _tiny_images(tmp_path, 130, ".png")
    assert real_images(tmp_path) == files[::2][:64]


# ---- the whole check on a tiny eager model -------------------------------------------------

INFO = ModelInfo(
    arch="tiny",
    tag="test",
    input_size=(3, 48, 48),
    num_classes=4,
    params=0,
    gflops=0.0,
    crop_pct=1.0,
)


class Tiny(nn.Module):
    """A conv net that accepts any input size (global pooling), with distinct logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)  # a seed where the two sample photos get different classes
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3))) * 10


@pytest.fixture(scope="module")
def tiny() -> nn.Module:
    return Tiny().eval()


def _eager(model: nn.Module):
    def run(x: np.ndarray) -> np.ndarray:
        assert x.dtype == np.float32
        with torch.no_grad():
            return model(torch.from_numpy(x)).numpy()

    return run


def _pre(path: Path) -> np.ndarray:
    from zoo.images import open_image
    from zoo.preprocess import preprocess

    return preprocess(open_image(path), INFO.preprocessing())


def _check(model: nn.Module, run, **kw) -> ParityReport:
    args = {"export_batch": 2, "dynamic_batch": False, "dynamic_size": False}
    args.update(kw)
    return check_parity(model, INFO, run, images=sample_image_paths(), **args)


def test_faithful_runtime_passes_all_three_levels(tiny: nn.Module) -> None:
    r = _check(tiny, _eager(tiny), export_batch=3, dynamic_batch=True, dynamic_size=True)
    assert r.passed and r.failures() == []
    assert r.tensors is not None and r.predictions is not None
    assert r.tensors.shape == [3, 4] and r.tensors.max_abs < 1e-5
    assert r.predictions.n_images == 2 and r.predictions.agreement == 1.0
    with torch.no_grad():  # the two photos get different classes: agreement means something
        y = tiny(torch.from_numpy(np.stack([_pre(p) for p in sample_image_paths()])))
    assert y.argmax(1).tolist() == [1, 2]
    assert 0 <= r.predictions.preprocessing_max_abs < 0.05  # type: ignore[operator]
    assert [i.kind for i in r.images] == ["given"] and r.images[0].count == 2
    assert [(d.batch, d.size) for d in r.dynamic] == [
        (1, 48),
        (2, 48),
        (5, 48),
        (3, 16),
        (3, 80),
    ]
    assert all(d.passed and d.diff.shape[0] == d.batch for d in r.dynamic)


@pytest.mark.parametrize(
    ("kw", "checked"),
    [
        ({}, []),
        ({"dynamic_batch": True, "export_batch": 5}, [(1, 48), (2, 48), (7, 48)]),
        ({"dynamic_size": True, "export_batch": 2}, [(2, 16), (2, 80)]),
    ],
)
def test_dynamic_shapes_checked(tiny: nn.Module, kw: dict, checked: list) -> None:
    r = _check(tiny, _eager(tiny), **kw)
    assert [(d.batch, d.size) for d in r.dynamic] == checked and r.passed


def test_a_wide_input_is_checked_at_its_own_height_and_width(tiny: nn.Module) -> None:
    wide = replace(INFO, input_size=(3, 48, 64))
    shapes: list[tuple[int, ...]] = []

    def run(x: np.ndarray) -> np.ndarray:
        shapes.append(x.shape)
        return _eager(tiny)(x)

    r = check_parity(
        tiny, wide, run, export_batch=2, dynamic_batch=True, dynamic_size=True,
        images=sample_image_paths(),
    )  # fmt: skip
    assert [(d.batch, d.size) for d in r.dynamic] == [
        (1, "64x48"),  # width x height
        (2, "64x48"),
        (5, "64x48"),
        (3, "32x16"),
        (3, "96x80"),
    ]
    assert shapes[-2:] == [(3, 3, 16, 32), (3, 3, 80, 96)] and r.passed
    assert r.dynamic[-1].where == "batch 3, 96x80"


def test_the_other_sizes_are_32_px_away_and_never_below_half() -> None:
    assert parity.other_sizes(224, 224) == ((192, 192), (256, 256))
    assert parity.other_sizes(48, 47) == ((16, 23), (80, 79))
    assert parity.other_sizes(32, 28) == ((16, 14), (64, 60))
    assert parity.other_sizes(1, 2) == ((1, 1), (33, 34))


def test_tensor_level_sees_the_noise_row(tiny: nn.Module) -> None:
    # the checked batch is the real images plus one seeded noise image, resized to the export
    # batch: a runtime that is wrong on out-of-distribution input only is caught at batch 3
    seen: list[np.ndarray] = []

    def run(x: np.ndarray) -> np.ndarray:
        seen.append(x.copy())
        return _eager(tiny)(x)

    _check(tiny, run, export_batch=4)
    x = seen[0]
    assert x.shape == (4, 3, 48, 48) and np.array_equal(x[3], x[0])
    noise = np.random.default_rng(0).standard_normal((3, 48, 48), np.float32)
    assert np.array_equal(x[2], noise)


def test_runtime_off_by_more_than_atol_fails(tiny: nn.Module) -> None:
    r = _check(tiny, lambda x: _eager(tiny)(x) + 2e-3)
    assert r.tensors is not None and r.predictions is not None
    assert not r.passed and not r.tensors.passed
    assert r.predictions.passed  # a constant shift keeps every top-1
    assert r.failures()[0].startswith("tensors differ: max abs 0.002")


def test_wrong_predictions_fail_the_agreement_level(tiny: nn.Module) -> None:
    r = _check(tiny, lambda x: -_eager(tiny)(x))
    assert r.predictions is not None
    assert r.predictions.agreement < 1.0 and r.predictions.passed is False
    assert any(f.startswith("top-1 agreement") for f in r.failures())


def test_agreement_must_be_total() -> None:
    assert parity.prediction_check(np.array([0, 1, 2, 3]), np.array([0, 1, 2, 3])).passed
    half = parity.prediction_check(np.array([0, 1]), np.array([0, 2]))
    assert half == PredictionCheck(n_images=2, agreement=0.5, passed=False)
    assert half.to_dict() == {"n_images": 2, "agreement": 0.5, "passed": False}
    most = parity.prediction_check(np.arange(100), np.r_[np.arange(99), 0])
    assert most.agreement == 0.99 and most.passed is False


def test_a_static_graph_fails_the_dynamic_level_with_the_runtime_error(tiny: nn.Module) -> None:
    def static(x: np.ndarray) -> np.ndarray:
        if x.shape[0] != 2 or x.shape[2] != 48:
            raise RuntimeError(
                f"[ONNXRuntimeError] Got invalid dimensions for input: {x.shape}"
                + "!" * 400
                + "\nsecond line"
            )
        return _eager(tiny)(x)

    r = _check(tiny, static, dynamic_batch=True, dynamic_size=True)
    assert r.tensors is not None and r.predictions is not None
    assert r.tensors.passed and r.predictions.passed and not r.passed
    failed = [d for d in r.dynamic if not d.passed]
    assert [(d.batch, d.size) for d in failed] == [(1, 48), (5, 48), (3, 16), (3, 80)]
    assert all(d.diff.max_abs == float("inf") for d in failed)
    err = failed[0].error
    assert err is not None and err.startswith(
        "[ONNXRuntimeError] Got invalid dimensions for input: (1, 3, 48, 48)"
    )
    assert len(err) == 302 and err.endswith(" …") and "second line" not in err  # cut, marked
    assert r.dynamic[1].passed and "error" not in r.dynamic[1].to_dict()
    assert r.to_dict()["dynamic"][0]["error"] == err
    assert (
        r.failures()[0] == f"dynamic check failed at batch 1, 48 px: the graph rejected it ({err})"
    )


def test_a_runtime_wrong_at_one_resolution_is_caught(tiny: nn.Module) -> None:
    def wrong_when_large(x: np.ndarray) -> np.ndarray:
        y = _eager(tiny)(x)
        return y + 1.0 if x.shape[2] > 48 else y

    r = _check(tiny, wrong_when_large, dynamic_size=True)
    assert [d.passed for d in r.dynamic] == [True, False]
    assert r.failures() == ["dynamic check failed at batch 2, 80 px: max abs 1"]


def test_the_report_is_reproducible(tiny: nn.Module) -> None:
    # every input is seeded: the same runtime gives the same figures on every run
    def noisy(x: np.ndarray) -> np.ndarray:
        return _eager(tiny)(x) + 1e-5 * np.abs(np.sin(x.sum((1, 2, 3))))[:, None]

    a = _check(tiny, noisy, dynamic_batch=True, dynamic_size=True).to_dict()
    b = _check(tiny, noisy, dynamic_batch=True, dynamic_size=True).to_dict()
    assert a == b and len({d["max_abs"] for d in a["dynamic"]}) > 2  # the noise shows


def test_check_parity_applies_the_given_tolerances_at_every_level(tiny: nn.Module) -> None:
    """The same runtime, off by 2e-3 everywhere: fails fp32's bounds, passes looser ones given
    to check_parity (tensors and the dynamic shapes alike), which the report records."""
    shifted = lambda x: _eager(tiny)(x) + 2e-3  # noqa: E731
    loose = parity.Tolerances(atol=5e-3)
    kw = {"export_batch": 3, "dynamic_batch": True}
    assert not _check(tiny, shifted, **kw).passed
    r = _check(tiny, shifted, tolerances=loose, **kw)
    assert r.passed and r.tensors is not None and r.tensors.passed
    assert all(d.passed for d in r.dynamic)
    assert r.tolerances == loose and r.to_dict()["tolerances"] == asdict(loose)


def test_check_parity_applies_the_given_agreement_floor(tiny: nn.Module) -> None:
    """A runtime whose top-1 differs on one of the two photos: refused at the default floor
    (100 %), accepted at a 50 % floor (tensor bounds opened so only agreement decides)."""

    def one_wrong(x: np.ndarray) -> np.ndarray:
        y = _eager(tiny)(x)
        if len(x) == 2:  # the prediction check's batch of the two photos: swap the first's top
            y[0] = y[0][::-1].copy()
        return y

    wide = {"atol": 1e3, "min_cosine": -1.0}
    strict = _check(tiny, one_wrong, tolerances=parity.Tolerances(**wide))
    assert strict.predictions == PredictionCheck(
        2, 0.5, False, strict.predictions.preprocessing_max_abs
    )  # type: ignore[union-attr]
    half = parity.Tolerances(**wide, min_agreement=0.5)
    assert _check(tiny, one_wrong, tolerances=half).predictions.passed  # type: ignore[union-attr]


# ---- the gate of a graph that preprocesses itself (--embed-preprocessing) ------------------


def _pixel_runtime(model: nn.Module, mean_shift: float = 0.0, seen: list | None = None):
    """A plain-Python stand-in for a graph with embedded preprocessing: ``uint8 (N, H, W, C)``
    in, the Python preprocessing (optionally with a wrong mean), ``model``'s logits out."""
    from zoo.preprocess import preprocess

    pre = INFO.preprocessing()

    def run(a: np.ndarray) -> np.ndarray:
        if seen is not None:
            seen.append(a)
        x = np.stack([preprocess(Image.fromarray(im), pre) for im in a]) - mean_shift
        return _eager(model)(x.astype(np.float32))

    return run


def test_embedded_tolerances_are_the_documented_ones() -> None:
    assert parity.Tolerances(range_atol=0.02, min_cosine=0.9999) == parity.EMBEDDED


def test_embedded_gate_passes_a_faithful_graph_at_every_case(tiny: nn.Module) -> None:
    seen: list[np.ndarray] = []
    photos = sample_image_paths()
    r = parity.check_embedded_parity(tiny, INFO, _pixel_runtime(tiny, seen=seen), photos)
    assert r.passed and r.failures() == [] and r.tolerances == parity.EMBEDDED
    assert r.tensors is not None and r.tensors.shape == [2, 4] and 0 < r.tensors.max_abs < 0.1
    assert r.predictions == PredictionCheck(n_images=2, agreement=1.0, passed=True)
    assert [i.kind for i in r.images] == ["given"] and r.images[0].count == 2
    w, h = Image.open(photos[0]).size
    assert [(d.case, d.batch, d.size) for d in r.dynamic] == [
        ("one image thrice", 3, f"{w}x{h}"),
        ("small", 1, "24x16"),  # half and a third of the 48 px crop: upsampled
        ("odd portrait", 1, "85x107"),
    ]
    assert all(d.passed and d.diff.shape[0] == d.batch for d in r.dynamic)
    # decoded pixels, each image at its own size, one a call; then the cases' batches
    assert [a.dtype for a in seen] == [np.uint8] * 5
    assert [a.shape for a in seen] == [
        (1, h, w, 3),
        (1, *Image.open(photos[1]).size[::-1], 3),
        (3, h, w, 3),
        (1, 16, 24, 3),
        (1, 107, 85, 3),
    ]


def test_embedded_gate_refuses_a_graph_that_preprocesses_wrongly(tiny: nn.Module) -> None:
    r = parity.check_embedded_parity(
        tiny, INFO, _pixel_runtime(tiny, mean_shift=0.5), sample_image_paths()
    )
    assert not r.passed and r.tensors is not None and not r.tensors.passed
    assert r.failures()[0].startswith("tensors differ: max abs")
    assert [d.passed for d in r.dynamic] == [False, False, False]


def test_embedded_gate_applies_the_given_tolerances(tiny: nn.Module) -> None:
    faithful = _pixel_runtime(tiny)
    shifted = lambda a: faithful(a) + 0.5  # noqa: E731  (top-1 kept, logits moved)
    photos = sample_image_paths()
    assert not parity.check_embedded_parity(tiny, INFO, shifted, photos).passed
    loose = parity.Tolerances(atol=1.0, min_cosine=0.9)
    r = parity.check_embedded_parity(tiny, INFO, shifted, photos, tolerances=loose)
    assert r.passed and r.tolerances == loose and all(d.passed for d in r.dynamic)

    def one_wrong(a: np.ndarray) -> np.ndarray:
        y = faithful(a)
        return y[:, ::-1].copy() if a.shape[1:3] == seen_first else y

    seen_first = Image.open(photos[0]).size[::-1]
    wide = {"atol": 1e3, "min_cosine": -1.0}
    strict = parity.check_embedded_parity(
        tiny, INFO, one_wrong, photos, tolerances=parity.Tolerances(**wide)
    )
    assert strict.predictions == PredictionCheck(2, 0.5, False)
    half = parity.Tolerances(**wide, min_agreement=0.5)
    assert parity.check_embedded_parity(tiny, INFO, one_wrong, photos, tolerances=half).passed


def test_embedded_gate_reports_a_shape_the_graph_rejects(tiny: nn.Module) -> None:
    faithful = _pixel_runtime(tiny)

    def one_at_a_time(a: np.ndarray) -> np.ndarray:
        if len(a) != 1:
            raise RuntimeError(f"Got invalid dimensions for input: {a.shape}\nsecond line")
        return faithful(a)

    r = parity.check_embedded_parity(tiny, INFO, one_at_a_time, sample_image_paths())
    assert r.tensors is not None and r.tensors.passed and not r.passed
    bad = r.dynamic[0]
    assert (bad.batch, bad.case, bad.passed) == (3, "one image thrice", False)
    assert bad.size == "{}x{}".format(*Image.open(sample_image_paths()[0]).size)
    assert r.failures()[-1].startswith(
        f"dynamic check failed at batch 3, {bad.size} (one image thrice): the graph rejected it"
    )
    assert bad.error is not None and bad.error.startswith("Got invalid dimensions for input: (3,")
    assert [d.passed for d in r.dynamic[1:]] == [True, True]


def test_embedded_gate_compares_every_image_past_a_chunk_of_32(
    tiny: nn.Module, tmp_path: Path
) -> None:
    files = _tiny_images(tmp_path, 33)
    r = parity.check_embedded_parity(tiny, INFO, _pixel_runtime(tiny), files)
    assert r.tensors is not None and r.tensors.shape == [33, 4] and r.passed
    assert r.predictions is not None and r.predictions.n_images == 33


# ---- the report's own shape: what --json and the failure message show ----------------------


def test_a_rejected_shape_reads_as_infinitely_wrong() -> None:
    d = DynamicCheck.rejected(3, 224, RuntimeError("bad dims\nmore"))
    inf = float("inf")
    assert d.to_dict() == {
        "batch": 3,
        "size": 224,
        "error": "bad dims",
        "shape": [],
        "max_abs": inf,
        "max_rel": inf,
        "cosine": 0.0,
        "passed": False,
    }
    assert d.diff.passed is False and d.diff.shape == []
    assert DynamicCheck.rejected(1, "small", ValueError()).error == "ValueError"  # no message


def test_a_dynamic_case_is_named_in_the_report() -> None:
    diff = TensorDiff([1, 4], 0.0, 0.0, 1.0, True)
    assert DynamicCheck(1, "24x16", diff, "small").to_dict() == {
        "batch": 1,
        "size": "24x16",
        "case": "small",
        **diff.to_dict(),
    }


def test_the_report_names_its_images_and_what_it_did_not_check() -> None:
    from zoo.deploy.export.gate_images import ImageSource

    sources = (ImageSource("bundled", 2, "2 bundled photos"), ImageSource("data", 5, "5 of x"))
    bad = PredictionCheck(n_images=7, agreement=0.5, passed=False)
    r = ParityReport(predictions=bad, images=sources)
    assert r.failures() == [
        "tensors were not compared",
        "top-1 agreement 50.0% on 7 real images (needs 100.0%; images: 2 bundled photos; 5 of x)",
    ]
    assert r.to_dict() == {
        "tolerances": asdict(parity.FP32),
        "tensors": {},
        "predictions": bad.to_dict(),
        "dynamic": [],
        "images": [s.to_dict() for s in sources],
        "knn": None,
        "passed": False,
    }
    assert ParityReport(predictions=bad).failures()[1].endswith("(needs 100.0%)")
    t = TensorDiff([2, 4], 0.0, 0.0, 1.0, True)
    assert ParityReport(tensors=t).to_dict()["tensors"] == t.to_dict()


def test_check_parity_names_the_gate_images_it_was_given(tiny: nn.Module) -> None:
    from zoo.deploy.export.gate_images import GateImages, ImageSource

    source = ImageSource("bundled", 2, "2 bundled photos")
    gate = GateImages(tuple(sample_image_paths()), (source,))
    kw = {"export_batch": 2, "dynamic_batch": False, "dynamic_size": False}
    r = check_parity(tiny, INFO, _eager(tiny), images=gate, **kw)
    assert r.images == (source,) and r.passed
    e = parity.check_embedded_parity(tiny, INFO, _pixel_runtime(tiny), gate)
    assert e.images == (source,)
