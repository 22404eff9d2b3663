"""Every registered entry has a card in model_cards/ whose numbers match model_info."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard

import zoo
from tests.conftest import ROOT
from tests.test_registry import EXPECTED_PARAMS
from zoo.cards import registry_card, validate_card_locally


@pytest.mark.parametrize("name", [n for n in zoo.list_models() if not n.startswith("tiny_")])
def test_card_exists_and_matches(name: str) -> None:
    path = ROOT / "model_cards" / f"{name}.md"
    assert path.exists(), "missing card: run python scripts/make_model_cards.py"
    card = ModelCard.load(path)
    info = zoo.model_info(name)
    data = card.data.to_dict()
    assert data["zoo_name"] == name
    assert data["params"] == EXPECTED_PARAMS[name]  # counted independently, not info.params
    assert data["gflops"] == info.gflops
    assert data["input_size"] == list(info.input_size)
    assert data["num_classes"] == info.num_classes
    assert data["preprocessing"] == info.preprocessing().to_dict()
    assert data["weights_pinned"] == info.weights.pinned
    published = {(r.metric_name, r.metric_value) for r in card.data.eval_results or []}
    assert published == {(k.split("/")[1], v) for k, v in info.metrics}
    assert f"{EXPECTED_PARAMS[name]:,}" in card.text
    validate_card_locally(str(card))
    assert str(card) == str(registry_card(info)), "card is stale: regenerate it"


@pytest.mark.parametrize("name", [n for n in zoo.list_models() if not n.startswith("tiny_")])
def test_card_commands_parse_and_name_this_entry(name: str) -> None:
    """A card's ``zoo`` lines are commands the CLI takes, about this entry (``zoo finetune
    resnet18`` would train another tag's weights), without flags kept only as no-ops."""
    import typer

    from tests.test_readme_blocks import _parse, zoo_argv
    from zoo.cli.app import app

    group = typer.main.get_command(app)
    text = (ROOT / "model_cards" / f"{name}.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("zoo ")]
    assert lines, "the card shows no zoo command"
    for line in lines:
        argv = zoo_argv(line)
        assert argv is not None
        _parse(group, argv)
        about = argv[argv.index("--student") + 1] if "--student" in argv else argv[1]
        assert about == name, f"{line!r} is about another entry than {name}"
        assert "--dynamic-batch" not in argv, "a no-op flag (the batch axis is the default)"
