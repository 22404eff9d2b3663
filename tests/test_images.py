"""One image-opening function (zoo.images.open_image) for train, check, eval, predict and
serve: EXIF orientation, modes, 16-bit scaling, the pixel limit, clear errors."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import run_zoo
from zoo.errors import InputError, PayloadTooLargeError
from zoo.images import list_images, open_image, to_channels
from zoo.samples import sample_image_paths

ORIENTATION = 0x0112


def _upright() -> np.ndarray:
    """An asymmetric 24×40 RGB image: every flip or rotation of it is different."""
    y, x = np.mgrid[0:24, 0:40]
    return np.stack([x * 6, y * 10, (x * y) % 256], axis=-1).astype(np.uint8)


# What the EXIF spec says the stored pixels are, for an image that must *display* as `up`.
STORED = {
    1: lambda a: a,
    2: np.fliplr,
    3: lambda a: np.rot90(a, 2),
    4: np.flipud,
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, 1),  # display: rotate 90° clockwise
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2),
    8: lambda a: np.rot90(a, -1),  # display: rotate 90° counter-clockwise
}


def _save(arr: np.ndarray, path: Path, orientation: int | None = None, **kw: object) -> Path:
    im = Image.fromarray(np.ascontiguousarray(arr))
    exif = Image.Exif()
    if orientation is not None:
        exif[ORIENTATION] = orientation
    im.save(path, exif=exif, **kw)
    return path


@pytest.mark.parametrize("orientation", sorted(STORED))
def test_every_exif_orientation_is_shown_upright(tmp_path: Path, orientation: int) -> None:
    up = _upright()
    path = _save(STORED[orientation](up), tmp_path / "x.png", orientation)
    assert np.array_equal(np.asarray(open_image(path)), up)
    assert np.array_equal(np.asarray(open_image(path.read_bytes())), up)


def test_real_jpeg_with_orientation_tag(tmp_path: Path) -> None:
    cat = Image.open(sample_image_paths()[0]).convert("RGB")
    path = _save(np.rot90(np.asarray(cat), 1), tmp_path / "portrait.jpg", 6, quality=95)
    stored = np.asarray(Image.open(path).convert("RGB"))  # what a plain decoder sees
    assert stored.shape[:2] == (cat.width, cat.height)
    shown = np.asarray(open_image(path))
    assert shown.shape[:2] == (cat.height, cat.width)
    assert np.array_equal(shown, np.rot90(stored, -1))


@pytest.fixture()
def rotated_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The same real photo twice, losslessly: stored upright, and stored rotated + EXIF tag 6."""
    cat = np.asarray(Image.open(sample_image_paths()[0]).convert("RGB"))
    (tmp_path / "photos").mkdir()
    return (
        _save(cat, tmp_path / "photos" / "upright.png"),
        _save(np.rot90(cat, 1), tmp_path / "photos" / "tagged.png", 6),
    )


def test_training_dataset_sees_the_upright_image(rotated_pair: tuple[Path, Path]) -> None:
    from zoo.catalog import model_info
    from zoo.train.data import ImageFolderDataset
    from zoo.transforms import eval_transform, train_transform

    info = model_info("mobilenet_v2")
    for tf in (eval_transform(info), train_transform(info)):  # augmentation seeded per index
        a = ImageFolderDataset([(rotated_pair[0], 0)], tf, seed=3)[0][0]
        b = ImageFolderDataset([(rotated_pair[1], 0)], tf, seed=3)[0][0]
        assert torch.equal(a, b)


def test_check_reports_upright_sizes(rotated_pair: tuple[Path, Path]) -> None:
    from zoo.train.check import check_files

    root = rotated_pair[0].parent
    res = check_files(root, list(rotated_pair), use_cache=False)
    sizes = {(r.width, r.height) for r in res.values()}
    assert len(sizes) == 1 and all(r.ok for r in res.values())


def test_predict_cli_sees_the_upright_image(
    rotated_pair: tuple[Path, Path], mobilenet_onnx: Path
) -> None:
    r = run_zoo("predict", str(mobilenet_onnx), *map(str, rotated_pair), "--json", "-k", "5")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows[0]["top"] == rows[1]["top"]
    assert rows[0]["top"][0]["label"] == "Egyptian cat"


def test_sixteen_bit_is_scaled_not_clipped(tmp_path: Path) -> None:
    ramp = (np.arange(256, dtype=np.uint32) * 257).reshape(16, 16)  # 0 … 65535
    path = tmp_path / "deep.png"
    Image.fromarray(ramp.astype(np.uint16)).save(path)
    im = open_image(path, channels=1)
    assert im.mode == "L"
    assert np.array_equal(np.asarray(im), np.arange(256).reshape(16, 16))
    rgb = np.asarray(open_image(path, channels=3))
    assert rgb.shape == (16, 16, 3) and rgb[..., 0].max() == 255


def test_transparency_palette_and_cmyk_become_rgb(tmp_path: Path) -> None:
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[:4] = (200, 10, 10, 255)  # opaque red top half, transparent black bottom half
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = np.asarray(open_image(tmp_path / "a.png", channels=3))
    assert (out[:4] == (200, 10, 10)).all() and (out[4:] == 255).all()  # flattened on white
    pal = Image.fromarray(rgba, "RGBA").convert("P")
    pal.info["transparency"] = 0
    assert to_channels(pal, 3).mode == "RGB"
    buf = io.BytesIO()
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(buf, "JPEG")
    red = np.asarray(open_image(buf.getvalue(), channels=3))
    assert red[..., 0].min() > 200 and red[..., 1].max() < 60
    assert open_image(tmp_path / "a.png", channels=1).mode == "L"


def test_pixel_limit_is_checked_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "wide.png"
    Image.new("1", (20_000, 10_000)).save(path)  # 200 MP, a few kB on disk
    with pytest.raises(PayloadTooLargeError, match=r"wide\.png .*limit"):
        open_image(path)
    with pytest.raises(PayloadTooLargeError, match="over the limit of 100"):
        open_image(_save(_upright(), tmp_path / "s.png"), max_pixels=100)


def _png_bytes(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h)).save(buf, "PNG")
    return buf.getvalue()


def test_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        open_image(tmp_path / "missing.jpg")
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(InputError, match=r"Cannot decode .*bad\.jpg"):
        open_image(bad)
    with pytest.raises(InputError, match="the uploaded data") as info:
        open_image(b"GIF89a broken")
    with pytest.raises(InputError, match="not a format PIL reads") as unknown:
        open_image(b"plain text, no image")
    assert "BytesIO" not in str(info.value) + str(unknown.value)  # no object addresses
    with pytest.raises(PayloadTooLargeError, match=r"^The uploaded image is 4×3 pixels, over"):
        open_image(_png_bytes(4, 3), max_pixels=10)


def test_list_images_natural_order_skips_hidden_and_other_files(tmp_path: Path) -> None:
    for name in ("c10.jpg", "c2.PNG", "c1.webp", "notes.txt", ".c0.jpg"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c3.jpeg").write_bytes(b"")
    assert [str(p.relative_to(tmp_path)) for p in list_images(tmp_path)] == [
        "c1.webp",
        "c2.PNG",
        "c10.jpg",
        "sub/c3.jpeg",
    ]


@pytest.mark.serve
def test_server_sees_the_upright_image(
    rotated_pair: tuple[Path, Path], mobilenet_onnx: Path
) -> None:
    import httpx

    from tests.serving import NAME, free_port, in_process_server
    from zoo.deploy.serve.config import ServeConfig

    cfg = ServeConfig(str(mobilenet_onnx), NAME, port=free_port(), max_batch=1)
    with in_process_server(cfg) as (url, srv):
        for _ in range(600):  # warm-up at batch 1
            if srv.ready:
                break
            time.sleep(0.1)
        tops = []
        for path in rotated_pair:
            r = httpx.post(
                f"{url}/v2/models/{NAME}/predict?top_k=5",
                content=path.read_bytes(),
                headers={"content-type": "image/png"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            tops.append(r.json()["predictions"])
    assert tops[0] == tops[1]
    assert tops[0][0]["label"] == "Egyptian cat"
