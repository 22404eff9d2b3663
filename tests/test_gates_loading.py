"""Strict state-dict loading on tiny modules (milliseconds): every tensor is loaded or the
load refuses in plain words; only the declared head may be re-initialised, and only with
``adapt_head``. The registry-level tests (real MobileNetV2 weights) live in test_registry.py."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from zoo.errors import StateDictMismatchError
from zoo.loading import LoadReport, _under, load_strict


def _net(classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 6), nn.ReLU(), nn.Sequential(nn.Linear(6, 6)), nn.Linear(6, classes)
    )


def _weights(classes: int = 3, seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: torch.randn_like(v) for k, v in _net(classes).state_dict().items()}


def _load(model: nn.Module, sd: dict[str, torch.Tensor], **kw) -> LoadReport:
    args = {"head": "3", "source": "w.safetensors", "adapt_head": False}
    args.update(kw)
    return load_strict(model, sd, **args)


def test_exact_fit_loads_every_tensor(caplog: pytest.LogCaptureFixture) -> None:
    model, sd = _net(), _weights()
    with caplog.at_level(logging.INFO, logger="zoo.loading"):
        report = _load(model, sd)
    assert report.loaded == sorted(sd) and report.source == "w.safetensors"
    assert report.reinitialised == report.missing == report.unexpected == []
    assert all(torch.equal(model.state_dict()[k], v) for k, v in sd.items())
    assert report.summary() == "loaded 6 tensors from w.safetensors"
    assert caplog.messages == ["loaded 6 tensors from w.safetensors"]
    assert report.to_dict() == {
        "source": "w.safetensors",
        "loaded": sorted(sd),
        "reinitialised": [],
        "missing": [],
        "unexpected": [],
        "unused": [],
    }


def test_head_of_another_size_is_reinitialised_only_with_adapt_head() -> None:
    model, sd = _net(classes=5), _weights(classes=3)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(StateDictMismatchError) as exc:
        _load(model, sd)
    assert str(exc.value) == (
        "Weights from w.safetensors do not fit the model (shape mismatch: 3.weight: weights "
        "(3, 6) vs model (5, 6); 3.bias: weights (3,) vs model (5,)). The classifier head has 3 "
        "outputs in the weights but the model expects 5 classes: pass num_classes to "
        "re-initialise it, or fix the class list that goes with these weights."
    )
    assert all(torch.equal(model.state_dict()[k], v) for k, v in fresh.items()), "nothing loaded"
    report = _load(model, sd, adapt_head=True)
    assert report.reinitialised == ["3.weight", "3.bias"]
    assert report.loaded == ["0.bias", "0.weight", "2.0.bias", "2.0.weight"]
    assert torch.equal(model.state_dict()["3.weight"], fresh["3.weight"])  # left fresh
    assert torch.equal(model.state_dict()["0.weight"], sd["0.weight"])
    assert report.summary() == (
        "loaded 4 tensors from w.safetensors; re-initialised head: 3.weight, 3.bias"
    )


def test_adapt_head_never_reaches_outside_the_head() -> None:
    model, sd = _net(), _weights()
    sd["2.0.weight"] = torch.zeros(7, 6)
    for head in ("3", "2", None):
        with pytest.raises(StateDictMismatchError) as exc:
            _load(model, sd, adapt_head=True, head=head if head != "2" else "2.0.w")
        assert "shape mismatch: 2.0.weight: weights (7, 6) vs model (6, 6)" in str(exc.value)
    assert _load(_net(), {**sd}, adapt_head=True, head="2").reinitialised == ["2.0.weight"]


def test_under_matches_whole_module_names_only() -> None:
    assert _under("fc", "fc") and _under("fc.weight", "fc")
    assert _under("classifier.1.bias", "classifier.1")
    assert not _under("fc2.weight", "fc") and not _under("classifier.10.weight", "classifier.1")
    assert not _under("fc.weight", None) and not _under("xfc.weight", "fc")


def test_missing_and_unexpected_keys_are_named() -> None:
    sd = _weights()
    sd.pop("0.weight")
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(StateDictMismatchError) as exc:
        _load(_net(), sd, adapt_head=True)
    assert str(exc.value) == (
        "Weights from w.safetensors do not fit the model (missing from the weights: 0.weight; "
        "not in the model: extra.weight)."
    )


def test_long_lists_are_cut_in_the_message() -> None:
    many = nn.Sequential(*[nn.Linear(2, 2) for _ in range(5)])  # 10 tensors
    sd = {f"x{i}": torch.zeros(1) for i in range(9)}
    with pytest.raises(StateDictMismatchError) as exc:
        load_strict(many, sd, head=None, source="s", adapt_head=True)
    msg = str(exc.value)
    keys = list(many.state_dict())
    assert f"missing from the weights: {', '.join(keys[:8])};" in msg and keys[8] not in msg
    assert f"not in the model: {', '.join(f'x{i}' for i in range(8))})." in msg
    wrong = {k: torch.zeros(3, 3) for k in keys}
    with pytest.raises(StateDictMismatchError) as exc:
        load_strict(many, wrong, head=None, source="s", adapt_head=True)
    msg = str(exc.value)
    assert msg.count("weights (3, 3) vs model") == 5 and keys[5] not in msg


def test_no_hint_when_the_head_fits_or_is_absent() -> None:
    sd = _weights()
    sd["0.weight"] = torch.zeros(2, 4)
    with pytest.raises(StateDictMismatchError) as exc:
        _load(_net(), sd)
    assert str(exc.value).endswith("vs model (6, 4)).")
    no_head = _weights()
    no_head.pop("3.weight")
    with pytest.raises(StateDictMismatchError) as exc:
        _load(_net(), no_head)
    assert str(exc.value).endswith("(missing from the weights: 3.weight).")
    bogus_head = _weights()
    with pytest.raises(StateDictMismatchError) as exc:  # the declared head is not in the model
        _load(_net(), {**bogus_head, "fc.weight": torch.zeros(2, 2)}, head="fc")
    assert str(exc.value).endswith("(not in the model: fc.weight).")


def test_unused_paths_are_skipped_and_reported_not_loaded() -> None:
    """A network cut short (``ModelInfo.unused_weights``): the weights file's blocks it does not
    have are listed, not errors; anything else unexpected still refuses."""
    full = _weights()
    short = nn.Sequential(nn.Linear(4, 6), nn.ReLU())
    report = _load(short, full, head=None, unused=("2", "3"))
    assert report.unused == ["2.0.weight", "2.0.bias", "3.weight", "3.bias"]
    assert report.loaded == ["0.bias", "0.weight"] and report.unexpected == []
    assert torch.equal(short[0].weight, full["0.weight"])
    assert report.summary() == (
        "loaded 2 tensors from w.safetensors; left out 4 tensors this architecture does not have"
    )
    with pytest.raises(StateDictMismatchError, match=r"not in the model: 3\.weight, 3\.bias"):
        _load(short, full, head=None, unused=("2",))
    with pytest.raises(StateDictMismatchError, match=r"not in the model: 2\.0\.weight"):
        _load(short, full, head=None, unused=("2.0.w", "3"))  # whole module names only


def test_fresh_head_reinitialises_the_head_whatever_the_weights_hold() -> None:
    """A headless entry's weights hold another network's head or none: with ``fresh_head``
    every head tensor stays fresh, even one of the same shape (a 1000-class head on ImageNet's
    file would otherwise keep its bias), and a head absent from the file is not missing."""
    sd = _weights()
    model = _net()
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    report = _load(model, sd, fresh_head=True)
    assert report.reinitialised == ["3.weight", "3.bias"] and not report.missing
    assert torch.equal(model[3].bias, fresh["3.bias"]) and torch.equal(
        model[0].weight, sd["0.weight"]
    )
    headless = {k: v for k, v in sd.items() if not k.startswith("3.")}
    report = _load(_net(), headless, fresh_head=True)
    assert report.reinitialised == ["3.weight", "3.bias"] and not report.missing
    with pytest.raises(StateDictMismatchError, match=r"missing from the weights: 3\.weight"):
        _load(_net(), headless)


def test_unused_paths_the_model_has_are_an_error() -> None:
    """Named, the first eight of them, comma-separated."""
    deep = nn.Sequential(nn.Linear(4, 6), nn.Sequential(*[nn.Linear(6, 6) for _ in range(5)]))
    sd = {k: v.clone() for k, v in deep.state_dict().items()}
    with pytest.raises(StateDictMismatchError) as exc:
        _load(deep, sd, head=None, unused=("1",))
    listed = [f"1.{i}.{p}" for i in range(5) for p in ("weight", "bias")][:8]
    assert f"declared left out of these weights: {', '.join(listed)})" in str(exc.value)
    with pytest.raises(
        StateDictMismatchError, match=r"declared left out of these weights: 2\.0\.weight"
    ):
        _load(_net(), _weights(), unused=("2",))


def test_the_class_count_hint_only_where_the_head_was_not_adapted() -> None:
    """The hint says to pass num_classes; where the head was re-initialised (asked for) and
    something else fails, it would tell the user to do what they did."""
    sd = _weights(classes=5)
    sd.pop("0.weight")
    with pytest.raises(StateDictMismatchError) as exc:
        _load(_net(), sd)
    assert "5 outputs in the weights but the model expects 3 classes" in str(exc.value)
    with pytest.raises(StateDictMismatchError) as exc:
        _load(_net(), sd, adapt_head=True)
    assert "missing from the weights: 0.weight" in str(exc.value)
    assert "pass num_classes" not in str(exc.value)
