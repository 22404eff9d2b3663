"""Pre-seed a Hugging Face cache in the real layout (blobs/, snapshots/<commit>/, refs/),
with huggingface_hub's own path and symlink helpers, from locally produced files."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from huggingface_hub.file_download import _create_symlink, repo_folder_name


def seed_repo(
    cache: Path, repo_id: str, files: dict[str, Path], *, commit: str, ref: str | None = "main"
) -> Path:
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        etag = hashlib.sha256(src.read_bytes()).hexdigest()  # LFS files are addressed by sha256
        blob = repo / "blobs" / etag
        if not blob.exists():
            shutil.copy2(src, blob)
        _create_symlink(str(blob), str(snapshot / name), new_blob=False)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
