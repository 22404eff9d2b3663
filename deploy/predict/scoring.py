"""``zoo predict``: top-k labels from an ONNX file (metadata only, no model code) or from a
registry entry / run through PyTorch.

:func:`load_scorer` loads a model once into a :class:`Scorer`: the per-image preprocessing
(thread-safe, so decode workers run it) and the batched scoring. :func:`predict` (a few files,
in memory) and :func:`zoo.deploy.predict.batch.predict_to_file` (millions, streamed to a file)
both use it, so they give the same scores."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from PIL import Image

from zoo.calibration import UNKNOWN_LABEL, Rejection, Verdict
from zoo.deploy.predict.inputs import unreadable_reason
from zoo.deploy.runtimes.classifier import Assessed, judge_logits
from zoo.deploy.runtimes.decisions import DEFAULT_THRESHOLD, Decisions, decision_rule
from zoo.errors import InputError
from zoo.images import open_image
from zoo.preprocessing import Preprocessing
from zoo.ref import RUNTIME_KINDS, ModelRef
from zoo.tta import average, check_tta, check_views, views


@dataclass(frozen=True)
class ClassScore:
    """One class of an image's top-k: its name, index and score."""

    label: str
    index: int
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "index": self.index, "score": self.score}


@dataclass(frozen=True)
class Prediction:
    """An image's top-k classes, best first (what :func:`predict` gives for each image), the
    model's rejection rule's verdict on it (None: no rule, or ``reject=False``) and a
    multi-label model's decided classes (:meth:`Scorer.decided`; None: single-label)."""

    image: str
    top: tuple[ClassScore, ...]
    verdict: Verdict | None = None
    labels: tuple[str, ...] | None = None  # a multi-label model's decided classes

    @property
    def label(self) -> str:
        """The answer: the best class, or :data:`zoo.calibration.UNKNOWN_LABEL` if rejected."""
        if self.verdict is not None and not self.verdict.accepted:
            return UNKNOWN_LABEL
        return self.top[0].label

    def to_dict(self) -> dict[str, Any]:
        """``zoo predict --json``'s shape: ``{"image", "top": [{"label", "index", "score"}]}``;
        with a rule also ``label`` (the answer), ``accepted``, ``score``, ``score_kind`` and
        ``threshold`` (:meth:`zoo.calibration.Verdict.to_dict`); a multi-label model's
        ``labels``, the classes at or over their thresholds."""
        d: dict[str, Any] = {"image": self.image, "top": [t.to_dict() for t in self.top]}
        if self.labels is not None:
            d["labels"] = list(self.labels)
        if self.verdict is not None:
            d.update(label=self.label, **self.verdict.to_dict())
        return d

    def lines(self) -> list[str]:
        """The image, then a ``score  label`` line per class; a rejected image's one line
        says ``unknown``, why, and its best class."""
        v = self.verdict
        if v is not None and not v.accepted:
            best = self.top[0]
            why = f"{v.reason()}; best class: {best.label} {best.score:.4f}"
            return [f"{self.image}:", f"  {UNKNOWN_LABEL}  ({why})"]
        decided = [] if self.labels is None else [f"  labels: {', '.join(self.labels) or '(none)'}"]
        return [f"{self.image}:", *(f"  {t.score:.4f}  {t.label}" for t in self.top), *decided]


@dataclass(frozen=True)
class Unreadable:
    """An input :func:`predict_each` could not score (missing, undecodable, too large), and
    why (the reason names the path, and for a path from a list its line)."""

    image: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """``zoo predict --json``'s entry for it: ``{"image", "error"}``."""
        return {"image": str(self.image), "error": self.reason}


@dataclass(frozen=True)
class Scorer:
    """A model loaded for prediction.

    Attributes:
        prepare: decoded image → ``(C, H, W)`` float32 array, as the model's eval transform
            makes it (pure: safe to call from several threads).
        score: ``(N, C, H, W)`` batch → ``(N, classes)`` float64 scores (softmax, or one
            sigmoid per class for a multi-label model).
        labels: class names (may be empty: an index then names its class).
        num_classes: the width of ``score``'s output.
        multi_label: independent per-class scores.
        decisions: a multi-label model's per-class decision rule (None: 0.5 for each class).
        identity: what names this model for a resumed job (reference, and for a file its
            size and modification time).
        embed: like ``score`` but also returns each sample's penultimate features, ``(N, D)``
            float32 (None unless loaded with ``embeddings=True``).
        pre: the model's eval preprocessing.
        pixels_in: the graph preprocesses itself (``zoo export --embed-preprocessing``):
            ``prepare`` gives ``(H, W, C)`` uint8 pixels of any size, and :meth:`batch` a list
            that ``score`` takes.
        rule: the rejection rule applied (None: the model has none, or it was turned off).
        assess: ``(batch, features)`` → :class:`Assessed`, the scores, the rule's scores and
            (``features``) the embeddings from one model call; None: from ``score``/``embed``.
    """

    prepare: Callable[[Image.Image], np.ndarray]
    score: Callable[[np.ndarray], np.ndarray]
    labels: tuple[str, ...]
    num_classes: int
    multi_label: bool = False
    decisions: Decisions | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    embed: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
    pre: Preprocessing | None = None
    pixels_in: bool = False
    rule: Rejection | None = None
    assess: Callable[[Any, bool], Assessed] | None = None

    def scored(self, x: Any, *, features: bool = False) -> Assessed:
        """Scores of a :meth:`batch`, the rule's scores when :attr:`rule` is set, and
        (``features``, a scorer with ``embed``) the penultimate features, in one model call."""
        if self.assess is not None:
            a = self.assess(x, features)
            return a if self.rule is not None else replace(a, rule_scores=None)
        if features:
            assert self.embed is not None, "load the scorer with embeddings=True"
            probs, feats = self.embed(x)
            return Assessed(probs, None, feats)
        return Assessed(self.score(x))

    def verdicts(self, a: Assessed) -> list[Verdict | None]:
        """Each row's verdict of :attr:`rule` (Nones without one)."""
        if self.rule is None or a.rule_scores is None:
            return [None] * len(a.probs)
        return [self.rule.verdict(s) for s in a.rule_scores]

    def batch(self, samples: list[np.ndarray]) -> Any:
        """What ``score`` takes for these prepared samples: one stacked array, or the list
        itself for a graph that preprocesses images of any size itself."""
        return list(samples) if self.pixels_in else np.stack(samples)

    def label(self, i: int) -> str:
        """Class ``i``'s name (its index as text when the model has no names)."""
        return self.labels[i] if i < len(self.labels) else str(i)

    def top(self, row: np.ndarray, k: int) -> tuple[ClassScore, ...]:
        """The ``k`` best classes of one score row, best first (ties: lower index first)."""
        return tuple(
            ClassScore(self.label(int(i)), int(i), float(row[i]))
            for i in np.argsort(-row, kind="stable")[:k]
        )

    def decided(self, row: np.ndarray) -> tuple[str, ...] | None:
        """Multi-label: the classes whose score reaches their threshold, in class order (None:
        a single-label model)."""
        if not self.multi_label:
            return None
        rule = self.decisions or Decisions((DEFAULT_THRESHOLD,) * len(row), self.labels)
        return tuple(rule.labels(row[None])[0])


def _identity(ref: ModelRef, device: str) -> dict[str, Any]:
    ident: dict[str, Any] = {"model": str(ref), "device": device}
    if ref.is_path:
        path = ref.path if ref.kind in RUNTIME_KINDS else ref.model_folder / "model.safetensors"
        ident["path"] = os.path.abspath(ref.path)
        if path.exists():
            st = path.stat()
            ident.update(size=st.st_size, mtime_ns=st.st_mtime_ns)
    return ident


def load_scorer(
    model: str | ModelRef,
    *,
    device: str = "cpu",
    embeddings: bool = False,
    threads: int | None = None,
    tta: str = "none",
    spin: bool = True,
    reject: bool = True,
) -> Scorer:
    """Load a model for prediction, once.

    Args:
        model: a model reference: an ``.onnx`` file runs in ONNX Runtime and an OpenVINO
            ``.xml`` IR in OpenVINO, each from its embedded metadata alone; anything else is
            built with :func:`zoo.create_model`.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        embeddings: also offer :attr:`Scorer.embed` (see :mod:`zoo.deploy.predict.embeddings`).
        threads: ONNX Runtime's threads (default: the CPUs available); PyTorch keeps its own.
        tta: test-time augmentation (:mod:`zoo.tta`): ``prepare`` then gives each
            image's views and ``score`` averages their probabilities.
        spin: let ONNX Runtime's idle threads busy-wait between runs (fastest when nothing
            else needs the cores; ``False`` when decoding threads run beside it).
        reject: apply the model's rejection rule, if it has one (``False``: every image gets
            its top-k, ``zoo predict --no-reject``).

    Returns:
        The loaded :class:`Scorer`.

    Raises:
        ModelRefError / UnknownModelError: the reference does not parse.
        Everything :func:`zoo.create_model` or ``OnnxClassifier`` raises.
    """
    if check_tta(tta) != "none" and embeddings:
        raise InputError(
            "Embeddings with test-time augmentation would average features of different "
            "views: drop --tta or --embeddings."
        )
    scorer = _load(ModelRef.parse(model), device, embeddings, threads, spin)
    if not reject:
        scorer = replace(scorer, rule=None)
    if scorer.pixels_in and tta != "none":
        raise InputError(
            f"{model} preprocesses images inside its graph (exported with "
            "--embed-preprocessing), so zoo cannot crop test-time views for it: drop --tta, "
            "or use the export made without --embed-preprocessing."
        )
    if tta == "none":
        return scorer
    pre, base, base_assess = scorer.pre, scorer.score, scorer.assess
    assert pre is not None and base_assess is not None
    check_views(pre, tta)  # refused here, not once per image

    def score_views(x: np.ndarray) -> np.ndarray:  # (N, V, C, H, W) → (N, K)
        n, v = x.shape[:2]
        return average(base(x.reshape(n * v, *x.shape[2:])).reshape(n, v, -1))

    def assess_views(x: np.ndarray, features: bool) -> Assessed:
        # the views' probabilities averaged as score_views does; the rule's score too
        n, v = x.shape[:2]
        a = base_assess(x.reshape(n * v, *x.shape[2:]), False)
        s = None if a.rule_scores is None else a.rule_scores.reshape(n, v).mean(1)
        return Assessed(average(a.probs.reshape(n, v, -1)), s)

    return replace(
        scorer,
        prepare=lambda im: views(im, pre, tta),
        score=score_views,
        assess=assess_views,
        identity={**scorer.identity, "tta": tta},
    )


def _load(ref: ModelRef, device: str, embeddings: bool, threads: int | None, spin: bool) -> Scorer:
    if ref.kind in RUNTIME_KINDS:  # an .onnx file or an OpenVINO IR, from its metadata alone
        from zoo.deploy.runtimes.loader import load_classifier

        clf = load_classifier(
            ref.path, device=device, threads=threads, spin=spin, embeddings=embeddings
        )
        return Scorer(
            prepare=clf.prepare,  # pixels for a graph that preprocesses itself
            score=clf.score,
            labels=tuple(clf.classes),
            num_classes=clf.num_classes,
            multi_label=clf.multi_label,
            decisions=clf.decisions,
            identity=_identity(ref, device),
            embed=clf.score_with_features if embeddings else None,
            pre=clf.pre,
            pixels_in=clf.embedded,
            rule=clf.rule,
            assess=lambda x, features: clf.assess(x, features=features),
        )
    import torch

    from zoo.deploy.predict.embeddings import torch_features
    from zoo.device import pick_device
    from zoo.factory import create_model, info_of
    from zoo.transforms import eval_transform

    dev = pick_device(device)
    net = create_model(ref).to(dev).eval()
    info = info_of(net)
    tf = eval_transform(info)

    cal = info.calibration
    rule = cal.reject if cal is not None and not info.multi_label else None
    from zoo.knn import rule_bank

    bank = rule_bank(cal, info.multi_label, lambda: ref.model_folder)  # a knn rule's embeddings
    both = torch_features(net, info.classifier) if embeddings or bank is not None else None

    def assess(x: np.ndarray, features: bool) -> Assessed:
        with torch.inference_mode():
            if both is None:
                logits, feats = net(torch.from_numpy(x).to(dev)), None
            else:
                logits, feats = both(torch.from_numpy(x).to(dev))
        knn = bank.scores(feats) if bank is not None and feats is not None else None
        a = judge_logits(logits.float().cpu().numpy(), info.multi_label, cal, knn)
        return Assessed(a.probs, a.rule_scores, feats if features else None)

    def score(x: np.ndarray) -> np.ndarray:
        return assess(x, False).probs

    def torch_embed(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = assess(x, True)
        assert a.features is not None
        return a.probs, a.features

    return Scorer(
        prepare=lambda im: tf(im).numpy(),
        score=score,
        labels=tuple(info.label_names or ()),
        num_classes=info.num_classes,
        multi_label=info.multi_label,
        decisions=(
            decision_rule(
                list(info.thresholds or ()),
                tuple(info.label_names or ()),
                info.num_classes,
                where=f"{ref}: config.json's thresholds",
                fix="fine-tune it again, or remove them (0.5 for every class)",
            )
            if info.multi_label
            else None
        ),
        identity=_identity(ref, str(dev)),
        embed=torch_embed if embeddings else None,
        pre=info.preprocessing(),
        rule=rule,
        assess=assess,
    )


def _scorer(model: str | ModelRef | Scorer, *, device: str, tta: str, reject: bool) -> Scorer:
    """``model`` itself when already loaded (its own ``tta`` and rule), else :func:`load_scorer`."""
    if isinstance(model, Scorer):
        return model
    return load_scorer(model, device=device, tta=tta, reject=reject)


def predict(
    model: str | ModelRef | Scorer,
    images: list[str],
    *,
    k: int = 5,
    device: str = "cpu",
    tta: str = "none",
    reject: bool = True,
) -> list[Prediction]:
    """Top-``k`` labels of each image.

    Args:
        model: a model reference (see :func:`load_scorer`) or a loaded :class:`Scorer`.
        images: image files.
        k: labels per image.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        tta: test-time augmentation (a reference only; a loaded Scorer keeps its own).
        reject: apply the model's rejection rule (a reference only, as ``tta``).

    Returns:
        One :class:`Prediction` per image, in order.

    Raises:
        ModelRefError / UnknownModelError: the reference does not parse.
        InputError: an image is missing or unreadable.
        Everything :func:`zoo.create_model` or ``OnnxClassifier`` raises.
    """
    scorer = _scorer(model, device=device, tta=tta, reject=reject)
    if not images:
        return []
    return _predictions(scorer, images, [scorer.prepare(open_image(p)) for p in images], k)


def _predictions(scorer: Scorer, images: list[str], samples: list[Any], k: int) -> list[Prediction]:
    """The predictions of ``images``, prepared as ``samples``, in one model call."""
    if not images:
        return []
    a = scorer.scored(scorer.batch(samples))
    return [
        Prediction(img, scorer.top(row, k), v, scorer.decided(row))
        for img, row, v in zip(images, a.probs, scorer.verdicts(a), strict=True)
    ]


def predict_each(
    model: str | ModelRef | Scorer,
    images: list[str],
    *,
    k: int = 5,
    device: str = "cpu",
    tta: str = "none",
    reject: bool = True,
    strict: bool = False,
) -> list[Prediction | Unreadable]:
    """Like :func:`predict`, but an image that cannot be read does not stop the others: it
    gives an :class:`Unreadable` in its place (``zoo predict`` without ``--out``; the same
    policy as ``--out``'s errors file).

    Args:
        strict: stop at the first image that cannot be read instead (``--strict``).

    Returns:
        One :class:`Prediction` or :class:`Unreadable` per image, in order.

    Raises:
        InputError: ``strict`` and an image is missing or unreadable (its reason, and what
            ``--strict`` does).
        Everything :func:`load_scorer` raises.
    """
    scorer = _scorer(model, device=device, tta=tta, reject=reject)
    samples: list[tuple[str, Any]] = []
    failed: dict[int, Unreadable] = {}
    for i, path in enumerate(images):
        try:
            samples.append((path, scorer.prepare(open_image(path))))
        except (OSError, ValueError) as exc:  # InputError (missing, undecodable, a bomb) too
            reason = unreadable_reason(path, exc)
            if strict:
                raise InputError(
                    f"{reason} --strict stops at the first input that cannot be read: fix or "
                    f"remove {str(path)!r}, or drop --strict to have the others scored."
                ) from exc
            failed[i] = Unreadable(path, reason)
    scored = iter(_predictions(scorer, [p for p, _ in samples], [x for _, x in samples], k))
    return [failed[i] if i in failed else next(scored) for i in range(len(images))]
