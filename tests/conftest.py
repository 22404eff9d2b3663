"""Shared fixtures. Tests never touch the network: the Hub is offline, and the real
MobileNetV2 ImageNet weights come from torch hub's cache (scripts/fetch_test_weights.sh)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["ZOO_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# the report at the end of every `zoo finetune` costs an evaluation pass; the suite runs
# dozens of them, so only the tests of the report ask for it (`--report`)
os.environ.setdefault("ZOO_FINETUNE_REPORT", "0")
# `-n auto` runs one xdist worker per CPU, and each worker's torch (and every zoo command it
# starts) would take every CPU for itself: N workers × N threads on N cores, whose spinning
# threads wait on each other. Measured on 2 cores, four training-heavy files (2 workers):
# 150 s with torch's default threads, 97 s with one each. A worker's share, unless set.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1:
    from zoo.system import available_cpus  # no torch: it reads the variable when imported

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, available_cpus() // _WORKERS)))
# Everything a test session writes to the temporary folder goes into one folder of its own,
# removed when the session ends: pytest's tmp_path, the processes the tests start (Ray's
# session files, torchrun's, multiprocessing's, a killed command's scratch) through TMPDIR,
# and zoo's cache. One session used to leave ~2.5 GB in /tmp, which filled CI's disk.
# ZOO_KEEP_TEST_TMP=1 keeps it (its path is printed at the end). xdist workers and nested
# pytest runs inherit it. A session that dies before its exit handlers run (SIGKILL, mutmut's
# os._exit) leaves its folder: the next session removes it, its owner's pid being gone.
_PID_FILE = "owner.pid"


def _remove_dead_sessions(base: str) -> None:
    import shutil

    for folder in Path(base).glob("zoo-tests-*"):
        try:
            pid = int((folder / _PID_FILE).read_text())
        except (OSError, ValueError):
            continue  # being created, or kept (ZOO_KEEP_TEST_TMP): not ours to judge
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


if "ZOO_TEST_TMP" not in os.environ:
    import tempfile

    # Ray puts its sockets ~70 characters below TMPDIR and refuses paths over 107: a long
    # inherited TMPDIR (a CI runner's) would break every Ray test, so such a one gives way
    _base = tempfile.gettempdir()
    _base = _base if len(_base) <= 20 or not os.path.isdir("/tmp") else "/tmp"
    _remove_dead_sessions(_base)
    _OWN_TMP = tempfile.mkdtemp(prefix="zoo-tests-", dir=_base)  # this process removes it
    Path(_OWN_TMP, _PID_FILE).write_text(str(os.getpid()))
    os.environ["ZOO_TEST_TMP"] = os.environ["TMPDIR"] = tempfile.tempdir = _OWN_TMP
if "ZOO_CACHE" not in os.environ:  # decoded images and check results: one folder per session
    os.environ["ZOO_CACHE"] = os.environ["ZOO_TEST_CACHE_ROOT"] = os.path.join(
        os.environ["ZOO_TEST_TMP"], "cache"
    )
# an xdist worker inherits the controller's folder: each worker gets one of its own inside it
# (a folder the user set is theirs, shared as given)
if "PYTEST_XDIST_WORKER" in os.environ and os.environ["ZOO_CACHE"] == os.environ.get(
    "ZOO_TEST_CACHE_ROOT"
):
    os.environ["ZOO_CACHE"] = os.path.join(
        os.environ["ZOO_CACHE"], os.environ["PYTEST_XDIST_WORKER"]
    )

import pytest  # noqa: E402  (after the environment above: torch's children inherit it)
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# OpenVINO's tests run in a process of their own (tests/test_openvino_process.py): none of
# its native libraries are ever loaded in the suite's own processes
OPENVINO_FILES = ["test_openvino.py", "test_gates_openvino.py"]
collect_ignore = [] if os.environ.get("ZOO_OPENVINO_CHILD") == "1" else OPENVINO_FILES
ZOO = str(Path(sys.executable).parent / "zoo")
# The files that take longest start first, so that `-n auto --dist loadfile` (the README's
# test command) does not end with one worker running a two-minute file alone.
LONGEST_FIRST = (
    "test_tune.py",
    "test_tracking.py",
    "test_openvino_process.py",
    "test_distributed.py",
    "test_serve_fuzz.py",
)


def pytest_unconfigure(config: pytest.Config) -> None:
    own = globals().get("_OWN_TMP")
    if own is None:
        return
    if os.environ.get("ZOO_KEEP_TEST_TMP") == "1":
        Path(own, _PID_FILE).unlink(missing_ok=True)  # kept: later sessions leave it alone
        print(f"\nthe session's temporary files are kept in {own}")
    else:
        import shutil
        from multiprocessing.util import Finalize

        # at exit, after multiprocessing removes its own folder in it (exit priority -100)
        Finalize(None, shutil.rmtree, args=(own,), kwargs={"ignore_errors": True},
                 exitpriority=-101)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    # xdist's loadfile would otherwise hand out the files with the most tests first, which puts
    # these (one or two long tests each) at the end; keep the collection order instead
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within and among the other files is kept


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist must not refuse it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: ``PYTEST_XDIST_AUTO_NUM_WORKERS`` when set, else one worker per usable CPU,
    at most 4 (each worker holds torch, onnxruntime and often a served model or a training
    run: about 2 GiB)."""
    from zoo.system import available_cpus

    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, min(available_cpus(), 4))


@pytest.fixture(scope="session")
def mobilenet_weights() -> Path:
    path = Path(torch.hub.get_dir()) / "checkpoints" / "mobilenet_v2-b0353104.pth"
    if not path.exists():
        pytest.fail(f"Real test weights missing at {path}: run scripts/fetch_test_weights.sh")
    return path


def run_zoo(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the real ``zoo`` console script."""
    return subprocess.run(
        [ZOO, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Run a command in this process and put back what it may change process-wide: the
    environment, working folder and argv; torch's threads, determinism flags, default dtype
    and matmul precision; torch's, numpy's and ``random``'s RNG states; signal handlers;
    logging's root handlers and level; and warning filters. So a test worker that runs one
    command in-process runs the next test as a fresh process would."""
    import logging
    import signal
    import warnings

    import torch

    from zoo.train.rng import get_rng_state, set_rng_state

    argv, environ, here = list(sys.argv), dict(os.environ), Path.cwd()
    threads = torch.get_num_threads()
    det, det_warn = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cudnn = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    dtype, matmul = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    rng = get_rng_state()  # Python's, numpy's and torch's (a run's checkpoint keeps the same)
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = {s: signal.getsignal(s) for s in sigs}
    root = logging.getLogger()
    log = (list(root.handlers), root.level)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(here)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det, warn_only=det_warn)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn
        torch.set_default_dtype(dtype)
        torch.set_float32_matmul_precision(matmul)
        set_rng_state(rng)
        for s, h in handlers.items():
            if h is not None:
                signal.signal(s, h)
        root.handlers[:] = log[0]
        root.setLevel(log[1])


def zoo_here(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The ``zoo`` console script's entry point (``zoo.cli.app.main``) run in this process, its
    exit code, stdout and stderr returned as :func:`run_zoo` returns them: the same command,
    options, messages and exit codes, without a new interpreter's start-up (seconds of
    imports), where that start-up is not what is tested (refusals before any work, a fixture's
    export, a command whose output the next one reads). What the command may change
    process-wide is put back after it (:func:`process_state_kept`)."""
    import io

    from zoo.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with process_state_kept():
        sys.argv = [ZOO, *args]
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code
    if isinstance(code, str):  # sys.exit("message"): the interpreter prints it, exit 1
        err.write(code + "\n")
    rc = 1 if isinstance(code, str) else (code or 0)
    return subprocess.CompletedProcess([ZOO, *args], rc, out.getvalue(), err.getvalue())


def zoo_ok(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """:func:`zoo_here`, failing the test with the command's stderr unless it exits 0."""
    r = zoo_here(*args, cwd=cwd, env=env)
    assert r.returncode == 0, f"zoo {' '.join(args)} exited {r.returncode}:\n{r.stderr}"
    return r


def file_sha256(path: Path) -> str:
    """The file's sha256, hex: to tell that a command left a file as it was (or rewrote it)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def finetune_here(data: Path, runs: Path, name: str, **options: Any) -> Path:
    """What ``zoo finetune ARCH --data DATA --runs RUNS --name NAME --num-workers 0
    --no-progress`` trains, in this process (``fit()`` itself): for fixtures that need a trained
    run folder, where the command's start-up (a new interpreter importing torch) is not what
    is tested."""
    from zoo.train.config import TrainConfig
    from zoo.train.trainer import fit

    base: dict[str, Any] = {"num_workers": 0, "progress": False}
    cfg = TrainConfig(data=str(data), runs_root=str(runs), name=name, **{**base, **options})
    with process_state_kept():
        run = fit(cfg)
    assert run == Path(runs) / name and (run / "model" / "model.safetensors").is_file()
    return run


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sklearn's 1,797 real handwritten digits as a flat image folder (32×32 PNGs)."""
    from zoo.samples import write_digits_folder

    return write_digits_folder(tmp_path_factory.mktemp("digits") / "digits")


@pytest.fixture(scope="session")
def small_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 real digits per class (300 images): enough for quick training tests."""
    from zoo.samples import write_digits_folder

    return write_digits_folder(tmp_path_factory.mktemp("digits") / "small", per_class=30)


@pytest.fixture(scope="session")
def digits16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100 real digits (10 per class) as 16 px PNGs: for the tests that train several tiny runs
    (teacher, student, QAT) in one module."""
    from zoo.samples import write_digits_folder

    return write_digits_folder(tmp_path_factory.mktemp("d16") / "digits", size=16, per_class=10)


@pytest.fixture(scope="session")
def four_digits(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four of the real digit classes (1, 3, 7, 8: 120 images), for tests that start many
    training processes: few images to load and a small confusion plot keep each one short."""
    root = tmp_path_factory.mktemp("four") / "digits"
    root.mkdir()
    for d in (1, 3, 7, 8):
        (root / f"digit_{d}").symlink_to(small_digits / f"digit_{d}")
    return root


@pytest.fixture(scope="session")
def multilabel_digits(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real digits with three labels each: the digit, even/odd, and small (<5)/large."""
    root = tmp_path_factory.mktemp("ml")
    rows = ["path,labels"]
    for img in sorted(small_digits.rglob("*.png")):
        d = int(img.parent.name.split("_")[1])
        rel = Path("images") / img.parent.name / img.name
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(img)
        rows.append(f"{rel},d{d};{'even' if d % 2 == 0 else 'odd'};{'small' if d < 5 else 'large'}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


MOBILENET_ONNX_ENV = "ZOO_TEST_MOBILENET_ONNX"


@pytest.fixture(scope="session")
def mobilenet_onnx(tmp_path_factory, mobilenet_weights) -> Path:
    """MobileNetV2 (real weights) exported by ``zoo export``, its report checked once per
    session; a child pytest (tests/test_openvino_process.py) is handed the parent's file
    through ``ZOO_TEST_MOBILENET_ONNX`` instead of exporting it again."""
    given = os.environ.get(MOBILENET_ONNX_ENV)
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("onnx") / "mobilenet_v2.onnx"
    r = zoo_here("export", "mobilenet_v2", "--dynamic-batch", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["parity"]["passed"] and report["exporter"] in ("dynamo", "legacy")
    assert [d["batch"] for d in report["parity"]["dynamic"]] == [1, 2, 5]
    assert report["parity"]["predictions"]["agreement"] == 1.0
    return out


def no_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a user with no home folder: no ``HOME`` and no passwd entry (an
    arbitrary container UID), so pathlib cannot expand ``~``."""

    def missing(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr("pwd.getpwuid", missing)
