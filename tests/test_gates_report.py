"""The report's arithmetic on plain arrays and hand-built modules (milliseconds): calibration
bins and ECE against a hand computation, Grad-CAM on a model whose answer comes from a known
place, the layer it hooks, and its refusal for a model with no feature map. The report itself,
from a real run and in a real browser, is in test_report.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from zoo.errors import InputError
from zoo.train.calibration import reliability
from zoo.train.gradcam import cam_layer, grad_cam, overlay, unnormalize


def test_reliability_bins_and_ece_by_hand() -> None:
    conf = np.array([0.05, 0.0, 0.15, 0.95, 1.0])
    correct = np.array([0, 1, 1, 1, 0])
    rows, ece = reliability(conf, correct, bins=10)
    assert [r["count"] for r in rows] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    assert rows[0]["confidence"] == pytest.approx(0.025) and rows[0]["accuracy"] == 0.5
    assert rows[2]["confidence"] is None and rows[2]["accuracy"] is None
    # 2/5·|0.5 − 0.025| + 1/5·|1 − 0.15| + 2/5·|0.5 − 0.975|
    assert ece == pytest.approx(0.4 * 0.475 + 0.2 * 0.85 + 0.4 * 0.475)


def test_reliability_edges_and_perfect_calibration() -> None:
    rows, _ = reliability(np.array([0.1, 0.1000001, 0.2]), np.array([1, 1, 1]), bins=10)
    assert [r["count"] for r in rows[:3]] == [1, 2, 0]  # (lo, hi]: 0.1 is bin 0's, 0.2 bin 1's
    rng = np.random.default_rng(0)
    conf = rng.choice([0.25, 0.75], size=4000)
    correct = rng.random(4000) < conf  # right as often as confident
    assert reliability(conf, correct, bins=4)[1] < 0.02
    assert reliability(conf, ~correct, bins=4)[1] > 0.45
    assert reliability(np.array([]), np.array([]))[1] == 0.0


class Spot(nn.Module):
    """Class 0's score is the mean brightness (ReLU'd), class 1's its negative."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1, bias=False)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(1, 2, bias=False)
        with torch.no_grad():
            self.conv.weight.fill_(1.0)
            self.fc.weight.copy_(torch.tensor([[1.0], [-1.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))


def test_grad_cam_points_where_the_score_comes_from() -> None:
    model = Spot().eval()
    x = torch.zeros(1, 1, 8, 8)
    x[0, 0, :3, :3] = 1.0  # the bright spot, top left
    layer = cam_layer(model, x)
    assert layer == "act"  # the last (N, C, H, W) map with H·W > 1 (the pool's 1×1 is not)
    cam = grad_cam(model, layer, x, target=0)
    assert cam.shape == (8, 8) and cam.max() == pytest.approx(1.0)
    assert cam[:3, :3].min() == pytest.approx(1.0) and cam[4:, 4:].max() == 0.0
    assert not grad_cam(model, layer, x, target=1).any()  # nothing raises class 1's score
    assert all(p.grad is None for p in model.parameters())  # the model is left as it was
    for p in model.parameters():  # frozen: the map still comes out
        p.requires_grad_(False)
    np.testing.assert_array_equal(grad_cam(model, layer, x, target=0), cam)


def test_a_model_without_a_feature_map_is_refused_clearly() -> None:
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(16, 4))
    with pytest.raises(InputError, match="Grad-CAM needs a spatial feature map"):
        cam_layer(mlp, torch.zeros(1, 1, 4, 4))


def test_overlay_and_unnormalize() -> None:
    image = np.full((4, 4, 3), 100, np.uint8)
    assert (np.asarray(overlay(image, np.zeros((4, 4)))) == 100).all()
    hot = np.asarray(overlay(image, np.ones((4, 4)), alpha=1.0))
    assert hot[0, 0].tolist() == [255, 220, 40]  # the top of the heat scale
    rgb = np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    x = (torch.from_numpy(rgb).permute(2, 0, 1) / 255 - torch.tensor(mean)[:, None, None]) / (
        torch.tensor(std)[:, None, None]
    )
    np.testing.assert_array_equal(unnormalize(x, mean, std), rgb)
    grey = unnormalize(torch.zeros(1, 2, 2), (0.5,), (0.5,))
    assert grey.shape == (2, 2, 3) and (grey == 128).all()


@pytest.mark.parametrize("n", [2, 5])
def test_top5_is_left_out_among_five_classes_or_fewer(n: int) -> None:
    """With at most five classes every label is in the top five: top-5 would read 1.0 for
    any model, so it is not reported (nor recorded) at all."""
    from zoo.train.epoch_row import ValScores
    from zoo.train.metrics import summarize

    target = torch.tensor([0, 1, 0, 1])
    logits = torch.nn.functional.one_hot(torch.tensor([1, 0, 1, 0]), n).float()  # all wrong
    got = summarize(logits, target, [f"c{i}" for i in range(n)])
    assert "top5" not in got and got["acc"] == 0.0
    assert ValScores.of(got).top5 is None


def test_top5_is_measured_among_six_classes() -> None:
    from zoo.train.metrics import summarize

    target = torch.tensor([0, 1, 2, 5])
    logits = torch.arange(6, dtype=torch.float).repeat(4, 1)  # ranks 5, 4, 3, 2, 1 on top
    got = summarize(logits, target, [f"c{i}" for i in range(6)])
    assert got["top5"] == pytest.approx(3 / 4)  # class 0 is ranked last


def test_macro_f1_counts_the_classes_that_occur() -> None:
    """scikit-learn's macro average: classes neither in the targets nor predicted are out."""
    from sklearn.metrics import f1_score

    from zoo.train.metrics import summarize

    target = torch.tensor([0, 0, 1, 1, 2])
    pred = torch.tensor([0, 1, 1, 1, 3])  # class 3 predicted, never a target; 4..9 absent
    logits = torch.nn.functional.one_hot(pred, 10).float()
    got = summarize(logits, target, [f"c{i}" for i in range(10)])
    want = f1_score(target.numpy(), pred.numpy(), average="macro")
    assert got["macro_f1"] == pytest.approx(want, abs=1e-4)
    assert [r["predicted"] for r in got["per_class"]][:4] == [1, 3, 0, 1]


def test_per_class_table_lines_up_wide_class_names() -> None:
    """``zoo eval``'s per-class table pads names by terminal cells: the figures after a CJK
    name (two cells a character) start in the same column as after an ASCII one."""
    from rich.cells import cell_len

    from zoo.cli.eval import per_class_lines

    def row(name: str) -> dict[str, object]:
        return {"class": name, "precision": 0.5, "recall": 0.25, "f1": 0.333, "support": 4}

    lines = per_class_lines([row("猫"), row("狗狗"), row("cat"), row("hedgehog")])
    starts = [cell_len(line[: line.index(" P 0.500")]) for line in lines]
    assert len(lines) == 4 and starts == [starts[0]] * 4, lines
    assert {cell_len(line) for line in lines} == {cell_len(lines[0])}


def test_eval_summary_says_top_1_without_top5() -> None:
    """A single-label result among five classes or fewer holds no ``top5``: its accuracy is
    still top-1 (multi-label's is exact-match), whatever keys the result has."""
    from zoo.cli.eval import metric_names

    assert metric_names(multi_label=False)["acc"] == "top-1"
    assert metric_names(multi_label=True)["acc"] == "exact-match"
