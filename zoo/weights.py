"""Weight resolution: torchvision files, Hugging Face Hub files, local safetensors.

Every file is hash-checked on *every* load (not only on download) when its entry pins a hash,
and nothing is unpickled: ``.pth`` files go through ``torch.load(weights_only=True)``, and
everything zoo reads from the Hub or writes itself is safetensors.

:func:`availability` says, without the network and without importing torch (``zoo list`` and
``zoo info`` call it), whether an entry's weights are usable here.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from zoo.errors import (
    REFETCH_FIX,
    InputError,
    UnsafeWeightsError,
    WeightsIntegrityError,
    WeightsNotFoundError,
    first_line,
)
from zoo.metadata import WeightSource

if TYPE_CHECKING:
    import torch

StateDict = dict[str, "torch.Tensor"]


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


LOCAL_FIX = (
    "nothing can fetch a local model folder's weights again: restore the folder from a copy, "
    "or make it again with the command that wrote it (its run's `zoo finetune`, `zoo distill` "
    "or `zoo enroll`; `zoo bundle`, `zoo convert`)"
)


def verify_file(
    path: Path, *, sha256: str | None = None, prefix: str | None = None, local: bool = False
) -> str:
    """Check ``path`` against a full sha256 (preferred) or torchvision's hash prefix;
    ``local``: a model folder's own file (the error says how to make it again, not fetch it)."""
    actual = sha256_file(path)
    if sha256 and actual != sha256:
        raise WeightsIntegrityError(str(path), sha256, actual, LOCAL_FIX if local else None)
    if not sha256 and prefix and not actual.startswith(prefix):
        raise WeightsIntegrityError(str(path), f"{prefix}…", actual)
    return actual


def torch_hub_dir() -> Path:
    """torch hub's folder: ``torch.hub.get_dir()`` once torch is loaded (``set_dir`` may have
    moved it), else the same rule from the environment, without importing torch
    (``$TORCH_HOME/hub``, else ``$XDG_CACHE_HOME/torch/hub``, else ``~/.cache/torch/hub``)."""
    if "torch" in sys.modules:
        import torch

        return Path(torch.hub.get_dir())
    cache = os.getenv("XDG_CACHE_HOME", os.path.join("~", ".cache"))
    return Path(os.path.expanduser(os.getenv("TORCH_HOME", os.path.join(cache, "torch")))) / "hub"


def torchvision_cache_path(source: WeightSource) -> Path:
    assert source.filename is not None
    return torch_hub_dir() / "checkpoints" / source.filename


AvailabilityState = Literal["cached", "missing", "corrupt", "not needed"]


@dataclass(frozen=True)
class Availability:
    """Whether an entry's weights can be loaded here without the network.

    ``state``: ``cached`` (the file is here and matches its pin, when it has one),
    ``missing`` (it would have to be downloaded), ``corrupt`` (here, but it fails its hash),
    ``not needed`` (random initialisation).
    """

    state: AvailabilityState
    path: str | None = None  # where the file is (or would be, for the torch hub cache)
    hash_checked: bool = False  # cached and matching the entry's sha256 (or hash prefix)
    local: bool = False  # a model folder's own file: nothing can fetch it again

    @property
    def available(self) -> bool:
        """Usable offline: cached and sound, or nothing to load."""
        return self.state in ("cached", "not needed")

    def describe(self) -> str:
        """One line for humans."""
        if self.state == "cached":
            pin = "hash checked" if self.hash_checked else "no pinned hash to check"
            return f"yes: cached at {self.path} ({pin})"
        if self.state == "corrupt":
            fix = LOCAL_FIX if self.local else REFETCH_FIX
            return f"no: {self.path} fails its pinned hash ({fix})"
        if self.state == "missing" and self.local:
            return f"no: {self.path} is not there ({LOCAL_FIX})"
        if self.state == "missing":
            where = f" (would be {self.path})" if self.path else ""
            return f"no: not cached here{where}; needs a download, or --weights none"
        return "yes: random initialisation, nothing to load"

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "state": self.state,
            "path": self.path,
            "hash_checked": self.hash_checked,
        }


def availability(source: WeightSource) -> Availability:
    """Whether ``source``'s file is usable here: looked up in the torch hub or Hugging Face
    cache (never downloaded) and hash-checked where the entry pins a hash. Imports no torch."""
    if source.kind == "none":
        return Availability("not needed")
    path: Path | None
    if source.kind == "torchvision":
        path = torchvision_cache_path(source)
    elif source.kind == "hub":
        path = _hub_cached(source)
    else:
        path = Path(source.path) if source.path else None
    local = source.kind == "local"
    if path is None or not path.is_file():
        return Availability("missing", str(path) if path is not None else None, local=local)
    pinned = bool(source.sha256 or source.hash_prefix)
    try:
        if pinned:
            verify_file(path, sha256=source.sha256, prefix=source.hash_prefix)
    except WeightsIntegrityError:
        return Availability("corrupt", str(path), local=local)
    return Availability("cached", str(path), hash_checked=pinned)


def _hub_cached(source: WeightSource) -> Path | None:
    """The file of a Hub source in the local Hugging Face cache, if it is there."""
    from huggingface_hub import try_to_load_from_cache

    assert source.repo_id and source.filename
    found = try_to_load_from_cache(source.repo_id, source.filename, revision=source.revision)
    return Path(found) if isinstance(found, str) else None


def _fetch_torchvision(source: WeightSource) -> Path:
    path = torchvision_cache_path(source)
    if not path.exists():
        if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("ZOO_OFFLINE") == "1":
            raise WeightsNotFoundError(
                f"Weights {source.filename} are not in the torch hub cache ({path}) and "
                "downloads are disabled (offline). Copy the file there or go online."
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        import torch

        try:
            torch.hub.download_url_to_file(
                str(source.url), str(tmp), hash_prefix=source.hash_prefix
            )
        except Exception as exc:  # urllib raises many kinds; all mean "could not fetch"
            tmp.unlink(missing_ok=True)
            raise WeightsNotFoundError(
                f"Could not download {source.url} ({exc}). Place the file at {path} "
                "(torch hub cache, $TORCH_HOME) or retry with network access."
            ) from exc
        os.replace(tmp, path)
    verify_file(path, sha256=source.sha256, prefix=source.hash_prefix)
    return path


@contextmanager
def hub_errors(repo_id: str, revision: str | None, what: str) -> Iterator[None]:
    """huggingface_hub's download errors → one error that names the repo, revision and fix."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    shown = f"hf:{repo_id}@{revision or 'main'}"
    try:
        yield
    except LocalEntryNotFoundError as exc:
        raise WeightsNotFoundError(
            f"{what} of {shown} is not in the Hugging Face cache and the Hub cannot be reached "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}). Fetch it once with network "
            f"access: `zoo pull {shown}` (unset HF_HUB_OFFLINE)."
        ) from exc
    except RevisionNotFoundError as exc:
        raise WeightsNotFoundError(
            f"Revision {revision!r} does not exist in hf:{repo_id}."
        ) from exc
    except RepositoryNotFoundError as exc:
        raise WeightsNotFoundError(
            f"Hub repo {repo_id!r} does not exist or needs a token (`hf auth login`)."
        ) from exc
    except EntryNotFoundError as exc:
        raise WeightsNotFoundError(f"{shown} has no {what}.") from exc


def hub_download(repo_id: str, filename: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    with hub_errors(repo_id, revision, filename):
        return Path(hf_hub_download(repo_id, filename, revision=revision))


def _fetch_hub(source: WeightSource) -> Path:
    assert source.repo_id and source.filename
    if not source.filename.endswith(".safetensors"):
        raise UnsafeWeightsError(
            f"Refusing {source.filename!r} from hf:{source.repo_id}: only safetensors are "
            "loaded from the Hub. Convert pickle checkpoints with `zoo convert`."
        )
    path = hub_download(source.repo_id, source.filename, source.revision)
    if source.sha256:
        verify_file(path, sha256=source.sha256)
    return path


def fetch_weights(source: WeightSource) -> Path:
    """Local path of the (verified) weights file for ``source``."""
    if source.kind == "torchvision":
        return _fetch_torchvision(source)
    if source.kind == "hub":
        return _fetch_hub(source)
    if source.kind == "local":
        assert source.path
        path = Path(source.path)
        if not path.is_file():
            raise WeightsNotFoundError(f"Weights file {path} does not exist.")
        if source.sha256:
            verify_file(path, sha256=source.sha256, local=True)
        return path
    raise WeightsNotFoundError("This entry has no pretrained weights (random initialisation).")


def _unreadable(path: Path, exc: Exception) -> InputError:
    """A ``.pth`` torch cannot read as weights, for a reason unpickling would not cure."""
    said = first_line(exc)
    said = said if said == type(exc).__name__ else f"{type(exc).__name__}: {said}"
    return InputError(
        f"{path} is not a readable PyTorch checkpoint ({said}): a truncated download or "
        "another kind of file. Fetch it again, or pass a .safetensors file."
    )


def read_state_dict(path: Path) -> StateDict:
    """Tensors from a safetensors file, or a ``.pth`` through ``weights_only=True``."""
    import pickle

    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if path.suffix == ".safetensors":
        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as exc:
            raise InputError(
                f"{path} is not a readable safetensors file ({first_line(exc)}): a truncated "
                "download or another kind of file. Fetch or export it again."
            ) from exc
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "GLOBAL" not in str(exc):  # torch names no global to unpickle: bytes of another kind
            raise _unreadable(path, exc) from exc
        raise UnsafeWeightsError(
            f"{path} cannot be loaded without unpickling arbitrary objects "
            f"({first_line(exc)}). If you trust it, convert it with `zoo convert --trust`."
        ) from exc
    except Exception as exc:  # a torn zip (RuntimeError), an empty (EOFError) or text file
        raise _unreadable(path, exc) from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UnsafeWeightsError(f"{path} does not hold a plain state_dict of tensors.")
    return obj


def load_weights(source: WeightSource) -> StateDict:
    return read_state_dict(fetch_weights(source))
