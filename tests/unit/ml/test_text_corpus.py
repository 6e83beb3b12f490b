"""A node's text corpus from JSON Lines, Parquet and Hugging Face ``datasets`` folders, written
here by the test in the layouts those tools write (no hub, no ``datasets`` package)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.jobpolicy import JobPolicy
from gpuflex.jobspec import JobSpec
from gpuflex.ml.llm import LLMError
from gpuflex.ml.llm import corpus as corpus_mod
from gpuflex.ml.llm.corpus import corpus_documents, read_document
from gpuflex.nodeconfig import parse_node_config

ROWS = ["First record, a sentence.", "Second record:\nwith two lines.", "Third ☃."]


def write_jsonl(path: Path, rows: list[str], **extra: object) -> Path:
    path.write_text("".join(json.dumps({"text": t, **extra}) + "\n" for t in rows) + "\n", encoding="utf-8")
    return path


def test_jsonl_records_become_one_document_per_file(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", ROWS, id=1)
    b = tmp_path / "b.json"
    b.write_text(json.dumps([{"text": "array one"}, {"text": "array two"}]), encoding="utf-8")
    plain = tmp_path / "c.txt"
    plain.write_text("plain text", encoding="utf-8")
    docs = corpus_documents((a, b, plain))
    assert docs == {"0:a.jsonl": "\n\n".join(ROWS), "1:b.json": "array one\n\narray two", "2:c.txt": "plain text"}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=20), st.booleans())
def test_any_records_read_back_as_written(tmp_path_factory: pytest.TempPathFactory, rows: list[str],
                                          as_array: bool) -> None:
    path = tmp_path_factory.mktemp("jsonl") / ("x.json" if as_array else "x.jsonl")
    if as_array:
        path.write_text(json.dumps([{"text": t} for t in rows]), encoding="utf-8")
    else:
        write_jsonl(path, rows)
    assert read_document(path) == "\n\n".join(rows)


@pytest.mark.parametrize(("content", "why"), [
    ('{"text": "ok"}\n{"body": "no text"}\n', "record 2: needs a string 'text'"),
    ('{"text": 3}\n', "record 1"),
    ('{"text": "ok"}\n{broken\n', "not JSON Lines"),
])
def test_bad_jsonl_names_the_file_and_record(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LLMError, match=why):
        read_document(path)


def test_a_folder_of_data_files_is_read_in_order_and_hidden_files_skipped(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train-00001.jsonl", ["second"])
    write_jsonl(tmp_path / "data" / "train-00000.jsonl", ["first"])
    (tmp_path / "README.md").write_text("# card", encoding="utf-8")
    (tmp_path / ".cache").mkdir()
    write_jsonl(tmp_path / ".cache" / "x.jsonl", ["hidden"])
    assert list(corpus_documents((tmp_path,)).values()) == ["first", "second"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(LLMError, match="holds no data files"):
        corpus_documents((tmp_path / "empty",))


def test_sizes_and_counts_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = write_jsonl(tmp_path / "big.jsonl", ["x" * 100])
    monkeypatch.setattr(corpus_mod, "MAX_FILE_BYTES", 50)
    with pytest.raises(LLMError, match="larger than"):
        read_document(big)
    monkeypatch.setattr(corpus_mod, "MAX_FILE_BYTES", 1 << 20)
    monkeypatch.setattr(corpus_mod, "MAX_RECORDS", 2)
    with pytest.raises(LLMError, match="more than 2 records"):
        read_document(write_jsonl(tmp_path / "many.jsonl", ROWS))
    monkeypatch.setattr(corpus_mod, "MAX_FILES", 2)
    for i in range(4):
        write_jsonl(tmp_path / f"f{i}.jsonl", ["x"])
    with pytest.raises(LLMError, match="at most 2"):
        corpus_documents((tmp_path,))


def test_a_corpus_can_be_named_in_data_like_other_data(tmp_path: Path) -> None:
    folder = tmp_path / "wiki"
    folder.mkdir()
    config = parse_node_config({"data": {"wiki": "wiki"}, "text": {"notes": "notes.txt"}}, base=tmp_path)
    assert config.text_files("wiki") == (folder,) and config.text_files("notes") == (tmp_path / "notes.txt",)
    assert config.has_corpus("wiki") and not config.has_corpus("other")
    spec = JobSpec.from_dict({"model": "llama", "data": "text", "partition": "local",
                              "llm": {"size": "tiny", "corpus": "wiki", "tokenizer": "bytes"}})
    assert JobPolicy(config).content_refusal(spec) is None
    other = JobSpec.from_dict({**spec.to_dict(), "llm": {**spec.llm, "corpus": "other"}})
    assert "corpus 'other' is not on this node" in str(JobPolicy(config).content_refusal(other))


# --- Arrow and Parquet: the layouts `datasets` writes -------------------------------------------

def _arrow_table(rows: list[str]):  # type: ignore[no-untyped-def]
    pa = pytest.importorskip("pyarrow", reason="Parquet and Arrow need the hf extra (pyarrow)")
    return pa, pa.table({"id": list(range(len(rows))), "text": rows})


def save_to_disk(folder: Path, shards: list[list[str]]) -> Path:
    """The files ``Dataset.save_to_disk`` writes: Arrow IPC streams listed in state.json."""
    pa, _ = _arrow_table([])
    folder.mkdir(parents=True)
    names = []
    for i, rows in enumerate(shards):
        name = f"data-{i:05d}-of-{len(shards):05d}.arrow"
        table = pa.table({"text": rows, "label": list(range(len(rows)))})
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        names.append(name)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                   "_split": "train"}), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))
    return folder


def test_parquet_text_column_and_the_only_string_column(tmp_path: Path) -> None:
    pa, table = _arrow_table(ROWS)
    import pyarrow.parquet as pq

    pq.write_table(table, tmp_path / "train.parquet")
    assert read_document(tmp_path / "train.parquet") == "\n\n".join(ROWS)
    pq.write_table(pa.table({"n": [1], "content": ["only string"]}), tmp_path / "one.parquet")
    assert read_document(tmp_path / "one.parquet") == "only string"
    pq.write_table(pa.table({"a": ["x"], "b": ["y"]}), tmp_path / "two.parquet")
    with pytest.raises(LLMError, match="no 'text' column"):
        read_document(tmp_path / "two.parquet")


def test_a_save_to_disk_dataset_and_dataset_dict(tmp_path: Path) -> None:
    one = save_to_disk(tmp_path / "ds", [ROWS[:2], ROWS[2:]])
    assert list(corpus_documents((one,)).values()) == ["\n\n".join(ROWS[:2]), ROWS[2]]
    both = tmp_path / "dict"
    save_to_disk(both / "train", [["train text"]])
    save_to_disk(both / "test", [["test text"]])
    (both / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert list(corpus_documents((both,)).values()) == ["train text"]
    (both / "dataset_dict.json").write_text(json.dumps({"splits": ["../../etc"]}))
    with pytest.raises(LLMError, match="split names"):
        corpus_documents((both,))
    (one / "state.json").write_text(json.dumps({"_data_files": [{"filename": "/etc/passwd"}]}))
    with pytest.raises(LLMError, match="_data_files"):
        corpus_documents((one,))


def test_without_pyarrow_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(LLMError, match=r"needs pyarrow: pip install 'gpuflex\[hf\]'"):
        read_document(path)
