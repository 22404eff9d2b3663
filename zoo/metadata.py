"""Typed, frozen metadata for each registry entry (one entry = one architecture + weight tag)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from zoo.calibration import Calibration
from zoo.preprocessing import Preprocessing

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

SourceKind = Literal["none", "torchvision", "hub", "local"]


@dataclass(frozen=True)
class WeightSource:
    """Where an entry's weights come from, and the pin that proves they are the right ones.

    ``kind``:
      - ``none``: random initialisation (architectures without published weights);
      - ``torchvision``: ``url`` through torch hub's cache; ``sha256`` is the full hash where
        known, ``hash_prefix`` the part torchvision puts in the file name and checks itself;
      - ``hub``: Hugging Face Hub ``repo_id`` / ``filename`` at ``revision`` (``None``: the
        default branch, i.e. *not pinned*), checked against ``sha256`` when given;
      - ``local``: a zoo model folder at ``path``.
    """

    kind: SourceKind = "none"
    url: str | None = None
    repo_id: str | None = None
    filename: str | None = None
    revision: str | None = None
    path: str | None = None
    sha256: str | None = None
    hash_prefix: str | None = None

    @property
    def pinned(self) -> bool:
        """Whether the exact bytes are fixed (a hash, or a full Hub commit)."""
        if self.kind == "hub":
            return self.revision is not None and len(self.revision) == 40
        return self.kind != "none"

    def describe(self) -> str:
        """One line for humans: where the weights come from and what pins them."""
        if self.kind == "torchvision":
            pin = f"sha256 {self.sha256}" if self.sha256 else f"sha256 prefix {self.hash_prefix}"
            return f"torchvision {self.url} ({pin})"
        if self.kind == "hub":
            rev = self.revision or "main (revision not pinned)"
            return f"hf://{self.repo_id}/{self.filename} @ {rev}"
        if self.kind == "local":  # no path: a card inside the folder (zoo finetune's)
            return f"local folder {self.path}" if self.path else "this model folder's weights"
        return "random initialisation (no pretrained weights)"


@dataclass(frozen=True)
class ModelInfo:
    """Everything known about one registry entry without building it (static data: reading
    it never imports torch).

    ``gflops`` follows torchvision's convention: one multiply-accumulate counts as one FLOP,
    measured at ``input_size`` with batch 1 (ResNet-18: 1.81). ``input_size``, ``mean``,
    ``std``, ``interpolation`` and ``crop_pct`` make up :meth:`preprocessing`. ``classifier``
    names the head module that a different class count replaces; ``parent`` and ``lineage``
    say what a fine-tuned entry descends from. ``num_classes`` 0 marks a pretrained backbone
    whose weights hold no head for it (:attr:`headless`): it is built with a class count
    (``zoo finetune`` and ``zoo distill --student`` take it from the data).
    ``unused_weights`` names the module paths of the weights file that the architecture leaves
    out on purpose (a network cut short): loading skips them and reports them.
    """

    arch: str
    tag: str
    input_size: tuple[int, ...]
    num_classes: int
    params: int
    gflops: float
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bilinear"
    crop_pct: float = 0.875
    label_names: tuple[str, ...] | None = None
    license: str = "apache-2.0"
    paper: str | None = None
    source: str | None = None
    description: str = ""
    weights: WeightSource = field(default_factory=WeightSource)
    metrics: tuple[tuple[str, float], ...] = ()
    metrics_source: str | None = None
    classifier: str | None = None
    parent: str | None = None
    lineage: tuple[str, ...] = ()
    multi_label: bool = False
    thresholds: tuple[float, ...] | None = None  # multi-label: per-class sigmoid thresholds
    calibration: Calibration | None = None  # temperature and rejection (zoo/calibration.py)
    unused_weights: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.arch}.{self.tag}"

    @property
    def headless(self) -> bool:
        """A pretrained backbone without a head of its own (``num_classes`` 0)."""
        return self.num_classes == 0

    @property
    def cut_short(self) -> bool:
        """A network cut short of the one its weights file was trained as (``unused_weights``):
        its last blocks end in mid-level features (:func:`zoo.train.config.default_strategy`)."""
        return bool(self.unused_weights)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``zoo info --json``), with the weights' ``pinned`` and ``description``."""
        d = asdict(self)
        d["name"] = self.name
        d["label_names"] = list(self.label_names) if self.label_names else None
        d["metrics"] = dict(self.metrics)
        d["weights"]["pinned"] = self.weights.pinned
        d["weights"]["description"] = self.weights.describe()
        return d

    def preprocessing(self) -> Preprocessing:
        """The eval preprocessing of this entry (written into configs and ONNX metadata with
        :meth:`Preprocessing.to_dict`).

        Raises:
            ValueError: the entry's input is not an image ``(C, H, W)``.
        """
        return Preprocessing(
            input_size=self.input_size,  # type: ignore[arg-type]
            crop_pct=self.crop_pct,
            interpolation=self.interpolation,
            mean=self.mean,
            std=self.std,
        )

    def with_preprocessing(self, pre: Preprocessing) -> ModelInfo:
        """A copy whose input size, crop, interpolation and normalisation are ``pre``'s."""
        return replace(
            self,
            input_size=pre.input_size,
            crop_pct=pre.crop_pct,
            interpolation=pre.interpolation,
            mean=pre.mean,
            std=pre.std,
        )
