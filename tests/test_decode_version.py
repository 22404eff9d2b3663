"""Every cache of decoded pixels, or of what a model computed from them, keys on the decoder's
version (``zoo.images.DECODE_VERSION``): a change to how a file becomes pixels (stop 61's
RGBa/LAB conversions) is never answered from an entry the old decoder made."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from torch import nn

from zoo import images
from zoo.preprocessing import Preprocessing
from zoo.train import check as chk
from zoo.train import features, teacher_cache
from zoo.train import image_cache as ic

SPEC = ic.CacheSpec(64, "bilinear", 3)


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    path = tmp_path / "a.png"
    Image.new("RGBA", (80, 70), (200, 10, 10, 128)).save(path)
    return path


def test_an_image_cache_entry_of_another_decoder_is_missed(
    photo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ic.ImageCache(SPEC, tmp_path / "store")
    cache.build([photo], workers=1)
    assert cache.missing([photo]) == []
    monkeypatch.setattr(images, "DECODE_VERSION", images.DECODE_VERSION + 1)
    assert ic.ImageCache(SPEC, tmp_path / "store").missing([photo]) == [photo]


def test_the_feature_key_names_the_decoder(photo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    dataset = SimpleNamespace(transform="eval", samples=[(str(photo), 0)])
    key = features.feature_key(model, "1", dataset, torch.device("cpu"))
    assert features.feature_key(model, "1", dataset, torch.device("cpu")) == key  # stable
    monkeypatch.setattr(features, "DECODE_VERSION", features.DECODE_VERSION + 1)
    assert features.feature_key(model, "1", dataset, torch.device("cpu")) != key


def test_the_teacher_logits_store_names_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    pre = Preprocessing((3, 32, 32), 1.0, "bilinear", (0.5,) * 3, (0.25,) * 3)
    store = teacher_cache.store_path("ab" * 32, pre, Path("/cache"))
    assert teacher_cache.store_path("ab" * 32, pre, Path("/cache")) == store
    monkeypatch.setattr(teacher_cache, "DECODE_VERSION", teacher_cache.DECODE_VERSION + 1)
    assert teacher_cache.store_path("ab" * 32, pre, Path("/cache")) != store


def test_zoo_checks_results_of_another_decoder_are_checked_again(
    photo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chk, "cache_home", lambda: tmp_path / "cache")
    root = photo.parent
    chk.check_files(root, [photo])
    path = chk._cache_file(root)
    assert json.loads(path.read_text())["version"] == f"3-decode{images.DECODE_VERSION}"
    decoded: list[Path] = []
    real = chk._check_file
    monkeypatch.setattr(chk, "_check_file", lambda p, c=None: decoded.append(p) or real(p, c))
    chk.check_files(root, [photo])
    assert decoded == []  # same decoder: answered from the cache
    old = json.loads(path.read_text())
    path.write_text(json.dumps({**old, "version": f"3-decode{images.DECODE_VERSION - 1}"}))
    chk.check_files(root, [photo])
    assert decoded == [photo]
