"""Every exception zoo raises on purpose.

Each one subclasses :class:`ZooError` (so the CLI can turn it into a clean message and
exit code 1) *and* the builtin it behaves like (so ordinary ``except ValueError`` code keeps
working). Messages quote the bad value and say what to do next.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class ZooError(Exception):
    """Base class of all errors raised by zoo on purpose."""


MODEL_FORMS = (
    "a registry name arch[.tag] (`zoo list`), timm:NAME, hf:ORG/REPO[@REVISION], "
    "hf-hub:ORG/NAME, a run or model folder"
)
"""The spellings of a PyTorch model reference (:mod:`zoo.ref`); the CLI's help uses them too."""
MODEL_REF_FORMS = MODEL_FORMS + ", or an .onnx file"
"""Every accepted spelling of a model reference, quoted by its errors."""


class UnknownModelError(ZooError, KeyError):
    """A model name is not in the registry (or, for ``timm:`` names, not in timm).

    Args:
        name: the unknown name, quoted in the message.
        suggestions: near misses, offered as "Did you mean ...?".
        forms: also list every accepted spelling of a model reference (the name was not
            recognised as any of them: a bare word that names no folder either).
    """

    def __init__(self, name: str, suggestions: Iterable[str] = (), *, forms: bool = False) -> None:
        self.name = name
        self.suggestions = list(suggestions)
        hint = (
            f" Did you mean {', '.join(repr(s) for s in self.suggestions)}?"
            if self.suggestions
            else ""
        )
        tail = (
            f" A model is named by {MODEL_REF_FORMS}."
            if forms
            else " Run `zoo list` to see every entry."
        )
        what = "no registry entry and no folder of that name" if forms else ""
        super().__init__(f"Unknown model {name!r}{': ' + what if what else ''}.{hint}{tail}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateModelError(ZooError, ValueError):
    """A registry name was registered twice."""


class WeightsNotFoundError(ZooError, FileNotFoundError):
    """Weights are neither cached nor downloadable (e.g. offline with an empty cache)."""


REFETCH_FIX = "delete it and fetch it again"
"""What to do about a downloaded weights file that fails its hash (a model folder's own file
cannot be fetched again: :data:`zoo.weights.LOCAL_FIX`)."""


class WeightsIntegrityError(ZooError, ValueError):
    """A weights file does not have the pinned hash."""

    def __init__(self, path: str, expected: str, actual: str, fix: str | None = None) -> None:
        self.path, self.expected, self.actual = path, expected, actual
        super().__init__(
            f"Weights file {path} failed its hash check: expected sha256 {expected}, "
            f"got {actual}. The file is corrupt or was tampered with; "
            f"{fix or REFETCH_FIX}."
        )


class UnsafeWeightsError(ZooError, ValueError):
    """Weights would need unpickling (arbitrary code execution) to load."""


class StateDictMismatchError(ZooError, RuntimeError):
    """Weights do not fit the architecture outside the declared classifier head."""


class ArtifactError(ZooError, ValueError):
    """A model folder does not follow the artifact contract."""


class ConfigError(ZooError, ValueError):
    """A configuration (options, or a run's ``config.json``) has an unknown or missing key."""


class DataError(ZooError, ValueError):
    """An image folder or split cannot be used for training or evaluation."""


class TrainingError(ZooError, RuntimeError):
    """Training cannot continue (non-finite loss that persists, bad resume, ...)."""


class CheckpointError(ZooError, RuntimeError):
    """A checkpoint cannot be written, read or resumed."""


class ExportError(ZooError, RuntimeError):
    """An export failed or produced a graph that must not be shipped."""


class ParityError(ExportError):
    """An exported model does not reproduce the PyTorch model within tolerance."""


class QuantizationError(ZooError, RuntimeError):
    """Quantization failed or breached its accuracy gate."""


class BackendUnavailableError(ZooError, RuntimeError):
    """A requested backend or device (CUDA, an ORT provider, ...) is not available."""


class InputError(ZooError, ValueError):
    """Something the user gave is unusable: a file or folder that is missing, unreadable or
    of the wrong kind, or an argument or option value that is out of range or inconsistent."""


class NoHomeFolderError(InputError):
    """A path starts with ``~`` (or ``~user``) and that user has no home folder here.

    Args:
        path: the path as given, quoted in the message.
        what: what the path was for ("Data folder", "ZOO_CACHE"), named first.
        fix: what to do instead (default: give the full path).
    """

    def __init__(self, path: str, what: str, fix: str = "Give the full path instead.") -> None:
        self.path = path
        user = path[1:].split("/", 1)[0]
        self.reason = f"no user {user!r} here" if user else "$HOME is unset"
        """Why ``~`` could not be expanded, for messages that quote the path themselves."""
        super().__init__(f"{what} {path!r} starts with '~', but {self.reason} to expand it. {fix}")


class UsageError(InputError):
    """An option or argument is out of range or contradicts another (``--calib`` without
    ``--precision int8``). The CLI exits 2 with the message and the command's usage, as for
    the usage errors it finds itself; called directly, the library raises it like any
    :class:`InputError`.

    Args:
        message: what is wrong and what to pass instead.
        param_hint: the option or argument to blame (``"--static-batch"``), named by the CLI.
    """

    def __init__(self, message: str, *, param_hint: str | None = None) -> None:
        self.param_hint = param_hint
        super().__init__(message)


class ModelRefError(InputError):
    """A model reference is malformed or names nothing (a bad Hub id or revision, a missing
    path); the message quotes it and lists the accepted forms (``forms=False``: a form that
    parsed but does not fit the command, where the list would offer it again)."""

    def __init__(self, text: str, problem: str, *, forms: bool = True) -> None:
        self.text, self.problem = text, problem
        tail = f" A model is named by {MODEL_REF_FORMS}." if forms else ""
        super().__init__(f"Model {text!r} {problem}.{tail}")


class ChoiceError(InputError):
    """A value is not one of a fixed set of choices (the message suggests the near miss).

    The CLI refuses such values itself (exit code 2, same message); this is raised when the
    library is called directly.
    """

    def __init__(self, what: str, value: object, choices: Sequence[str]) -> None:
        self.what, self.value, self.choices = what, value, tuple(choices)
        close = difflib.get_close_matches(str(value), self.choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        super().__init__(f"{what} {value!r} is not one of {', '.join(self.choices)}.{hint}")

    @classmethod
    def check(cls, what: str, value: str, choices: Sequence[str]) -> str:
        """``value`` if it is one of ``choices``, else raise this error."""
        if value not in choices:
            raise cls(what, value, choices)
        return value


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a long command; the message says what was kept and how to go on
    (``zoo finetune --resume RUN``). A :class:`KeyboardInterrupt`, not a :class:`ZooError`:
    whatever handles an interrupt still does, and the CLI exits 130 with the message.

    Args:
        message: what was kept and the command that continues.
    """

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class ServerBusyError(ZooError, RuntimeError):
    """The server's request queue is full; the client should retry later (``retry_after_s``)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelNotServedError(ZooError, LookupError):
    """A request names a model the server does not serve (HTTP 404, gRPC NOT_FOUND)."""


class ModelNotReadyError(ZooError, RuntimeError):
    """The served model is still loading or warming up, or failed to (HTTP 503, gRPC
    UNAVAILABLE); the message says which."""


class PayloadTooLargeError(InputError):
    """An upload or a decoded image is over the configured limit."""


class UnsupportedMediaTypeError(InputError):
    """A request body comes in an encoding or media type the server does not read."""


class TrackingError(ZooError, ConnectionError):
    """An experiment tracker cannot be used: MLflow is not installed, its tracking server does
    not answer, or a run's tracking record names a run the server does not have. The message
    says how to fix it or how to go on without tracking."""


def first_line(exc: BaseException | str, limit: int = 300) -> str:
    """An error's (or a warning's) first line, shortened past ``limit`` characters (at a word,
    unless that drops more than half of them) and marked ``…``: what a one-line message
    quotes (an exception's type name when it has no text)."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else "" if isinstance(exc, str) else type(exc).__name__
    if len(line) <= limit:
        return line
    cut = line[:limit]
    at_word = cut.rsplit(" ", 1)[0]
    return (at_word if len(at_word) >= limit // 2 else cut) + " …"


def some_of(names: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, comma-separated, and how many more there are: what a
    message quotes of a long list, so that none is left out without saying so."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
