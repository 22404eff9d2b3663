"""Preprocessing: one typed value, read strictly, and two implementations that agree.

The torchvision eval transform (training, evaluation, parity's reference) and the numpy + PIL
function (exported models: predict, serve, quantize) are both built from a
:class:`Preprocessing`. On real photographs, for every interpolation name, they must give the
same array within ``TOLERANCE``: both resize with PIL and crop with the same arithmetic, so
only float32 rounding of the normalise step could differ (today they are bit-identical).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from zoo.errors import ArtifactError
from zoo.preprocess import preprocess
from zoo.preprocessing import INTERPOLATIONS, Preprocessing
from zoo.samples import sample_image_paths
from zoo.transforms import eval_transform

TOLERANCE = 1e-6  # max abs difference, in normalised units

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

# What zoo wrote into config.json and ONNX metadata before the typed value existed.
WRITTEN_BEFORE = {
    "input_size": [3, 224, 224],
    "resize_size": 256,
    "crop_pct": 0.875,
    "interpolation": "bilinear",
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
}


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    """Real photographs in several shapes: landscape, portrait, square, grayscale, and crops
    whose resized long side leaves an odd margin (where crop rounding matters)."""
    skdata = pytest.importorskip("skimage.data")
    ims = [Image.open(p) for p in sample_image_paths()]  # 451×300 cat, 600×400 coffee
    astronaut = skdata.astronaut()  # 512×512 RGB
    ims += [
        Image.fromarray(astronaut),
        Image.fromarray(skdata.camera()),  # 512×512 grayscale
        Image.fromarray(astronaut[:, :301]),  # portrait
        Image.fromarray(np.ascontiguousarray(astronaut[:489, :512])),  # 64 px: long side 67
        Image.fromarray(skdata.coffee()[:203, :231]),  # small: upscaled at 224 px
    ]
    return ims


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize(
    ("input_size", "crop_pct"), [((3, 224, 224), 0.875), ((3, 64, 64), 1.0), ((1, 28, 28), 0.9)]
)
def test_numpy_and_torchvision_agree(
    photos: list[Image.Image], interpolation: str, input_size: tuple[int, int, int], crop_pct: float
) -> None:
    c = input_size[0]
    pre = Preprocessing(input_size, crop_pct, interpolation, IMAGENET[0][:c], IMAGENET[1][:c])
    tf = eval_transform(pre)
    for im in photos:
        ref = tf(im).numpy()
        got = preprocess(im, pre)
        assert got.shape == ref.shape == input_size
        assert got.dtype == np.float32 and got.flags.c_contiguous
        assert np.abs(got - ref).max() <= TOLERANCE, (interpolation, im.size)


@pytest.mark.parametrize("channels", [3, 1])
def test_every_pixel_value_is_scaled_exactly_and_written_into_out(channels: int) -> None:
    """All 256 values of every channel (no resize, no crop at 16 px, crop_pct 1): the lookup
    table gives bit for bit ``(x / 255 - mean) / std`` in float32, in the batch row passed as
    ``out`` and nowhere else."""
    rng = np.random.default_rng(0)
    pixels = np.stack([rng.permutation(256).reshape(16, 16) for _ in range(channels)], -1)
    pixels = pixels.astype(np.uint8)
    mean, std = IMAGENET[0][:channels], IMAGENET[1][:channels]
    pre = Preprocessing((channels, 16, 16), 1.0, "bilinear", mean, std)
    im = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
    x = pixels.astype(np.float32) / np.float32(255.0)
    ref = ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).transpose(2, 0, 1)
    batch = np.full((3, channels, 16, 16), np.nan, np.float32)
    got = preprocess(im, pre, out=batch[1])
    assert np.shares_memory(got, batch) and got.flags.c_contiguous
    np.testing.assert_array_equal(batch[1], ref)
    assert np.isnan(batch[[0, 2]]).all()
    np.testing.assert_array_equal(preprocess(im, pre), ref)
    for wrong in (batch[1, :, :8], batch[1].astype(np.float16), np.zeros((4, 16, 16), np.float32)):
        with pytest.raises(ValueError, match="C-contiguous float32"):
            preprocess(im, pre, out=wrong)


def test_interpolations_differ() -> None:
    """Each name selects its own filter (a table mapping every name to one filter would pass
    the agreement test above)."""
    im = Image.open(sample_image_paths()[0])
    outs = {
        name: preprocess(im, Preprocessing((3, 64, 64), 0.875, name, *IMAGENET))
        for name in INTERPOLATIONS
    }
    for a in INTERPOLATIONS:
        for b in INTERPOLATIONS:
            if a < b:
                assert not np.array_equal(outs[a], outs[b]), (a, b)


def test_round_trip_and_files_written_before() -> None:
    pre = Preprocessing.from_dict(WRITTEN_BEFORE)
    assert pre == Preprocessing((3, 224, 224), 0.875, "bilinear", *IMAGENET)
    assert pre.resize_size == 256 and pre.crop_size == 224 and pre.channels == 3
    assert pre.to_dict() == WRITTEN_BEFORE
    assert Preprocessing.from_dict(pre.to_dict()) == pre
    without_derived = {k: v for k, v in WRITTEN_BEFORE.items() if k != "resize_size"}
    assert Preprocessing.from_dict(without_derived) == pre


def test_unknown_and_missing_keys_are_named() -> None:
    with pytest.raises(ArtifactError, match=r"unknown key 'crop_mode'"):
        Preprocessing.from_dict({**WRITTEN_BEFORE, "crop_mode": "center"}, where="x.json")
    for key in ("input_size", "crop_pct", "interpolation", "mean", "std"):
        partial = {k: v for k, v in WRITTEN_BEFORE.items() if k != key}
        with pytest.raises(ArtifactError, match=rf"lacks the required key '{key}'"):
            Preprocessing.from_dict(partial)


def test_inconsistent_or_invalid_values_are_refused() -> None:
    with pytest.raises(ArtifactError, match=r"resize_size=300.*gives 256"):
        Preprocessing.from_dict({**WRITTEN_BEFORE, "resize_size": 300})
    with pytest.raises(ArtifactError, match=r"'bicubik'.*Did you mean 'bicubic'"):
        Preprocessing.from_dict({**WRITTEN_BEFORE, "interpolation": "bicubik"})
    with pytest.raises(ArtifactError, match=r"mean needs 3 finite values"):
        Preprocessing.from_dict({**WRITTEN_BEFORE, "mean": [0.5]})
    with pytest.raises(ArtifactError, match=r"crop_pct must be in \(0, 1\]"):
        Preprocessing.from_dict({**WRITTEN_BEFORE, "crop_pct": 1.5})
    with pytest.raises(ArtifactError, match=r"input_size must be \(channels, height, width\)"):
        Preprocessing.from_dict({**WRITTEN_BEFORE, "input_size": [224, 224]})
    with pytest.raises(ValueError, match=r"std must be positive"):
        Preprocessing((3, 8, 8), 1.0, "bilinear", (0.0,) * 3, (1.0, 0.0, 1.0))


def test_model_info_gives_the_typed_value() -> None:
    import zoo

    info = zoo.model_info("resnet18.a1_in1k")
    pre = info.preprocessing()
    assert isinstance(pre, Preprocessing)
    assert (pre.interpolation, pre.crop_pct, pre.resize_size) == ("bicubic", 0.95, 235)
    assert info.with_preprocessing(pre) == info


def test_model_folder_preprocessing_is_read_strictly(tmp_path) -> None:
    """A fine-tuned folder's stored preprocessing wins over its parent's; a bad key is named."""
    import json

    from zoo.artifact import CONFIG_FILE, info_from_config
    from zoo.bundle import bundle
    from zoo.catalog import model_info
    from zoo.model_config import ModelConfig

    folder = bundle("simple_cnn", tmp_path / "m")
    config = json.loads((folder / CONFIG_FILE).read_text())
    config["preprocessing"] = {**config["preprocessing"], "input_size": [3, 48, 48]}
    config["preprocessing"]["resize_size"] = 48
    info = info_from_config(folder, ModelConfig(config), model_info("simple_cnn"))
    assert info.input_size == (3, 48, 48) and info.preprocessing().resize_size == 48
    config["preprocessing"]["resize"] = 48
    with pytest.raises(
        ArtifactError, match=r"config\.json 'preprocessing' has an unknown key 'resize'"
    ):
        info_from_config(folder, ModelConfig(config), model_info("simple_cnn"))
