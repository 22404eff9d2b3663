"""Every exception zoo raises on purpose.

Each one subclasses :class:`ZooError` (so the CLI can turn it into a clean message and
exit code 1) *and* the builtin it behaves like (so ordinary ``except ValueError`` code keeps
working). Messages quote the bad value and say what to do next.
"""

from __future__ import annotations

from collections.abc import Iterable


class ZooError(Exception):
    """Base class of all errors raised by zoo on purpose."""


class UnknownModelError(ZooError, KeyError):
    """A model name is not in the registry."""

    def __init__(self, name: str, suggestions: Iterable[str] = ()) -> None:
        self.name = name
        self.suggestions = list(suggestions)
        hint = (
            f" Did you mean {', '.join(repr(s) for s in self.suggestions)}?"
            if self.suggestions
            else ""
        )
        super().__init__(f"Unknown model {name!r}.{hint} Run `zoo list` to see every entry.")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateModelError(ZooError, ValueError):
    """A registry name was registered twice."""


class WeightsNotFoundError(ZooError, FileNotFoundError):
    """Weights are neither cached nor downloadable (e.g. offline with an empty cache)."""


class WeightsIntegrityError(ZooError, ValueError):
    """A weights file does not have the pinned hash."""

    def __init__(self, path: str, expected: str, actual: str) -> None:
        self.path, self.expected, self.actual = path, expected, actual
        super().__init__(
            f"Weights file {path} failed its hash check: expected sha256 {expected}, "
            f"got {actual}. The file is corrupt or was tampered with; delete it and fetch "
            "it again."
        )


class UnsafeWeightsError(ZooError, ValueError):
    """Weights would need unpickling (arbitrary code execution) to load."""


class StateDictMismatchError(ZooError, RuntimeError):
    """Weights do not fit the architecture outside the declared classifier head."""


class ArtifactError(ZooError, ValueError):
    """A model folder does not follow the artifact contract."""


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
    """A file given by the user is missing, unreadable or of the wrong kind."""


class ServerBusyError(ZooError, RuntimeError):
    """The server's request queue is full; the client should retry later."""


class PayloadTooLargeError(InputError):
    """An upload or a decoded image is over the configured limit."""


class UnsupportedMediaTypeError(InputError):
    """A request body comes in an encoding or media type the server does not read."""
