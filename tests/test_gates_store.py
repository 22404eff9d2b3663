"""The ``zoo predict --out`` chunk store (deploy/predict/store.py) on small files in tmp,
beside tests/test_gates_predict.py's commit/resume/merge walk: the columns, the chunk digest,
what a killed run leaves and a restart clears, the errors file's life, each format's exact
bytes (quoting, the embedding column) and the manifest's version."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zoo.deploy.predict import store as st
from zoo.deploy.predict.store import ChunkStore, columns, digest
from zoo.errors import InputError


def test_columns_per_k_labels_and_embeddings() -> None:
    assert columns(0, multi_label=False) == [("path", "str")]
    assert columns(2, multi_label=True, embeddings=True) == [
        ("path", "str"),
        ("label_1", "str"),
        ("index_1", "int"),
        ("score_1", "float"),
        ("label_2", "str"),
        ("index_2", "int"),
        ("score_2", "float"),
        ("labels", "str"),
        ("embedding", "floats"),
    ]
    assert columns(1, multi_label=False) == columns(1, False, embeddings=False)
    # a model with a rejection rule: the answer, whether it was accepted, the rule's score,
    # after the top-k and before the embedding
    assert columns(1, multi_label=False, embeddings=True, judged=True) == [
        ("path", "str"),
        ("label_1", "str"),
        ("index_1", "int"),
        ("score_1", "float"),
        ("label", "str"),
        ("accepted", "bool"),
        ("score", "float"),
        ("embedding", "floats"),
    ]
    assert columns(1, False) == columns(1, False, judged=False)


def test_digest_is_the_sha256_of_the_paths_one_a_line() -> None:
    paths = ["a/x.jpg", "b/\udcff.jpg"]  # an undecodable file name survives
    want = hashlib.sha256("a/x.jpg\nb/\udcff.jpg".encode("utf-8", "surrogateescape"))
    assert digest(paths) == want.hexdigest()[:16]
    assert digest(["a", "b"]) != digest(["ab"]) != digest(["b", "a"])


def test_a_fresh_job_writes_its_manifest_with_the_version(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "p.jsonl"  # the folder is made
    s = ChunkStore(out, columns(1, False))
    assert (s.parts, s.errors_file) == (
        tmp_path / "deep" / "p.jsonl.parts",
        tmp_path / "deep" / "p.jsonl.errors.jsonl",
    )
    assert s.open({"model": "m"}, overwrite=False) == []
    assert json.loads((s.parts / "manifest.json").read_text()) == {"version": 1, "model": "m"}
    assert st.MANIFEST_VERSION == 1
    # a sidecar of an older manifest version is another job
    (s.parts / "manifest.json").write_text(json.dumps({"version": 0, "model": "m"}))
    with pytest.raises(InputError, match=r"version: 0 then, 1 now"):
        ChunkStore(out, columns(1, False)).open({"model": "m"}, overwrite=False)


def test_a_restart_clears_what_a_killed_finish_and_commit_left(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    cols = columns(1, False)
    ChunkStore(out, cols).open({"m": 1}, overwrite=False)
    killed_file = tmp_path / ".p.csv.1a2b3c4d.tmp"  # the merge's temporary output
    killed_folder = tmp_path / ".p.csv.parts.5e6f7a8b.tmp"  # the sidecar, parked for removal
    killed_file.write_text("half")
    killed_folder.mkdir()
    (killed_folder / "part-00000.csv").write_text("x")
    other = tmp_path / ".q.csv.1a2b3c4d.tmp"  # another output's: not ours to remove
    other.write_text("q")
    in_parts = tmp_path / "p.csv.parts" / ".part-00000.csv.9a9a9a9a.tmp"
    in_parts.write_text("half a chunk")
    assert ChunkStore(out, cols).open({"m": 1}, overwrite=False) == []
    assert not killed_file.exists() and not killed_folder.exists() and not in_parts.exists()
    assert other.exists()


def test_errors_file_follows_the_output(tmp_path: Path) -> None:
    out = tmp_path / "p.jsonl"
    cols = columns(1, False)
    errors = tmp_path / "p.jsonl.errors.jsonl"
    errors.write_text('{"path": "old"}\n')  # left beside an output removed by hand
    s = ChunkStore(out, cols)
    s.open({}, overwrite=False)
    assert not errors.exists()
    s.commit(0, ["a"], [], [{"path": "a", "reason": "broken"}])
    s.commit(1, ["b", "c"], [], [{"path": "b", "reason": "x"}, {"path": "c", "reason": "y"}])
    assert s.finish(2) == 3
    assert [json.loads(x)["path"] for x in errors.read_text().splitlines()] == ["a", "b", "c"]
    # the same output overwritten by a job without errors: the old errors file goes
    s2 = ChunkStore(out, cols)
    assert s2.open({}, overwrite=True) == []
    assert errors.exists()  # still describes the output that is still there
    s2.commit(0, ["a"], [{"path": "a", "label_1": "c", "index_1": 0, "score_1": 1.0}], [])
    assert s2.finish(1) == 0 and not errors.exists()
    assert out.read_text() == '{"path": "a", "label_1": "c", "index_1": 0, "score_1": 1.0}\n'


def test_overwrite_discards_an_interrupted_jobs_chunks(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    cols = columns(1, False)
    s = ChunkStore(out, cols)
    s.open({"top_k": 1}, overwrite=False)
    s.commit(0, ["a"], [{"path": "a", "label_1": "c", "index_1": 0, "score_1": 0.5}], [])
    assert len(ChunkStore(out, cols).open({"top_k": 1}, overwrite=False)) == 1
    assert ChunkStore(out, cols).open({"top_k": 1}, overwrite=True) == []
    assert sorted(p.name for p in (tmp_path / "p.csv.parts").iterdir()) == ["manifest.json"]


def test_csv_quotes_and_keeps_the_header_once(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    cols = columns(1, True)
    s = ChunkStore(out, cols)
    s.open({}, overwrite=False)
    odd = {"path": 'a,"b".jpg', "label_1": "x", "index_1": 1, "score_1": 0.5, "labels": "x;y"}
    s.commit(0, ["a"], [odd], [])
    s.commit(1, ["b"], [{**odd, "path": "b"}], [])
    s.finish(2)
    text = out.read_bytes().decode()
    assert text.splitlines()[0] == "path,label_1,index_1,score_1,labels"
    assert text.count("\r\n") == 3  # the header and two rows, CSV's own line ends
    rows = list(csv.DictReader(out.open(newline="")))
    assert [r["path"] for r in rows] == ['a,"b".jpg', "b"] and rows[0]["labels"] == "x;y"


def test_parquet_keeps_types_and_the_embedding_as_float32(tmp_path: Path) -> None:
    out = tmp_path / "p.parquet"
    cols = columns(1, False, embeddings=True)
    s = ChunkStore(out, cols)
    s.open({}, overwrite=False)
    row = {"path": "a", "label_1": "c", "index_1": 2, "score_1": 0.1, "embedding": [0.5, 1.5]}
    s.commit(0, ["a"], [row], [])
    s.commit(1, ["b"], [{**row, "path": "b"}], [])
    s.finish(2)
    table = pq.read_table(out)
    assert table.schema == pa.schema(
        [
            ("path", pa.string()),
            ("label_1", pa.string()),
            ("index_1", pa.int64()),
            ("score_1", pa.float64()),
            ("embedding", pa.list_(pa.float32())),
        ]
    )
    assert table.to_pylist() == [row, {**row, "path": "b"}]
