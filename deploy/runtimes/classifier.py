"""What predict and serve run, whatever the runtime (:class:`Classifier`): preprocessing and
class names from the model file's zoo metadata, top-k, and fixed-batch graphs padded and
chunked in one place (``run_padded``) for predict, serve, parity and bench. The runtimes are
:class:`zoo.deploy.runtimes.loader.OnnxClassifier` and
:class:`zoo.deploy.runtimes.openvino.OpenVinoClassifier`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.calibration import Calibration, Rejection
from zoo.deploy.runtimes.decisions import Decisions, decision_rule
from zoo.errors import InputError
from zoo.images import open_image
from zoo.onnx_meta import read_calibration, read_preprocessing
from zoo.preprocess import preprocess, scores
from zoo.variants import warn_if_stale


def padded_chunks(x: np.ndarray, batch: int) -> list[np.ndarray]:
    """``x`` in chunks of exactly ``batch`` samples, what a graph with a fixed batch takes: the
    last padded with copies of the last sample (real values, never zeros that a model may not
    expect; ``zoo quantize`` calibrates on these too, a padded copy weighing that image a
    little more)."""
    pad = -len(x) % batch
    if pad:
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    return list(x.reshape(-1, batch, *x.shape[1:]))


def run_padded(run: Callable[[np.ndarray], np.ndarray], x: np.ndarray, batch: int) -> np.ndarray:
    """Run ``x`` in chunks of exactly ``batch`` samples (:func:`padded_chunks`), for graphs
    with a fixed batch; the padding's outputs are dropped.

    Args:
        run: one call of the graph on exactly ``batch`` samples.
        x: any number of samples, ``len(x) >= 1``.
        batch: the graph's batch dimension.

    Returns:
        ``len(x)`` outputs, in order.
    """
    if len(x) == batch:
        return run(x)
    return np.concatenate([run(chunk) for chunk in padded_chunks(x, batch)])[: len(x)]


@dataclass
class Prediction:
    """One class of an image's top-k (:meth:`Classifier.classify`): its name, index and score
    (softmax, or the class's own sigmoid for a multi-label model)."""

    label: str
    index: int
    score: float


@dataclass(frozen=True)
class Assessed:
    """A batch scored from its logits in one pass (:meth:`Classifier.assess`).

    Attributes:
        probs: ``(N, classes)`` float64 scores, as :meth:`Classifier.score` gives them.
        rule_scores: ``(N,)`` each sample's score of the model's rejection rule (None: the
            model has no rule); :meth:`zoo.calibration.Rejection.verdict` judges one.
        features: ``(N, D)`` float32 penultimate features, when asked for.
    """

    probs: np.ndarray
    rule_scores: np.ndarray | None = None
    features: np.ndarray | None = None


def judge_logits(
    logits: np.ndarray,
    multi_label: bool,
    calibration: Calibration | None,
    knn: np.ndarray | None = None,
) -> Assessed:
    """Scores of raw ``(N, classes)`` logits (:func:`zoo.preprocess.scores`) and the scores of
    the calibration's rejection rule (energy needs the logits before the softmax, so both come
    from here; a ``knn`` rule takes the model's ``(N,)`` kNN scores; a multi-label model has no
    rule)."""
    rule = calibration.reject if calibration is not None and not multi_label else None
    return Assessed(
        scores(logits, multi_label, calibration),
        rule.scores(logits, calibration.temperature, knn) if rule and calibration else None,
    )


class Classifier:
    """What predict and serve run, whatever the runtime: preprocessing and class names from the
    model file's zoo metadata, batches padded and chunked for a fixed-batch graph, top-k.

    A runtime sets ``meta``, ``input_name``, ``input_shape``, ``input_type`` (ONNX's
    spelling, e.g. ``tensor(float)``), ``output_name``, ``width`` (outputs per sample),
    ``knn`` (the graph also has :data:`zoo.knn.KNN_OUTPUT`), ``threads`` and ``load_s``, and
    implements ``_run_once`` (exactly the graph's batch in, float32 *outputs* out: the logits,
    then with ``knn`` one column more, the kNN score, so one array is padded, chunked and
    batched as one). Callers score through :meth:`score` (and :meth:`score_with_features`
    for embeddings) or :meth:`classify`; :meth:`run` gives the raw logits, :meth:`outputs`
    the whole array that :meth:`judge` and :meth:`split` take.
    """

    path: Path
    meta: dict[str, Any]
    input_name: str
    input_shape: list[Any]
    input_type: str
    output_name: str
    width: int | None
    threads: int
    load_s: float
    runtime: str
    knn: bool = False

    def _init_common(self) -> None:
        self.pre = read_preprocessing(self.meta, self.path)
        warn_if_stale(self.path, self.meta)  # a model folder's export holding older weights
        dim = self.input_shape[0]
        self.static_batch = dim if isinstance(dim, int) and dim > 0 else None
        self.classes: list[str] = list(self.meta.get("class_names") or [])
        self.multi_label = bool(self.meta.get("multi_label", False))
        # a multi-label model's per-class thresholds, checked at load (never a 500 per request)
        self.decisions: Decisions | None = (
            decision_rule(
                self.meta.get("thresholds"),
                tuple(self.classes),
                self.num_classes,
                where=f"{self.path}: the metadata's thresholds",
                fix="export it again (zoo export) from a model folder whose config.json holds "
                "one threshold in [0, 1] per class, or none (0.5 for each)",
            )
            if self.multi_label
            else None
        )
        self.calibration = read_calibration(self.meta, self.path)  # temperature, reject rule
        # zoo export --embed-preprocessing: the graph takes uint8 (N, H, W, C) decoded pixels
        self.embedded = self.input_type == "tensor(uint8)"
        # zoo export --fp16-io: float16 at the graph's boundary, cast here both ways
        self.half_io = self.input_type == "tensor(float16)"

    @property
    def num_classes(self) -> int:
        """Outputs per sample: the graph's last dimension, else the number of class names."""
        return self.width if self.width is not None else len(self.classes)

    @property
    def rule(self) -> Rejection | None:
        """The rejection rule in the metadata (None: none stored; a multi-label model has none)."""
        cal = self.calibration
        return cal.reject if cal is not None and not self.multi_label else None

    def _run_once(self, batch: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def run_with_features(
        self, batch: np.ndarray | list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Logits and penultimate features (``(N, D)`` float32) in one pass (ONNX Runtime
        only, see :class:`zoo.deploy.runtimes.loader.OnnxClassifier`).

        Raises:
            InputError: this runtime cannot read a model's features.
        """
        outputs, feats = self._with_features(batch)
        return self.split(outputs)[0], feats

    def _with_features(self, batch: np.ndarray | list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_outputs_with_features` of prepared samples: for a graph with embedded
        preprocessing, pixel arrays that may differ in size (one call per size, as
        :meth:`run_each`)."""
        if isinstance(batch, np.ndarray):
            return self._outputs_with_features(batch)
        if len({x.shape for x in batch}) == 1:
            return self._outputs_with_features(np.stack(batch))
        parts = [self._outputs_with_features(x[None]) for x in batch]
        return np.concatenate([o for o, _ in parts]), np.concatenate([f for _, f in parts])

    def _outputs_with_features(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise InputError(
            f"{self.runtime} cannot read {self.path}'s embeddings: they come from a second "
            "output that zoo adds to ONNX graphs in ONNX Runtime; give the .onnx file."
        )

    def prepare(self, image: Any) -> np.ndarray:
        """One decoded image as the graph takes it: ``(C, H, W)`` float32 preprocessed here,
        or the ``(H, W, C)`` uint8 pixels a graph with embedded preprocessing resizes itself."""
        if self.embedded:
            from zoo.deploy.export.graph_preprocess import pixels

            return pixels(image, self.pre.channels)
        return preprocess(image, self.pre)

    def run_each(self, samples: list[np.ndarray]) -> np.ndarray:
        """:meth:`outputs` of samples that may differ in size (pixels for an embedded graph):
        one batch when they share a shape, one call each otherwise."""
        if len({x.shape for x in samples}) == 1:
            return self.outputs(np.stack(samples))
        return np.concatenate([self.outputs(x[None]) for x in samples])

    def outputs(self, batch: np.ndarray) -> np.ndarray:
        """The graph's outputs for any number of samples (padded and chunked for a
        fixed-batch graph): the logits, and with :attr:`knn` the kNN score as a last column."""
        if self.static_batch is None:
            return self._run_once(batch)
        return run_padded(self._run_once, batch, self.static_batch)

    def split(self, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`outputs` as ``(logits, knn scores or None)``."""
        if not self.knn:
            return outputs, None
        return outputs[:, :-1], outputs[:, -1]

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Logits for any number of samples (padded and chunked for a fixed-batch graph)."""
        return self.split(self.outputs(batch))[0]

    def score(self, batch: np.ndarray | list[np.ndarray]) -> np.ndarray:
        """Scores of prepared samples (softmax at the metadata's temperature, or one sigmoid
        per class for a multi-label model), float64 ``(N, classes)``.

        Args:
            batch: ``(N, C, H, W)`` samples from :meth:`prepare`, or for a graph with embedded
                preprocessing the list of its pixel arrays (they may differ in size).

        Returns:
            One row of scores per sample, in order.
        """
        logits = self.split(self._outputs(batch))[0]
        return scores(logits, self.multi_label, self.calibration)

    def _outputs(self, batch: np.ndarray | list[np.ndarray]) -> np.ndarray:
        return self.run_each(list(batch)) if self.embedded else self.outputs(np.asarray(batch))

    def judge(self, outputs: np.ndarray) -> Assessed:
        """:func:`judge_logits` of :meth:`outputs` with this model's calibration (and kNN
        scores, when the graph gives them)."""
        logits, knn = self.split(outputs)
        return judge_logits(logits, self.multi_label, self.calibration, knn)

    def assess(self, batch: np.ndarray | list[np.ndarray], *, features: bool = False) -> Assessed:
        """:meth:`score`, the rejection rule's scores and (``features``) the penultimate
        features of prepared samples, from one run of the graph.

        Raises:
            InputError / ValueError: ``features`` where :meth:`score_with_features` raises.
        """
        if not features:
            return self.judge(self._outputs(batch))
        outputs, feats = self._with_features(batch)
        judged = self.judge(outputs)
        return Assessed(judged.probs, judged.rule_scores, feats)

    def score_with_features(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score` and each sample's penultimate features, ``(N, D)`` float32, in one pass.

        Raises:
            InputError: the runtime cannot read features (see :meth:`run_with_features`).
            ValueError: an ONNX Runtime model loaded without ``embeddings=True``.
        """
        logits, feats = self.run_with_features(batch)
        return scores(logits, self.multi_label, self.calibration), feats

    def preprocess_images(self, images: list[Any]) -> list[np.ndarray]:
        """:meth:`prepare` of each image (a path or bytes is decoded first)."""
        return [
            self.prepare(im if not isinstance(im, str | Path | bytes) else open_image(im))
            for im in images
        ]

    def classify(self, images: list[Any], k: int = 5) -> list[list[Prediction]]:
        """The top ``k`` classes of each image, best first.

        Args:
            images: image files (paths or bytes) or decoded PIL images.
            k: classes per image.

        Returns:
            One list of :class:`Prediction` per image, in order.

        Raises:
            InputError: an image file is missing or unreadable.
        """
        probs = self.score(self.preprocess_images(images))
        out = []
        for row in probs:
            top = np.argsort(-row)[:k]
            out.append(
                [
                    Prediction(
                        self.classes[i] if i < len(self.classes) else str(i), int(i), float(row[i])
                    )
                    for i in top
                ]
            )
        return out
