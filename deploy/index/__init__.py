"""Embeddings you can search: ``zoo index`` writes an index folder (:mod:`.store`, built by
:mod:`.build`), ``zoo similar`` and the kNN out-of-distribution score search it
(:mod:`.query`, backends in :mod:`.search`)."""

from zoo.calibration import KNN_K  # the kNN score's k: one place (zoo/knn.py's rule uses it too)

__all__ = ["KNN_K"]
