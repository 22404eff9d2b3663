"""The trainer's observer hook (``zoo.train.observe``): what a tracker or a search's reporter
hears, when, and that it can neither break a run nor lose an epoch. Real runs on real digits
(simple_cnn at 32 px, in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo.errors import CheckpointError
from zoo.train.config import TrainConfig
from zoo.train.epoch_row import EpochRow, TrainPass, ValScores
from zoo.train.observe import StopRun
from zoo.train.trainer import fit


class Recorder:
    """Records every call; ``stop_after``: raise StopRun at that epoch; ``fail``: the events
    that raise an ordinary error."""

    def __init__(self, stop_after: int | None = None, fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, object]] = []
        self.stop_after, self.fail = stop_after, fail

    def run_started(self, run: Path, cfg: TrainConfig, history: list[EpochRow]) -> None:
        self.calls.append(("run_started", [r.epoch for r in history]))
        assert (run / "config.json").exists()  # the folder is open
        if "run_started" in self.fail:
            raise RuntimeError("tracker down")

    def epoch_ended(self, run: Path, row: EpochRow) -> None:
        self.calls.append(("epoch_ended", row))
        # committed: last.pt and metrics.jsonl already hold this epoch
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["epoch"] == row.epoch
        if "epoch_ended" in self.fail:
            raise RuntimeError("tracker down")
        if self.stop_after == row.epoch:
            raise StopRun

    def run_ended(self, run: Path, status: str) -> None:
        self.calls.append(("run_ended", (status, (run / "report.json").exists())))


def _options(data: Path, runs: Path, name: str, epochs: int) -> TrainConfig:
    return TrainConfig(
        model="simple_cnn", data=str(data), weights="none", epochs=epochs, image_size=32,
        batch_size=32, num_workers=0, runs_root=str(runs), name=name, progress=False,
    )  # fmt: skip


def _resume(run: Path, extend: int = 0) -> TrainConfig:
    """What ``zoo finetune --resume RUN [--extend N]`` passes to :func:`fit`."""
    return TrainConfig(model=None, data=None, resume=str(run), extend=extend, progress=False)  # type: ignore[arg-type]


def test_rows_round_trip_and_name_the_monitored_value() -> None:
    row = EpochRow(
        epoch=2, step=40, train=TrainPass(0.5, 0.8, 0.1, 900.0, 1.5),
        val=ValScores(loss=0.4, acc=0.9, macro_f1=0.88, balanced_acc=0.87),
        lr=1e-3, nonfinite_skipped=0,
        ema=ValScores(loss=0.3, acc=0.92, macro_f1=0.9, balanced_acc=0.91), shipped="ema",
    )  # fmt: skip
    assert EpochRow.from_dict(row.to_dict()) == row
    assert EpochRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row
    assert row.scalars()["val/acc"] == 0.9 and "epoch" not in row.scalars()
    assert "val/top5" not in row.scalars()  # not measured: not logged as a number
    assert row.val.monitored("val/loss") == -0.4
    assert row.val.monitored("val/balanced_acc") == 0.87
    with pytest.raises(ValueError, match="val/top5"):
        row.val.monitored("val/top5")


def test_observers_hear_each_committed_epoch_and_the_end(four_digits, tmp_path) -> None:
    rec = Recorder()
    run = fit(_options(four_digits, tmp_path, "seen", 2), observers=[rec])
    assert run is not None
    names = [c[0] for c in rec.calls]
    assert names == ["run_started", "epoch_ended", "epoch_ended", "run_ended"]
    assert rec.calls[0][1] == []  # a new run has no history
    rows = [c[1] for c in rec.calls if c[0] == "epoch_ended"]
    on_disk = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.to_dict() for r in rows] == on_disk  # the rows, exactly as the run keeps them
    assert rec.calls[-1][1] == ("done", True)  # report.json written before run_ended

    # --resume --extend: the earlier epochs arrive as history, only the new one as an event
    again = Recorder()
    assert fit(_resume(run, extend=1), frozenset({"resume", "extend"}), observers=[again]) == run
    assert again.calls[0] == ("run_started", [1, 2])
    assert [c[1].epoch for c in again.calls if c[0] == "epoch_ended"] == [3]


def test_a_stop_request_ends_the_run_as_early_stopping_does(four_digits, tmp_path) -> None:
    rec = Recorder(stop_after=1)
    run = fit(_options(four_digits, tmp_path, "stopped", 3), observers=[rec])
    assert run is not None
    assert [c[1].epoch for c in rec.calls if c[0] == "epoch_ended"] == [1]
    report = json.loads((run / "report.json").read_text())
    assert report["epochs"] == 1 and rec.calls[-1][1] == ("done", True)
    # committed as a stop: a plain resume does not train on (as after early stopping)
    with pytest.raises(CheckpointError, match="stopped early"):
        fit(_resume(run), frozenset({"resume"}))


def test_a_failing_observer_is_a_warning_not_the_end_of_training(
    four_digits, tmp_path, capsys
) -> None:
    rec = Recorder(fail=("run_started", "epoch_ended"))
    run = fit(_options(four_digits, tmp_path, "failing", 2), observers=[rec])
    assert run is not None and json.loads((run / "report.json").read_text())["epochs"] == 2
    err = capsys.readouterr().err
    assert "warning: Recorder.epoch_ended failed: RuntimeError: tracker down" in err
    assert rec.calls[-1] == ("run_ended", ("done", True))
