"""Pull and push zoo model folders through the Hugging Face Hub (``huggingface_hub``).

- ``hf:ORG/REPO[@REVISION]`` pulls a model folder into the standard HF cache. A pinned commit
  already in the cache is used without touching the network; with ``HF_HUB_OFFLINE=1`` and
  nothing cached, the error names the repo and revision and says how to fetch it.
- ``hf-hub:ORG/NAME`` (timm's spelling) is not pulled here: it names the ``timm:`` entry
  (:func:`zoo.factory.resolve`).
- Only safetensors are pulled; every weights file's sha256 goes into a local lock the first
  time it is seen and is verified on every later load (and against ``config.json``).
- Push uploads exactly the artifact files in one commit, after the contract and the card
  are validated locally; pickle files are never uploaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zoo.artifact import ALLOWED_FILES, CARD_FILE, WEIGHTS_FILE, read_config
from zoo.errors import (
    ArtifactError,
    InputError,
    ModelRefError,
    UnsafeWeightsError,
    WeightsIntegrityError,
    first_line,
)
from zoo.ref import ModelRef, is_repo_id

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
PICKLE_SUFFIXES = (".bin", ".pth", ".pt", ".pkl", ".ckpt")


def lock_path() -> Path:
    from zoo.system import expand_home

    given = os.environ.get("ZOO_HOME")
    home = (
        Path(given)
        if given
        else expand_home(
            "~/.cache/zoo", what="zoo's home folder", fix="Set ZOO_HOME (or HOME) to a folder."
        )
    )
    return home / "weights.lock.json"


def _read_lock() -> dict[str, str]:
    p = lock_path()
    return json.loads(p.read_text()) if p.exists() else {}


def verify_locked(key: str, path: Path) -> str:
    """sha256 of ``path``; recorded under ``key`` the first time, compared on every later call."""
    from zoo.artifact import write_json
    from zoo.weights import sha256_file

    actual = sha256_file(path)
    lock = _read_lock()
    expected = lock.get(key)
    if expected is None:
        lock[key] = actual
        lock_path().parent.mkdir(parents=True, exist_ok=True)
        write_json(lock_path(), lock)
    elif expected != actual:
        raise WeightsIntegrityError(str(path), expected, actual)
    return actual


def pull(name: str | ModelRef) -> Path:
    """The local model folder of ``hf:ORG/REPO[@REV]``, pulled if needed and verified.

    Args:
        name: an ``hf`` model reference (text or :class:`ModelRef`).

    Returns:
        The snapshot folder in the HF cache (safetensors + config + card only).

    Raises:
        ModelRefError: ``name`` is not an ``hf:`` reference (or does not parse).
        WeightsNotFoundError: offline, or the repo/revision does not exist.
        UnsafeWeightsError: the repo only holds pickle weights.
        ArtifactError / WeightsIntegrityError: see :func:`verify_snapshot`.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from zoo.weights import hub_errors

    ref = ModelRef.parse(name)
    if ref.kind != "hf":
        raise ModelRefError(ref.shown, "is not a Hub model folder: give hf:ORG/REPO[@REVISION]")
    repo, rev = ref.name, ref.revision
    shown = f"hf:{repo}@{rev or 'main'}"
    patterns = sorted(ALLOWED_FILES)  # never download pickle files
    folder: str | None = None
    if rev and _COMMIT.match(rev):  # a pinned commit in the cache never touches the network
        try:
            folder = snapshot_download(
                repo, revision=rev, allow_patterns=patterns, local_files_only=True
            )
        except LocalEntryNotFoundError:
            folder = None
    if folder is None:
        with hub_errors(repo, rev, "the model folder"):
            folder = snapshot_download(repo, revision=rev, allow_patterns=patterns)
    path = Path(folder)
    if not (path / WEIGHTS_FILE).is_file():
        pickles = [
            p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES
        ] or _remote_pickles(repo, rev)
        if pickles:
            raise UnsafeWeightsError(
                f"{shown} only has pickle weights ({', '.join(pickles)}); zoo loads safetensors only. "
                "Download the file yourself and convert it: `zoo convert FILE --arch ARCH`."
            )
        raise ArtifactError(
            f"{shown} has no {WEIGHTS_FILE}: it is not a zoo model folder. If it holds pickle "
            "weights, download them yourself and convert: `zoo convert FILE --arch ARCH`."
        )
    verify_snapshot(path, repo)
    return path


def verify_snapshot(snapshot: Path, repo: str) -> None:
    """Check a pulled snapshot's weights against both pins: the local lock (recorded the first
    time this repo@commit is seen) and the ``weights_sha256`` in its own ``config.json``.

    Raises:
        ArtifactError: the folder breaks the model-folder contract.
        WeightsIntegrityError: the weights file differs from the lock or from its config.
    """
    config = read_config(snapshot)
    weights = snapshot / WEIGHTS_FILE
    actual = verify_locked(f"{repo}@{snapshot.name}/{WEIGHTS_FILE}", weights)
    if actual != config.weights_sha256:
        raise WeightsIntegrityError(str(weights), str(config.weights_sha256), actual)


def _remote_pickles(repo: str, rev: str | None) -> list[str]:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return []
    try:
        from huggingface_hub import HfApi

        return [
            f for f in HfApi().list_repo_files(repo, revision=rev) if f.endswith(PICKLE_SUFFIXES)
        ]
    except Exception:  # listing is only for a better message
        return []


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a request that never got an answer raises in the HTTP client huggingface_hub uses
    (httpx2 from 2.x, httpx or requests before); not OSError: a local file it cannot read is
    not the network's fault."""
    import importlib

    found: list[type[BaseException]] = []
    for name, error in (
        ("httpx2", "TransportError"),
        ("httpx", "TransportError"),
        ("requests", "ConnectionError"),
    ):
        with contextlib.suppress(ImportError):
            found.append(getattr(importlib.import_module(name), error))
    return tuple(found)


@contextlib.contextmanager
def _push_errors(repo_id: str, endpoint: str) -> Iterator[None]:
    """huggingface_hub's upload errors → an InputError that says what to do (``pull``'s
    download errors are :func:`zoo.weights.hub_errors`)."""
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalTokenNotFoundError,
        OfflineModeIsEnabled,
    )

    try:
        yield
    except OfflineModeIsEnabled as exc:
        raise InputError(
            f"zoo push {repo_id} needs the Hub, and HF_HUB_OFFLINE is set: unset it to upload."
        ) from exc
    except LocalTokenNotFoundError as exc:
        raise InputError(
            f"zoo push {repo_id} needs a Hugging Face token with write access: run "
            "`hf auth login`, or set HF_TOKEN."
        ) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        fix = {
            401: "the Hub did not accept the token: run `hf auth login` with a write token",
            403: f"the token may not write to {repo_id}: push to your own namespace, or ask "
            "its owner for write access",
        }.get(status or 0, "see the Hub's message")
        raise InputError(
            f"The Hub refused the upload to {repo_id} (HTTP {status}: {first_line(exc)}); {fix}."
        ) from exc
    except _transport_errors() as exc:
        raise InputError(
            f"zoo push {repo_id}: the Hub at {endpoint} cannot be reached "
            f"({type(exc).__name__}: {first_line(exc)}); check the network and HF_ENDPOINT."
        ) from exc


def push(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    api: Any = None,
    token: str | None = None,
) -> dict[str, Any]:
    """Upload a model folder in one commit, after checking its contract and card locally.

    Args:
        folder: a model folder, or a training run (its ``model/`` is pushed).
        repo_id: ``ORG/REPO`` to push to (created if missing).
        private, revision, create_pr: as for ``HfApi.create_commit``; a revision other than
            ``main`` is created as a branch unless ``create_pr``.
        api, token: an ``HfApi`` to use (tests), or the token for a new one.

    Returns:
        What was sent: repo id, file names, revision, and the commit or PR URL.

    Raises:
        InputError: a malformed ``repo_id``; ModelRefError: ``folder`` is missing or not a
            folder.
        ArtifactError: the folder breaks the artifact contract or its card is invalid.
        UnsafeWeightsError: the folder holds pickle files.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    from zoo.cards import validate_card_locally

    if not is_repo_id(repo_id):
        raise InputError(f"Repo id must be in the form 'namespace/repo_name': {repo_id!r}")
    src = ModelRef.parse(Path(folder)).model_folder  # a run folder pushes its model/
    read_config(src)  # the contract: exact file set, schema, class count
    bad = [p.name for p in src.iterdir() if p.suffix in PICKLE_SUFFIXES]
    if bad:
        raise UnsafeWeightsError(f"Refusing to push pickle files: {', '.join(bad)}")
    card_text = (src / CARD_FILE).read_text()
    validate_card_locally(card_text)
    # the contract's files only: variants/ (int8, fp16, IR) stay local (zoo.variants)
    files = sorted(p.name for p in src.iterdir() if p.name in ALLOWED_FILES)
    api = api or HfApi(token=token)
    operations = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(src / f)) for f in files]
    with _push_errors(repo_id, getattr(api, "endpoint", "the Hub")):
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main" and not create_pr:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations=operations,
            commit_message=f"Upload {src.name} with zoo",
            revision=revision,
            create_pr=create_pr,
        )
    return {
        "repo_id": repo_id,
        "files": files,
        "revision": revision,
        "create_pr": create_pr,
        "commit_url": getattr(info, "commit_url", None),
        "pr_url": getattr(info, "pr_url", None),
    }
