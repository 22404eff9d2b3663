"""An index folder on disk (``zoo index MODEL DIR -o INDEX``): what it holds and how it is
written and read.

``INDEX/index.json`` says which model made the embeddings (:class:`ModelIdentity`), the image
folder they come from, their width and the shards; each ``INDEX/shard-NNNNN.safetensors``
holds up to :data:`SHARD_ROWS` L2-normalised float32 embeddings (tensor ``embeddings``) and,
in its metadata, the images' paths relative to the folder (``paths``, a JSON list): a shard is
self-contained, so a row never loses its path. :class:`IndexWriter` writes a shard as soon as
it fills (memory stays one shard whatever the number of images) into a hidden temporary
folder swapped in whole at the end (:func:`zoo.durable.replace_dir`): a kill leaves the old
index or the new one, never a half-written one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zoo import durable
from zoo.errors import ArtifactError, InputError
from zoo.ref import ModelRef

FORMAT = "zoo-index"
VERSION = 1
MANIFEST = "index.json"
SHARD_ROWS = 4096  # rows per shard: what indexing holds at once (4096 × 1280 floats: 20 MiB)
TENSOR = "embeddings"


def fresh_index_name(folder: Path) -> Path:
    """Where to suggest an index go instead of ``folder``, a folder of another kind: beside it
    (``runs/cnn`` → ``runs/cnn-index``; ``.`` and ``..`` resolved first)."""
    folder = folder if folder.name not in ("", "..") else folder.resolve()
    return folder.parent / f"{folder.name or 'root'}-index"


@dataclass(frozen=True)
class ModelIdentity:
    """Which model's embeddings an index holds.

    Attributes:
        ref: the model reference (a path reference as an absolute path), to load it again.
        digest: sha256 naming the weights: of the file itself for an ONNX file (for an
            OpenVINO IR, of its ``.xml`` and ``.bin``), of ``model.safetensors`` for a run or
            model folder (its ``config.json`` ``weights_sha256``, checked at every load), of the entry's pinned weights for a registry name, and of the name
            and revision for a Hub (``timm:``/``hf:``) reference.
    """

    ref: str
    digest: str

    @classmethod
    def of(cls, model: str | ModelRef) -> ModelIdentity:
        """The identity of ``model`` as it is on disk now.

        Raises:
            InputError: a registry entry without trained weights (random initialisation:
                its embeddings would differ at every load).
        """
        ref = ModelRef.parse(model)
        h = hashlib.sha256()
        if ref.kind == "openvino":
            for f in (ref.path, ref.path.with_suffix(".bin")):
                h.update(_file_sha(f).encode())
        elif ref.kind == "onnx":
            h.update(_file_sha(ref.path).encode())
        elif ref.kind in ("run", "model-folder"):  # the sha256 loading checks the file against
            from zoo.artifact import read_config

            h.update(str(read_config(ref.model_folder).weights_sha256).encode())
        elif ref.kind == "registry":
            from zoo.catalog import model_info

            w = model_info(ref.name).weights
            if w.kind == "none":
                raise InputError(
                    f"{ref.shown} has no trained weights (random initialisation): its "
                    "embeddings would differ at every load. Index with a run, a model folder "
                    "or an entry with pretrained weights."
                )
            h.update(json.dumps([ref.name, w.kind, w.sha256, w.hash_prefix, w.url]).encode())
        else:  # timm / hf: named, not hashed (their files live in the Hub's cache)
            h.update(f"{ref.kind}:{ref.name}@{ref.revision}".encode())
        text = str(ref.path.resolve()) if ref.is_path else str(ref)
        return cls(ref=text, digest=h.hexdigest())

    def to_dict(self) -> dict[str, str]:
        return {"ref": self.ref, "digest": self.digest}


def _file_sha(path: Path) -> str:
    from zoo.weights import sha256_file

    return sha256_file(path)


@dataclass(frozen=True)
class Shard:
    """One shard file and its row count."""

    file: str
    rows: int


@dataclass(frozen=True)
class IndexManifest:
    """``index.json``: everything about an index but its rows.

    Attributes:
        model: the model that made the embeddings.
        root: the indexed folder (absolute); the shards' paths are relative to it.
        dim: the embeddings' width.
        shards: the shard files, in row order.
        skipped: images that could not be read, ``{"path", "reason"}`` each.
    """

    model: ModelIdentity
    root: str
    dim: int
    shards: tuple[Shard, ...]
    skipped: tuple[dict[str, str], ...] = field(default=())

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model.to_dict(),
            "root": self.root,
            "dim": self.dim,
            "rows": self.rows,
            "normalized": True,
            "shards": [{"file": s.file, "rows": s.rows} for s in self.shards],
            "skipped": list(self.skipped),
        }

    @classmethod
    def read(cls, index: str | Path) -> IndexManifest:
        """Read ``INDEX/index.json`` and check every shard it names is there.

        Raises:
            InputError: ``index`` is not an index folder (no ``index.json``).
            ArtifactError: ``index.json`` is malformed, of another format or version, or a
                shard is missing.
        """
        folder = Path(index)
        path = folder / MANIFEST
        if not path.is_file():
            target = fresh_index_name(folder) if folder.exists() else folder
            raise InputError(
                f"{folder} is not a zoo index (no {MANIFEST}): build one with "
                f"`zoo index MODEL DIR -o {target}` and pass that."
            )
        try:
            d = json.loads(path.read_text())
            if d.get("format") != FORMAT or d.get("version") != VERSION:
                raise ValueError(f"format {d.get('format')!r} version {d.get('version')!r}")
            m = cls(
                model=ModelIdentity(ref=str(d["model"]["ref"]), digest=str(d["model"]["digest"])),
                root=str(d["root"]),
                dim=int(d["dim"]),
                shards=tuple(Shard(str(s["file"]), int(s["rows"])) for s in d["shards"]),
                skipped=tuple(d.get("skipped", ())),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(
                f"{path} is malformed ({exc}): rebuild the index with `zoo index`."
            ) from exc
        missing = [s.file for s in m.shards if not (folder / s.file).is_file()]
        if missing:
            raise ArtifactError(
                f"{folder} lacks {', '.join(missing)} that {MANIFEST} lists: the index is "
                "incomplete; rebuild it with `zoo index`."
            )
        return m


def read_shards(index: str | Path, m: IndexManifest) -> Iterator[tuple[list[str], np.ndarray]]:
    """Each shard's ``(paths, (rows, dim) float32 embeddings)``, in row order: one shard in
    memory at a time.

    Raises:
        ArtifactError: a shard disagrees with ``index.json`` (rows, width, paths).
    """
    from safetensors import SafetensorError, safe_open

    for s in m.shards:
        path = Path(index) / s.file
        try:
            with safe_open(str(path), framework="np") as f:
                emb = f.get_tensor(TENSOR)
                paths = json.loads((f.metadata() or {}).get("paths", "null"))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ArtifactError(f"{path} is unreadable ({exc}): rebuild the index.") from exc
        if emb.shape != (s.rows, m.dim) or not isinstance(paths, list) or len(paths) != s.rows:
            raise ArtifactError(
                f"{path} holds {emb.shape} embeddings and {len(paths or [])} paths where "
                f"{MANIFEST} says ({s.rows}, {m.dim}): rebuild the index."
            )
        yield paths, emb


def read_paths(index: str | Path, m: IndexManifest) -> list[str]:
    """Every row's path, in row order (the shards' metadata only, no embeddings).

    Raises:
        ArtifactError: a shard is torn or lacks its paths (as :func:`read_shards`).
    """
    from safetensors import SafetensorError, safe_open

    found: list[str] = []
    for s in m.shards:
        path = Path(index) / s.file
        try:
            with safe_open(str(path), framework="np") as f:
                paths = json.loads((f.metadata() or {})["paths"])
        except (SafetensorError, OSError, ValueError, KeyError) as exc:
            raise ArtifactError(f"{path} is unreadable ({exc!r}): rebuild the index.") from exc
        found.extend(paths)
    return found


class IndexWriter:
    """Write an index shard by shard into a hidden temporary folder; :meth:`publish` swaps it
    in as ``out`` (see the module docstring). Use as a context manager: leaving it without
    publishing removes the temporary folder."""

    def __init__(self, out: Path, model: ModelIdentity, root: Path) -> None:
        self.out, self.model, self.root = out, model, root
        out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = durable.temp_path(out, folder=True)
        self.shards: list[Shard] = []
        self.skipped: list[dict[str, str]] = []
        self.dim: int | None = None
        self._paths: list[str] = []
        self._rows: list[np.ndarray] = []

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)  # gone already once published

    def add(self, paths: list[str], embeddings: np.ndarray) -> None:
        """Append rows (already normalised); a full shard is written at once."""
        if self.dim is None:
            self.dim = int(embeddings.shape[1])
        self._paths.extend(paths)
        self._rows.append(embeddings)
        if len(self._paths) >= SHARD_ROWS:
            self._flush()

    def skip(self, path: str, reason: str) -> None:
        self.skipped.append({"path": path, "reason": reason})

    def _flush(self, *, final: bool = False) -> None:
        """Write every full shard held (``final``: the rest too); keep the remainder."""
        from safetensors.numpy import save

        if not self._paths:
            return
        rows = np.concatenate(self._rows)
        end = len(rows) if final else len(rows) - len(rows) % SHARD_ROWS
        for start in range(0, end, SHARD_ROWS):
            part, paths = rows[start : start + SHARD_ROWS], self._paths[start : start + SHARD_ROWS]
            name = f"shard-{len(self.shards):05d}.safetensors"
            data = save({TENSOR: np.ascontiguousarray(part)}, {"paths": json.dumps(paths)})
            durable.write_bytes(self.tmp / name, data, label=None)
            self.shards.append(Shard(name, len(part)))
        self._paths, self._rows = self._paths[end:], [rows[end:].copy()] if end < len(rows) else []

    def publish(self) -> IndexManifest:
        """Write the last shard and ``index.json``, then swap the folder in as ``out``.

        Raises:
            InputError: no row was added (no image could be read).
        """
        self._flush(final=True)
        if self.dim is None:
            reasons = "; ".join(f"{s['path']}: {s['reason']}" for s in self.skipped[:3])
            raise InputError(f"No image under {self.root} could be read ({reasons}).")
        m = IndexManifest(
            self.model, str(self.root), self.dim, tuple(self.shards), tuple(self.skipped)
        )
        durable.write_json(self.tmp / MANIFEST, m.to_dict(), label=None)
        durable.replace_dir(self.tmp, self.out, label=None)
        return m


__all__ = [
    "SHARD_ROWS",
    "IndexManifest",
    "IndexWriter",
    "ModelIdentity",
    "Shard",
    "read_paths",
    "read_shards",
]
