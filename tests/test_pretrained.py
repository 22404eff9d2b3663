"""Real ImageNet weights on real photographs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import zoo
from zoo.errors import WeightsIntegrityError
from zoo.metadata import WeightSource
from zoo.samples import sample_image_paths
from zoo.transforms import eval_transform
from zoo.weights import fetch_weights


def _top5(model, img: Image.Image) -> list[str]:
    x = eval_transform(model.zoo_info)(img).unsqueeze(0)
    with torch.no_grad():
        idx = model(x).topk(5).indices[0].tolist()
    return [model.zoo_info.label_names[i] for i in idx]


def test_mobilenet_v2_recognises_real_photos(mobilenet_weights) -> None:
    skdata = pytest.importorskip("skimage.data")
    model = zoo.create_model("mobilenet_v2")
    cat = _top5(model, Image.fromarray(skdata.chelsea()))
    assert cat[0] in {"Egyptian cat", "tabby", "tiger cat"}, cat
    assert _top5(model, Image.fromarray(skdata.coffee()))[0] == "espresso"


def test_bundled_samples_match_skimage(mobilenet_weights) -> None:
    chelsea, coffee = sample_image_paths()
    model = zoo.create_model("mobilenet_v2")
    assert _top5(model, Image.open(chelsea))[0] in {"Egyptian cat", "tabby", "tiger cat"}
    assert _top5(model, Image.open(coffee))[0] == "espresso"


def test_tampered_torchvision_file_is_refused(mobilenet_weights, tmp_path, monkeypatch) -> None:
    fake_hub = tmp_path / "hub"
    (fake_hub / "checkpoints").mkdir(parents=True)
    data = bytearray(mobilenet_weights.read_bytes())
    data[-10] ^= 0xFF
    (fake_hub / "checkpoints" / mobilenet_weights.name).write_bytes(bytes(data))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(fake_hub))
    info = zoo.model_info("mobilenet_v2")
    with pytest.raises(WeightsIntegrityError, match=info.weights.sha256):
        fetch_weights(info.weights)


def test_missing_torchvision_file_offline(tmp_path, monkeypatch) -> None:
    from zoo.errors import WeightsNotFoundError

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(WeightsNotFoundError, match="offline"):
        fetch_weights(zoo.model_info("resnet18").weights)


def test_pickle_refused_without_trust(tmp_path) -> None:
    from zoo.errors import UnsafeWeightsError
    from zoo.weights import read_state_dict

    path = tmp_path / "evil.pth"
    torch.save({"weight": torch.zeros(1), "obj": np.dtype("float32")}, path)
    with pytest.raises(UnsafeWeightsError, match="zoo convert --trust"):
        read_state_dict(path)
    assert WeightSource(kind="none").describe().startswith("random")
