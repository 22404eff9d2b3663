"""Embeddings you can search: ``zoo index`` writes an index folder (:mod:`.store`, built by
:mod:`.build`), ``zoo similar`` and the kNN out-of-distribution score search it
(:mod:`.query`, backends in :mod:`.search`)."""

KNN_K = 10
"""The kNN score's k (``zoo eval --ood --knn``): Sun et al. use 50 of CIFAR-10's 50,000
training images; our training splits hold hundreds to thousands of images, so fewer."""
