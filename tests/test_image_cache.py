"""The decode-once image cache and the augmentation of cached images: entries equal a fresh
decode, edits and torn entries are decoded again, broken files are quarantined as without the
cache, concurrent builders (real processes) leave a sound store, the random parameters are
torchvision's own draws, the colour map is torchvision's three operations, and the eval view
is ``eval_transform``'s pixels exactly."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from itertools import permutations
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

import zoo
from tests.conftest import ZOO, run_zoo
from zoo.images import open_image
from zoo.samples import sample_image_paths, write_photo_folder
from zoo.train import build
from zoo.train import image_cache as ic
from zoo.train.augment import (
    Augment,
    CachedImageDataset,
    augment_u8,
    colour_matrix,
    draw,
    finish_batch,
)
from zoo.train.check import check_splits
from zoo.train.config import TrainConfig
from zoo.train.data import scan
from zoo.transforms import eval_transform

PRE = zoo.model_info("mobilenet_v2").preprocessing()
SPEC = ic.CacheSpec.for_model(PRE)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """42 real photographs (6 crops of each of scikit-image's 7 colour photographs)."""
    return write_photo_folder(tmp_path_factory.mktemp("photos") / "p", per_class=6)


@pytest.fixture()
def cache(tmp_path: Path) -> ic.ImageCache:
    return ic.ImageCache(SPEC, tmp_path / "store")


def _upright(path: Path) -> Path:
    """chelsea saved sideways with EXIF orientation 6 (rotate 90° to view)."""
    im = Image.open(sample_image_paths()[0]).transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    im.save(path, exif=exif)
    return path


def test_entry_equals_a_fresh_decode_at_the_storage_size(
    cache: ic.ImageCache, tmp_path: Path
) -> None:
    for path in [*sample_image_paths(), _upright(tmp_path / "sideways.jpg")]:
        fresh = np.asarray(T.Resize(SPEC.size)(open_image(path, channels=3)))
        got = cache.get(path)
        assert got.shape == fresh.shape and min(got.shape[:2]) == SPEC.size
        assert np.array_equal(got, fresh)
        assert np.array_equal(cache.get(path), fresh)  # read back from the store
        h, w, _ = got.shape
        assert SPEC.stored_shape(*open_image(path).size) == (h, w, 3)
    sideways = open_image(tmp_path / "sideways.jpg")
    assert sideways.height < sideways.width  # EXIF applied: upright, as chelsea is


def test_an_edited_file_is_decoded_again_and_nothing_else(
    cache: ic.ImageCache, tmp_path: Path
) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    Image.new("RGB", (300, 260), (200, 10, 10)).save(a)
    Image.new("RGB", (300, 260), (10, 200, 10)).save(b)
    old_a, entry_b = ic.entry_path(a, SPEC, cache.root), ic.entry_path(b, SPEC, cache.root)
    cache.build([a, b], workers=2)
    stamp_b = entry_b.stat().st_mtime_ns
    Image.new("RGB", (300, 260), (10, 10, 200)).save(a)
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 10**9))
    assert ic.entry_path(a, SPEC, cache.root) != old_a
    assert ic.ImageCache(SPEC, cache.root).missing([a, b]) == [a]
    assert tuple(ic.ImageCache(SPEC, cache.root).get(a)[0, 0]) == (10, 10, 200)
    assert entry_b.stat().st_mtime_ns == stamp_b


def test_a_torn_or_foreign_entry_is_never_trusted(cache: ic.ImageCache) -> None:
    path = sample_image_paths()[1]
    good = cache.get(path).copy()
    entry = ic.entry_path(path, SPEC, cache.root)
    for damage in (entry.read_bytes()[:-1000], b"not an array", b""):
        entry.write_bytes(damage)
        assert np.array_equal(ic.ImageCache(SPEC, cache.root).get(path), good)
    np.save(entry, good[:, :, :1])  # another spec's channels
    assert np.array_equal(ic.ImageCache(SPEC, cache.root).get(path), good)
    assert np.array_equal(np.load(entry), good)  # rewritten whole


def test_a_broken_file_is_quarantined_as_without_the_cache(
    cache: ic.ImageCache, tmp_path: Path
) -> None:
    root = tmp_path / "d"
    for cls, colour in (("a", 30), ("b", 220)):
        for i in range(3):
            (root / cls).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (64, 48), (colour, i, 0)).save(root / cls / f"{i}.jpg")
    (root / "a" / "bad.jpg").write_bytes((root / "a" / "0.jpg").read_bytes()[:200])
    splits = scan(root)
    plain = check_splits(splits, use_cache=False)
    cached = check_splits(splits, use_cache=False, image_cache=cache)
    assert plain.corrupt == cached.corrupt and [c["path"] for c in cached.corrupt] == ["a/bad.jpg"]
    assert cache.missing(sorted(root.rglob("*.jpg"))) == [root / "a" / "bad.jpg"]
    assert cache.build([root / "a" / "bad.jpg"]) == 1  # tried, skipped, not stored
    assert cache.missing([root / "a" / "bad.jpg"]) == [root / "a" / "bad.jpg"]


def test_concurrent_builders_leave_a_sound_store(photos: Path, tmp_path: Path) -> None:
    """Two real `zoo check --cache-for` processes fill one empty store at the same time (as
    two DDP ranks would); every entry then equals a fresh decode. `zoo cache` lists and
    clears it."""
    env = {**os.environ, "ZOO_CACHE": str(tmp_path / "shared")}
    argv = [ZOO, "check", str(photos), "--cache-for", "mobilenet_v2"]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    store = ic.ImageCache(SPEC, tmp_path / "shared" / "images")
    paths = sorted(photos.rglob("*.jpg"))
    assert len(paths) == 42 and not store.missing(paths)
    for path in paths:
        entry = ic.entry_path(path, SPEC, store.root)
        fresh = np.asarray(T.Resize(SPEC.size)(open_image(path, channels=3)))
        assert np.array_equal(np.load(entry), fresh), path
    assert not list(store.root.rglob("*.tmp")), "no temporary file left behind"
    listed = json.loads(run_zoo("cache", "ls", "--json", env=env).stdout)
    assert listed["images"] == [
        {"spec": SPEC.tag, "entries": 42, "bytes": listed["images"][0]["bytes"]}
    ]
    assert listed["images"][0]["bytes"] > 42 * SPEC.size**2 * 3
    cleared = run_zoo("cache", "clear", env=env)
    assert cleared.returncode == 0 and "freed" in cleared.stdout
    assert not (tmp_path / "shared" / "images").exists()


def test_auto_is_decided_once_in_the_resolved_config(
    photos: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--image-cache auto`` becomes on or off in ``resolve_config`` (the frozen config the
    run records, so a resume keeps it); it is off when the images would not fit the budget."""
    from zoo.train.resolve import resolve_config

    cfg = TrainConfig(model="mobilenet_v2", data=str(photos), weights="none")
    assert resolve_config(cfg).cfg.image_cache == "on"
    monkeypatch.setattr(ic, "DISK_SHARE", 0.0)
    assert resolve_config(cfg).cfg.image_cache == "off"
    assert "image cache: off" in capsys.readouterr().err
    assert resolve_config(replace(cfg, image_cache="on")).cfg.image_cache == "on"  # forced
    assert resolve_config(replace(cfg, image_cache="off")).cfg.image_cache == "off"


def test_parameters_are_torchvisions_own_draws() -> None:
    """Same seed, same numbers as RandomResizedCrop → RandomHorizontalFlip → ColorJitter draw
    in the PIL path: the distributions are torchvision's by construction."""
    aug = Augment.for_model(PRE, train=True)
    image = torch.zeros(3, 256, 341, dtype=torch.uint8)
    flips = []
    for seed in range(200):
        torch.manual_seed(seed)
        box, row = draw(aug, image)
        torch.manual_seed(seed)
        ref_box = T.RandomResizedCrop.get_params(image, [0.5, 1.0], [3 / 4, 4 / 3])
        ref_flip = float(torch.rand(1) < 0.5)
        _, b, c, s, _ = T.ColorJitter.get_params([0.8, 1.2], [0.8, 1.2], [0.8, 1.2], None)
        assert box == ref_box
        assert row[:6].tolist() == pytest.approx([box[2], box[3], ref_flip, b, c, s])
        flips.append(ref_flip)
    assert 0.35 < np.mean(flips) < 0.65


def test_colour_map_is_torchvisions_three_operations_in_any_order() -> None:
    """Where nothing clips, one affine map per sample equals brightness, contrast and
    saturation applied one after another (torchvision's functional ops), in every order."""
    g = torch.Generator().manual_seed(0)
    x = 0.3 + 0.2 * torch.rand(4, 3, 32, 32, generator=g)  # mid-range: no clipping
    factors = 0.8 + 0.4 * torch.rand(4, 3, generator=g)
    rows = torch.zeros(4, 9)
    rows[:, 3:6] = factors
    rows[:, 6:9] = x.mean(dim=(-2, -1))
    a, o = colour_matrix(rows)
    fused = (torch.bmm(a, x.flatten(2)) + o).view_as(x)
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation)
    for order in permutations(range(3)):
        for i in range(4):
            ref = x[i]
            for k in order:
                ref = ops[k](ref, float(factors[i, k]))
            torch.testing.assert_close(fused[i], ref, atol=2e-3, rtol=0)
    moved = (fused - x).abs().mean()
    assert moved > 0.01, "the factors must change the image for this test to mean anything"


def test_crop_and_flip_follow_the_drawn_parameters() -> None:
    """The worker's crop is torchvision's resized crop of the drawn box, mirrored when the
    draw says so (on the stored image seen as CHW: the uint8 fast path)."""
    aug = Augment.for_model(PRE, train=True)
    image = torch.from_numpy(ic.decode(sample_image_paths()[0], SPEC)).permute(2, 0, 1)
    flips = set()
    for seed in range(6):
        torch.manual_seed(seed)
        box, row = draw(aug, image)
        ref = TF.resized_crop(image.contiguous(), *box, [224, 224], antialias=True)
        ref = TF.hflip(ref) if row[2] > 0 else ref
        got = augment_u8(aug, image, box, row)
        assert got.shape == (3, 224, 224) and (got.int() - ref.int()).abs().max() <= 1
        flips.add(bool(row[2] > 0))
    assert flips == {True, False}


def test_finish_batch_is_jitter_then_normalise() -> None:
    """The folded map (scaling, colour map, normalisation) and the clip in normalised units
    equal the plain sequence: /255, torchvision's three operations, clip, Normalize."""
    aug = Augment.for_model(PRE, train=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(60, 150, (3, 3, 40, 40), generator=g, dtype=torch.uint8)
    x[2, :, :8] = 255  # a clipped corner: brightness 1.2 takes it past 1
    rows = torch.tensor([[40, 40, 0, 1.1, 0.9, 1.15, 0, 0, 0]] * 3)
    rows[2, 3:6] = torch.tensor([1.2, 1.0, 1.0])
    rows[:, 6:9] = x.float().mean(dim=(-2, -1)) / 255
    got = finish_batch(aug, x, rows)
    norm = T.Normalize(aug.mean, aug.std)
    for i in range(3):
        ref = x[i].float() / 255
        b, c, s = rows[i, 3:6].tolist()
        ref = TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(ref, b), c), s)
        torch.testing.assert_close(got[i], norm(ref.clamp(0, 1)), atol=1e-2, rtol=0)
    assert torch.equal(finish_batch(aug, x, rows, scratch=torch.empty(10**6)), got)
    top = ((1 - torch.tensor(aug.mean)) / torch.tensor(aug.std)).view(3, 1, 1)
    assert torch.allclose(got[2, :, :8], top.expand(3, 8, 40))


def test_eval_view_is_exactly_eval_transform(photos: Path) -> None:
    paths = sorted(photos.rglob("*.jpg"))[:6] + sample_image_paths()
    ds = CachedImageDataset(
        [(p, 0) for p in paths],
        ic.ImageCache(SPEC, photos.parent / "store"),
        Augment.for_model(PRE, train=False),
    )
    x, _, idx = next(iter(build.loader(ds, list(range(len(ds))), 16, 0, 0, torch.device("cpu"))))
    ref = torch.stack([eval_transform(PRE)(open_image(p)) for p in paths])
    assert torch.equal(x, ref) and idx.tolist() == list(range(len(paths)))


def test_training_batches_are_a_function_of_seed_epoch_and_index(photos: Path) -> None:
    """Resumes stay exact: a batch is the same whichever order, worker count or loader
    builds it; another epoch draws other crops."""
    paths = sorted(photos.rglob("*.jpg"))[:8]
    ds = CachedImageDataset(
        [(p, 0) for p in paths],
        ic.ImageCache(SPEC, photos.parent / "store"),
        Augment.for_model(PRE, train=True),
        seed=3,
    )
    cpu = torch.device("cpu")
    one = next(iter(build.loader(ds, [(i, 0) for i in range(8)], 8, 0, 0, cpu)))[0]
    two = next(iter(build.loader(ds, [(i, 0) for i in reversed(range(8))], 8, 2, 0, cpu)))[0]
    assert torch.equal(one, two.flip(0))
    other = next(iter(build.loader(ds, [(i, 1) for i in range(8)], 8, 0, 0, cpu)))[0]
    assert not torch.equal(one, other)
