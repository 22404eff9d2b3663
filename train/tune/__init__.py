"""``zoo tune``: a hyper-parameter search on Ray Tune whose trials are ordinary zoo runs.

- ``space.py``: the tunable options, the default space, ``--space FILE``, the trials drawn;
- ``book.py``: ``tune.json``, the search's record (what ``--resume`` continues);
- ``search.py``: the driver (:func:`run_search`);
- ``ray_run.py`` / ``trial.py``: the trials on Ray Tune (the ``tune`` extra).

Nothing is imported here; ``zoo --help`` imports none of it (its choices live in
``zoo.train.config``).
"""
