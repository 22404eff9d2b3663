"""``zoo export RUN --format kserve``: a fine-tuned run → an ``InferenceService`` read back with
KServe's own SDK classes → the Triton repository it points at, loaded in ONNX Runtime → the
``zoo`` runtime's container arguments and the ``Dockerfile``'s health check run against a real
``zoo serve`` on loopback. Docker itself is not here: the image is never built."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import httpx
import numpy as np
import pytest

from tests.conftest import ROOT, run_zoo, zoo_here
from tests.serving import free_port, server
from zoo.deploy.export import kserve as ks
from zoo.errors import ExportError

pytestmark = pytest.mark.slow

STORAGE = "s3://zoo-models/digits"
IMAGE = "registry.example.com/zoo-serve:0.1"
KEY = "kserve-manifest-test-key-0123456789"
BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from zoo.samples import write_digits_folder

    return write_digits_folder(tmp_path_factory.mktemp("digits") / "digits", per_class=10)


@pytest.fixture(scope="module")
def run(digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fine-tune of real digits (simple_cnn, 32 px, one epoch)."""
    root = tmp_path_factory.mktemp("runs")
    r = run_zoo(
        *("finetune", "simple_cnn", "--data", str(digits), "--epochs", "1"),
        *("--image-size", "32", "--no-progress", "--num-workers", "0"),
        *("--runs", str(root), "--name", "digits"),
    )
    assert r.returncode == 0, r.stderr
    return root / "digits"


def _export(run: Path, out: Path, *args: str) -> tuple[Path, dict[str, Any], str]:
    """``zoo export RUN --format kserve -o out/isvc.yaml ARGS --json``, its durable writes
    traced: the manifest, the ``--json`` and the trace."""
    trace = out / "trace.tsv"
    r = run_zoo(
        *("export", str(run), "--format", "kserve", "-o", str(out / "isvc.yaml"), *args, "--json"),
        env={"ZOO_FAULT_TRACE": str(trace)},
    )
    assert r.returncode == 0, r.stderr
    return out / "isvc.yaml", json.loads(r.stdout), trace.read_text() + r.stderr


@pytest.fixture(scope="module")
def triton(run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    return _export(run, tmp_path_factory.mktemp("triton"))


@pytest.fixture(scope="module")
def zoo_runtime(run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    return _export(
        run,
        tmp_path_factory.mktemp("zoo"),
        *("--kserve-runtime", "zoo", "--storage-uri", STORAGE, "--image", IMAGE),
    )


def _digit_batch(digits: Path, model: Path) -> np.ndarray:
    """Ten real digits, one per class, preprocessed as the ONNX file's metadata says."""
    from PIL import Image

    from zoo.onnx_meta import read_metadata, read_preprocessing
    from zoo.preprocess import preprocess

    pre = read_preprocessing(read_metadata(model), model)
    paths = [sorted(d.glob("*.png"))[0] for d in sorted(digits.iterdir())]
    return np.stack([preprocess(Image.open(p).convert("RGB"), pre) for p in paths])


def _ort(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["logits"], {"input": x})[0])


def test_triton_runtime_manifest_reads_back_and_its_repository_loads(
    triton: tuple[Path, dict, str], run: Path, digits: Path
) -> None:
    import kserve

    from zoo.deploy.export.triton import validate_config

    manifest, report, trace = triton
    isvc = ks.load_manifest(manifest.read_text())
    assert isinstance(isvc, kserve.V1beta1InferenceService)
    assert (isvc.api_version, isvc.kind) == ("serving.kserve.io/v1beta1", "InferenceService")
    model = isvc.spec.predictor.model
    assert isinstance(model, kserve.V1beta1ModelSpec) and not isvc.spec.predictor.containers
    assert (model.model_format.name, model.protocol_version) == ("triton", "v2")

    # storageUri is the file:// URI of the repository written beside the manifest
    uri = urlparse(model.storage_uri)
    repo = Path(url2pathname(uri.path))
    assert uri.scheme == "file" and repo == manifest.parent.resolve() / "isvc_model_repository"
    assert [p.name for p in repo.iterdir()] == [report["model_name"]]
    name = report["model_name"]
    assert isvc.metadata.name == ks.service_name(name) == "simple-cnn-ft-digits"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", isvc.metadata.name)
    assert isvc.metadata.annotations["zoo.model-name"] == name
    assert report["parity"]["passed"] and report["runtime"] == "triton"
    assert "export again with --storage-uri" in trace  # no URI given: said where it points

    cfg = validate_config((repo / name / "config.pbtxt").read_text())
    classes = json.loads((run / "classes.json").read_text())
    labels = (repo / name / "labels.txt").read_text().splitlines()
    assert cfg.name == name and cfg.max_batch_size == 32 and labels == classes
    onnx_file = repo / name / "1" / "model.onnx"
    logits = _ort(onnx_file, _digit_batch(digits, onnx_file))
    assert logits.shape == (10, len(classes)) == (10, cfg.output[0].dims[0])
    assert np.isfinite(logits).all()

    # the repository is swapped in whole first, the manifest written (durably) last
    labels_written = [line.split("\t")[1] for line in trace.splitlines() if "\t" in line]
    assert labels_written[-1] == "isvc.yaml" and name in labels_written[:-1]


def _container(manifest: Path) -> Any:
    isvc = ks.load_manifest(manifest.read_text())
    assert isvc.spec.predictor.model is None
    (container,) = isvc.spec.predictor.containers
    return container


def _local_args(args: list[str], mount: Path) -> tuple[str, list[str]]:
    """A container's ``zoo serve`` arguments for loopback here: what KServe mounts at
    ``/mnt/models`` → ``mount``, ``--host``/``--port`` left to :func:`tests.serving.server`."""
    model, rest = Path(args[0]), args[1:]
    assert model.is_relative_to(ks.MODEL_MOUNT), args
    kept: list[str] = []
    pairs = iter(rest)
    for flag in pairs:
        value = next(pairs)
        assert flag.startswith("--"), args
        if flag not in ("--host", "--port"):
            kept += [flag, value]
    return str(mount / model.relative_to(ks.MODEL_MOUNT)), kept


@pytest.mark.serve
def test_zoo_runtime_container_serves_the_repository_on_its_probes(
    zoo_runtime: tuple[Path, dict, str], digits: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.client import V1Container

    manifest, report, trace = zoo_runtime
    name, repo = report["model_name"], Path(report["repository"])
    c = _container(manifest)
    assert isinstance(c, V1Container) and c.image == IMAGE and c.name == "kserve-container"
    assert [(p.container_port, p.name) for p in c.ports] == [(8080, "http1")]
    env = {e.name: e for e in c.env}
    assert env.keys() == {"STORAGE_URI", "ZOO_API_KEY"} and env["STORAGE_URI"].value == STORAGE
    secret = env["ZOO_API_KEY"].value_from.secret_key_ref
    assert (secret.name, secret.key) == ("simple-cnn-ft-digits-api-key", "api-key")
    assert c.security_context.run_as_non_root and c.security_context.run_as_user == 1000
    assert not c.security_context.allow_privilege_escalation
    assert c.resources.limits == c.resources.requests == {"cpu": "2", "memory": "2Gi"}
    probes = {"readiness": c.readiness_probe, "liveness": c.liveness_probe}
    assert {k: (p.http_get.path, p.http_get.port) for k, p in probes.items()} == {
        "readiness": ("/v2/health/ready", 8080),
        "liveness": ("/v2/health/live", 8080),
    }
    assert (
        c.args[c.args.index("--port") + 1] == "8080"
        and c.args[c.args.index("--host") + 1] == "0.0.0.0"
    )
    assert "export again with --storage-uri" not in trace  # the URI was given

    # the container's own arguments, the mount swapped for the repository written here
    model, args = _local_args(c.args, repo)
    x = _digit_batch(digits, Path(model))
    monkeypatch.setenv("ZOO_API_KEY", KEY)  # as Kubernetes sets it from the Secret
    with server(model, *args) as (url, _):
        for probe in probes.values():  # probes carry no key
            assert httpx.get(url + probe.http_get.path).status_code == 200
        meta = httpx.get(f"{url}/v2/models/{name}", headers=BEARER).json()
        assert meta["name"] == name and meta["parameters"]["max_batch"] == 32
        body = {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        }
        r = httpx.post(f"{url}/v2/models/{name}/infer", json=body, headers=BEARER, timeout=30)
        assert r.status_code == 200, r.text
    served = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(10, -1)
    np.testing.assert_allclose(served, _ort(Path(model), x), rtol=1e-4, atol=1e-5)


@pytest.mark.serve
def test_dockerfile_is_non_root_and_its_healthcheck_passes_on_a_real_server(
    zoo_runtime: tuple[Path, dict, str],
) -> None:
    from dockerfile_parse import DockerfileParser

    manifest, report, _ = zoo_runtime
    docker = DockerfileParser(str(ROOT / "Dockerfile"))
    instructions: dict[str, list[str]] = {}
    for item in docker.structure:
        instructions.setdefault(item["instruction"], []).append(item["value"])
    (user,) = instructions["USER"]
    assert user.isdigit() and int(user) == ks.RUN_AS != 0  # numeric: runAsNonRoot can check it
    assert instructions["EXPOSE"] == [str(ks.PORT)]
    assert json.loads(instructions["ENTRYPOINT"][0]) == ["zoo", "serve"]
    (healthcheck,) = instructions["HEALTHCHECK"]
    probe = json.loads(healthcheck.partition(" CMD ")[2])
    assert probe[0] == "python" and f"127.0.0.1:{ks.PORT}{ks.READY_PATH}" in probe[-1]
    # the manifest deploys this image: its port and readiness path are the Dockerfile's
    c = _container(manifest)
    assert c.ports[0].container_port == ks.PORT and c.readiness_probe.http_get.path == ks.READY_PATH

    # the image's default command (a model folder mounted at /mnt/models), on loopback here
    mounted = Path(report["repository"]) / report["model_name"] / "1"  # docker run -v …:/mnt/models
    model, args = _local_args(json.loads(instructions["CMD"][0]), mounted)
    assert model == str(mounted)
    with server(model, *args) as (url, _):
        port = url.rsplit(":", 1)[1]
        check = [sys.executable, *probe[1:-1], probe[-1].replace(f":{ks.PORT}/", f":{port}/")]
        assert subprocess.run(check, timeout=30, env=os.environ).returncode == 0
    # and the same check fails where nothing answers (it is not a no-op)
    idle = probe[-1].replace(f":{ks.PORT}/", f":{free_port()}/")
    assert subprocess.run([sys.executable, *probe[1:-1], idle], capture_output=True).returncode != 0


def test_load_manifest_refuses_what_kserve_lacks(zoo_runtime: tuple[Path, dict, str]) -> None:
    import yaml

    doc = yaml.safe_load(zoo_runtime[0].read_text())
    container = doc["spec"]["predictor"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")  # a typo the SDK would drop
    with pytest.raises(ExportError, match=r"spec\.predictor\.containers\[0\]\.readinesProbe"):
        ks.load_manifest(yaml.safe_dump(doc))
    with pytest.raises(ExportError, match="not a KServe InferenceService"):
        ks.load_manifest(yaml.safe_dump({**doc, "kind": "Deployment"}))


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--kserve-runtime", "tritn"], 2, "Did you mean 'triton'?"),
        (["--storage-uri", "bucket/models"], 2, "'bucket/models' is not a storage URI"),
        (["--image", "zoo-serve:1"], 2, "--image names the zoo serve container"),
        (["--format", "onnx", "--storage-uri", STORAGE], 2, "applies to --format kserve"),
        (["--max-batch", "0"], 2, "--max-batch 0: give at least 1"),
        (["--format", "triton", "--max-batch", "-3"], 2, "--max-batch -3: give at least 1"),
    ],
)
def test_bad_options_are_usage_errors(
    args: list[str], code: int, message: str, tmp_path: Path
) -> None:
    r = run_zoo("export", "simple_cnn", "--format", "kserve", *args, cwd=tmp_path)
    assert r.returncode == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir()), "nothing written"


def test_a_missing_run_exits_1_naming_it(tmp_path: Path) -> None:
    r = run_zoo("export", "runs/nope", "--format", "kserve", "-o", "isvc.yaml", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "'runs/nope' does not exist" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir()), "nothing written"


def test_an_output_of_the_wrong_kind_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """kserve's -o is the manifest, a file: a folder there was written beside (the Triton
    repository) and then a traceback; triton's -o is a repository, a folder: a file there
    raised FileExistsError. Both exit 1 now, naming the path, and nothing is written."""
    folder, a_file = tmp_path / "out", tmp_path / "f.txt"
    folder.mkdir()
    a_file.write_text("keep")
    for fmt, target, words in (("kserve", folder, "is a folder"), ("triton", a_file, "is a file")):
        r = zoo_here("export", "simple_cnn", "--format", fmt, "-o", str(target), cwd=tmp_path)
        assert r.returncode == 1, (fmt, r.stderr)
        assert f"-o {target} {words}" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "out"]
    assert not list(folder.iterdir()) and a_file.read_text() == "keep"


def test_a_second_export_to_the_same_manifest_replaces_its_repository_whole(
    triton: tuple[Path, dict, str], tmp_path: Path
) -> None:
    """Exporting another model to the same ``-o`` rewrote the manifest but left the first
    model in the repository its ``storageUri`` names, for Triton to load as well."""
    import shutil

    manifest, report, _ = triton
    out = tmp_path / "again"
    shutil.copytree(manifest.parent, out)
    r = zoo_here("export", "simple_cnn", "--format", "kserve", "-o", str(out / "isvc.yaml"))
    assert r.returncode == 0, r.stderr
    repo = out / "isvc_model_repository"
    names = [p.name for p in repo.iterdir()]
    assert len(names) == 1 and names != [report["model_name"]], names
    isvc = ks.load_manifest((out / "isvc.yaml").read_text())
    assert isvc.metadata.annotations["zoo.model-name"] == names[0]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no scratch left
