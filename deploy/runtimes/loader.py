"""onnxruntime sessions with explicit threads and an asserted provider, the ONNX Runtime
:class:`~zoo.deploy.runtimes.classifier.Classifier`, and :func:`load_classifier`, which picks the runtime
for a model file."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.predict.embeddings import flat, with_feature_output
from zoo.deploy.runtimes.classifier import Classifier, Prediction, run_padded
from zoo.errors import BackendUnavailableError, InputError
from zoo.knn import KNN_OUTPUT
from zoo.onnx_meta import read_metadata
from zoo.system import available_cpus


def static_batch_of(session: Any) -> int | None:
    """The fixed batch dimension of a session's first input, or None when it is dynamic."""
    dim = session.get_inputs()[0].shape[0]
    return dim if isinstance(dim, int) and dim > 0 else None


PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
log = logging.getLogger("zoo.runtimes")


def make_session(
    path: str | Path | bytes, *, device: str = "cpu", threads: int | None = None, spin: bool = True
) -> Any:
    """An ``InferenceSession`` on ``device``; raises if the provider is missing or the session
    silently fell back to another one (never a CPU number labelled CUDA).

    ``spin=False`` stops ORT's idle worker threads from busy-waiting: right for a server, whose
    cores also decode images and speak HTTP (bench/serve_peers.py: ORT used 15 instead of 18
    ms of CPU per image request)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if device == "auto":  # CUDA where this onnxruntime and the machine have it, else the CPU
        from zoo.device import pick_device

        if PROVIDERS["cuda"] in available and pick_device("auto").type == "cuda":
            try:
                return make_session(path, device="cuda", threads=threads, spin=spin)
            except BackendUnavailableError as exc:  # e.g. CUDA libraries that do not load
                log.warning("onnxruntime runs on the CPU: %s", exc)
        device = "cpu"
    provider = PROVIDERS.get(device.split(":")[0])
    if provider is None:
        raise InputError(f"Unknown device {device!r}: use cpu, cuda or auto.")
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


class OnnxClassifier(Classifier):
    """An exported zoo model in ONNX Runtime."""

    runtime = "onnxruntime"

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
        t0 = time.perf_counter()
        source: Path | bytes = self.path
        self.feature_name: str | None = None  # embeddings: the second output's name
        if embeddings:
            source, self.feature_name = with_feature_output(self.path)
        self.session = make_session(source, device=device, threads=threads, spin=spin)
        self.load_s = time.perf_counter() - t0
        self.input = self.session.get_inputs()[0]
        self.input_shape, self.input_type = list(self.input.shape), self.input.type
        self.input_name, self.output_name = self.input.name, self.session.get_outputs()[0].name
        self.knn = KNN_OUTPUT in {o.name for o in self.session.get_outputs()}
        self._names = [self.output_name, *([KNN_OUTPUT] if self.knn else [])]
        width = self.session.get_outputs()[0].shape[-1]
        self.width = width if isinstance(width, int) else None
        self.threads = self.session.get_session_options().intra_op_num_threads
        self._init_common()

    def _run_once(self, batch: np.ndarray) -> np.ndarray:
        x = batch.astype(np.float16) if self.half_io else batch
        found = self.session.run(self._names, {self.input.name: x})
        logits = found[0].astype(np.float32, copy=False)
        if not self.knn:
            return logits
        return np.concatenate([logits, found[1].reshape(-1, 1).astype(np.float32)], axis=1)

    def _outputs_with_features(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`outputs` and penultimate features (``(N, D)`` float32) in one pass; needs
        ``embeddings=True``. Like :meth:`_run_once`: float16 in for an ``--fp16-io`` graph,
        and everything back as float32 (an fp16 graph's features are float16 inside it)."""
        if self.feature_name is None:
            raise ValueError("OnnxClassifier(embeddings=True) is needed for features.")
        names = [*self._names, self.feature_name]
        width = 0

        def both(chunk: np.ndarray) -> np.ndarray:  # one array: run_padded chunks it as usual
            nonlocal width
            x = chunk.astype(np.float16) if self.half_io else chunk
            *outs, feats = self.session.run(names, {self.input.name: x})
            logits = np.concatenate(
                [np.asarray(o, np.float32).reshape(len(o), -1) for o in outs], axis=1
            )
            width = logits.shape[1]
            return np.concatenate([logits, flat(feats)], axis=1)

        out = (
            both(batch) if self.static_batch is None else run_padded(both, batch, self.static_batch)
        )
        return out[:, :width], flat(out[:, width:])


def load_classifier(
    path: str | Path,
    *,
    runtime: str = "auto",
    device: str = "cpu",
    threads: int | None = None,
    spin: bool = True,
    embeddings: bool = False,
) -> Classifier:
    """The runtime for a model file: an ``.xml`` IR (or ``runtime="openvino"``) in OpenVINO
    (:mod:`zoo.deploy.runtimes.openvino`), an ``.onnx`` file in ONNX Runtime.

    Raises:
        InputError: an IR with ``runtime="onnxruntime"``, or embeddings asked of OpenVINO.
        BackendUnavailableError: the runtime or device is not available.
    """
    from zoo.deploy.choices import RUNTIMES
    from zoo.errors import ChoiceError

    ChoiceError.check("runtime", runtime, RUNTIMES)
    is_ir = Path(path).suffix == ".xml"
    if is_ir and runtime == "onnxruntime":
        raise InputError(f"{path} is an OpenVINO IR: run it with --runtime openvino (or auto).")
    if is_ir or runtime == "openvino":
        if embeddings:
            raise InputError(
                "--embeddings reads a second output that zoo adds to ONNX graphs, in ONNX "
                "Runtime: give the .onnx file the IR was exported from (zoo export MODEL)."
            )
        from zoo.deploy.runtimes.openvino import OpenVinoClassifier

        return OpenVinoClassifier(path, device=device, threads=threads)
    return OnnxClassifier(path, device=device, threads=threads, spin=spin, embeddings=embeddings)


__all__ = [
    "Classifier",
    "OnnxClassifier",
    "Prediction",
    "load_classifier",
    "make_session",
    "run_padded",
    "static_batch_of",
]
