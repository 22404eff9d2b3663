"""``zoo distill``: the KD loss's values, the teacher's cached logits (equal to its live
outputs, read again instead of recomputed), the distill → export → predict chain, a kill -9
mid-run resumed to the uninterrupted run, and the refusals. Real digits at 16 px, a
simple_cnn teacher fine-tuned here, an mlp student."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests import crash
from tests.conftest import zoo_here
from zoo.errors import CheckpointError, InputError
from zoo.train.config import DistillConfig, TrainConfig
from zoo.train.distill import kd_loss

QUIET = {"num_workers": 0, "progress": False}


@pytest.fixture(scope="module")
def digits16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 real digits (12 per class) as 16 px PNGs."""
    from zoo.samples import write_digits_folder

    return write_digits_folder(tmp_path_factory.mktemp("d") / "digits", size=16, per_class=12)


@pytest.fixture(scope="module")
def teacher(digits16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simple_cnn fine-tuned on the digits (the larger model: 3× the mlp's parameters)."""
    from zoo.train.trainer import fit

    root = tmp_path_factory.mktemp("teacher")
    cfg = TrainConfig(
        "simple_cnn", str(digits16), epochs=2, augment=False, runs_root=str(root), name="t"
    )
    run = fit(TrainConfig.from_dict({**cfg.to_dict(), **QUIET}))
    assert run is not None
    return run


def student_cfg(teacher: Path, data: Path, root: Path, **kw: Any) -> TrainConfig:
    kd = DistillConfig(str(teacher), **kw.pop("kd", {}))
    return TrainConfig(
        "mlp", str(data), epochs=1, batch_size=16, runs_root=str(root), distill=kd, **QUIET, **kw
    )


def test_kd_loss_hand_values_and_limits() -> None:
    student, y = torch.tensor([[0.0, 0.0]]), torch.tensor([0])
    teacher = torch.tensor([[math.log(3.0), 0.0]])  # softmax: (0.75, 0.25)
    ce = F.cross_entropy(student, y)
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # 0.130812
    at = {(t, a): kd_loss(student, teacher * t, ce, temperature=t, alpha=a) for t in (1, 2)
          for a in (0.0, 0.5, 1.0)}  # fmt: skip
    assert at[1, 0.0] == ce  # α = 0: the hard loss, exactly
    assert at[1, 1.0].item() == pytest.approx(kl, abs=1e-6)
    # the same probabilities at T = 2 (teacher logits doubled): the KL scaled by T² = 4
    assert at[2, 1.0].item() == pytest.approx(4 * kl, abs=1e-6)
    assert at[1, 0.5].item() == pytest.approx(0.5 * kl + 0.5 * ce.item(), abs=1e-6)
    same = kd_loss(teacher, teacher, ce, temperature=3.0, alpha=1.0)
    assert same.item() == pytest.approx(0.0, abs=1e-7)  # a student that agrees: no soft loss
    # gradients reach the student, never the teacher
    s = student.clone().requires_grad_(True)
    t = teacher.clone().requires_grad_(True)
    kd_loss(s, t, F.cross_entropy(s, y), temperature=2.0, alpha=0.5).backward()
    assert s.grad is not None and t.grad is None


def test_cached_logits_are_the_teachers_and_are_not_recomputed(
    teacher: Path, digits16: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from zoo.images import open_image
    from zoo.train.build import build_run
    from zoo.train.loop import train_epoch
    from zoo.train.resolve import resolve_config
    from zoo.train.run_dir import RunDir
    from zoo.transforms import eval_transform

    cfg = student_cfg(teacher, digits16, tmp_path, augment=False)
    parts = build_run(resolve_config(cfg))
    kd = parts.distill
    assert kd is not None and kd.cached is not None and parts.cfg.distill is not None
    assert parts.cfg.distill.logits == "cached" and parts.cfg.distill.teacher_sha256
    assert "teacher logits cached (deterministic training views" in capfd.readouterr().err
    # each training image's row: the teacher's live output on its eval view
    tf = eval_transform(kd.pre)
    paths = [p for p, _ in parts.data.samples["train"]]
    with torch.inference_mode():
        live = kd.teacher(torch.stack([tf(open_image(p)) for p in paths]))
    torch.testing.assert_close(kd.cached, live, rtol=1e-5, atol=1e-5)
    # two epochs of training: the teacher never runs again
    calls: list[int] = []
    kd.teacher.register_forward_hook(lambda *_: calls.append(1))
    run = RunDir(tmp_path / "run")
    for _ in range(2):
        assert train_epoch(parts, run, None) is not None
        parts.state.epoch += 1
        parts.state.step_in_epoch = 0
    assert calls == [] and parts.state.global_step == 2 * parts.steps_per_epoch
    # a second run reads the store: nothing computed
    again = build_run(resolve_config(cfg)).distill
    assert again is not None and again.cached is not None
    assert torch.equal(again.cached, kd.cached)
    assert f"({len(paths)} computed now" not in capfd.readouterr().err
    # random views: the teacher judges every training batch
    online = build_run(resolve_config(student_cfg(teacher, digits16, tmp_path, augment=True)))
    assert online.distill is not None and online.distill.cached is None
    online.distill.teacher.register_forward_hook(lambda *_: calls.append(1))
    assert train_epoch(online, run, None) is not None
    assert len(calls) == online.steps_per_epoch


@pytest.mark.parametrize("image_cache", ["on", "off"])
def test_online_teacher_judges_each_view_at_its_own_size(
    teacher: Path,
    digits16: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    image_cache: str,
) -> None:
    """The mlp takes 28 px, the teacher 32 px: batches are rendered at 32 px (from the image
    cache's entries at that size, or by PIL), the teacher judges them as they are and the
    training step hands the student them scaled down to 28 px. With deterministic views the
    teacher's online logits are its cached ones (its own eval view of each image), not its
    answers on a 28 px view scaled up."""
    from zoo.train.build import build_run
    from zoo.train.loop import train_epoch
    from zoo.train.resolve import resolve_config
    from zoo.train.run_dir import RunDir

    cached = build_run(resolve_config(student_cfg(teacher, digits16, tmp_path, augment=False)))
    cfg = student_cfg(
        teacher, digits16, tmp_path, augment=False, image_cache=image_cache,
        kd={"logits": "online"},
    )  # fmt: skip
    parts = build_run(resolve_config(cfg))
    kd = parts.distill
    assert kd is not None and kd.cached is None and cached.distill is not None
    assert kd.student is not None and kd.student.crop_size == 28 and kd.pre.crop_size == 32
    said = " ".join(capfd.readouterr().err.split())
    assert "training views rendered at the teacher's 32 px" in said
    assert "the student sees it scaled down to 28 px" in said
    n = len(parts.data.samples["train"])
    assert (f"{n} training images ready at the views' 32 px" in said) == (image_cache == "on")
    x, _, idx = next(iter(parts.train_loader))
    assert tuple(x.shape[-2:]) == (32, 32)
    torch.testing.assert_close(kd.teacher_logits(x, idx), cached.distill.cached[idx])
    # the training step: the student sees 28 px, the teacher 32 px
    seen: list[tuple[int, ...]] = []
    judged: list[tuple[int, ...]] = []
    parts.model.register_forward_hook(lambda _m, args, _o: seen.append(tuple(args[0].shape)))
    kd.teacher.register_forward_hook(lambda _m, args, _o: judged.append(tuple(args[0].shape)))
    assert train_epoch(parts, RunDir(tmp_path / "run"), None) is not None
    assert len(seen) == len(judged) == parts.steps_per_epoch
    assert {s[1:] for s in seen} == {(1, 28, 28)}  # the grey mlp
    assert {s[1:] for s in judged} == {(kd.pre.channels, 32, 32)}
    # the student's view: the batch scaled down, antialiased, with its filter
    small = F.interpolate(x, size=(28, 28), mode="bilinear", antialias=True)
    torch.testing.assert_close(kd.student_view(x), small)
    xv, _, _ = next(iter(parts.val_loader))  # validation: the student's own eval view
    assert tuple(xv.shape[-2:]) == (28, 28)
    # a teacher of the student's size, or logits cached: batches are the student's own size
    assert cached.distill.student is None
    assert cached.distill.student_view(x) is x


def test_refusals(teacher: Path, digits16: Path, tmp_path: Path) -> None:
    from zoo.train.resolve import resolve_config

    four = tmp_path / "four"
    four.mkdir()
    for d in (1, 3, 7, 8):
        (four / f"digit_{d}").symlink_to(digits16 / f"digit_{d}")
    # six of the teacher's classes are missing: five named, and the sixth counted
    gone = r"not in the data: digit_0, digit_2, digit_4, digit_5, digit_6 and 1 more\)"
    with pytest.raises(InputError, match=r"data has 4 classes, the teacher 10.*" + gone):
        resolve_config(student_cfg(teacher, four, tmp_path))
    with pytest.raises(InputError, match=r"views are random \(--augment\)"):
        resolve_config(student_cfg(teacher, digits16, tmp_path, kd={"logits": "cached"}))
    with pytest.raises(InputError, match="alpha in"):
        resolve_config(student_cfg(teacher, digits16, tmp_path, kd={"alpha": 1.5}))
    # a resumed run whose teacher changed: named as such, before the classes are compared
    for data in (digits16, four):
        with pytest.raises(CheckpointError, match="other weights than when this run started"):
            resolve_config(student_cfg(teacher, data, tmp_path, kd={"teacher_sha256": "0" * 64}))
    # the command: exit 1, the reason, no run folder
    r = zoo_here(
        "distill", str(teacher), "--student", "mlp", "--data", str(four), "--runs",
        str(tmp_path / "runs"), "--no-progress",
    )  # fmt: skip
    assert r.returncode == 1 and "was not trained on the classes" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()
    r = zoo_here("distill", "--resume", str(teacher), "-T", "2")
    assert r.returncode == 2 and "drop --temperature" in r.stderr, r.stderr


def test_distill_then_export_then_predict(teacher: Path, digits16: Path, tmp_path: Path) -> None:
    d = zoo_here(
        "distill", str(teacher), "--student", "mlp", "--data", str(digits16), "--epochs", "2",
        "-T", "3", "--alpha", "0.7", "--runs", str(tmp_path), "--name", "s", "--num-workers",
        "0", "--no-progress", "--no-report",
    )  # fmt: skip
    assert d.returncode == 0, d.stderr
    run = tmp_path / "s"
    assert d.stdout.strip() == str(run)
    assert "teacher logits online (random training views (--augment)" in d.stderr
    # the mlp's 28 px views, rendered at the 32 px teacher's size: the user is told
    said = " ".join(d.stderr.split())
    assert "training views rendered at the teacher's 32 px" in said
    summary = json.loads((run / "report.json").read_text())["distill"]
    assert summary["teacher_logits"] == "online"
    assert (summary["temperature"], summary["alpha"]) == (3.0, 0.7)
    assert summary["student"]["params"] < summary["teacher"]["params"]
    assert 0 <= summary["teacher"]["val_acc"] <= 1
    assert "val acc" in d.stderr and "params" in d.stderr  # the side-by-side table
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == "mlp" and config["distill"]["logits"] == "online"
    ex = zoo_here("export", str(run), "--data", str(digits16), "--json")
    assert ex.returncode == 0, ex.stderr
    assert json.loads(ex.stdout)["parity"]["passed"]
    images = [digits16 / f"digit_{i}" / "0000.png" for i in range(10)]
    onnx = zoo_here("predict", str(run / "model" / "model.onnx"), *map(str, images), "--json")
    assert onnx.returncode == 0, onnx.stderr
    # the exported student answers as the distilled PyTorch weights do
    from zoo.factory import create_model
    from zoo.images import open_image
    from zoo.transforms import eval_transform

    model = create_model(str(run))
    tf = eval_transform(model.zoo_info)  # type: ignore[arg-type]
    with torch.inference_mode():
        top = model(torch.stack([tf(open_image(p)) for p in images])).argmax(1).tolist()
    names = json.loads((run / "classes.json").read_text())
    assert [r["top"][0]["label"] for r in json.loads(onnx.stdout)] == [names[i] for i in top]


def test_distill_into_a_cut_pretrained_backbone_then_export(
    teacher: Path, digits16: Path, tmp_path: Path, mobilenet_weights: Path
) -> None:
    """A headless registry entry as the student (mobilenet_v2_s16: MobileNetV2's first 14
    blocks from the whole network's real weights file, a head made for the data's classes):
    it trains whole by default, the run ships a model folder that rebuilds without the
    registry's weights file, and its export passes the gate."""
    d = zoo_here(
        "distill", str(teacher), "--student", "mobilenet_v2_s16", "--data", str(digits16),
        "--epochs", "1", "--image-size", "32", "--runs", str(tmp_path), "--name", "cut", "--num-workers", "0", "--no-progress",
        "--no-report",
    )  # fmt: skip
    assert d.returncode == 0, d.stderr
    said = " ".join(d.stderr.split())
    assert "left out 78 tensors this architecture does not have" in said  # blocks 14-18
    assert (
        "note: mobilenet_v2_s16.tv_in1k is a network cut short, ending in mid-level features: "
        "--strategy full, backbone LR × 1 (its defaults: every layer trains from the start)"
    ) in said
    run = tmp_path / "cut"
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["base"] == "mobilenet_v2_s16.tv_in1k" and config["num_classes"] == 10
    from zoo.factory import create_model

    model = create_model(str(run))  # from the folder's own weights: nothing left out
    assert model.zoo_load_report.unused == [] and len(model.features) == 14
    assert model.zoo_info.unused_weights == () and not model.zoo_info.cut_short
    # a headless backbone cannot teach: refused before any work, saying what to do
    refused = zoo_here(
        "distill", "mobilenet_v2_s16", "--student", "mlp", "--data", str(digits16),
        "--runs", str(tmp_path), "--name", "no",
    )  # fmt: skip
    assert refused.returncode == 1 and "backbone without a head" in refused.stderr
    assert "Fine-tune it first" in " ".join(refused.stderr.split())
    assert not (tmp_path / "no").exists()
    ex = zoo_here("export", str(run), "--data", str(digits16), "--json")
    assert ex.returncode == 0, ex.stderr
    assert json.loads(ex.stdout)["parity"]["passed"]


@pytest.mark.slow
@pytest.mark.parametrize("views", ["--no-augment", "--augment"])
def test_kill_mid_run_then_resume_equals_the_uninterrupted_run(
    teacher: Path, digits16: Path, tmp_path: Path, views: str
) -> None:
    """Cached teacher logits (deterministic views) or online ones (random views rendered at
    the teacher's 32 px, the mlp's at 28): SIGKILLed right after a mid-epoch step save,
    resumed; the same run, checkpoints and weights bitwise, report included."""
    ctx = crash.fork_server()
    walk = [
        "distill", str(teacher), "--student", "mlp", "--data", str(digits16), "--epochs", "2",
        "--batch-size", "16", "--save-every-steps", "2", views, "--name", "r",
        "--num-workers", "0", "--no-progress", "--no-report",
    ]  # fmt: skip
    ref_root, root = tmp_path / "ref", tmp_path / "killed"
    trace = tmp_path / "trace"
    code = crash.run(
        ctx, [*walk, "--runs", str(ref_root)], tmp_path / "ref.log", ZOO_FAULT_TRACE=str(trace)
    )
    assert code == 0, (tmp_path / "ref.log").read_text()
    labels = crash.trace(trace)
    epoch1 = labels.index("metrics.jsonl") + 1  # epoch 1's commit is written
    kill = next(n for n in range(epoch1 + 1, len(labels)) if labels[n - 1] == "checkpoints/last.pt")
    log = tmp_path / "killed.log"
    assert crash.run(ctx, [*walk, "--runs", str(root)], log, ZOO_FAULT_KILL_AT=str(kill)) == -9
    resume = ["distill", "--resume", str(root / "r"), "--no-progress", "--num-workers", "0"]
    assert crash.run(ctx, resume, log) == 0, log.read_text()
    assert "resumed" in log.read_text()
    crash.assert_same_run(ref_root / "r", root / "r")


def test_unlabelled_images_take_the_teachers_answers_then_the_run_exports(
    teacher: Path, digits16: Path, tmp_path: Path
) -> None:
    """``--unlabelled``: a flat folder without class folders; every image's label is the
    teacher's top-1 answer on its eval view, fixed in split.json, so the run's val acc is the
    student's agreement with the teacher; the run then exports like any other."""
    from zoo.factory import create_model
    from zoo.images import open_image
    from zoo.transforms import eval_transform

    flat = tmp_path / "flat"
    flat.mkdir()
    for p in sorted(digits16.glob("*/*.png")):
        (flat / f"{p.parent.name}_{p.name}").symlink_to(p)
    common = ["--runs", str(tmp_path / "runs"), "--num-workers", "0", "--no-progress"]
    # without --unlabelled: refused, and the message says what to add
    r = zoo_here("distill", str(teacher), "--student", "mlp", "--data", str(flat), *common)
    assert r.returncode == 1 and "has no class folders" in r.stderr, r.stderr
    assert "--unlabelled" in r.stderr and not (tmp_path / "runs").exists()
    d = zoo_here(
        "distill", str(teacher), "--student", "mlp", "--data", str(flat), "--unlabelled",
        "--epochs", "2", "--no-augment", "--name", "u", "--no-report", *common,
    )  # fmt: skip
    assert d.returncode == 0, d.stderr
    run = tmp_path / "runs" / "u"
    assert "120 unlabelled images labelled by the teacher's top-1 answers" in d.stderr
    assert "labelled by the teacher: acc is agreement with it" in d.stderr
    assert "--sampler balanced" not in d.stderr  # not an option of zoo distill
    split = json.loads((run / "split.json").read_text())
    classes = json.loads((teacher / "classes.json").read_text())
    assert split["layout"] == "teacher" and split["classes"] == classes
    # the flat folder links the teacher's own images: the split is the teacher's (its 20
    # validation images, 2 a class, stay validation), not a fresh seeded 24 of the 120
    assert sorted(len(v) for v in split["splits"].values()) == [20, 100]
    assert "split lined up with the teacher's (run t)" in d.stderr
    # each label is the teacher's own answer
    model = create_model(str(teacher))
    tf = eval_transform(model.zoo_info)  # type: ignore[arg-type]
    rows = [row for rows in split["splits"].values() for row in rows]
    with torch.inference_mode():
        top = model(torch.stack([tf(open_image(flat / rel)) for rel, _ in rows])).argmax(1)
    assert [c for _, c in rows] == [classes[i] for i in top.tolist()]
    summary = json.loads((run / "report.json").read_text())["distill"]
    assert summary["labels"] == "teacher" and summary["teacher"]["val_acc"] == 1.0
    assert json.loads((run / "config.json").read_text())["distill"]["unlabelled"] is True
    # the student's val acc is its agreement with the teacher on the 24 validation images
    student = create_model(str(run))
    s_tf = eval_transform(student.zoo_info)  # type: ignore[arg-type]
    val = split["splits"]["val"]
    with torch.inference_mode():
        s_top = student(torch.stack([s_tf(open_image(flat / rel)) for rel, _ in val])).argmax(1)
    agree = sum(classes[i] == c for i, (_, c) in zip(s_top.tolist(), val, strict=True))
    assert summary["student"]["val_acc"] == pytest.approx(agree / len(val), abs=1e-6)
    ex = zoo_here("export", str(run), "--json")
    assert ex.returncode == 0 and json.loads(ex.stdout)["parity"]["passed"], ex.stderr
    # --resume keeps the run's own labels: --unlabelled cannot be given again
    r = zoo_here("distill", "--resume", str(run), "--unlabelled")
    assert r.returncode == 2 and "drop --unlabelled" in r.stderr, r.stderr
    # an image that does not decode: named, exit 1, no run folder
    (flat / "broken.png").write_bytes(b"not a png")
    r = zoo_here(
        "distill", str(teacher), "--student", "mlp", "--data", str(flat), "--unlabelled",
        "--name", "b", *common,
    )  # fmt: skip
    assert r.returncode == 1 and "broken.png" in r.stderr and "remove or replace" in r.stderr
    assert not (tmp_path / "runs" / "b").exists()


def test_scan_unlabelled_keeps_a_train_val_layout_and_splits_the_rest(tmp_path: Path) -> None:
    from zoo.errors import DataError
    from zoo.train.data import scan_unlabelled

    png = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (4, 4)).save(png)
    for rel in ("any/a.png", "any/deep/b.png", "c.png", "d.png", "e.png"):
        (tmp_path / "flat" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "flat" / rel).write_bytes(png.read_bytes())
    root, rels = scan_unlabelled(tmp_path / "flat", val_fraction=0.4, seed=3)
    assert root == (tmp_path / "flat").resolve()
    assert len(rels["val"]) == 2 and len(rels["train"]) == 3
    assert sorted(rels["train"] + rels["val"]) == sorted(
        ["any/a.png", "any/deep/b.png", "c.png", "d.png", "e.png"]
    )
    assert scan_unlabelled(tmp_path / "flat", val_fraction=0.4, seed=3)[1] == rels  # seeded
    for split in ("train", "val"):
        (tmp_path / "tv" / split / "x").mkdir(parents=True)
        (tmp_path / "tv" / split / "x" / "i.png").write_bytes(png.read_bytes())
    assert scan_unlabelled(tmp_path / "tv")[1] == {
        "train": ["train/x/i.png"],
        "val": ["val/x/i.png"],
    }
    (tmp_path / "none").mkdir()
    with pytest.raises(DataError, match="No images for the train split"):
        scan_unlabelled(tmp_path / "none")
