"""``zoo distill``: knowledge distillation (Hinton et al., 2015) with the trainer's own machinery.

A distillation run is a fine-tuning run of the student whose loss is :func:`kd_loss`: the
trainer resolves the teacher (:func:`resolve_teacher`, in ``resolve.py``), builds a
:class:`Distiller` beside the other parts (``build.py``), the loop asks it for each batch's loss
(``loop.py``) and the finishing step adds :meth:`Distiller.summary` to ``report.json``. Run
folder, resume, checkpoints, recipes, observers and report are the trainer's.

Where the teacher's logits come from is decided once, from the resolved augmentation: with
deterministic training views (``--no-augment`` and no recipe) the teacher judges each image
once, through its own eval transform, and the logits are kept on disk
(:mod:`zoo.train.teacher_cache`); with random augmentation the teacher must judge the view the
student trains on, so it runs on every batch (``online``), on the student's input mapped to the
teacher's normalisation, channels and size.

Two things follow the teacher when it is a run (a fine-tuned model folder): its split and its
rejection rule. A new run's split is lined up with the teacher's (:func:`line_up_split`): the
images the teacher trained on train, the ones it held out validate, so the student's val acc and
the teacher-vs-student table are measured on images neither learned. Its rejection rule
(``unknown`` below a score, :class:`~zoo.calibration.Rejection`) is refitted on the distilled
weights at the end: ``zoo distill`` asks for the same score and acceptance by default
(:func:`teacher_rejection`), and the run's finishing step fits it as ``zoo finetune --reject``
does; ``--qat`` included, whose weights move through int8 rounding.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.calibration import Rejection, score_kind
from zoo.errors import CheckpointError, DataError, InputError, some_of
from zoo.factory import create_model, info_of, require_weights, resolve, weight_source
from zoo.images import open_image
from zoo.preprocessing import Preprocessing
from zoo.registry import Entry
from zoo.run_images import SPLIT_FILE, find_run
from zoo.system import mib
from zoo.train.config import DistillConfig, TrainConfig
from zoo.train.console import say
from zoo.train.teacher_cache import store_path, teacher_logits
from zoo.transforms import eval_transform
from zoo.weights import fetch_weights, sha256_file

if TYPE_CHECKING:
    from zoo.metadata import ModelInfo
    from zoo.train.data import Splits

Teacher = tuple[Entry, Path | None]  # the teacher resolved: its entry (and model folder)


def kd_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    hard: torch.Tensor,
    *,
    temperature: float,
    alpha: float,
) -> torch.Tensor:
    """Hinton et al.'s distillation loss: ``α·T²·KL(softmax(t/T) ‖ softmax(s/T)) + (1 − α)·hard``.

    The T² keeps the soft term's gradients on the scale of the hard term's as T changes.

    Args:
        student: the student's logits ``(N, C)``.
        teacher: the teacher's logits ``(N, C)`` (no gradient flows into them).
        hard: the hard-label loss of the batch (the run's own: label smoothing, class weights
            and mixed targets included).
        temperature: T > 0; higher spreads the teacher's probabilities.
        alpha: the soft term's share in [0, 1]; 0 is the hard loss alone.

    Returns:
        The scalar loss.
    """
    t = temperature
    soft = F.kl_div(
        F.log_softmax(student / t, dim=1),
        F.log_softmax(teacher.detach().to(student.dtype) / t, dim=1),
        reduction="batchmean",
        log_target=True,
    )
    return alpha * t * t * soft + (1.0 - alpha) * hard


def random_views(cfg: TrainConfig) -> list[str]:
    """The options that make a training view random (the teacher must then see each one)."""
    named = {
        "--augment": cfg.augment,
        "--auto-augment": cfg.auto_augment,
        "--random-erasing": cfg.random_erasing,
        "--mixup": cfg.mixup,
        "--cutmix": cfg.cutmix,
    }
    return [k for k, v in named.items() if v]


def resolve_teacher(cfg: TrainConfig, splits: Splits) -> tuple[DistillConfig, Teacher]:
    """``cfg.distill`` checked and decided: the teacher resolved, its classes compared with the
    data's, its weights' sha256 recorded and where its logits come from (``cached`` or
    ``online``) chosen from the resolved augmentation. A new run's ``splits`` are lined up
    with the teacher run's, in place (:func:`line_up_split`; the caller writes them to the
    run's ``split.json``), and what becomes of the teacher's rejection rule is said.

    Raises:
        InputError: T or α out of range, ``--multi-label`` or ``--cache-features``, the teacher's
            classes are not the data's, or ``cached`` logits asked with random training views.
        DataError: every image of the data was in the teacher's training split (none is left
            to validate on), or the teacher run's ``split.json`` cannot be read.
        CheckpointError: a resumed run whose teacher's weights changed since it started.
        UnknownModelError / ModelRefError / ArtifactError / weights errors: the teacher does
            not resolve or its weights are unavailable.
    """
    d = cfg.distill
    assert d is not None
    if not d.temperature > 0 or not 0 <= d.alpha <= 1:
        raise InputError(
            f"Distillation needs a temperature above 0 and alpha in [0, 1]; got "
            f"-T {d.temperature:g}, --alpha {d.alpha:g}."
        )
    if cfg.multi_label or cfg.cache_features:
        raise InputError(
            "zoo distill trains a single-label student on images: drop "
            f"{'--multi-label' if cfg.multi_label else '--cache-features'}."
        )
    teacher = resolve(d.teacher)
    info = teacher[0].info
    _refuse_headless(d.teacher, info)
    source = weight_source(info, None)
    require_weights(source)
    # a resumed run's teacher first: changed weights may have changed its classes too
    digest = teacher_digest(teacher)
    if d.teacher_sha256 is not None and d.teacher_sha256 != digest:
        raise CheckpointError(
            f"The teacher {d.teacher} has other weights than when this run started "
            f"(sha256 {d.teacher_sha256[:12]}…, now {digest[:12]}…): resuming would mix two "
            "teachers. Restore the teacher or start a new run."
        )
    theirs = list(info.label_names or ())
    if theirs != splits.classes and splits.layout != "teacher":  # teacher-labelled: its own
        missing = sorted(set(splits.classes) - set(theirs))
        extra = sorted(set(theirs) - set(splits.classes))
        why = (
            f"the data has {len(splits.classes)} classes, the teacher {info.num_classes}"
            + (f"; not in the teacher: {some_of(missing)}" if missing else "")
            + (f"; not in the data: {some_of(extra)}" if extra else "")
            + ("; the same names in another order" if not missing and not extra else "")
        )
        raise InputError(
            f"The teacher {d.teacher} was not trained on the classes of {splits.root} ({why}). "
            "A student learns the teacher's classes: distill from a teacher fine-tuned on this "
            "data (zoo finetune ARCH --data DIR, then zoo distill RUN ...), or add --unlabelled "
            "to label the images with the teacher's own answers."
        )
    if d.qat and (cfg.model != d.teacher or cfg.weights is not None):
        raise InputError(
            "--qat trains the teacher's own weights through int8 rounding: drop --student "
            f"{cfg.model}"
            + (f" and --weights {cfg.weights}" if cfg.weights is not None else "")
            + " (the student is the teacher)."
        )
    random = random_views(cfg)
    if d.logits == "cached" and random:
        raise InputError(
            f"--teacher-logits cached: the training views are random ({', '.join(random)}), "
            "and the teacher must judge the view the student trains on. Use --teacher-logits "
            "online (or auto), or --no-augment without the recipes."
        )
    logits = d.logits if d.logits != "auto" else ("online" if random else "cached")
    why = (
        f"random training views ({', '.join(random)}): the teacher judges each one"
        if random and logits == "online"
        else "deterministic training views: computed once per image"
        if logits == "cached"
        else "asked"
    )
    say(
        f"{d.kind}: teacher {d.teacher} ({info.params / 1e6:.2f} M params), T {d.temperature:g}, "
        f"alpha {d.alpha:g}; teacher logits {logits} ({why})"
        + ("; labels: the teacher's top-1 answers (--unlabelled)" if d.unlabelled else "")
    )
    run = teacher_run(teacher)
    if run is not None and not cfg.resume:  # a resumed run keeps the split.json it started with
        line_up_split(splits, run, d.kind)
    say_rejection(cfg, info.calibration.reject if info.calibration is not None else None)
    return replace(d, logits=logits, teacher_sha256=digest), teacher


def teacher_rejection(teacher: str) -> Rejection | None:
    """The rejection rule the teacher ships (``unknown`` below a score; None: it has none, as a
    registry entry): ``zoo distill``'s default ``--reject`` and ``--acceptance`` are its
    score and acceptance, refitted on the distilled weights at the end of the run.

    Raises:
        UnknownModelError / ModelRefError / ArtifactError: the teacher does not resolve.
    """
    calibration = resolve(teacher)[0].info.calibration
    return calibration.reject if calibration is not None else None


def say_rejection(cfg: TrainConfig, theirs: Rejection | None) -> None:
    """Say, at the start, what the run's model will do about images from outside the classes
    where the teacher answers ``unknown`` for them: the same rule refitted, another one, or
    none (a warning)."""
    d = cfg.distill
    if theirs is None or d is None:
        return
    rule = (
        f"'unknown' below {theirs.score} {theirs.threshold:.4g}, accepting "
        f"{theirs.acceptance:.0%} of its validation images"
    )
    ours = score_kind(cfg.reject)
    if not ours:
        say(
            f"warning: the teacher answers {rule}, but this run fits no rejection rule "
            "(--reject off): its model will answer every image with one of the classes. Drop "
            "--reject off to refit the teacher's rule on this run, or fit one afterwards: "
            f"zoo calibrate RUN --reject {theirs.score}"
        )
    elif (ours, cfg.acceptance) == (theirs.score, theirs.acceptance):
        say(
            f"{d.kind}: refits the teacher's rejection rule ({ours}, accepting "
            f"{cfg.acceptance:.0%} of the validation images) on this run's weights at the end; "
            f"the teacher's: {rule} (--reject off: none)"
        )
    else:
        say(
            f"{d.kind}: fits the rejection rule asked ({ours}, accepting {cfg.acceptance:.0%} "
            f"of the validation images) at the end; the teacher's: {rule}"
        )


def teacher_run(teacher: Teacher) -> Path | None:
    """The run the teacher's model folder belongs to (None: a registry entry, or a model
    folder of no run)."""
    folder = teacher[1]
    return find_run(folder) if folder is not None else None


def real_paths(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Each path with its symlinks resolved (folders resolved once each; a file only where it
    is a link itself): the identity of an image whichever folder names it."""
    folders: dict[str, str] = {}
    out = []
    for p in paths:
        head, name = os.path.split(os.fspath(p))
        real = folders.get(head)
        if real is None:
            real = folders[head] = os.path.realpath(head)
        path = os.path.join(real, name)
        out.append(os.path.realpath(path) if os.path.islink(path) else path)
    return out


def teacher_split(run: Path) -> dict[str, set[str]]:
    """The teacher run's images by split (``train``, ``val``, any ``test``), as
    :func:`real_paths`, from its ``split.json``.

    Raises:
        DataError: the file cannot be read.
    """
    where = run / SPLIT_FILE
    try:
        doc = json.loads(where.read_text())
        root = Path(doc["root"])
        return {
            split: set(real_paths(root / rel for rel, _ in found))
            for split, found in doc["splits"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"The teacher run's {where} cannot be read ({e}): it names the images the teacher "
            "trained on, which the distillation keeps out of its validation split. Restore the "
            "file (a copy of the teacher run, or the teacher fine-tuned again)."
        ) from e


def line_up_split(splits: Splits, run: Path, kind: str = "distill") -> None:
    """Line ``splits`` up with the teacher run's, in place: an image the teacher trained on
    goes to ``train``, one it held out (its ``val`` or ``test``) leaves ``train`` for ``val``;
    images it never saw keep their seeded split. So no validation image of the run was in the
    teacher's training split, and the teacher's validation images stay validation images.

    Raises:
        DataError: no validation image left (the teacher trained on every image of the data),
            or the teacher's ``split.json`` cannot be read.
    """
    theirs = teacher_split(run)
    trained = theirs.get("train", set())
    held = set().union(*(found for split, found in theirs.items() if split != "train"))
    placed: dict[str, list[tuple[int, tuple[str, str]]]] = {"train": [], "val": []}
    placed.update({split: [] for split in splits.files})
    moved = {"train": 0, "val": 0}  # into train (the teacher trained on it), into val (held out)
    shared = position = 0
    for split, found in splits.files.items():
        reals = real_paths(splits.root / rel for rel, _ in found)
        for row, real in zip(found, reals, strict=True):
            to = split
            if real in trained:
                to = "train"
            elif real in held and split == "train":
                to = "val"
            shared += real in trained or real in held
            if to != split:
                moved[to] += 1
            placed[to].append((position, row))
            position += 1
    total = position
    where = f"run {run.name}"
    if not shared:
        say(
            f"{kind}: none of the {total} images of {splits.root} is in the teacher's split "
            f"({where}, {run / SPLIT_FILE}): this run's own seeded split stands (copies of the "
            "teacher's images under another path are not recognised)"
        )
        return
    if not placed["val"]:
        raise DataError(
            f"The teacher ({where}) trained on every image of {splits.root}, so none is left "
            "for validation: the val acc would be measured on images the teacher learned. Give "
            "--data the folder the teacher was trained on (its validation images were held "
            "out; the teacher run's split.json names them), or add images it has not seen."
        )
    if moved["train"] or moved["val"]:
        splits.files = {split: [row for _, row in sorted(rows)] for split, rows in placed.items()}
    said = (
        f"{moved['train']} it trained on moved out of validation, {moved['val']} it held out "
        "moved out of training"
        if moved["train"] or moved["val"]
        else "none had to move"
    )
    say(
        f"{kind}: split lined up with the teacher's ({where}): {shared} of the {total} images "
        f"are in its split and take the side it gave them ({said}); validation: "
        f"{len(splits.files['val'])} images, none in the teacher's training split"
    )


def teacher_digest(teacher: Teacher) -> str:
    """The sha256 of the teacher's weights file: what its cached logits and a resume key on."""
    entry, folder = teacher
    if folder is not None:
        return sha256_file(folder / "model.safetensors")
    return sha256_file(fetch_weights(weight_source(entry.info, None)))


def load_teacher(
    d: DistillConfig, teacher: Teacher, device: torch.device
) -> tuple[nn.Module, Preprocessing]:
    """The teacher in eval mode, without gradients, on ``device``, and its eval preprocessing."""
    model = create_model(str(teacher[1] or d.teacher)).to(device).eval()
    model.requires_grad_(False)
    return model, info_of(model).preprocessing()


def cached_teacher_logits(
    model: nn.Module, pre: Preprocessing, digest: str, paths: list[Path], device: torch.device
) -> torch.Tensor:
    """The teacher's logits of ``paths`` through its eval transform, read from (and added to)
    its cache (:mod:`zoo.train.teacher_cache`), in order."""
    t0 = time.perf_counter()
    transform = eval_transform(pre)

    def compute(batch: list[Path]) -> torch.Tensor:
        x = torch.stack([transform(open_image(p)) for p in batch]).to(device)
        with torch.inference_mode():
            return model(x)

    store = store_path(digest, pre)
    logits, computed = teacher_logits(paths, store, compute)
    say(
        f"distill: teacher logits of {len(paths)} images ready in "
        f"{time.perf_counter() - t0:.1f}s ({computed} computed now, the rest read from {store})"
    )
    return logits


def _refuse_headless(name: str, info: ModelInfo) -> None:
    """A teacher must have a head: a headless backbone (:attr:`ModelInfo.headless`) has no
    answers to teach.

    Raises:
        InputError: ``info`` is headless; the message says to fine-tune it first.
    """
    if info.headless:
        raise InputError(
            f"The teacher {name} is a backbone without a head: it has no answers to teach. "
            f"Fine-tune it first (zoo finetune {name} --data DIR), then distil from that run."
        )


def label_by_teacher(cfg: TrainConfig) -> Splits:
    """A new ``--unlabelled`` run's splits: the images of ``cfg.data``, in any layout
    (:func:`zoo.train.data.scan_unlabelled`), each labelled with the teacher's top-1 answer
    through its eval transform. So the run's ``val/acc`` is the student's agreement with the
    teacher, and the labels are fixed in the run's ``split.json`` (a resume reads them back).
    The logits stay in the teacher cache, where cached-logit training reads them again.

    Raises:
        DataError: no images for a split, or one that does not decode (it could not be labelled).
        InputError: a teacher that names no classes.
    """
    from zoo.device import pick_device
    from zoo.train.data import Splits, scan_unlabelled

    d = cfg.distill
    assert d is not None and d.unlabelled
    root, rels = scan_unlabelled(cfg.data, val_fraction=cfg.val_fraction, seed=cfg.seed)
    teacher = resolve(d.teacher)
    _refuse_headless(d.teacher, teacher[0].info)
    require_weights(weight_source(teacher[0].info, None))
    names = list(teacher[0].info.label_names or ())
    if not names:
        raise InputError(
            f"--unlabelled takes its labels from the teacher's answers, but {d.teacher} names "
            "no classes: give a classifier as the teacher."
        )
    device = pick_device(cfg.device)
    model, pre = load_teacher(d, teacher, device)
    paths = [root / rel for split in rels.values() for rel in split]
    try:
        top1 = iter(
            cached_teacher_logits(model, pre, teacher_digest(teacher), paths, device)
            .argmax(1)
            .tolist()
        )
    except InputError as e:  # an image that does not decode: named by open_image
        raise DataError(
            f"{e} --unlabelled labels every image before training: remove or replace it."
        ) from e
    files = {split: [(rel, names[next(top1)]) for rel in found] for split, found in rels.items()}
    used = {c for found in files.values() for _, c in found}
    say(
        f"distill: {len(paths)} unlabelled images labelled by the teacher's top-1 answers "
        f"({len(used)} of its {len(names)} classes); val acc is agreement with the teacher"
    )
    return Splits(
        root, names, files, layout="teacher", val_fraction=cfg.val_fraction, seed=cfg.seed
    )


def view_adapter(student: Preprocessing, teacher: Preprocessing) -> Callable[[Any], Any]:
    """Map a batch as the student sees it (normalised, its size and channels) to the same
    pixels as the teacher expects them; the identity when both preprocess alike."""
    same = (student.mean, student.std, student.input_size) == (
        teacher.mean,
        teacher.std,
        teacher.input_size,
    )
    if same:
        return lambda x: x

    def stats(values: Sequence[float], channels: int) -> torch.Tensor:
        t = torch.tensor(list(values), dtype=torch.float32).view(1, -1, 1, 1)
        return t.expand(1, channels, 1, 1) if t.shape[1] == 1 else t

    ms, ss = stats(student.mean, student.channels), stats(student.std, student.channels)
    mt, st = stats(teacher.mean, teacher.channels), stats(teacher.std, teacher.channels)
    size = (teacher.crop_size, teacher.crop_size)

    def adapt(x: torch.Tensor) -> torch.Tensor:
        x = x.float() * ss.to(x.device) + ms.to(x.device)  # back to [0, 1] pixels
        if x.shape[1] != teacher.channels:  # grey ↔ colour, as to_channels converts images
            x = x.mean(1, keepdim=True) if teacher.channels == 1 else x.expand(-1, 3, -1, -1)
        if tuple(x.shape[-2:]) != size:
            x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
        return (x - mt.to(x.device)) / st.to(x.device)

    return adapt


def say_views(student: Preprocessing, teacher: Preprocessing) -> None:
    """Say how the teacher judges the student's smaller training views: each random view is
    rendered at the teacher's crop size, and the student trains on it scaled down to its own
    (:meth:`Distiller.student_view`); upsampling the student's view instead costs the
    teacher answers (the bench's ``teacher_on_views``)."""
    say(
        f"distill: training views rendered at the teacher's {teacher.crop_size} px: the teacher "
        f"judges each at its own size, the student sees it scaled down to "
        f"{student.crop_size} px"
    )


@dataclass
class Distiller:
    """The teacher beside a run's parts: its logits for each training batch, the batch's
    :func:`kd_loss`, and the teacher-vs-student summary at the end."""

    cfg: DistillConfig
    teacher: nn.Module  # eval mode, no gradients, on the run's device
    pre: Preprocessing  # the teacher's eval preprocessing
    adapt: Callable[[torch.Tensor], torch.Tensor]  # a training batch → the teacher's input
    cached: torch.Tensor | None  # (train images, classes) by training index; None: online
    teacher_run: Path | None = None  # the run the teacher comes from (its split.json)
    # online with a teacher of larger input: batches come at the teacher's crop size and the
    # student sees them scaled down to its own (this, its preprocessing); None: batches are
    # the student's own size
    student: Preprocessing | None = None

    @classmethod
    def build(
        cls,
        d: DistillConfig,
        teacher: Teacher,
        train: Sequence[tuple[Path, Any]],
        student: Preprocessing,
        device: torch.device,
    ) -> Distiller:
        """Load the teacher and, for ``cached`` logits, compute (or read) them for every
        training image ``train`` holds, in its order (the training set's indices)."""
        model, pre = load_teacher(d, teacher, device)
        cached = None
        if d.logits == "cached":
            assert d.teacher_sha256 is not None
            paths = [p for p, _ in train]
            cached = cached_teacher_logits(model, pre, d.teacher_sha256, paths, device)
        scaled = cached is None and student.crop_size < pre.crop_size
        if scaled:
            say_views(student, pre)
        adapt = view_adapter(student.at_size(pre.crop_size) if scaled else student, pre)
        own = student if scaled else None
        return cls(d, model, pre, adapt, cached, teacher_run(teacher), student=own)

    def views(self, student: Preprocessing) -> Preprocessing:
        """The preprocessing the training views are rendered with: the student's, at the
        teacher's crop size when the student sees them scaled down (``self.student``)."""
        return student if self.student is None else student.at_size(self.pre.crop_size)

    def student_view(self, x: torch.Tensor) -> torch.Tensor:
        """A training batch (normalised, after any recipe) as the student sees it: scaled down
        to its crop with its own filter (antialiased, as PIL resizes its eval view; bicubic
        clamped to the pixel range) when the views come at the teacher's size, else ``x``."""
        s = self.student
        if s is None:
            return x
        mode = s.interpolation if s.interpolation in ("bilinear", "bicubic") else "bilinear"
        side = (s.crop_size, s.crop_size)
        y = F.interpolate(x, size=side, mode=mode, antialias=True, align_corners=False)
        if mode == "bicubic":  # overshoot past black or white, which uint8 pixels cannot hold
            mean = torch.tensor(s.mean, device=y.device).view(1, -1, 1, 1)
            std = torch.tensor(s.std, device=y.device).view(1, -1, 1, 1)
            y = torch.maximum(torch.minimum(y, (1 - mean) / std), -mean / std)
        return y

    def teacher_logits(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The teacher's logits of a training batch: ``x`` (the batch as rendered, after any
        recipe) or, cached, the rows of the batch's image indices ``idx``."""
        if self.cached is not None:
            return self.cached[idx.cpu()].to(x.device, non_blocking=True)
        with torch.no_grad():
            return self.teacher(self.adapt(x)).float()

    def loss(
        self, logits: torch.Tensor, hard: torch.Tensor, x: torch.Tensor, idx: torch.Tensor
    ) -> torch.Tensor:
        """The batch's :func:`kd_loss` (``hard``: the run's own loss of it)."""
        return kd_loss(
            logits,
            self.teacher_logits(x, idx),
            hard,
            temperature=self.cfg.temperature,
            alpha=self.cfg.alpha,
        )

    def summary(
        self, student: nn.Module, student_acc: float, val: Sequence[tuple[Path, Any]], model: str
    ) -> DistillSummary:
        """Teacher and student side by side on the run's validation images (each through its
        own eval transform)."""
        transform = eval_transform(self.pre)
        device = next(self.teacher.parameters()).device
        correct = 0
        with torch.inference_mode():
            for start in range(0, len(val), 256):
                chunk = val[start : start + 256]
                x = torch.stack([transform(open_image(p)) for p, _ in chunk]).to(device)
                pred = self.teacher(x).argmax(1).cpu()
                correct += int((pred == torch.tensor([int(y) for _, y in chunk])).sum())
        seen = None  # how many of the validation images the teacher trained on (None: unknown)
        if self.teacher_run is not None:
            try:
                trained = teacher_split(self.teacher_run).get("train", set())
            except DataError:  # gone since the start: the count is unknown, not a failed run
                trained = None
            if trained is not None:
                seen = sum(p in trained for p in real_paths(p for p, _ in val))
        return DistillSummary(
            teacher=ModelSide.of(self.cfg.teacher, self.teacher, correct / max(1, len(val))),
            student=ModelSide.of(model, student, student_acc),
            temperature=self.cfg.temperature,
            alpha=self.cfg.alpha,
            logits=self.cfg.logits,
            val_images=len(val),
            qat=self.cfg.qat,
            unlabelled=self.cfg.unlabelled,
            teacher_split=str(self.teacher_run) if self.teacher_run is not None else None,
            val_seen_by_teacher=seen,
        )


@dataclass(frozen=True)
class ModelSide:
    """One column of the summary: a model's validation accuracy and size."""

    model: str
    val_acc: float
    params: int
    weights_mb: float  # fp32 state dict

    @classmethod
    def of(cls, name: str, module: nn.Module, acc: float) -> ModelSide:
        tensors = module.state_dict().values()
        return cls(
            model=name,
            val_acc=round(acc, 6),
            params=sum(p.numel() for p in module.parameters()),
            weights_mb=mib(sum(t.numel() * 4 for t in tensors)),
        )


@dataclass(frozen=True)
class DistillSummary:
    """``report.json``'s ``distill``: teacher vs student, and how the student learned."""

    teacher: ModelSide
    student: ModelSide
    temperature: float
    alpha: float
    logits: str
    val_images: int
    qat: bool = False  # the student's accuracy is through int8 rounding (--qat)
    unlabelled: bool = False  # the labels are the teacher's answers: val acc is agreement
    teacher_split: str | None = None  # the teacher run whose split.json the split lines up with
    val_seen_by_teacher: int | None = None  # validation images in its training split (None: ?)

    def to_dict(self) -> dict[str, Any]:
        return {
            "qat": self.qat,
            "labels": "teacher" if self.unlabelled else "data",
            "teacher": vars(self.teacher),
            "student": vars(self.student),
            "temperature": self.temperature,
            "alpha": self.alpha,
            "teacher_logits": self.logits,
            "val_images": self.val_images,
            "teacher_split": self.teacher_split,
            "val_seen_by_teacher": self.val_seen_by_teacher,
            "latency": "not measured here: zoo export each model, then zoo bench (ONNX Runtime)",
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DistillSummary:
        return cls(
            teacher=ModelSide(**d["teacher"]),
            student=ModelSide(**d["student"]),
            temperature=d["temperature"],
            alpha=d["alpha"],
            logits=d["teacher_logits"],
            val_images=d["val_images"],
            qat=d.get("qat", False),
            unlabelled=d.get("labels") == "teacher",
            teacher_split=d.get("teacher_split"),
            val_seen_by_teacher=d.get("val_seen_by_teacher"),
        )

    def lines(self) -> list[str]:
        """The side-by-side table, for stderr."""
        t, s = self.teacher, self.student
        names = [Path(m).name if "/" in m else m for m in (t.model, s.model)]  # a run: its name
        width = max(*map(len, names), 7)
        seen = self.val_seen_by_teacher
        among = (
            ""
            if seen is None
            else ", none in the teacher's training split"
            if seen == 0
            else f", {seen} in the teacher's training split"
        )
        return [
            f"{'':9}{'teacher':>{width}}  {'student':>{width}}",
            f"{'model':9}{names[0]:>{width}}  {names[1]:>{width}}",
            f"{'val acc':9}{t.val_acc:>{width}.4f}  {s.val_acc:>{width}.4f}"
            f"   ({self.val_images} validation images{among}"
            + (", labelled by the teacher: acc is agreement with it)" if self.unlabelled else ")"),
            f"{'params':9}{t.params:>{width},}  {s.params:>{width},}"
            f"   (student {s.params / max(1, t.params):.2f}× the teacher)",
            f"{'fp32 MiB':9}{t.weights_mb:>{width}}  {s.weights_mb:>{width}}",
            f"distilled at T {self.temperature:g}, alpha {self.alpha:g}, teacher logits "
            f"{self.logits}; latency: zoo export each, then zoo bench",
        ] + (
            [
                "qat: the student's val acc is through int8 rounding (fp32 weights in the run); "
                "int8: zoo export RUN, then zoo quantize RUN/model/model.onnx --engine ort"
            ]
            if self.qat
            else []
        )


__all__ = [
    "DistillSummary",
    "Distiller",
    "ModelSide",
    "Teacher",
    "kd_loss",
    "label_by_teacher",
    "line_up_split",
    "random_views",
    "real_paths",
    "resolve_teacher",
    "say_rejection",
    "say_views",
    "teacher_rejection",
    "teacher_run",
    "teacher_split",
    "view_adapter",
]
