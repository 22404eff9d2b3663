"""What a request brings, read and checked before it reaches the model: the body within the
size limit (raw or a multipart upload), and the tensor a v2 ``infer`` request sends, against
the model's input. Every refusal is an error of :mod:`zoo.errors` the app maps to a 4xx."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from python_multipart.exceptions import FormParserError, MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.requests import Request

from zoo.deploy.runtimes.loader import Classifier
from zoo.deploy.serve.protocol import datatype_of
from zoo.errors import InputError, PayloadTooLargeError, UnsupportedMediaTypeError
from zoo.preprocess import check_aspect

MAX_PARTS = 16  # parts of one multipart upload (Starlette's max_fields was 16 too)
# the parser logs each parse error before raising it to us: a second line for one bad request
logging.getLogger("python_multipart").setLevel(logging.ERROR)
HALF_MAX = float(np.finfo(np.float16).max)  # 65504: the largest input an --fp16-io graph holds


def check_encoding(request: Request) -> None:
    """Refuse a compressed body (UnsupportedMediaTypeError)."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedMediaTypeError(
            f"Content-Encoding {encoding!r} is not supported: send the body uncompressed"
        )


def declared_length(request: Request) -> int | None:
    """The Content-Length header's value, None when absent or not a number."""
    declared = request.headers.get("content-length", "").strip()
    return int(declared) if declared.isascii() and declared.isdigit() else None


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused (PayloadTooLargeError) as soon as it is over ``limit`` bytes."""
    check_encoding(request)
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise PayloadTooLargeError(
            f"request body of {declared:,} bytes is over the {limit:,}-byte limit"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body is over the {limit:,}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_upload(request: Request, limit: int) -> bytes:
    """The bytes of the multipart field ``file``, within ``limit`` bytes of body."""
    check_encoding(request)
    if declared_length(request) is None:
        raise InputError("multipart uploads need a Content-Length header")
    _, params = parse_options_header(request.headers.get("content-type"))
    boundary = params.get(b"boundary")
    if not boundary:
        raise InputError(
            "multipart body cannot be parsed: missing boundary in the Content-Type (send "
            "multipart/form-data with a boundary and a 'file' field)"
        )
    return upload_field(await read_body(request, limit), boundary)


def upload_field(body: bytes, boundary: bytes, name: bytes = b"file") -> bytes:
    """The content of the one file part named ``name`` in a whole multipart ``body``, parsed
    in memory by python-multipart's own parser.
    Written here because the body is already held whole within the limit: Starlette's form
    spools each part to a temporary file on the event loop, which cost small uploads (a
    32×32 digit) 15% of a server's requests per second, measured side by side.

    Raises:
        InputError: a body that does not parse or was cut short, more than
            :data:`MAX_PARTS` parts, or not exactly one file part of that name.
    """
    parts: list[tuple[bytes, bytes | None, list[bytes]]] = []  # name, filename, data
    header = [b"", b"", b""]  # the field and the value being read; this part's disposition

    def on_part_begin() -> None:
        header[2] = b""

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        if header[0].lower() == b"content-disposition":
            header[2] = header[1]
        header[0] = header[1] = b""

    def on_headers_finished() -> None:
        if len(parts) >= MAX_PARTS:
            raise InputError(f"multipart body has more than {MAX_PARTS} parts")
        _, options = parse_options_header(header[2])
        parts.append((options.get(b"name", b""), options.get(b"filename"), []))

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1][2].append(data[start:end])

    callbacks = {
        "on_part_begin": on_part_begin,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished,
        "on_part_data": on_part_data,
    }
    try:
        parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
        parser.write(body)
        parser.finalize()
    except (MultipartParseError, FormParserError) as exc:
        raise InputError(
            f"multipart body cannot be parsed: {exc} (send multipart/form-data with a "
            "boundary and a 'file' field)"
        ) from exc
    if parser.state != MultipartState.END:
        raise InputError(
            "multipart body ends before its closing boundary: the upload was cut short"
        )
    # the closing boundary came, so every part is whole
    files = [data for n, filename, data in parts if n == name and filename is not None]
    if not files:
        raise InputError(f"multipart upload needs a {name.decode()!r} field (a file part)")
    if len(files) > 1:  # answering one of them would pass the others over in silence
        raise InputError(
            f"multipart upload has {len(files)} {name.decode()!r} file parts; this endpoint "
            "classifies one image a request: send each in a request of its own, or several "
            "as one batch to /v2/models/NAME/infer"
        )
    return b"".join(files[0])


@dataclass(frozen=True)
class TensorSpec:
    """What a v2 request's tensor may be, one sample's shape without the batch: ``dims`` as
    requests may send it (None: any size, the height and width of a ``--dynamic-size`` graph)
    and ``export``, the shape the graph was exported, proven and warmed up at; ``resizes``:
    the graph resizes what it takes itself (decoded pixels, ``--embed-preprocessing``), so
    each sample is one sample of the export size whatever its own."""

    dims: tuple[int | None, ...]
    export: tuple[int, ...]
    resizes: bool = False

    @classmethod
    def of(cls, clf: Classifier) -> TensorSpec:
        """The tensor ``clf``'s graph takes (pixels of any size for one that preprocesses
        itself, warmed up at its crop size)."""
        if clf.embedded:
            crop, channels = clf.pre.crop_size, clf.pre.channels
            return cls((None, None, channels), (crop, crop, channels), resizes=True)
        shape = clf.input_shape
        sample = [
            d if isinstance(d, int) else clf.pre.input_size[i - 1] for i, d in enumerate(shape)
        ]
        return cls(tuple(d if isinstance(d, int) else None for d in shape[1:]), tuple(sample[1:]))

    @property
    def free(self) -> bool:
        """Some dimension takes any size."""
        return None in self.dims

    def cost(self, x: np.ndarray) -> float:
        """``x``'s work in samples at the export size, what ``--max-batch`` counts: a sample
        with n times the export size's values counts n times, a smaller one once (it still
        takes a slot of the batch)."""
        if self.resizes or not self.free:
            return float(len(x))
        return len(x) * max(1.0, x[0].size / math.prod(self.export))


def check_tensor(
    inputs: list[tuple[str, np.ndarray]],
    clf: Classifier,
    spec: TensorSpec,
    *,
    max_batch: int,
    max_image_pixels: int,
) -> np.ndarray:
    """The one input tensor of a v2 request, if the model takes it: its name, dtype, shape
    (``[batch, *spec.dims]``, any size where the graph leaves it free, worth at most
    ``max_batch`` samples of the export size; or any-size uint8 pixels for a graph that
    preprocesses itself, within ``max_image_pixels``), a batch within ``max_batch``, finite
    values within the graph's input type.

    Raises:
        InputError: naming what is wrong and what the model takes.
    """
    if len(inputs) != 1:
        raise InputError(
            f"this model takes exactly one input ({clf.input_name!r}), got {len(inputs)}"
        )
    name, x = inputs[0]
    if name != clf.input_name:
        raise InputError(f"unknown input {name!r}; the model's input is {clf.input_name!r}")
    if clf.embedded:
        return _check_pixels(name, x, clf.pre.channels, max_batch, max_image_pixels)
    if x.dtype != np.float32:
        raise InputError(f"input {name!r} must be FP32, got {datatype_of(x.dtype)}")
    dims = spec.dims
    if x.ndim != 1 + len(dims) or any(
        d is not None and n != d for n, d in zip(x.shape[1:], dims, strict=True)
    ):
        raise InputError(
            f"input {name!r} has shape {list(x.shape)}; expected [batch, "
            f"{', '.join('any' if d is None else str(d) for d in dims)}]"
        )
    if spec.free and 0 in x.shape[1:]:
        raise InputError(f"input {name!r} has shape {list(x.shape)}: an empty dimension")
    if not 1 <= len(x) <= max_batch:
        raise InputError(f"batch of {len(x)} is outside 1..{max_batch} (--max-batch)")
    if (cost := spec.cost(x)) > max_batch:  # a bigger size is more work: bounded as a batch
        raise InputError(
            f"input {name!r} has shape {list(x.shape)}: as much work as {cost:.3g} samples of "
            f"the export size [{', '.join(map(str, spec.export))}], over --max-batch "
            f"({max_batch}): send fewer samples or a smaller size"
        )
    if not np.isfinite(x).all():
        raise InputError(f"input {name!r} contains NaN or infinite values")
    if clf.half_io and float(np.abs(x).max()) > HALF_MAX:
        raise InputError(
            f"input {name!r} has values beyond float16's range (±{HALF_MAX:g}), which this "
            "model (exported with --fp16-io) takes"
        )
    return x


def _check_pixels(
    name: str, x: np.ndarray, c: int, max_batch: int, max_image_pixels: int
) -> np.ndarray:
    """A graph that preprocesses itself takes decoded pixels: uint8 ``[batch, height,
    width, channels]``, any size within ``--max-image-pixels``."""
    if x.dtype != np.uint8:
        raise InputError(f"input {name!r} must be UINT8 pixels, got {datatype_of(x.dtype)}")
    if x.ndim != 4 or x.shape[-1] != c or 0 in x.shape:
        raise InputError(
            f"input {name!r} has shape {list(x.shape)}; expected [batch, height, width, {c}]"
        )
    check_aspect(x.shape[2], x.shape[1])
    if x.shape[1] * x.shape[2] > max_image_pixels:
        raise InputError(
            f"input {name!r}: {x.shape[2]}x{x.shape[1]} pixels is over the limit of "
            f"{max_image_pixels} (--max-image-pixels)"
        )
    if not 1 <= len(x) <= max_batch:
        raise InputError(f"batch of {len(x)} is outside 1..{max_batch} (--max-batch)")
    return x
