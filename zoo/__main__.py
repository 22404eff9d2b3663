"""``python -m zoo``: the same CLI as the ``zoo`` console script."""

from zoo.cli.app import main

main()
