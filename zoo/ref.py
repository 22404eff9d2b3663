"""What a model name means: the one parser of every command's MODEL argument.

:meth:`ModelRef.parse` turns the text a user typed into a typed, frozen value; every command
and every library entry point (``create_model``, ``export_onnx``, ``predict``, ``serve``,
``bundle``, ``pull``) takes that value (or parses its string argument once) and branches on
``ref.kind``, never on the spelling again. Parsing reads the file system and the registry's
static table; it never imports torch.

Accepted forms and their precedence (the first rule that applies wins):

1. A prefix names its kind, whatever exists on disk: ``timm:<name>``, ``hf:ORG/REPO[@REV]``,
   ``hf-hub:ORG/NAME`` (timm's spelling, resolved to ``timm:NAME``). A folder literally
   called ``hf:x`` is named ``./hf:x``.
2. A name ending in ``.onnx`` is an ONNX file, one ending in ``.xml`` an OpenVINO IR (written by
   ``zoo export --format openvino``); either must exist. A model folder's derived files
   (``model/variants/int8-static.onnx``, see :mod:`zoo.variants`) are such files too, also
   reached from the folder by :meth:`ModelRef.variant`.
3. A path spelling (a separator, a leading ``.`` or ``~``, or an absolute path) is a folder,
   and must exist: a training run when it holds ``model/``, else a model folder (its
   contract is checked when it is loaded, with the precise violation).
4. A bare word that is a registry name (``arch`` or ``arch.tag``) is that entry, even when
   the working directory holds a folder of the same name: a registry name means the same
   everywhere. Write ``./resnet18`` for the folder.
5. A bare word naming an existing folder is that folder (``zoo predict myrun``).
6. Anything else is refused, quoting the text, listing these forms, and suggesting the
   registry's near misses.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from zoo.errors import ModelRefError, NoHomeFolderError, UnknownModelError

RefKind = Literal["registry", "timm", "hf", "hf-hub", "run", "model-folder", "onnx", "openvino"]
PATH_KINDS: frozenset[RefKind] = frozenset({"run", "model-folder", "onnx", "openvino"})
RUNTIME_KINDS: frozenset[RefKind] = frozenset({"onnx", "openvino"})  # files a runtime runs as is
_RUNTIME_SUFFIXES = {".onnx": ("onnx", "ONNX file"), ".xml": ("openvino", "OpenVINO IR (.xml)")}

_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")
_REVISION = re.compile(r"^[\w.-]+(/[\w.-]+)*$")  # a branch, tag, commit or refs/pr/N
_TIMM = re.compile(r"^[\w.-]+$")
_PREFIXES = ("timm:", "hf:", "hf-hub:")


def is_repo_id(text: str) -> bool:
    """Whether ``text`` has the Hub's ``namespace/repo_name`` form."""
    return bool(_REPO.match(text))


@dataclass(frozen=True)
class ModelRef:
    """A parsed model reference. Build it with :meth:`parse`; ``str(ref)`` parses back to it.

    Attributes:
        kind: which of the accepted forms it is (see the module docstring).
        name: ``arch.tag`` (registry, canonical: ``resnet18`` → ``resnet18.tv_in1k``); the
            timm model name (``timm``); ``ORG/REPO`` (``hf``) or ``ORG/NAME`` (``hf-hub``);
            the path as given (``run``, ``model-folder``, ``onnx``).
        revision: the Hub revision of an ``hf`` reference (None: the default branch).
        text: what the user typed, for messages (not part of equality).
    """

    kind: RefKind
    name: str
    revision: str | None = None
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str | os.PathLike[str] | ModelRef) -> ModelRef:
        """Parse a model reference.

        Args:
            text: what the user gave: a registry name, ``timm:<name>``,
                ``hf:ORG/REPO[@REV]``, ``hf-hub:ORG/NAME``, a run or model folder, or an
                ``.onnx`` file (a path object is always a path). A :class:`ModelRef` is
                returned as is.

        Returns:
            The typed reference.

        Raises:
            ModelRefError: a malformed Hub id or revision, an empty ``timm:`` name, or a
                path that does not exist or is not a folder / ``.onnx`` file.
            UnknownModelError: a bare word that is neither a registry name nor an existing
                folder (with did-you-mean suggestions).
        """
        if isinstance(text, ModelRef):
            return text
        if isinstance(text, os.PathLike):
            return _parse_path(os.fspath(text), text=os.fspath(text))
        s = text.strip()
        if not s:
            raise ModelRefError(text, "is empty")
        if s.startswith(_PREFIXES):
            return _parse_prefixed(s)
        if s.endswith(tuple(_RUNTIME_SUFFIXES)) or _looks_like_path(s):
            return _parse_path(s, text=s)
        from zoo.catalog import suggest, try_canonical_name

        canonical = try_canonical_name(s)
        if canonical is not None:
            return cls("registry", canonical, text=s)
        if Path(s).exists():
            return _parse_path(s, text=s)
        raise UnknownModelError(s, suggest(s), forms=True)

    @property
    def is_path(self) -> bool:
        """Whether the reference names something on disk (run, model folder, ONNX file)."""
        return self.kind in PATH_KINDS

    @property
    def path(self) -> Path:
        """The file or folder of a path reference.

        Raises:
            ModelRefError: the reference is not a path (a registry, timm or Hub name).
        """
        if not self.is_path:
            raise ModelRefError(self.shown, f"is a {self.kind} reference, not a file or folder")
        from zoo.system import expand_home

        return expand_home(self.name, what="Model")

    @property
    def model_folder(self) -> Path:
        """The model folder of a ``run`` (its ``model/``) or ``model-folder`` reference.

        Raises:
            ModelRefError: the reference is not a folder.
        """
        if self.kind not in ("run", "model-folder"):
            raise ModelRefError(self.shown, f"is a {self.kind} reference, not a model folder")
        return self.path / "model" if self.kind == "run" else self.path

    def variant(self, name: str) -> ModelRef:
        """The derived variant ``name`` of a run or model folder (``int8`` for
        ``model/variants/int8-static.onnx``; see :func:`zoo.variants.resolve_variant`), as an
        ``onnx`` or ``openvino`` reference.

        Raises:
            ModelRefError: the reference is not a run or model folder.
            InputError: no variant, or several, answer to ``name``.
            ArtifactError: the folder breaks the model-folder contract.
        """
        if self.kind not in ("run", "model-folder"):
            raise ModelRefError(
                self.shown,
                f"is a {self.kind} reference; --variant picks a derived file of a run or "
                "model folder (for a file, give the file itself)",
            )
        from zoo.variants import resolve_variant

        path = resolve_variant(self.model_folder, name)
        return _parse_path(str(path), text=str(path))

    @property
    def timm_name(self) -> str:
        """The timm model a ``timm:`` or ``hf-hub:`` reference names (``resnet18.a1_in1k``).

        Raises:
            ModelRefError: the reference is neither.
        """
        if self.kind not in ("timm", "hf-hub"):
            raise ModelRefError(self.shown, f"is a {self.kind} reference, not a timm model")
        return self.name.split("/", 1)[-1]

    def __str__(self) -> str:
        if self.kind == "timm":
            return f"timm:{self.name}"
        if self.kind == "hf":
            return f"hf:{self.name}" + (f"@{self.revision}" if self.revision else "")
        if self.kind == "hf-hub":
            return f"hf-hub:{self.name}"
        return self.name

    @property
    def shown(self) -> str:
        """The reference as the user typed it (its canonical spelling when built directly)."""
        return self.text or str(self)


def _looks_like_path(s: str) -> bool:
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return any(c in s for c in seps) or s.startswith((".", "~")) or os.path.isabs(s)


def _parse_prefixed(s: str) -> ModelRef:
    prefix, _, rest = s.partition(":")
    if prefix == "timm":
        if not _TIMM.match(rest):
            raise ModelRefError(s, "needs a timm model name after 'timm:' (timm:resnet18.a1_in1k)")
        return ModelRef("timm", rest, text=s)
    if prefix == "hf-hub":
        if "@" in rest or not _REPO.match(rest):
            raise ModelRefError(
                s, "must be hf-hub:ORG/NAME with a timm name (hf-hub:timm/resnet18.a1_in1k)"
            )
        return ModelRef("hf-hub", rest, text=s)
    repo, at, rev = rest.partition("@")
    if not _REPO.match(repo):
        raise ModelRefError(s, f"has the Hub repo id {repo!r}; it must be 'namespace/repo_name'")
    if at and (not _REVISION.match(rev) or ".." in rev):
        raise ModelRefError(
            s,
            f"has the revision {rev!r}; give a branch, tag or commit after '@' (hf:ORG/REPO@main)",
        )
    return ModelRef("hf", repo, rev or None, text=s)


_PROGRAMS = {
    ".pt2": ("a torch.export program", "pt2"),
    ".ts": ("a TorchScript program", "torchscript"),
    ".torchscript": ("a TorchScript program", "torchscript"),
}


def _file_hint(p: Path) -> str:
    """What to give instead of the file ``p`` (not .onnx/.xml): an export zoo's runtimes do not
    run is told apart from a checkpoint to convert (by suffix, or for ``.pt`` by the archive's
    member names: TorchScript's zip holds ``code/``; nothing is unpickled)."""
    import zipfile

    program = _PROGRAMS.get(p.suffix.lower())
    if program is None and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as z:
            if any("/code/" in name for name in z.namelist()):
                program = ("a TorchScript program", "torchscript")
    if program is not None:
        what, fmt = program
        return (
            f"it is {what} (what `zoo export --format {fmt}` writes), which zoo's commands do "
            "not run: give the run or model folder it was exported from, or its .onnx export "
            "(`zoo export RUN` writes one)"
        )
    if p.suffix.lower() == ".safetensors" and (p.parent / "config.json").is_file():
        return f"give the model folder holding it: {p.parent}"
    return (
        "give its model folder or an .onnx file; a PyTorch checkpoint (.pth, .pt, "
        ".safetensors weights) becomes a model folder with `zoo convert FILE --arch ARCH -o DIR`"
    )


def _parse_path(s: str, *, text: str) -> ModelRef:
    from zoo.system import expand_home

    try:
        p = expand_home(s, what="Model")
    except NoHomeFolderError as e:
        raise ModelRefError(text, f"does not exist ({e.reason} to expand '~')") from None
    if p.suffix in _RUNTIME_SUFFIXES:
        kind, what = _RUNTIME_SUFFIXES[p.suffix]
        if not p.is_file():
            raise ModelRefError(
                text, f"does not exist (no such {what})" if not p.exists() else "is not a file"
            )
        return ModelRef(kind, s, text=text)  # type: ignore[arg-type]
    if not p.exists():
        raise ModelRefError(text, "does not exist (no such run or model folder)")
    if not p.is_dir():
        raise ModelRefError(text, f"is a file; {_file_hint(p)}")
    ir = p / "model.xml"  # a folder written by zoo export --format openvino
    if ir.is_file() and not (p / "config.json").exists() and not (p / "model").is_dir():
        return ModelRef("openvino", str(ir), text=text)
    return ModelRef("run" if (p / "model").is_dir() else "model-folder", s, text=text)


__all__ = ["RUNTIME_KINDS", "ModelRef", "RefKind", "is_repo_id"]
