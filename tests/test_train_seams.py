"""The trainer's seams: which epoch ships and why (ties keep the earlier one), a range test
whose curve has not turned, weights that are not here (said before any data work, and shown
by ``zoo list``/``zoo info``), Ctrl-C, file modes, the card's GFLOPs at the run's size, and
the time estimate per phase. Real runs on real digits, real ``zoo`` subprocesses."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ZOO, run_zoo, zoo_here
from zoo import durable
from zoo.train import lr_find
from zoo.train.config import TrainConfig
from zoo.train.finish import shipped_summary
from zoo.train.preflight import phases

SMALL = ["--image-size", "32", "--num-workers", "0", "--no-progress"]


def _zoo_umask_022(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``zoo`` (in this process) under umask 022 (what most users have), whatever this
    process's is; the umask is put back after it."""
    before = os.umask(0o022)
    try:
        return zoo_here(*args, cwd=cwd)
    finally:
        os.umask(before)


def _row(epoch: int, acc: float, **extra: object) -> dict[str, object]:
    return {"epoch": epoch, "val/acc": acc, "val/loss": 1.0 - acc, **extra}


# ---- which epoch ships ------------------------------------------------------------------


def test_the_summary_names_the_shipped_epoch_its_ties_and_the_rest() -> None:
    rows = [_row(1, 0.8), _row(2, 0.925), _row(3, 0.925)]
    assert shipped_summary(rows, 2, "val/acc") == (
        "shipped epoch 2 (val/acc 0.925; epoch 3 tied and the earlier epoch is kept)"
    )
    rows += [_row(4, 0.9), _row(5, 0.925)]
    assert shipped_summary(rows, 2, "val/acc") == (
        "shipped epoch 2 (val/acc 0.925; epochs 3, 5 tied and the earlier epoch is kept; "
        "epoch 4 scored lower)"
    )
    assert (
        shipped_summary(rows[:2], 2, "val/acc") == "shipped epoch 2 (val/acc 0.925; the last epoch)"
    )
    # lower is better for the loss; the value is shown as logged
    losses = [_row(1, 0.5), _row(2, 0.7)]
    assert (
        shipped_summary(losses, 2, "val/loss") == "shipped epoch 2 (val/loss 0.3; the last epoch)"
    )
    assert "epoch 2 scored higher" in shipped_summary([_row(1, 0.7), _row(2, 0.5)], 1, "val/loss")
    # --ema: the better of the two counts, and the summary says whose weights ship
    ema = [_row(1, 0.8, **{"ema/val/acc": 0.9, "shipped": "ema"}), _row(2, 0.9)]
    assert shipped_summary(ema, 1, "val/acc") == (
        "shipped epoch 1 (val/acc 0.9 (the EMA's weights); epoch 2 tied and the earlier epoch "
        "is kept)"
    )


@pytest.fixture(scope="module")
def tied_run(four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A 1-epoch simple_cnn run at a learning rate too small to move a prediction, then
    ``--resume --extend 1``: the new epoch ties the first on val/acc."""
    tmp = tmp_path_factory.mktemp("tied")
    first = zoo_here("finetune", "simple_cnn", "--data", str(four_digits), "--weights", "none",
                    "--epochs", "1", "--lr", "1e-12", "--runs", str(tmp), "--name", "tie",
                    *SMALL, cwd=tmp)  # fmt: skip
    assert first.returncode == 0, first.stderr
    run = tmp / "tie"
    sha = json.loads((run / "report.json").read_text())["weights_sha256"]
    second = zoo_here("finetune", "--resume", str(run), "--extend", "1", "--no-progress", cwd=tmp)
    assert second.returncode == 0, second.stderr
    return {"run": run, "first": first, "second": second, "sha_before": sha}


def test_a_tied_extension_ships_the_earlier_epoch_and_says_so(tied_run: dict) -> None:
    run, second = tied_run["run"], tied_run["second"]
    report = json.loads((run / "report.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[0]["val/acc"] == rows[1]["val/acc"]
    assert report["best"]["epoch"] == 1 and report["weights_sha256"] == tied_run["sha_before"]
    acc = f"{rows[0]['val/acc']:.4g}"
    assert (
        "epoch 2/2:" in second.stderr
        and "(ties the best, epoch 1: the earlier epoch is kept)" in second.stderr
    )
    # counted as the epoch lines count: one epoch done, the second next (not "at epoch 1")
    assert f"resumed {run} after 1 of 2 epochs (global step" in second.stderr, second.stderr
    assert (
        f"done: shipped epoch 1 (val/acc {acc}; epoch 2 tied and the earlier epoch is kept)"
        in second.stderr
    ), second.stderr


def test_a_resumed_runs_time_counts_its_earlier_epochs(tied_run: dict) -> None:
    """The report's (and ``zoo runs``') time of a run trained by two processes is the run's,
    not the last process's alone."""
    timing = json.loads((tied_run["run"] / "report.json").read_text())["timing"]
    assert len(timing["epochs"]) == 2 and timing["total_s"] >= sum(timing["epochs"]), timing


def test_a_taken_name_gets_a_new_folder_and_says_so(tied_run: dict, four_digits: Path) -> None:
    """``--name tie`` again: the first run is kept, the new one is ``tie-2``, and the output
    says so (with how to continue the first) instead of silently writing elsewhere."""
    run = tied_run["run"]
    again = zoo_here("finetune", "simple_cnn", "--data", str(four_digits), "--weights", "none",
                     "--epochs", "1", "--runs", str(run.parent), "--name", "tie", *SMALL,
                     cwd=run.parent)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert (run.parent / "tie-2" / "model" / "model.safetensors").is_file()
    assert (
        f"note: {run} is another run, so this one is {run.parent / 'tie-2'} "
        f"(--resume {run} continues that one instead)"
    ) in again.stderr, again.stderr
    first = zoo_here("finetune", "simple_cnn", "--data", str(four_digits), "--weights", "none",
                     "--epochs", "1", "--runs", str(run.parent), "--name", "fresh", *SMALL,
                     cwd=run.parent)  # fmt: skip
    assert first.returncode == 0 and "is another run" not in first.stderr, first.stderr


# ---- lr-find: a curve that has not turned -----------------------------------------------


def test_a_curve_turns_only_when_it_rises_after_its_lowest_point_inside_the_range() -> None:
    lrs = lr_find.lr_schedule(1e-5, 1.0, 8)
    turned = lr_find.check_curve(lrs, [2.0, 1.8, 1.5, 1.0, 0.8, 1.0, 2.5, 6.0])
    assert turned.turned and turned.problem is None
    falling = lr_find.check_curve(lrs, [2.0, 1.9, 1.7, 1.5, 1.2, 1.0, 0.9, 0.85])
    assert not falling.turned and "had not turned up" in falling.problem
    assert "step 8 of 8" in falling.problem
    # a wobble after the lowest point is no turn; a clear rise is
    assert not lr_find.check_curve(lrs, [2.0, 1.5, 1.2, 1.0, 0.9, 0.93, 0.95, 0.96]).turned
    assert lr_find.check_curve(lrs, [2.0, 1.5, 1.2, 1.0, 0.9, 0.95, 1.0, 1.1]).turned
    rising = lr_find.check_curve(lrs, [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    assert not rising.turned and "lowest at the start" in rising.problem


def test_a_short_sweep_that_is_still_falling_warns(four_digits: Path, tmp_path: Path) -> None:
    # every step sees the same 96 training images (one batch), at rates that only lower the loss
    r = zoo_here("lr-find", "simple_cnn", "--data", str(four_digits), "--weights", "none",
                "--steps", "6", "--start", "1e-5", "--end", "1e-3", "--sweeps", "1", "-b", "96",
                "--no-augment", "--plot", str(tmp_path / "lr.png"), "--json", *SMALL[:4],
                cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert found["turned"] is False and found["problem"]
    assert "WARNING: the suggestion" in r.stderr and "not reliable" in r.stderr
    assert "--steps" in r.stderr and "--end" in r.stderr and "--lr VALUE" in r.stderr
    assert found["problem"] == lr_find.check_curve(found["lrs"], found["loss"]).problem


def test_lr_auto_refuses_a_curve_that_has_not_turned(four_digits: Path) -> None:
    from zoo.errors import TrainingError

    cfg = TrainConfig(model="simple_cnn", data=str(four_digits), weights="none", lr="auto",
                      num_workers=0, image_size=32, batch_size=96, augment=False,
                      progress=False)  # fmt: skip
    with pytest.raises(TrainingError) as exc:
        lr_find.auto_lr(cfg, start=1e-5, end=1e-3, steps=6, sweeps=1)
    message = str(exc.value)
    assert "--lr auto refuses" in message and "zoo lr-find simple_cnn" in message
    assert "--steps 12" in message and "--end 0.01" in message and "--lr VALUE" in message


# ---- weights that are (not) here ----------------------------------------------------------


@pytest.fixture(scope="module")
def offline_env(tmp_path_factory: pytest.TempPathFactory, mobilenet_weights: Path) -> dict:
    """A torch hub cache with MobileNetV2's real weights and a corrupt ResNet-18 file, an
    empty Hugging Face cache, a fresh zoo cache; no network."""
    root = tmp_path_factory.mktemp("offline")
    ckpt = root / "torch" / "hub" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / mobilenet_weights.name).symlink_to(mobilenet_weights)
    (ckpt / "resnet34-b627a593.pth").write_bytes(b"not the weights")
    return {
        "TORCH_HOME": str(root / "torch"),
        "HF_HOME": str(root / "hf"),
        "ZOO_CACHE": str(root / "zoo-cache"),
        "HF_HUB_OFFLINE": "1",
        "ZOO_OFFLINE": "1",
    }


def test_missing_weights_fail_before_the_data_check(
    offline_env: dict, four_digits: Path, tmp_path: Path
) -> None:
    r = run_zoo("finetune", "resnet18", "--data", str(four_digits), "--runs", str(tmp_path),
                *SMALL, env=offline_env, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "resnet18-f37072fd.pth are not in the torch hub cache" in r.stderr
    assert "usable here without the network: mobilenet_v2.tv_in1k" in r.stderr
    assert "--weights none" in r.stderr and "resnet34" not in r.stderr  # corrupt: not offered
    # the data check never ran: it prints `data:` lines and stores its results in ZOO_CACHE
    assert "data:" not in r.stderr and not Path(offline_env["ZOO_CACHE"]).exists()
    assert list(tmp_path.iterdir()) == []


def test_list_and_info_say_which_weights_are_usable_here(offline_env: dict) -> None:
    r = run_zoo("list", "--json", "--no-local", env=offline_env)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    here = {n: (row["weights_available"], row["weights_state"]) for n, row in rows.items()}
    assert here["mobilenet_v2.tv_in1k"] == (True, "cached")
    assert here["resnet18.tv_in1k"] == (False, "missing")
    assert here["resnet34.tv_in1k"] == (False, "corrupt")  # hash-checked, not only present
    assert here["resnet18.a1_in1k"] == (False, "missing")  # the (empty) Hugging Face cache
    assert here["simple_cnn.scratch"] == (True, "not needed")
    r = run_zoo("list", env=offline_env)
    assert "torchvision, cached" in r.stdout and "torchvision, not cached" in r.stdout
    r = run_zoo("info", "mobilenet_v2", "--json", env=offline_env)
    info = json.loads(r.stdout)
    assert info["weights_available"] is True and "hash checked" in info["weights_here"]
    r = run_zoo("info", "resnet34", env=offline_env)
    assert (
        r.returncode == 0
        and "weights_here: no:" in r.stdout
        and "fails its pinned hash" in r.stdout
    )


# ---- Ctrl-C -------------------------------------------------------------------------------


def test_ctrl_c_says_how_to_resume_and_exits_130(four_digits: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [ZOO, "finetune", "simple_cnn", "--data", str(four_digits), "--weights", "none",
         "--epochs", "200", "--runs", str(tmp_path), "--name", "long", *SMALL],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        # a shell's background job ignores SIGINT; Ctrl-C reaches a foreground command
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("epoch 1/200"):
            proc.send_signal(signal.SIGINT)
            break
    _, rest = proc.communicate(timeout=120)
    run = tmp_path / "long"
    assert proc.returncode == 130, "".join(seen) + rest
    assert f"continue where it stopped with: zoo finetune --resume {run}" in rest, rest
    assert (run / "checkpoints" / "last.pt").is_file()


def test_ctrl_c_before_the_first_checkpoint_does_not_claim_one(tmp_path: Path) -> None:
    from zoo.train.trainer import resume_hint

    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    assert resume_hint(run) == (
        f"interrupted: {run} has no checkpoint yet (it stopped before the first); start it "
        f"over with: zoo finetune --resume {run}"
    )
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    assert "keeps its last checkpoint; continue where it stopped with" in resume_hint(run)


# ---- file modes, the card's GFLOPs, the estimate per phase --------------------------------


@pytest.fixture(scope="module")
def small_mobilenet(four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """MobileNetV2 (real ImageNet weights, 224 px in the registry) trained at 32 px for two
    epochs, the first with its backbone frozen, under umask 022."""
    tmp = tmp_path_factory.mktemp("mnv2")
    r = _zoo_umask_022("finetune", "mobilenet_v2", "--data", str(four_digits), "--epochs", "2",
                       "--freeze-epochs", "1", "--runs", str(tmp), "--name", "m", *SMALL,
                       cwd=tmp)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return {"run": tmp / "m", "stderr": r.stderr}


def test_artifacts_get_the_umask_modes(small_mobilenet: dict) -> None:
    run = small_mobilenet["run"]
    files = ["model/model.safetensors", "model/config.json", "model/README.md", "config.json",
             "report.json", "checkpoints/last.pt", "checkpoints/best.pt"]  # fmt: skip
    modes = {f: oct(stat.S_IMODE((run / f).stat().st_mode)) for f in files}
    assert modes == dict.fromkeys(files, "0o644")


def test_an_export_gets_the_umask_modes(small_mobilenet: dict) -> None:
    """model.onnx is readable by whoever may read the run (a container's other uid): not the
    0600 of a plain mkstemp."""
    run = small_mobilenet["run"]
    r = _zoo_umask_022("export", str(run), cwd=run.parent)
    assert r.returncode == 0, r.stderr
    assert oct(stat.S_IMODE((run / "model" / "model.onnx").stat().st_mode)) == "0o644"
    assert not [p for p in (run / "model").iterdir() if p.name.startswith(".")]  # no temp left


def test_durable_writes_honour_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        durable.write_bytes(tmp_path / "a.bin", b"x", label=None)
        with durable.file_output(tmp_path / "by_name.onnx") as tmp:
            tmp.write_bytes(b"onnx")  # as an exporter writes to a file name
        with pytest.raises(RuntimeError), durable.file_output(tmp_path / "failed.onnx") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("exporter failed")
        folder = durable.temp_path(tmp_path / "dir", folder=True)
        (folder / "w").write_bytes(b"w")
        os.chmod(folder / "w", 0o600)  # as safetensors creates its files
        durable.replace_dir(folder, tmp_path / "dir", label=None)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "by_name.onnx").stat().st_mode) == 0o640
    assert (tmp_path / "by_name.onnx").read_bytes() == b"onnx"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "by_name.onnx", "dir"]
    assert stat.S_IMODE((tmp_path / "dir" / "w").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "dir").stat().st_mode) == 0o750


def test_the_card_counts_gflops_at_the_run_size(small_mobilenet: dict) -> None:
    import zoo
    from zoo.catalog import model_info
    from zoo.profile import count_gflops

    folder = small_mobilenet["run"] / "model"
    card = (folder / "README.md").read_text()
    front = dict(line.split(": ", 1) for line in card.split("---")[1].splitlines() if ": " in line)
    at_32 = count_gflops(zoo.create_model(str(folder)), (3, 32, 32))
    assert float(front["gflops"]) == pytest.approx(at_32, rel=1e-5)
    assert float(front["gflops"]) < model_info("mobilenet_v2").gflops / 10  # not 224 px's
    assert f"{at_32:.4g} GFLOPs at 3×32×32" in card
    config = json.loads((folder / "config.json").read_text())
    assert config["gflops"] == pytest.approx(at_32, rel=1e-5)


def test_phases_split_the_remaining_epochs_by_a_frozen_backbone() -> None:
    assert phases("gradual", 1, 5) == [(True, 1), (False, 4)]
    assert phases("gradual", 2, 5, start=1) == [(True, 1), (False, 3)]
    assert phases("gradual", 1, 5, start=3) == [(False, 2)]
    assert phases("linear", 1, 3) == [(True, 3)]
    assert phases("full", 1, 3) == [(False, 3)]
    assert phases("gradual", 0, 2) == [(False, 2)]


def test_the_estimate_prices_each_phase(small_mobilenet: dict) -> None:
    report = json.loads((small_mobilenet["run"] / "report.json").read_text())
    est = report["timing"]["estimate"]
    assert [(p["frozen"], p["epochs"]) for p in est["phases"]] == [(True, 1), (False, 1)]
    assert est["total_estimate_s"] == pytest.approx(sum(p["epoch_s"] for p in est["phases"]))
    assert "1 frozen-backbone epoch(s) at" in small_mobilenet["stderr"]
    assert "1 full epoch(s) at" in small_mobilenet["stderr"]


def test_an_image_size_the_layers_cannot_take_is_a_usage_error(four_digits: Path, tmp_path) -> None:
    """simple_cnn's head is sized for 32×32: --image-size 16 names the size it takes (exit 2,
    no run folder), not a matrix-shape traceback."""
    r = zoo_here("finetune", "simple_cnn", "--data", str(four_digits), "--weights", "none",
                "--image-size", "16", "--num-workers", "0", "--no-progress",
                "--runs", str(tmp_path / "runs"), cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "simple_cnn cannot take 16×16 images" in r.stderr
    assert "--image-size 32" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()
