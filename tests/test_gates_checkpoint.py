"""Checkpoint files and ``--resume`` decisions on small files in tmp (no training, seconds):
the fast tests scripts/mutation.sh runs against train/checkpoint.py and train/resume.py. The
kill-at-every-write proof lives in test_crash_consistency.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from zoo import durable
from zoo.errors import CheckpointError
from zoo.train import resume
from zoo.train.checkpoint import load_checkpoint, save_checkpoint
from zoo.train.config import TrainConfig
from zoo.train.run_dir import RunDir

# ---- checkpoint files ---------------------------------------------------------------------


def _state(**over: Any) -> dict[str, Any]:
    return {"model": {"w": torch.arange(4.0)}, "epoch": 1, "global_step": 6, **over}


def test_save_then_load_round_trips_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace.tsv"
    monkeypatch.setenv(durable.TRACE_ENV, str(trace))
    path = tmp_path / "run" / "checkpoints" / "last.pt"
    save_checkpoint(_state(), path)  # creates the folder
    save_checkpoint(_state(epoch=2), path)  # replaces the file
    got = load_checkpoint(path)
    assert got["epoch"] == 2 and torch.equal(got["model"]["w"], torch.arange(4.0))
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # no temporary left
    labels = [line.split("\t")[1] for line in trace.read_text().splitlines()]
    assert labels == ["checkpoints/last.pt", "checkpoints/last.pt"]


def test_load_refuses_missing_broken_and_foreign_files(tmp_path: Path) -> None:
    missing = tmp_path / "last.pt"
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(missing)
    assert str(exc.value) == (f"No checkpoint at {missing}. Was the run started with this folder?")
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a zip archive")
    with pytest.raises(CheckpointError, match=rf"^Checkpoint {broken} cannot be read safely: "):
        load_checkpoint(broken)
    for name, obj in [("tensor.pt", torch.ones(2)), ("nomodel.pt", {"epoch": 1})]:
        torch.save(obj, tmp_path / name)
        with pytest.raises(CheckpointError) as exc:
            load_checkpoint(tmp_path / name)
        assert str(exc.value) == f"{tmp_path / name} is not a zoo training checkpoint."


def test_load_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = tmp_path / "unpickling-ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.mkdir, (ran,))

    torch.save({"model": {}, "x": Payload()}, tmp_path / "evil.pt")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch's default flipped
    with pytest.raises(CheckpointError, match="cannot be read safely"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not ran.exists()


def test_a_checkpoint_saved_on_a_gpu_loads_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.serialization as serialization

    with monkeypatch.context() as m:  # what torch.save writes for tensors on cuda:0
        m.setattr(serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(_state(), tmp_path / "gpu.pt")
    got = load_checkpoint(tmp_path / "gpu.pt")
    assert got["model"]["w"].device.type == "cpu"


# ---- --resume decisions -------------------------------------------------------------------


def _run(tmp_path: Path, state: dict[str, Any] | None = None, **cfg: Any) -> Path:
    run = tmp_path / "r"
    run.mkdir()
    saved = TrainConfig(model="mlp", data="digits", epochs=3, lr=0.01, **cfg)
    saved.schedule_segments = [{"from_step": 0, "epochs": 3, "kind": "cosine"}]  # as a run writes
    (run / "config.json").write_text(json.dumps(saved.to_dict()))
    if state is not None:
        save_checkpoint(state, run / "checkpoints" / "last.pt")
    return run


def _asked(run: Path, **over: Any) -> TrainConfig:
    return TrainConfig(model="mlp", data="digits", resume=str(run), **over)


def test_not_a_run_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as exc:
        resume.prepare_resume(_asked(tmp_path), frozenset())
    assert str(exc.value) == f"{tmp_path} is not a zoo run folder (no config.json)."


def test_only_options_typed_are_compared_and_runtime_ones_apply(tmp_path: Path) -> None:
    run = _run(tmp_path, _state())
    asked = _asked(run, lr=0.5, epochs=9, num_workers=3, progress=False)
    with pytest.raises(CheckpointError) as exc:
        resume.prepare_resume(asked, frozenset({"lr", "num_workers"}))
    assert str(exc.value) == (
        "--resume refuses a changed configuration (lr: run has 0.01, asked 0.5). Resume with "
        "the same settings, use --extend N to add epochs, or start a new run."
    )
    # untyped differences (epochs) are the run's own; runtime options are the user's
    cfg, rd, state = resume.prepare_resume(asked, frozenset({"num_workers", "progress"}))
    assert (cfg.epochs, cfg.lr, cfg.num_workers, cfg.progress) == (3, 0.01, 3, False)
    assert cfg.resume == str(run) and rd.path == run and state is not None
    assert state["global_step"] == 6
    same = _asked(run, lr=0.01)
    assert resume.prepare_resume(same, frozenset({"lr", "model"}))[2] is not None


def test_two_changes_are_both_named(tmp_path: Path) -> None:
    run = _run(tmp_path, _state())
    with pytest.raises(CheckpointError) as exc:
        resume.prepare_resume(_asked(run, lr=0.5, seed=4), frozenset({"lr", "seed"}))
    assert "lr: run has 0.01, asked 0.5" in str(exc.value)
    assert "seed: run has 0, asked 4" in str(exc.value)


def test_top_k_comes_from_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path, _state(), top_k_checkpoints=3)
    assert resume.prepare_resume(_asked(run), frozenset())[1].top_k == 3


def test_killed_before_its_first_checkpoint(tmp_path: Path) -> None:
    run = _run(tmp_path)
    cfg, rd, state = resume.prepare_resume(_asked(run), frozenset())
    assert state is None and rd.path == run and cfg.epochs == 3
    with pytest.raises(CheckpointError) as exc:
        resume.prepare_resume(_asked(run, extend=2), frozenset({"extend"}))
    assert str(exc.value) == (
        f"Run {run} has no checkpoint yet, so there is nothing to extend: resume it without "
        "--extend first."
    )


def test_extend_appends_a_segment_from_the_checkpoint_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path, _state(epoch=3, global_step=18))
    cfg, _, state = resume.prepare_resume(_asked(run, extend=2), frozenset({"extend"}))
    assert cfg.epochs == 5 and state is not None
    assert cfg.schedule_segments[1:] == [
        {"from_step": 18, "epochs": 2, "kind": "cosine", "peak_scale": 0.1}
    ]
    assert capsys.readouterr().err == (
        "extending the run by 2 epoch(s) to 5; the new schedule is recorded in config.json\n"
    )


def _report(run: Path, **fields: Any) -> None:
    (run / "report.json").write_text(json.dumps(fields))


def test_a_finished_run_is_refused_only_once_its_finish_completed(tmp_path: Path) -> None:
    run = _run(tmp_path, _state(epoch=3, global_step=18))
    assert resume.prepare_resume(_asked(run), frozenset())[2] is not None  # no report yet
    _report(run, global_step=12)  # a report of an earlier checkpoint: finish again
    assert resume.prepare_resume(_asked(run), frozenset())[2] is not None
    _report(run, global_step=18)
    with pytest.raises(CheckpointError) as exc:
        resume.prepare_resume(_asked(run), frozenset())
    assert str(exc.value) == (
        f"Run {run} already finished (3 of 3 epochs). Use --extend N to train longer."
    )
    (run / "report.json").write_text("{not json")  # half a report: finishing is redone
    assert resume.prepare_resume(_asked(run), frozenset())[2] is not None


def test_an_unfinished_epoch_count_is_resumed_even_with_a_report(tmp_path: Path) -> None:
    run = _run(tmp_path, _state(epoch=2, global_step=12))
    _report(run, global_step=12)
    assert resume.prepare_resume(_asked(run), frozenset())[2]["epoch"] == 2  # type: ignore[index]


def test_a_report_from_before_it_named_its_checkpoint(tmp_path: Path) -> None:
    run = _run(tmp_path, _state(epoch=3, global_step=18))
    _report(run, best_epoch=2)
    assert resume.prepare_resume(_asked(run), frozenset())[2] is not None  # no model/ yet
    (run / "model").mkdir()
    with pytest.raises(CheckpointError, match="already finished"):
        resume.prepare_resume(_asked(run), frozenset())


def test_early_stop_and_an_extension_recorded_after_it(tmp_path: Path) -> None:
    stopped = _state(epoch=2, global_step=12, stopped=True)
    run = _run(tmp_path, stopped)
    _report(run, global_step=12)
    with pytest.raises(CheckpointError) as exc:
        resume.prepare_resume(_asked(run), frozenset())
    assert str(exc.value) == (
        f"Run {run} already finished (2 of 3 epochs, stopped early). Use --extend N to "
        "train longer."
    )
    # --extend after the stop: a new segment from the stop's step overrides it
    cfg, _, state = resume.prepare_resume(_asked(run, extend=1), frozenset({"extend"}))
    assert state is not None and state["stopped"] is False and cfg.epochs == 4
    # that extension recorded in config.json, then killed before a new checkpoint: still on
    segments = [
        {"from_step": 0, "epochs": 3, "kind": "cosine", "peak_scale": 1.0},
        {"from_step": 12, "epochs": 1, "kind": "cosine", "peak_scale": 0.1},
    ]
    for extra, resumed in [
        (segments, True),
        (segments[:1], False),
        ([segments[0], {**segments[1], "from_step": 11}], False),
    ]:
        config = json.loads((run / "config.json").read_text())
        config.update(schedule_segments=extra, epochs=4)
        (run / "config.json").write_text(json.dumps(config))
        if resumed:
            assert resume.prepare_resume(_asked(run), frozenset())[2]["stopped"] is False  # type: ignore[index]
        else:
            with pytest.raises(CheckpointError, match="stopped early"):
                resume.prepare_resume(_asked(run), frozenset())


def test_repair_records_the_extension_and_cleans_temporaries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path)
    rd = RunDir(run)
    (run / ".last.pt.123.tmp").write_bytes(b"half")
    cfg = TrainConfig(model="mlp", data="digits", epochs=7)
    resume.repair_run(rd, cfg, None, extended=True, is_main=True, world=1)
    assert json.loads((run / "config.json").read_text()) == cfg.to_dict()
    assert not (run / ".last.pt.123.tmp").exists()
    assert capsys.readouterr().err == (
        f"resuming {run} from its start: it stopped before its first checkpoint\n"
        f"removed 1 temporary file(s) a killed process left in {run}\n"
    )
    before = (run / "config.json").read_text()
    (run / ".x.tmp").write_bytes(b"half")
    resume.repair_run(
        rd, TrainConfig(model="m", data="d"), None, extended=False, is_main=False, world=1
    )
    assert (run / "config.json").read_text() == before and (run / ".x.tmp").exists()
    assert "removed" not in capsys.readouterr().err  # only rank 0 repairs


def test_gather_epoch_stats_packs_each_rank_row(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {"loss": 1.5, "correct": 3, "n": 8}
    assert resume.gather_epoch_stats(stats, 1, torch.device("cpu")) == [stats]
    sent: list[torch.Tensor] = []

    def all_gather(rows: list[torch.Tensor], mine: torch.Tensor) -> None:  # a 2-rank world
        sent.append(mine.clone())
        rows[0].copy_(mine)
        rows[1].copy_(torch.tensor([2.25, 5.0, 7.0], dtype=torch.float64))

    monkeypatch.setattr(resume.dist, "all_gather", all_gather)
    got = resume.gather_epoch_stats(stats, 2, torch.device("cpu"))
    assert got == [stats, {"loss": 2.25, "correct": 5, "n": 7}]
    assert sent[0].dtype == torch.float64 and sent[0].tolist() == [1.5, 3.0, 8.0]
    assert all(isinstance(r["correct"], int) and isinstance(r["n"], int) for r in got)


def test_rank_one_of_a_new_world_starts_from_zero() -> None:
    rows = [{"loss": 1.5, "correct": 3, "n": 8}, {"loss": 2.25, "correct": 5, "n": 8}]
    assert resume.own_epoch_stats(rows, 1, 3) == {"loss": 0.0, "correct": 0, "n": 0}
    assert resume.own_epoch_stats(rows, 0, 3) == {"loss": 3.75, "correct": 8, "n": 16}


def test_only_the_latest_extension_can_override_an_early_stop(tmp_path: Path) -> None:
    run = _run(tmp_path, _state(epoch=2, global_step=12, stopped=True))
    _report(run, global_step=12)
    config = json.loads((run / "config.json").read_text())
    config["schedule_segments"] = [
        {"from_step": 0, "epochs": 3, "kind": "cosine"},
        {"from_step": 6, "epochs": 1, "kind": "cosine", "peak_scale": 0.1},  # before the stop
        {"from_step": 12, "epochs": 1, "kind": "cosine", "peak_scale": 0.1},  # after it
    ]
    config["epochs"] = 5
    (run / "config.json").write_text(json.dumps(config))
    state = resume.prepare_resume(_asked(run), frozenset())[2]
    assert state is not None and state["stopped"] is False


def test_repair_writes_config_as_a_named_durable_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace.tsv"
    monkeypatch.setenv(durable.TRACE_ENV, str(trace))
    run = _run(tmp_path)
    cfg = TrainConfig(model="mlp", data="digits", epochs=7)
    resume.repair_run(RunDir(run), cfg, None, extended=True, is_main=True, world=1)
    assert [line.split("\t")[1] for line in trace.read_text().splitlines()] == ["config.json"]
