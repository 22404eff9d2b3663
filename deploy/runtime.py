"""onnxruntime sessions with explicit threads and an asserted provider, plus top-k
classification from the metadata embedded in the file. Graphs with a fixed batch dimension are
padded and chunked here, in one place (``run_padded``), for predict, serve, parity and bench."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.embeddings import flat, with_feature_output
from zoo.deploy.onnx_meta import read_metadata, read_preprocessing
from zoo.deploy.preprocess import preprocess, scores
from zoo.errors import BackendUnavailableError, InputError
from zoo.images import open_image
from zoo.system import available_cpus


def run_padded(run: Callable[[np.ndarray], np.ndarray], x: np.ndarray, batch: int) -> np.ndarray:
    """Run ``x`` in chunks of exactly ``batch`` samples, for graphs with a fixed batch.

    The last chunk is padded with copies of its last sample (real values, never zeros that a
    model may not expect) and the padding's outputs are dropped.

    Args:
        run: one call of the graph on exactly ``batch`` samples.
        x: any number of samples, ``len(x) >= 1``.
        batch: the graph's batch dimension.

    Returns:
        ``len(x)`` outputs, in order.
    """
    if len(x) == batch:
        return run(x)
    outs = []
    for i in range(0, len(x), batch):
        chunk = x[i : i + batch]
        n = len(chunk)
        if n < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - n, axis=0)])
        outs.append(run(chunk)[:n])
    return np.concatenate(outs)


def static_batch_of(session: Any) -> int | None:
    """The fixed batch dimension of a session's first input, or None when it is dynamic."""
    dim = session.get_inputs()[0].shape[0]
    return dim if isinstance(dim, int) and dim > 0 else None


PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def make_session(
    path: str | Path | bytes, *, device: str = "cpu", threads: int | None = None, spin: bool = True
) -> Any:
    """An ``InferenceSession`` on ``device``; raises if the provider is missing or the session
    silently fell back to another one (never a CPU number labelled CUDA).

    ``spin=False`` stops ORT's idle worker threads from busy-waiting: right for a server, whose
    cores also decode images and speak HTTP (bench/serve_peers.py: ORT used 15 instead of 18
    ms of CPU per image request)."""
    import onnxruntime as ort

    provider = PROVIDERS.get(device.split(":")[0])
    if provider is None:
        raise InputError(f"Unknown device {device!r}: use cpu or cuda.")
    available = ort.get_available_providers()
    if provider not in available:
        raise BackendUnavailableError(
            f"{provider} is not available in this onnxruntime ({', '.join(available)}). "
            "For CUDA install onnxruntime-gpu matching your CUDA version."
        )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or available_cpus()
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        source = path if isinstance(path, bytes) else str(path)
        sess = ort.InferenceSession(source, sess_options=opts, providers=[provider])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        where = "the model" if isinstance(path, bytes) else path
        raise InputError(f"onnxruntime cannot load {where}: {exc}") from exc
    if sess.get_providers()[0] != provider:
        raise BackendUnavailableError(
            f"Asked for {provider} but the session runs on {sess.get_providers()[0]}."
        )
    return sess


@dataclass
class Prediction:
    label: str
    index: int
    score: float


class OnnxClassifier:
    """An exported zoo model: preprocessing and class names come from its metadata."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "cpu",
        threads: int | None = None,
        spin: bool = True,
        embeddings: bool = False,
    ) -> None:
        self.path = Path(path)
        self.meta = read_metadata(self.path)
        self.pre = read_preprocessing(self.meta, self.path)
        t0 = time.perf_counter()
        source: Path | bytes = self.path
        self.feature_name: str | None = None  # embeddings: the second output's name
        if embeddings:
            source, self.feature_name = with_feature_output(self.path)
        self.session = make_session(source, device=device, threads=threads, spin=spin)
        self.load_s = time.perf_counter() - t0
        self.input = self.session.get_inputs()[0]
        self.static_batch = static_batch_of(self.session)
        self.output_name = self.session.get_outputs()[0].name
        self.classes: list[str] = list(self.meta.get("class_names") or [])
        self.multi_label = bool(self.meta.get("multi_label", False))
        # zoo export --embed-preprocessing: the graph takes uint8 (N, H, W, C) decoded pixels
        self.embedded = self.input.type == "tensor(uint8)"
        # zoo export --fp16-io: float16 at the graph's boundary, cast here both ways
        self.half_io = self.input.type == "tensor(float16)"

    def prepare(self, image: Any) -> np.ndarray:
        """One decoded image as the graph takes it: ``(C, H, W)`` float32 preprocessed here,
        or the ``(H, W, C)`` uint8 pixels a graph with embedded preprocessing resizes itself."""
        if self.embedded:
            from zoo.deploy.graph_preprocess import pixels

            return pixels(image, self.pre.channels)
        return preprocess(image, self.pre)

    def run_each(self, samples: list[np.ndarray]) -> np.ndarray:
        """Logits of samples that may differ in size (pixels for an embedded graph): one
        batch when they share a shape, one call each otherwise."""
        if len({x.shape for x in samples}) == 1:
            return self.run(np.stack(samples))
        return np.concatenate([self.run(x[None]) for x in samples])

    def _run_once(self, batch: np.ndarray) -> np.ndarray:
        if self.half_io:
            x = batch.astype(np.float16)
            return self.session.run([self.output_name], {self.input.name: x})[0].astype(np.float32)
        return self.session.run([self.output_name], {self.input.name: batch})[0]

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Logits for any number of samples (padded and chunked for a fixed-batch graph)."""
        if self.static_batch is None:
            return self._run_once(batch)
        return run_padded(self._run_once, batch, self.static_batch)

    def run_with_features(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logits and penultimate features (``(N, D)`` float32) in one pass; needs
        ``embeddings=True``."""
        if self.feature_name is None:
            raise ValueError("OnnxClassifier(embeddings=True) is needed for features.")
        names = [self.output_name, self.feature_name]
        width = 0

        def both(x: np.ndarray) -> np.ndarray:  # one array, so run_padded chunks it as usual
            nonlocal width
            logits, feats = self.session.run(names, {self.input.name: x})
            width = logits.shape[1]
            return np.concatenate([logits, flat(feats).astype(logits.dtype)], axis=1)

        out = (
            both(batch) if self.static_batch is None else run_padded(both, batch, self.static_batch)
        )
        return out[:, :width], flat(out[:, width:])

    def preprocess_images(self, images: list[Any]) -> list[np.ndarray]:
        return [
            self.prepare(im if not isinstance(im, str | Path | bytes) else open_image(im))
            for im in images
        ]

    def classify(self, images: list[Any], k: int = 5) -> list[list[Prediction]]:
        probs = scores(self.run_each(self.preprocess_images(images)), self.multi_label)
        out = []
        for row in probs:
            top = np.argsort(-row)[:k]
            out.append(
                [
                    Prediction(
                        self.classes[i] if i < len(self.classes) else str(i), int(i), float(row[i])
                    )
                    for i in top
                ]
            )
        return out
