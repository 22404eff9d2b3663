"""The ``zoo`` command line (typer). Each module with a ``register(app)`` adds commands."""
