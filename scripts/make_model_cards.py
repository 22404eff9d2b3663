"""Regenerate model_cards/ from the registry: python scripts/make_model_cards.py"""

from pathlib import Path

from zoo.cards import registry_card
from zoo.catalog import list_models, model_info

out = Path(__file__).resolve().parent.parent / "model_cards"
out.mkdir(exist_ok=True)
for name in list_models():
    (out / f"{name}.md").write_text(registry_card(model_info(name)))
    print(f"wrote model_cards/{name}.md")
