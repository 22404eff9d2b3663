"""``zoo predict --out``'s options: :class:`PredictFileOptions`, the one place their defaults
and checks live (made before a model is loaded or a file written)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.deploy.choices import ENGINES, PredictEngine
from zoo.errors import InputError
from zoo.ref import ModelRef
from zoo.tta import Tta

if TYPE_CHECKING:
    from zoo.deploy.predict.scoring import Scorer


@dataclass(frozen=True)
class PredictFileOptions:
    """A ``--out`` job: what to score, into which file, and how; checked on construction.

    Args:
        model: a model reference (see :func:`zoo.deploy.predict.scoring.load_scorer`), or a
            loaded :class:`~zoo.deploy.predict.scoring.Scorer` (local engine only).
        inputs: image files, folders (recursive), globs and text files listing paths.
        out: ``.csv``, ``.jsonl`` or ``.parquet``: one row per scored image (``path``, then
            ``label_i``, ``index_i``, ``score_i`` for the ``top_k`` best classes; a
            multi-label model adds ``labels``, its decided classes joined by ``;``).
        top_k: classes per row (at most the model's number of classes).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        chunk_size: inputs per committed chunk (what a kill can cost; part of the job's
            identity: a resume needs the same value).
        batch_size: images per model call.
        workers: decoding threads (local; default: the CPUs available), or model replicas
            (Ray actors; default: the cluster's CPUs).
        strict: stop at the first input that cannot be scored instead of listing it.
        overwrite: replace an existing ``out`` and discard an interrupted job.
        embeddings: add ``embedding``, the penultimate-layer features as a list of float32
            (``.parquet`` or ``.jsonl`` only).
        engine: ``local`` (this process) or ``ray`` (Ray Data, see
            :mod:`zoo.deploy.predict.ray_engine`; the file is written here, in the same chunks).
        address: the Ray cluster to join (default: a local Ray started for the job).
        tta: test-time augmentation (:mod:`zoo.tta`; a model reference only).
        reject: apply the model's rejection rule, if it has one: a rejected image's row says
            ``label`` ``unknown`` (with ``accepted`` and the rule's ``score``; ``False``: every
            row its top-k only, ``zoo predict --no-reject``).

    Raises:
        InputError: ``out`` a folder or under a file, an unknown output extension or engine,
            embeddings into CSV, an option below 1, or a loaded Scorer with another engine,
            ``tta`` or embeddings it lacks.
    """

    model: str | ModelRef | Scorer
    inputs: Sequence[str]
    out: Path
    top_k: int = 5
    device: str = "cpu"
    chunk_size: int = 1024
    batch_size: int = 32
    workers: int | None = None
    strict: bool = False
    overwrite: bool = False
    embeddings: bool = False
    engine: PredictEngine = "local"
    address: str | None = None
    tta: Tta = "none"
    reject: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))  # a str is welcome too
        from zoo.deploy.predict.store import FORMATS, format_of  # csv: not at CLI start-up

        self._check_out_path(FORMATS)
        fmt = format_of(self.out)
        for name in ("top_k", "chunk_size", "batch_size"):
            value = getattr(self, name)
            if value < 1:
                raise InputError(f"{name} must be at least 1, got {value}.")
        if self.engine not in ENGINES:
            raise InputError(f"Unknown engine {self.engine!r}: use {' or '.join(ENGINES)}.")
        if self.embeddings and fmt == "csv":
            raise InputError(
                "Embeddings are a list of floats per row and CSV has no list type: name the "
                f"output {self.out.with_suffix('.parquet').name} or "
                f"{self.out.with_suffix('.jsonl').name}."
            )
        scorer = None if isinstance(self.model, (str, ModelRef)) else self.model
        if scorer is not None and (
            self.engine != "local"
            or self.tta != "none"
            or (self.embeddings and scorer.embed is None)
        ):
            raise InputError("Pass a model reference, not a loaded Scorer, for this engine/option.")

    def _check_out_path(self, formats: dict[str, str]) -> None:
        """Refuse an ``out`` that can never be written, before any work (else the job scores
        every image and fails at its last step): a folder, or a path under a file
        (:func:`zoo.durable.refuse_folder`, the one place for these messages)."""
        from zoo import durable

        suffix = self.out.suffix.lower()
        durable.refuse_folder(
            self.out,
            flag="--out",
            writes="zoo predict writes one .csv, .jsonl or .parquet file",
            name="predictions" + (suffix if suffix in formats else ".csv"),
        )


def option_defaults() -> dict[str, Any]:
    """Each option's default: ``zoo predict``'s options read theirs from here."""
    return {f.name: f.default for f in fields(PredictFileOptions) if f.default is not MISSING}
