"""Seams of ``zoo serve`` a new user met: a two-model server (a worker process each) starts
without a warning about the other worker's relay socket (the workers open theirs at about
the same time: a request in the first moments waits for the peer), while a peer that never
opens its socket is still reported, naming the file; the ready line of an int8 file says
int8, not fp32; a Triton model repository is refused first, saying what it is and which
``.onnx`` file to serve instead, with no export warning that never comes true."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path

import pytest

from tests.conftest import run_zoo
from tests.serving import free_port, server
from zoo.deploy.serve import relay
from zoo.deploy.serve.model import precision_of
from zoo.deploy.serve.protocol import IndexEntry
from zoo.deploy.serve.relay import Peers

pytestmark = pytest.mark.serve

KEY = "seams-key-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def cnn_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CNN exported by ``zoo export`` (its registry weights: quick to load twice)."""
    out = tmp_path_factory.mktemp("seams") / "cnn.onnx"
    r = run_zoo("export", "simple_cnn", "-o", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_a_two_model_server_starts_without_a_relay_warning(cnn_onnx: Path, tmp_path: Path) -> None:
    """``zoo serve a=… b=… --api-key-file … --grpc-port …``: the readiness probe from the first
    moment (``server`` polls at once), the index and each model answer; the log holds no
    warning (the probe used to reach one worker before the other had opened its relay socket:
    ``worker 1 (b): [Errno 2] No such file or directory``)."""
    import httpx

    keys = tmp_path / "keys.txt"
    keys.write_text(f"{KEY}\n")
    os.chmod(keys, 0o600)
    log = tmp_path / "server.log"
    args = ["--api-key-file", str(keys), "--grpc-port", str(free_port())]
    with server(f"a={cnn_onnx}", f"b={cnn_onnx}", *args, log=log) as (url, _):
        auth = {"Authorization": f"Bearer {KEY}"}
        index = httpx.get(f"{url}/v2/repository/index", headers=auth).json()
        assert [(e["name"], e["state"]) for e in index] == [("a", "READY"), ("b", "READY")]
        for name in ("a", "b"):
            assert httpx.get(f"{url}/v2/models/{name}/ready", headers=auth).status_code == 200
    text = log.read_text(errors="replace")
    assert len(re.findall(r"model '[ab]' ready", text)) == 2, text
    assert "WARNING" not in text and "No such file" not in text, text


def test_a_peer_that_never_opens_its_socket_is_reported_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the start-up wait, a worker whose relay socket is not there is UNAVAILABLE, and
    the warning names the missing file and what it means."""
    monkeypatch.setattr(relay, "PEER_START_S", 0.2)
    peers = Peers({"a": 0, "b": 1}, 0, tmp_path)
    with caplog.at_level(logging.WARNING, "zoo.serve"):
        entries = asyncio.run(peers.entries([IndexEntry("a", "1", "READY", "")]))
    assert [(e.name, e.state) for e in entries] == [("a", "READY"), ("b", "UNAVAILABLE")]
    warned = caplog.text
    assert f"its relay socket {tmp_path / '1.sock'} is not there" in warned, warned
    assert "worker 1 is not serving (not started yet, restarting, or exited" in warned, warned


def test_a_peer_that_opens_its_socket_late_is_waited_for(tmp_path: Path) -> None:
    """Within the start-up wait, a call to a worker whose socket is not there yet waits for
    it, and gets its answer."""
    asker, late = Peers({"a": 0, "b": 1}, 0, tmp_path), Peers({"a": 0, "b": 1}, 1, tmp_path)
    mine = [IndexEntry("b", "1", "READY", "")]

    async def main() -> list[IndexEntry]:
        async def http(call: relay.HttpCall) -> relay.HttpReply:
            raise AssertionError("no HTTP call here")

        async def open_later() -> None:
            await asyncio.sleep(0.3)
            await late.open(http, None, lambda: mine)

        opening = asyncio.get_running_loop().create_task(open_later())
        try:
            return await asyncio.wait_for(asker.entries([IndexEntry("a", "1", "READY", "")]), 5)
        finally:
            await opening
            await late.close(1)
            await asker.close(1)

    entries = asyncio.run(main())
    assert [(e.name, e.state) for e in entries] == [("a", "READY"), ("b", "READY")]


def test_precision_of_a_quantized_file_is_int8() -> None:
    fp32 = {"precision": "fp32"}
    assert precision_of(fp32) == "fp32"
    assert precision_of({}) == "fp32"
    assert precision_of({"precision": "fp16"}) == "fp16"
    # zoo quantize keeps its fp32 source's metadata (precision included) and adds quantization
    assert precision_of({**fp32, "quantization": {"mode": "static", "engine": "ort"}}) == (
        "int8 (static)"
    )
    assert precision_of({**fp32, "quantization": {"mode": "static", "engine": "nncf"}}) == (
        "int8 (nncf)"
    )


def test_the_ready_line_of_an_int8_file_says_int8(cnn_onnx: Path, tmp_path: Path) -> None:
    """``zoo quantize --mode dynamic`` on real digits, then ``zoo serve q8=FILE``: the ready
    line says ``onnxruntime int8 (dynamic)``, not fp32."""
    from zoo.samples import write_digits_folder

    digits = write_digits_folder(tmp_path / "digits", per_class=3)
    q8 = tmp_path / "int8-dynamic.onnx"
    r = run_zoo(
        "quantize", str(cnn_onnx), "--mode", "dynamic", "--data", str(digits), "-o", str(q8),
        "--allow-drop",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    log = tmp_path / "server.log"
    with server(f"q8={q8}", log=log):
        pass
    text = log.read_text(errors="replace")
    assert f"model 'q8' ready ({q8}) in onnxruntime int8 (dynamic) on cpu" in text, text
    assert "fp32 on cpu" not in text, text


def test_a_triton_repository_is_refused_first_naming_the_onnx_to_serve(tmp_path: Path) -> None:
    """``zoo serve REPO`` (and ``REPO/NAME``) of ``zoo export --format triton``: exit 1 at once,
    saying it is a Triton repository and naming ``NAME=REPO/NAME/1/model.onnx`` to serve; no
    warning about an export that never happens, no traceback."""
    repo = tmp_path / "repo"
    r = run_zoo("export", "simple_cnn", "--format", "triton", "-o", str(repo))
    assert r.returncode == 0, r.stderr
    (model,) = [p for p in repo.iterdir() if (p / "config.pbtxt").is_file()]
    onnx = model / "1" / "model.onnx"
    for given, what in ((repo, "a Triton model repository"), (model, "a Triton model's folder")):
        r = run_zoo("serve", str(given), "--port", str(free_port()), timeout=120)
        assert r.returncode == 1, r.stderr
        assert f"{given} is {what}" in r.stderr, r.stderr
        assert f"zoo serve {model.name}={onnx}" in r.stderr, r.stderr
        assert "exporting" not in r.stderr and "Traceback" not in r.stderr, r.stderr
