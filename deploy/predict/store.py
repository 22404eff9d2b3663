"""Where ``zoo predict --out FILE`` keeps its results while it runs, and how it finishes.

Chunks of results are committed into a sidecar folder ``FILE.parts/``::

    manifest.json           the model, inputs and options of the job (a resume must match)
    part-00000.<ext>        the rows of chunk 0, in the output's format
    part-00000.json         its commit marker: inputs, their digest, rows, errors

Every file is written atomically (:mod:`zoo.durable`: temporary file, fsync, rename) and a
chunk counts only once its marker exists, so a kill at any moment leaves whole chunks. At the
end the parts are merged into ``FILE`` (one atomic write; the errors, if any, into
``FILE.errors.jsonl`` just before) and the sidecar is removed. A restart reads the markers,
skips the inputs they cover and goes on; the output holds each input exactly once.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from zoo import durable
from zoo.errors import InputError

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
MANIFEST_VERSION = 1


def format_of(out: Path) -> str:
    """``csv``, ``jsonl`` or ``parquet`` from the output's extension.

    Raises:
        InputError: another extension.
    """
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise InputError(
            f"Output {str(out)!r} has an unknown extension: name it .csv, .jsonl or .parquet."
        )
    return fmt


def digest(paths: Sequence[str]) -> str:
    """A chunk's inputs in one short value (a resumed job checks it meets the same ones)."""
    return hashlib.sha256("\n".join(paths).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def columns(
    k: int, multi_label: bool, embeddings: bool = False, judged: bool = False
) -> list[tuple[str, str]]:
    """The output's columns and their types (``str``, ``int``, ``float``, ``bool``, ``floats``:
    a list of float32, the penultimate features). ``judged`` (a model with a rejection rule)
    adds ``label`` (the answer: the best class, or ``unknown``), ``accepted`` and ``score``
    (the rule's score of the image)."""
    cols = [("path", "str")]
    for i in range(1, k + 1):
        cols += [(f"label_{i}", "str"), (f"index_{i}", "int"), (f"score_{i}", "float")]
    if multi_label:
        cols.append(("labels", "str"))
    if judged:
        cols += [("label", "str"), ("accepted", "bool"), ("score", "float")]
    return [*cols, ("embedding", "floats")] if embeddings else cols


def _schema(cols: list[tuple[str, str]]) -> Any:
    import pyarrow as pa

    types = {
        "str": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "floats": pa.list_(pa.float32()),
    }
    return pa.schema([(name, types[t]) for name, t in cols])


def _write_rows(f: IO[bytes], fmt: str, cols: list[tuple[str, str]], rows: list[dict]) -> None:
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows, schema=_schema(cols)), f)
    elif fmt == "jsonl":
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    else:  # csv: the header is written once, by the merge
        text = io.StringIO(newline="")
        w = csv.writer(text)
        w.writerows([[r[name] for name, _ in cols] for r in rows])
        f.write(text.getvalue().encode())


class ChunkStore:
    """The sidecar folder of one ``--out`` file.

    Args:
        out: the output file.
        cols: its columns (:func:`columns`).
    """

    def __init__(self, out: Path, cols: list[tuple[str, str]]) -> None:
        self.out = out
        self.fmt = format_of(out)
        self.cols = cols
        self.parts = out.with_name(out.name + ".parts")
        self.errors_file = out.with_name(out.name + ".errors.jsonl")

    def _part(self, i: int, ext: str) -> Path:
        return self.parts / f"part-{i:05d}.{ext}"

    def open(self, manifest: dict[str, Any], *, overwrite: bool) -> list[dict[str, Any]]:
        """Start the job, or find where an interrupted one stopped.

        Args:
            manifest: the job's model, inputs and options (JSON values).
            overwrite: discard an existing output and an interrupted job's chunks.

        Returns:
            The committed chunks' markers, in order (empty for a fresh job).

        Raises:
            InputError: ``out`` exists (without ``overwrite``), or the sidecar holds a job
                with another manifest.
        """
        pattern = glob.escape(f".{self.out.name}.") + "*" + durable.TMP_SUFFIX
        for stale in self.out.parent.glob(pattern):  # temporaries of a killed finish
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
        manifest = {"version": MANIFEST_VERSION, **manifest}
        if overwrite:  # the old output stays readable until the new one replaces it
            shutil.rmtree(self.parts, ignore_errors=True)
        old = self._read_manifest()
        if old is None:
            if self.out.exists() and not overwrite:
                raise InputError(
                    f"{self.out} already exists: add --overwrite to replace it, or choose "
                    "another --out."
                )
            if not self.out.exists():
                self.errors_file.unlink(missing_ok=True)  # left beside a removed output
            self.parts.mkdir(parents=True, exist_ok=True)
            durable.write_json(self.parts / "manifest.json", manifest, label="manifest.json")
            return []
        if old != manifest:
            diff = "; ".join(
                f"{key}: {old.get(key)!r} then, {manifest.get(key)!r} now"
                for key in sorted(set(old) | set(manifest))
                if old.get(key) != manifest.get(key)
            )
            raise InputError(
                f"{self.parts} holds an interrupted job with other settings ({diff}): rerun "
                "the same command to resume it, or add --overwrite to start over."
            )
        durable.remove_stale_temps(self.parts)
        committed: list[dict[str, Any]] = []
        while (marker := self._part(len(committed), "json")).exists():
            committed.append(json.loads(marker.read_text()))
        return committed

    def _read_manifest(self) -> dict[str, Any] | None:
        path = self.parts / "manifest.json"
        if not path.exists():  # no sidecar, or killed before its first write
            return None
        return dict(json.loads(path.read_text()))

    def commit(
        self, i: int, paths: Sequence[str], rows: list[dict], errors: list[dict[str, str]]
    ) -> None:
        """Write chunk ``i`` (its rows, then its marker: the chunk counts from then on).

        Args:
            i: the chunk's number (0, 1, ...).
            paths: every input of the chunk, in order (scored or not).
            rows: one row per scored input.
            errors: ``{"path", "reason"}`` per input that could not be scored.
        """
        name = self._part(i, self.fmt).name
        durable.write_with(
            self.parts / name, lambda f: _write_rows(f, self.fmt, self.cols, rows), label=name
        )
        marker = {"inputs": len(paths), "digest": digest(paths), "rows": len(rows)}
        durable.write_json(self._part(i, "json"), {**marker, "errors": errors}, label=f"{i}.json")

    def finish(self, n_chunks: int) -> int:
        """Merge the ``n_chunks`` committed chunks into the output, write the errors file, and
        remove the sidecar.

        Returns:
            How many errors the errors file lists.
        """
        markers = [self._part(i, "json") for i in range(n_chunks)]
        n_errors = sum(len(json.loads(m.read_text())["errors"]) for m in markers)
        if n_errors:

            def fill(f: IO[bytes]) -> None:  # one chunk's errors in memory at a time
                for m in markers:
                    f.write(
                        "".join(
                            json.dumps(e) + "\n" for e in json.loads(m.read_text())["errors"]
                        ).encode()
                    )

            durable.write_with(self.errors_file, fill, label=self.errors_file.name)
        else:  # an overwritten job's
            durable.remove(self.errors_file, label=self.errors_file.name)
        durable.write_with(self.out, lambda f: self._merge(f, n_chunks), label=self.out.name)
        trash = durable.temp_path(self.parts, folder=True)
        os.replace(self.parts, trash)  # one step: a kill leaves the sidecar whole or gone
        shutil.rmtree(trash, ignore_errors=True)
        return n_errors

    def _merge(self, f: IO[bytes], n_chunks: int) -> None:
        parts = [self._part(i, self.fmt) for i in range(n_chunks)]
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            with pq.ParquetWriter(f, _schema(self.cols)) as writer:
                for p in parts:  # one part in memory at a time
                    writer.write_table(pq.read_table(p))
            return
        if self.fmt == "csv":
            f.write((",".join(name for name, _ in self.cols) + "\r\n").encode())
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)


__all__ = ["FORMATS", "ChunkStore", "columns", "digest", "format_of"]
