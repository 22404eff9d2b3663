"""``zoo cache ls|clear``: where zoo's caches live, what they hold, and removing them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import JsonOpt, out, print_json

cache_app = typer.Typer(help="zoo's caches: decoded images, backbone features, data-check results.")


def _folder_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0


@cache_app.command("ls")
def ls_cmd(as_json: JsonOpt = False) -> None:
    """Where the cache is ($ZOO_CACHE, default ~/.cache/zoo), its entries and size on disk."""
    from zoo.system import cache_home, mib
    from zoo.train.features import FEATURES_DIR
    from zoo.train.image_cache import usage

    home = cache_home()
    rows = usage()
    check_bytes = _folder_bytes(home / "datacheck")
    feature_bytes = _folder_bytes(home / FEATURES_DIR)
    if as_json:
        print_json(
            {
                "location": str(home),
                "images": rows,
                "features_bytes": feature_bytes,
                "datacheck_bytes": check_bytes,
            }
        )
        return
    out.print(f"cache: {home}  (set $ZOO_CACHE to move it; zoo cache clear empties it)")
    for r in rows:
        out.print(f"  images {r['spec']}: {r['entries']} entries, {mib(r['bytes'])} MiB")
    if not rows:
        out.print("  images: none")
    out.print(f"  backbone features (--cache-features): {mib(feature_bytes)} MiB")
    out.print(f"  data-check results: {mib(check_bytes)} MiB")


@cache_app.command("clear")
def clear_cmd(
    images_only: Annotated[
        bool, typer.Option("--images-only", help="keep the data-check results")
    ] = False,
) -> None:
    """Remove the cached images and features (and data-check results): runs rebuild what they
    need."""
    from zoo.system import cache_home, mib
    from zoo.train.features import FEATURES_DIR
    from zoo.train.image_cache import clear

    freed = clear() + _folder_bytes(cache_home() / FEATURES_DIR)
    shutil.rmtree(cache_home() / FEATURES_DIR, ignore_errors=True)
    if not images_only:
        freed += _folder_bytes(cache_home() / "datacheck")
        shutil.rmtree(cache_home() / "datacheck", ignore_errors=True)
    out.print(f"freed {mib(freed)} MiB from {cache_home()}")


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")
