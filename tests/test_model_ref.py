"""``ModelRef.parse``: every accepted form, the precedence between them, and the refusals.

Plain strings and small folders only (milliseconds); the commands that consume a reference
are tested end to end in their own files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from tests.conftest import no_home, run_zoo
from zoo.errors import MODEL_REF_FORMS, InputError, ModelRefError, UnknownModelError
from zoo.ref import ModelRef

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _model_folder(p: Path) -> Path:
    p.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "README.md"):
        (p / f).write_text("{}")
    return p


@pytest.mark.parametrize(
    ("text", "kind", "name", "revision", "canonical"),
    [
        ("resnet18", "registry", "resnet18.tv_in1k", None, "resnet18.tv_in1k"),
        ("resnet18.a1_in1k", "registry", "resnet18.a1_in1k", None, "resnet18.a1_in1k"),
        ("timm:vit_tiny_patch16_224", "timm", "vit_tiny_patch16_224", None, None),
        ("timm:resnet18.a1_in1k", "timm", "resnet18.a1_in1k", None, None),
        ("hf:me/my-model", "hf", "me/my-model", None, None),
        ("hf:me/my-model@main", "hf", "me/my-model", "main", None),
        (f"hf:me/m@{SHA}", "hf", "me/m", SHA, None),
        ("hf:me/m@refs/pr/1", "hf", "me/m", "refs/pr/1", None),
        ("hf:me/m@v1.0", "hf", "me/m", "v1.0", None),
        ("hf-hub:timm/resnet18.a1_in1k", "hf-hub", "timm/resnet18.a1_in1k", None, None),
        ("  resnet18 ", "registry", "resnet18.tv_in1k", None, "resnet18.tv_in1k"),
    ],
)
def test_names_parse_to_their_kind_and_back(
    text: str, kind: str, name: str, revision: str | None, canonical: str | None, cwd: Path
) -> None:
    ref = ModelRef.parse(text)
    assert (ref.kind, ref.name, ref.revision) == (kind, name, revision)
    assert str(ref) == (canonical or text.strip())
    assert ModelRef.parse(str(ref)) == ref  # the string form is the serialisation
    assert ref.shown == text.strip() and not ref.is_path
    with pytest.raises(ModelRefError, match="not a file or folder"):
        _ = ref.path


def test_equality_ignores_the_spelling() -> None:
    assert ModelRef.parse("resnet18") == ModelRef.parse("resnet18.tv_in1k")
    assert ModelRef.parse("resnet18") != ModelRef.parse("resnet18.a1_in1k")
    assert ModelRef.parse("hf:me/m") != ModelRef.parse("hf:me/m@main")
    ref = ModelRef.parse("mlp")
    assert ModelRef.parse(ref) is ref
    assert ModelRef.parse("hf-hub:timm/resnet18.a1_in1k").timm_name == "resnet18.a1_in1k"
    assert ModelRef.parse("timm:resnet18").timm_name == "resnet18"
    with pytest.raises(ModelRefError, match="not a timm model"):
        _ = ref.timm_name


def test_folders_runs_and_onnx_files(cwd: Path) -> None:
    _model_folder(cwd / "exported")
    run = cwd / "runs" / "cats"
    _model_folder(run / "model")
    (cwd / "m.onnx").write_bytes(b"not checked here")

    ref = ModelRef.parse("./exported")
    assert (ref.kind, ref.path, ref.model_folder) == (
        "model-folder",
        Path("exported"),
        Path("exported"),
    )
    ref = ModelRef.parse("runs/cats")
    assert (ref.kind, ref.model_folder) == ("run", Path("runs/cats/model"))
    assert ModelRef.parse(str(run.resolve())).kind == "run"  # absolute
    assert ModelRef.parse(run / "model").kind == "model-folder"  # a Path is always a path
    ref = ModelRef.parse("m.onnx")
    assert (ref.kind, ref.path, ref.is_path) == ("onnx", Path("m.onnx"), True)
    with pytest.raises(ModelRefError, match="not a model folder"):
        _ = ref.model_folder
    # a bare word that is no registry name but an existing folder is that folder
    assert ModelRef.parse("exported").kind == "model-folder"
    assert ModelRef.parse("runs").kind == "model-folder"  # loading it says what it lacks


def test_home_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _model_folder(tmp_path / "m")
    ref = ModelRef.parse("~/m")
    assert ref.kind == "model-folder" and ref.path == tmp_path / "m" and str(ref) == "~/m"


def test_precedence_registry_name_beats_a_folder_of_that_name(cwd: Path) -> None:
    """A registry name means the same in every directory; ``./name`` is the folder."""
    _model_folder(cwd / "resnet18")
    assert ModelRef.parse("resnet18").kind == "registry"
    assert ModelRef.parse("./resnet18").kind == "model-folder"
    assert ModelRef.parse(Path("resnet18")).kind == "model-folder"


def test_precedence_prefix_beats_a_folder_of_that_name(cwd: Path) -> None:
    _model_folder(cwd / "timm:resnet18")
    assert ModelRef.parse("timm:resnet18").kind == "timm"
    assert ModelRef.parse("./timm:resnet18").kind == "model-folder"


def test_precedence_onnx_suffix_is_a_file_even_when_missing(cwd: Path) -> None:
    with pytest.raises(ModelRefError, match=r"^Model 'model\.onnx' does not exist"):
        ModelRef.parse("model.onnx")
    (cwd / "dir.onnx").mkdir()
    with pytest.raises(ModelRefError, match=r"'dir\.onnx' is not a file"):
        ModelRef.parse("dir.onnx")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("hf:me/m@", "has the revision ''"),
        ("hf:me/m@two words", "has the revision 'two words'"),
        ("hf:me/m@../../etc", "has the revision '../../etc'"),
        ("hf:me/m@main/", "has the revision 'main/'"),
        ("hf:me/m@/main", "has the revision '/main'"),
        ("hf:me/m@a@b", "has the revision 'a@b'"),
        ("hf:me/m@x..y", "has the revision 'x..y'"),
        ("hf:resnet18", "has the Hub repo id 'resnet18'"),
        ("hf:a/b/c", "has the Hub repo id 'a/b/c'"),
        ("hf:", "has the Hub repo id ''"),
        ("hf:/m", "has the Hub repo id '/m'"),
        ("hf-hub:resnet18", "must be hf-hub:ORG/NAME"),
        ("hf-hub:timm/resnet18@main", "must be hf-hub:ORG/NAME"),
        ("timm:", "needs a timm model name"),
        ("timm:res net", "needs a timm model name"),
        ("", "is empty"),
        ("   ", "is empty"),
    ],
)
def test_malformed_references_are_refused_with_the_forms(text: str, problem: str) -> None:
    with pytest.raises(ModelRefError) as exc:
        ModelRef.parse(text)
    msg = str(exc.value)
    assert msg.startswith(f"Model {text!r} {problem}"), msg
    assert msg.endswith(f"A model is named by {MODEL_REF_FORMS}.")
    assert isinstance(exc.value, InputError) and isinstance(exc.value, ValueError)


@pytest.mark.parametrize("text", ["./nope", "runs/nope", "/no/such/folder", "~/no-such-zoo-x"])
def test_missing_paths_are_refused(text: str, cwd: Path) -> None:
    with pytest.raises(ModelRefError) as exc:
        ModelRef.parse(text)
    assert str(exc.value).startswith(
        f"Model {text!r} does not exist (no such run or model folder)."
    )


@pytest.mark.parametrize("text", ["weights.safetensors", "./weights.safetensors", "old.pth"])
def test_a_file_that_is_not_onnx_is_refused(text: str, cwd: Path) -> None:
    (cwd / Path(text).name).write_bytes(b"x")
    with pytest.raises(ModelRefError) as exc:
        ModelRef.parse(text)
    assert str(exc.value).startswith(f"Model {text!r} is a file; ") and "zoo convert" in str(
        exc.value
    )


def test_unknown_bare_word_suggests_and_lists_the_forms(cwd: Path) -> None:
    with pytest.raises(UnknownModelError) as exc:
        ModelRef.parse("resnt18")
    msg = str(exc.value)
    assert msg.startswith("Unknown model 'resnt18': no registry entry and no folder of that name.")
    assert "Did you mean 'resnet18'" in msg and MODEL_REF_FORMS in msg
    assert exc.value.suggestions[0] == "resnet18" and isinstance(exc.value, KeyError)
    with pytest.raises(UnknownModelError, match="'zzzzzz': no registry entry") as exc:
        ModelRef.parse("zzzzzz")
    assert exc.value.suggestions == [] and "Did you mean" not in str(exc.value)


def test_create_model_refuses_an_onnx_file(cwd: Path) -> None:
    (cwd / "m.onnx").write_bytes(b"x")
    with pytest.raises(
        ModelRefError, match=r"'m\.onnx' is an ONNX file, and this command needs the PyTorch"
    ):
        zoo.create_model("m.onnx")


def test_a_broken_run_folder_says_what_it_lacks(cwd: Path) -> None:
    (cwd / "runs" / "r" / "model").mkdir(parents=True)
    with pytest.raises(zoo.ZooError, match=r"runs/r/model is not a zoo model folder: missing"):
        zoo.create_model("runs/r")


def test_parsing_imports_no_heavy_library() -> None:
    code = (
        "import json, sys\nfrom zoo.ref import ModelRef\n"
        "kinds = [ModelRef.parse(t).kind for t in ('resnet18', 'hf:a/b@main', 'timm:x', '.')]\n"
        "print(json.dumps([kinds, [m for m in ('torch', 'timm', 'onnxruntime') if m in sys.modules]]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [["registry", "hf", "timm", "model-folder"], []]


def test_cli_bad_reference_exits_1_and_pull_of_a_non_hub_name_exits_2(tmp_path: Path) -> None:
    r = run_zoo("info", "hf:me/m@bad rev", cwd=tmp_path)
    assert r.returncode == 1 and "Model 'hf:me/m@bad rev' has the revision" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_zoo("pull", "resnet18", cwd=tmp_path)
    assert r.returncode == 2 and "is a registry reference" in r.stderr


# --- what each form keeps of the text, and the paths' finer cases (mutation-tested) -----------


def test_every_form_keeps_the_text_as_typed(cwd: Path) -> None:
    _model_folder(cwd / "mf")
    (cwd / "run" / "model").mkdir(parents=True)
    (cwd / "m.onnx").write_bytes(b"x")
    for text in ("timm:resnet18", "hf-hub:timm/resnet18.a1_in1k", "hf:me/m@main", "./mf", "run"):
        ref = ModelRef.parse(text)
        assert ref.text == text and ref.shown == text
    assert ModelRef.parse("m.onnx").text == "m.onnx"
    assert ModelRef.parse(cwd / "m.onnx").text == str(cwd / "m.onnx")  # a path object
    assert ModelRef.parse(cwd / "mf").text == str(cwd / "mf")


def test_a_leading_dot_or_tilde_alone_makes_a_path(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ModelRefError) as err:  # a path that does not exist, not a name
        ModelRef.parse(".hidden")
    assert "Model '.hidden' does not exist (no such run or model folder). " in str(err.value)
    monkeypatch.setenv("HOME", str(cwd / "home"))
    _model_folder(cwd / "home")
    assert ModelRef.parse("~") == ModelRef("model-folder", "~")  # the home folder
    with pytest.raises(ModelRefError, match="does not exist"):
        ModelRef.parse(str(cwd / "absent"))  # absolute


def test_only_the_first_colon_ends_the_prefix() -> None:
    with pytest.raises(ModelRefError) as err:
        ModelRef.parse("hf:me/m@a:b")
    assert "has the revision 'a:b'" in str(err.value)


def test_a_plain_file_is_refused_with_the_way_to_convert_it(cwd: Path) -> None:
    (cwd / "weights.pt").write_bytes(b"x")
    with pytest.raises(ModelRefError) as err:
        ModelRef.parse("./weights.pt")
    assert (
        "Model './weights.pt' is a file; give its model folder or an .onnx file; a PyTorch "
        "checkpoint (.pth, .pt, .safetensors weights) becomes a model folder with "
        "`zoo convert FILE --arch ARCH -o DIR`. "
    ) in str(err.value)


def test_a_torch_program_is_told_apart_from_a_checkpoint(cwd: Path) -> None:
    """Real files as PyTorch writes them: a TorchScript archive named .pt (PyTorch's docs'
    name) and a torch.export .pt2 are exports zoo's commands do not run, so the way back is the
    folder they came from or an .onnx export, not ``zoo convert``; a state dict named .pt is a
    checkpoint to convert; a model folder's weights file points at its folder."""
    import torch

    net = torch.nn.Linear(2, 1)
    torch.jit.save(torch.jit.script(net), cwd / "scripted.pt")
    torch.export.save(torch.export.export(net, (torch.zeros(1, 2),)), cwd / "exported.pt2")
    torch.save(net.state_dict(), cwd / "state.pt")
    (cwd / "folder").mkdir()
    (cwd / "folder" / "model.safetensors").write_bytes(b"x")
    (cwd / "folder" / "config.json").write_text("{}")

    def said(name: str) -> str:
        with pytest.raises(ModelRefError) as err:
            ModelRef.parse(f"./{name}")
        return str(err.value)

    for name, what, fmt in (
        ("scripted.pt", "a TorchScript program", "torchscript"),
        ("exported.pt2", "a torch.export program", "pt2"),
    ):
        assert (
            f"is a file; it is {what} (what `zoo export --format {fmt}` writes), which zoo's "
            "commands do not run: give the run or model folder it was exported from, or its "
            ".onnx export (`zoo export RUN` writes one)."
        ) in said(name)
        assert "zoo convert" not in said(name)
    assert "`zoo convert FILE --arch ARCH -o DIR`" in said("state.pt")
    assert f"give the model folder holding it: {Path('folder')}." in said(
        "folder/model.safetensors"
    )


def test_a_folder_holding_an_ir_alone_is_that_ir(cwd: Path) -> None:
    ir = cwd / "ov" / "model.xml"
    ir.parent.mkdir()
    ir.write_text("<net/>")
    ref = ModelRef.parse("./ov")
    assert (ref.kind, ref.name, ref.text) == ("openvino", str(Path("./ov") / "model.xml"), "./ov")
    (cwd / "ov" / "config.json").write_text("{}")  # a model folder that also holds an IR
    assert ModelRef.parse("./ov").kind == "model-folder"
    (cwd / "ov" / "config.json").unlink()
    (cwd / "ov" / "model").mkdir()  # a run
    assert ModelRef.parse("./ov").kind == "run"


def test_a_variant_is_a_file_of_the_folder(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zoo.variants

    asked: list[tuple[Path, str]] = []
    onnx = cwd / "int8-static.onnx"
    onnx.write_bytes(b"x")

    def resolve(folder: Path, name: str) -> Path:
        asked.append((folder, name))
        return onnx

    monkeypatch.setattr(zoo.variants, "resolve_variant", resolve)
    (cwd / "run" / "model").mkdir(parents=True)
    ref = ModelRef.parse("./run").variant("int8")
    assert ref == ModelRef("onnx", str(onnx)) and ref.text == str(onnx)
    assert asked == [(Path("./run") / "model", "int8")]
    _model_folder(cwd / "mf")
    assert ModelRef.parse("./mf").variant("int8") == ref  # a model folder: its own variants
    assert asked[-1] == (Path("./mf"), "int8")
    for other in ("resnet18", "./int8-static.onnx"):
        with pytest.raises(ModelRefError) as err:
            ModelRef.parse(other).variant("int8")
        kind = ModelRef.parse(other).kind
        assert (
            f"Model {other!r} is a {kind} reference; --variant picks a derived file of a run "
            "or model folder (for a file, give the file itself). "
        ) in str(err.value)


def test_is_repo_id() -> None:
    from zoo.ref import is_repo_id

    assert is_repo_id("me/my-model.v2") and not is_repo_id("me") and not is_repo_id("a/b/c")


def test_a_home_folder_of_no_user_is_a_plain_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    # found 2026-12-05: pathlib's expanduser raised a bare RuntimeError (a traceback from
    # `zoo predict ~nobody`)
    with pytest.raises(ModelRefError) as err:
        ModelRef.parse("~no-such-user-zoo/run")
    assert str(err.value).startswith(
        "Model '~no-such-user-zoo/run' does not exist (no user 'no-such-user-zoo' here to "
        "expand '~'). A model is named by "
    )  # the ModelRefError's own wording: expand_home's `what` is not shown
    no_home(monkeypatch)
    with pytest.raises(ModelRefError, match=r"does not exist \(\$HOME is unset to expand '~'\)"):
        ModelRef.parse("~/run")


def test_an_exported_file_of_a_model_folder_names_that_folder(cwd: Path) -> None:
    """The message ended "A model is named by ..., or an .onnx file." right after refusing
    one; for a file inside a model folder it now names the folder to give instead."""
    folder = cwd / "runs" / "r" / "model"
    (folder / "variants").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "README.md"):  # the folder's contract
        (folder / name).write_text("{}")
    for file in (folder / "model.onnx", folder / "variants" / "int8-static.onnx"):
        file.write_bytes(b"x")
        rel = file.relative_to(cwd)
        with pytest.raises(ModelRefError) as exc:
            zoo.create_model(str(rel))
        assert str(exc.value) == (
            f"Model {str(rel)!r} is an ONNX file, and this command needs the PyTorch model: give "
            f"the model folder it belongs to, {rel.parent if file.name == 'model.onnx' else rel.parent.parent}."
        )
    (cwd / "runs" / "r" / "config.json").write_text("{}")  # a run's training config: not it
    (cwd / "runs" / "r" / "m.onnx").write_bytes(b"x")
    with pytest.raises(ModelRefError) as exc:
        zoo.create_model("runs/r/m.onnx")
    assert str(exc.value).endswith("the registry name, run or model folder it was exported from.")
    (cwd / "m.onnx").write_bytes(b"x")  # outside any model folder
    with pytest.raises(ModelRefError) as exc:
        zoo.create_model("m.onnx")
    assert str(exc.value).endswith("the registry name, run or model folder it was exported from.")
