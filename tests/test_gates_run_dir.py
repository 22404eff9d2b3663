"""train/run_dir.py on hand-made checkpoint states in tmp (no training, seconds): top-k and
the metrics files as functions of the history, what a commit derives (best, top-k, metrics)
and when, the resume's recovery and TensorBoard purge steps, the run folder's publication.
The fast tests scripts/mutation.sh runs against train/run_dir.py; the kill-at-every-write
walk that proves the whole design lives in test_crash_consistency.py.

TensorBoard is replaced by a recorder of what would reach it (the real writer is exercised
by the crash walk); every write of the run folder is counted by the real
``ZOO_FAULT_TRACE``."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.tensorboard
from torch import nn

from zoo import durable
from zoo.train import run_dir
from zoo.train.checkpoint import save_checkpoint
from zoo.train.config import TrainConfig
from zoo.train.run_dir import (
    LOCK_FILE,
    RunDir,
    at_epoch_end,
    metrics_files,
    publish_run_dir,
    top_k_name,
    top_k_rows,
)


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's durable writes, counted from 1; a self-kill is recorded as ``kill``."""
    path = tmp_path / "trace.tsv"
    monkeypatch.setattr(durable, "_writes", 0)
    monkeypatch.delenv(durable.KILL_ENV, raising=False)
    monkeypatch.setenv(durable.TRACE_ENV, str(path))
    return path


def _labels(trace: Path, start: int = 0) -> list[str]:
    lines = trace.read_text().splitlines() if trace.exists() else []
    return [line.split("\t")[1] for line in lines][start:]


class Board:
    """Records what would reach TensorBoard, in order (stands for ``SummaryWriter``)."""

    def __init__(self, events: list[Any], root: Path, logdir: str, purge_step: Any) -> None:
        self.events, self.name = events, Path(logdir).relative_to(root).as_posix()
        events.append(("open", self.name, purge_step))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.events.append(("scalar", self.name, tag, value, step))

    def flush(self) -> None:
        self.events.append(("flush", self.name))

    def close(self) -> None:
        self.events.append(("close", self.name))


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    events: list[Any] = []
    root = tmp_path / "run"

    def writer(logdir: str, purge_step: Any = None) -> Board:
        return Board(events, root, logdir, purge_step)

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", writer)
    monkeypatch.setattr(durable.os, "kill", lambda pid, sig: events.append("kill"))
    return events


def _row(epoch: int, acc: float, **more: Any) -> dict[str, Any]:
    return {"epoch": epoch, "step": epoch * 10, "train/loss": 1.0 / epoch, "val/acc": acc, **more}


def _state(
    epoch: int,
    history: list[dict[str, Any]],
    *,
    since_best: int = 0,
    step_in_epoch: int = 0,
    best: float | None = 0.9,
) -> dict[str, Any]:
    return {
        "model": {"w": torch.full((2,), float(epoch * 100 + step_in_epoch))},
        "epoch": epoch,
        "step_in_epoch": step_in_epoch,
        "global_step": epoch * 10 + step_in_epoch,
        "best": best,
        "epochs_since_best": since_best,
        "history": history,
    }


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# ---- functions of the history -------------------------------------------------------------


def test_top_k_among_equals_the_earliest_stays() -> None:
    def epochs(accs: list[float], k: int) -> list[int]:
        return [r["epoch"] for r in top_k_rows([_row(i, a) for i, a in enumerate(accs, 1)], k)]

    assert epochs([0.5, 0.5, 0.9], 2) == [1, 3]  # epoch 2 ties epoch 1 and is newer: it goes
    assert epochs([0.5, 0.6, 0.6, 0.4], 1) == [2]
    assert epochs([0.9, 0.5], 2) == [1, 2]  # fewer than k kept: any epoch enters
    assert epochs([0.9, 0.5], -1) == []
    assert top_k_name({"epoch": 12, "val/acc": 0.123456}) == "epoch012-acc0.1235.pt"


def test_metrics_columns_in_first_seen_order() -> None:
    history = [{"epoch": 1, "a": 0.5}, {"epoch": 2, "b": "x", "a": 0.25}]
    out = metrics_files(history)
    assert out == {
        "metrics.jsonl": '{"epoch": 1, "a": 0.5}\n{"epoch": 2, "b": "x", "a": 0.25}\n',
        "metrics.csv": "epoch,a,b\r\n1,0.5,\r\n2,0.25,x\r\n",
    }


@pytest.mark.parametrize(
    ("epoch", "step_in_epoch", "end"),
    [(0, 0, False), (1, 0, True), (3, 0, True), (1, 4, False), ("2", "0", True)],
)
def test_at_epoch_end(epoch: Any, step_in_epoch: Any, end: bool) -> None:
    assert at_epoch_end({"epoch": epoch, "step_in_epoch": step_in_epoch}) is end


def test_paths_of_the_run_folder(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.config_path == tmp_path / "config.json"
    assert run.last_path == tmp_path / "checkpoints" / "last.pt"
    assert run.best_path == tmp_path / "checkpoints" / "best.pt"
    assert run.top_k == 0
    (tmp_path / "split.json").write_text('{"train": [1]}')
    assert run.read_json("split.json") == {"train": [1]}


# ---- what a commit derives ----------------------------------------------------------------


def _run(tmp_path: Path, top_k: int) -> RunDir:
    run = RunDir(tmp_path / "run", top_k=top_k)
    (run.path / "checkpoints").mkdir(parents=True)
    return run


def _commit(run: RunDir, state: dict[str, Any]) -> None:
    save_checkpoint(state, run.last_path)


def test_derive_at_a_new_best_copies_best_and_top_k_and_writes_metrics(
    tmp_path: Path, trace: Path
) -> None:
    run = _run(tmp_path, top_k=1)
    ck = run.path / "checkpoints"
    (ck / "epoch001-acc0.5000.pt").write_bytes(b"epoch 1")
    (ck / "notes.pt").write_bytes(b"not a top-k file")
    history = [_row(1, 0.5), _row(2, 0.9)]
    _commit(run, _state(2, history))
    run.derive(_state(2, history))
    assert _labels(trace, 1) == [
        "checkpoints/best.pt",
        "checkpoints/epoch002-acc0.9000.pt",
        "checkpoints/epoch001-acc0.5000.pt",  # removed: no longer in the top 1
        "metrics.jsonl",
        "metrics.csv",
    ]
    last = run.last_path.read_bytes()
    assert run.best_path.read_bytes() == last
    assert (ck / "epoch002-acc0.9000.pt").read_bytes() == last
    assert _files(run.path) == [
        "checkpoints/best.pt",
        "checkpoints/epoch002-acc0.9000.pt",
        "checkpoints/last.pt",
        "checkpoints/notes.pt",
        "metrics.csv",
        "metrics.jsonl",
    ]
    for name, text in metrics_files(history).items():
        assert (run.path / name).read_bytes() == text.encode()
    run.derive(_state(2, history))  # again (a resume): the copies again, metrics unchanged
    assert _labels(trace, 6) == ["checkpoints/best.pt", "checkpoints/epoch002-acc0.9000.pt"]


@pytest.mark.parametrize(
    "case", ["not the best", "no best score", "mid-epoch save", "mid-epoch, best so far"]
)
def test_best_is_copied_only_at_an_epoch_end_that_set_it(
    case: str, tmp_path: Path, trace: Path
) -> None:
    run = _run(tmp_path, top_k=0)
    run.best_path.write_bytes(b"epoch 1's")
    history = [_row(1, 0.9), _row(2, 0.5)]
    state = {
        "not the best": _state(2, history, since_best=1),
        "no best score": _state(2, history, best=None),
        "mid-epoch save": _state(2, history, step_in_epoch=3, since_best=1),
        "mid-epoch, best so far": _state(2, history, step_in_epoch=3, since_best=0),
    }[case]
    _commit(run, state)
    run.derive(state)
    assert run.best_path.read_bytes() == b"epoch 1's"
    assert _labels(trace, 1) == ["metrics.jsonl", "metrics.csv"]


def test_top_k_only_the_epochs_kept_and_only_at_their_end(tmp_path: Path, trace: Path) -> None:
    run = _run(tmp_path, top_k=1)
    ck = run.path / "checkpoints"
    (ck / "epoch001-acc0.9000.pt").write_bytes(b"epoch 1")
    history = [_row(1, 0.9), _row(2, 0.5)]
    _commit(run, _state(2, history, since_best=1))
    run.derive(_state(2, history, since_best=1))  # epoch 2 does not enter the top 1
    assert sorted(p.name for p in ck.glob("epoch*")) == ["epoch001-acc0.9000.pt"]
    assert (ck / "epoch001-acc0.9000.pt").read_bytes() == b"epoch 1"
    # a step save in epoch 3: the top 1 would be epoch 2 by this (made-up) history, but
    # nothing is copied before an epoch's end; what is not kept still goes
    history = [_row(1, 0.5), _row(2, 0.9)]
    _commit(run, _state(3, history, step_in_epoch=4))
    run.derive(_state(3, history, step_in_epoch=4))
    assert sorted(p.name for p in ck.glob("epoch*")) == []
    assert "checkpoints/epoch001-acc0.9000.pt" in _labels(trace)


def test_top_k_zero_keeps_no_epoch_checkpoint(tmp_path: Path, trace: Path) -> None:
    run = _run(tmp_path, top_k=0)
    ck = run.path / "checkpoints"
    for name in ("epoch001-acc0.5000.pt", "epoch002-acc0.9000.pt"):
        (ck / name).write_bytes(b"old")
    history = [_row(1, 0.5), _row(2, 0.9)]
    _commit(run, _state(2, history, since_best=1))
    run.derive(_state(2, history, since_best=1))
    assert _labels(trace, 1) == [  # in name order
        "checkpoints/epoch001-acc0.5000.pt",
        "checkpoints/epoch002-acc0.9000.pt",
        "metrics.jsonl",
        "metrics.csv",
    ]
    assert _files(ck) == ["last.pt"]


def test_metrics_are_rewritten_only_when_they_differ(tmp_path: Path, trace: Path) -> None:
    run = _run(tmp_path, top_k=0)
    history = [_row(1, 0.5), _row(2, 0.9)]
    want = metrics_files(history)
    (run.path / "metrics.jsonl").write_text(want["metrics.jsonl"])  # already right
    (run.path / "metrics.csv").write_text(metrics_files(history[:1])["metrics.csv"])  # behind
    state = _state(2, history, since_best=1)
    _commit(run, state)
    run.derive(state)
    assert _labels(trace, 1) == ["metrics.csv"]
    assert (run.path / "metrics.csv").read_bytes() == want["metrics.csv"].encode()


def test_before_the_first_epoch_nothing_is_derived(tmp_path: Path, trace: Path) -> None:
    run = _run(tmp_path, top_k=2)
    state = _state(0, [], step_in_epoch=4)  # a step save in the first epoch
    _commit(run, state)
    run.derive(state)
    assert _labels(trace) == ["checkpoints/last.pt"]
    assert _files(run.path) == ["checkpoints/last.pt"]


def test_commit_order_scalars_last_then_what_derives(
    tmp_path: Path, trace: Path, board: list[Any]
) -> None:
    run = _run(tmp_path, top_k=1)
    history = [_row(1, 0.9)]
    run.log_epoch_scalars(history[0])
    run.commit(_state(1, history))
    assert _labels(trace) == [
        "tensorboard",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
        "checkpoints/epoch001-acc0.9000.pt",
        "metrics.jsonl",
        "metrics.csv",
    ]
    assert torch.load(run.best_path, weights_only=True)["epoch"] == 1
    run.commit(_state(2, history, step_in_epoch=3))  # a step save: last.pt only
    assert _labels(trace, 6) == ["checkpoints/last.pt"]
    assert torch.load(run.last_path, weights_only=True)["step_in_epoch"] == 3


# ---- TensorBoard --------------------------------------------------------------------------


def test_scalars_reach_tensorboard_just_before_the_commit(
    tmp_path: Path, trace: Path, board: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, top_k=0)
    row = {"epoch": 2, "step": 20, "train/loss": 0.5, "val/acc": 1, "note": "x", "lr": 0.01}
    run.log_epoch_scalars(row)
    model = nn.Linear(2, 1)
    model.weight.grad = torch.tensor([[3.0, 4.0]])  # the bias has no gradient: not logged
    run.log_grad_norms(model, step=17)
    assert board == []  # queued only
    monkeypatch.setenv(durable.KILL_ENV, "1:inside")
    run.close()
    assert board == [
        ("open", "tensorboard", None),
        ("scalar", "tensorboard", "train/loss", 0.5, 2),
        ("scalar", "tensorboard", "val/acc", 1.0, 2),
        ("scalar", "tensorboard", "lr", 0.01, 2),
        ("open", "tensorboard/grad_norms", None),
        ("scalar", "tensorboard/grad_norms", "grad_norm/weight", 5.0, 17),
        "kill",  # the inside point: events queued, not yet flushed
        ("flush", "tensorboard"),
        ("flush", "tensorboard/grad_norms"),
        ("close", "tensorboard"),
        ("close", "tensorboard/grad_norms"),
    ]
    assert all(type(e[3]) is float for e in board if e[0] == "scalar")
    assert _labels(trace) == ["tensorboard"]
    board.clear()
    run.close()  # nothing queued, no writer left: nothing happens
    assert board == [] and _labels(trace) == ["tensorboard"]


def test_a_rollback_drops_what_was_queued(tmp_path: Path, trace: Path, board: list[Any]) -> None:
    run = _run(tmp_path, top_k=0)
    run.log_epoch_scalars(_row(1, 0.5))
    run.drop_pending()
    run.log_epoch_scalars({"epoch": 1, "val/acc": 0.75})
    run.commit(_state(1, [_row(1, 0.75)], step_in_epoch=2))
    assert [e for e in board if e[0] == "scalar"] == [("scalar", "tensorboard", "val/acc", 0.75, 1)]
    run.log_epoch_scalars({"epoch": 1, "val/acc": 0.5})
    run.drop_pending()
    run.commit(_state(1, [_row(1, 0.75)], step_in_epoch=4))
    assert _labels(trace) == ["tensorboard", "checkpoints/last.pt", "checkpoints/last.pt"]
    assert [e[0] for e in board] == ["open", "scalar", "flush"]  # one writer, reused


def test_recover_purges_tensorboard_past_the_commit(
    tmp_path: Path, trace: Path, board: list[Any]
) -> None:
    run = _run(tmp_path, top_k=0)
    (run.path / "tensorboard" / "grad_norms").mkdir(parents=True)
    (run.path / ".metrics.csv.1234abcd.tmp").write_text("half")
    history = [_row(1, 0.5), _row(2, 0.9)]
    state = _state(2, history, step_in_epoch=5)  # 25 steps done, 2 epochs committed
    _commit(run, state)
    stale = run.recover(state)
    assert stale == [run.path / ".metrics.csv.1234abcd.tmp"] and not stale[0].exists()
    assert board == [  # opened now, so that the purge marker is written before anything
        ("open", "tensorboard", 3),
        ("open", "tensorboard/grad_norms", 25),
    ]
    assert _labels(trace, 1) == ["metrics.jsonl", "metrics.csv"]  # derived
    run.close()
    board.clear()
    run.log_epoch_scalars({"epoch": 3, "val/acc": 0.5})
    run.close()  # a writer opened later purges nothing more
    assert board[0] == ("open", "tensorboard", None)


def test_recover_without_a_checkpoint_and_without_tensorboard_yet(
    tmp_path: Path, trace: Path, board: list[Any]
) -> None:
    run = _run(tmp_path, top_k=0)
    assert run.recover(None) == []
    assert board == [] and _labels(trace) == []
    model = nn.Linear(1, 1)
    model.bias.grad = torch.tensor([2.0])
    run.log_grad_norms(model, step=0)
    run.log_epoch_scalars({"epoch": 1, "val/acc": 0.5})
    run.close()  # the writers opened now still purge what a killed attempt wrote
    opened = [e for e in board if e[0] == "open"]
    assert opened == [("open", "tensorboard/grad_norms", 0), ("open", "tensorboard", 1)]


def test_recover_opens_only_the_writers_whose_folders_exist(
    tmp_path: Path, trace: Path, board: list[Any]
) -> None:
    run = _run(tmp_path, top_k=0)
    (run.path / "tensorboard").mkdir()
    state = _state(1, [_row(1, 0.5)], since_best=1, step_in_epoch=0)
    state["global_step"] = 7
    _commit(run, state)
    run.recover(state)
    assert board == [("open", "tensorboard", 2)]
    model = nn.Linear(1, 1)
    model.bias.grad = torch.tensor([1.0])
    run.log_grad_norms(model, step=8)
    run.close()
    assert ("open", "tensorboard/grad_norms", 7) in board


class Clock:
    """``time`` for ``_wait_past_event_files``: each sleep moves it on by a quarter second."""

    def __init__(self, now: float) -> None:
        self.now, self.sleeps = now, []

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += 0.25


@pytest.mark.parametrize(("now", "sleeps"), [(1003.5, 2), (1004.0, 0), (1010.0, 0)])
def test_a_purging_writer_waits_past_the_second_of_the_newest_event_file(
    now: float, sleeps: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "events.out.tfevents.1000.host.1.0",
        "events.out.tfevents.1003.host.2.0",
        "events.out.tfevents.host.3.0",  # no stamp: not counted
        "other.1999.x.y",
    ):
        (tmp_path / name).write_text("")
    clock = Clock(now)
    monkeypatch.setattr(run_dir, "time", clock)
    run_dir._wait_past_event_files(tmp_path)
    assert clock.sleeps == [0.05] * sleeps


def test_no_event_file_no_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoClock:
        def time(self) -> float:
            raise AssertionError("read the clock with no event file")

    monkeypatch.setattr(run_dir, "time", NoClock())
    run_dir._wait_past_event_files(tmp_path)


def test_a_purging_writer_waits_before_it_opens(
    tmp_path: Path, trace: Path, board: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, top_k=0)
    (run.path / "tensorboard").mkdir()
    (run.path / "tensorboard" / "events.out.tfevents.1003.host.2.0").write_text("")
    clock = Clock(1003.5)
    monkeypatch.setattr(run_dir, "time", clock)
    run.recover(None)
    assert clock.sleeps == [0.05, 0.05] and board == [("open", "tensorboard", 1)]


# ---- publishing the run folder ------------------------------------------------------------


def _cfg(tmp_path: Path, **over: Any) -> TrainConfig:
    return TrainConfig(
        model="mlp",
        data=str(tmp_path / "digits"),
        runs_root=str(tmp_path / "home" / "runs"),
        **over,
    )


def test_auto_name_is_the_architecture_and_the_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    name = lambda model, data: run_dir._auto_name(TrainConfig(model=model, data=data))  # noqa: E731
    assert name("mlp", "digits") == "mlp-digits"
    assert name("timm:resnet18.a1_in1k", "data/flowers/") == "timm_resnet18-flowers"
    assert name("hf:org/sub/mobilevit.v2/", "./pets/../cats") == "mobilevit-cats"
    assert name("hf:me/model:x", ".") == f"model_x-{tmp_path.name}"
    assert name("hf:me/vit-X/", "d") == "vit-X-d"  # only the slash is stripped


def test_publish_makes_the_folder_complete_under_the_first_free_name(
    tmp_path: Path, trace: Path
) -> None:
    files = {"split.json": {"train": ["a.png"], "val": []}, "classes.json": ["cat", "dog"]}
    cfg = _cfg(tmp_path)
    first = publish_run_dir(cfg, files)
    second = publish_run_dir(cfg, files)
    named = publish_run_dir(_cfg(tmp_path, name="r"), {})
    runs = tmp_path / "home" / "runs"
    assert (first, second, named) == (runs / "mlp-digits", runs / "mlp-digits-2", runs / "r")
    assert sorted(p.name for p in runs.iterdir()) == ["mlp-digits", "mlp-digits-2", "r"]
    for path in (first, second):
        assert sorted(p.name for p in path.iterdir()) == [
            LOCK_FILE,  # held by the process that published it (this one)
            "checkpoints",
            "classes.json",
            "config.json",
            "split.json",
        ]
        assert not any((path / "checkpoints").iterdir())
        assert (path / "split.json").read_text() == json.dumps(files["split.json"], indent=2) + "\n"
        assert (path / "config.json").read_text() == (
            json.dumps(replace(cfg, run_dir=str(path)).to_dict(), indent=2) + "\n"
        )
    assert json.loads((named / "config.json").read_text())["run_dir"] == str(named)
    assert _labels(trace) == [".", ".", "."]
    third = publish_run_dir(cfg, files)
    assert third == runs / "mlp-digits-3"


def test_publish_loses_a_race_and_takes_the_next_name(
    tmp_path: Path, trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.rename
    raced: list[str] = []

    def rename(src: Any, dst: Any) -> None:
        if not raced:  # another run takes the name between the check and the rename
            raced.append(Path(dst).name)
            (Path(dst) / "checkpoints").mkdir(parents=True)
        real(src, dst)

    monkeypatch.setattr(durable.os, "rename", rename)
    cfg = _cfg(tmp_path, name="r")
    path = publish_run_dir(cfg, {})
    assert raced == ["r"] and path == tmp_path / "home" / "runs" / "r-2"
    assert json.loads((path / "config.json").read_text())["run_dir"] == str(path)
    assert sorted(p.name for p in (tmp_path / "home" / "runs").iterdir()) == ["r", "r-2"]


def test_a_failed_publish_leaves_nothing(tmp_path: Path, trace: Path) -> None:
    cfg = _cfg(tmp_path, name="r")
    with pytest.raises(TypeError, match="not JSON serializable"):
        publish_run_dir(cfg, {"split.json": {"a": 1}, "bad.json": {1, 2}})
    assert list((tmp_path / "home" / "runs").iterdir()) == [] and _labels(trace) == []


def test_a_failure_after_the_rename_is_raised_as_itself(
    tmp_path: Path, trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder is in place (complete) and the temporary name is gone: the clean-up must
    not replace the real error with its own."""

    def sync_dir(folder: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(durable, "_sync_dir", sync_dir)
    with pytest.raises(OSError) as exc:
        publish_run_dir(_cfg(tmp_path, name="r"), {"split.json": []})
    assert (exc.value.errno, exc.value.strerror) == (5, "Input/output error")
    runs = tmp_path / "home" / "runs"
    assert [p.name for p in runs.iterdir()] == ["r"]
    assert sorted(p.name for p in (runs / "r").iterdir()) == [
        "checkpoints",
        "config.json",
        "split.json",
    ]
