"""A node's private text corpus from the formats people already keep text in.

A corpus entry in node.toml names a path; what lives there decides how it is read:

- a plain text file: one document;
- a JSON Lines file (``.jsonl``, or ``.json`` holding lines or an array of records) or a Parquet
  file (``.parquet``): the ``text`` column of its records, one document per file;
- a Hugging Face ``datasets`` folder written by ``save_to_disk``: its Arrow files (a
  ``DatasetDict`` gives its ``train`` split when it has one, else every split);
- any other folder: the data files in it (``.parquet``, ``.jsonl``, ``.json``, ``.arrow``,
  ``.txt``), as a Hugging Face data repository lays them out.

Nothing is downloaded and ``datasets`` is not needed: JSON Lines is read directly, Parquet and
Arrow through ``pyarrow`` when it is installed (``pip install 'gpuflex[hf]'``). The files are the
operator's own, yet sizes and counts are bounded so that a wrong path fails with one clear line
instead of filling memory. The column is ``text``, or the only string column when there is no
``text``. The records of one file are joined by blank lines into one document, so short
records still pack into full training rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuflex.ml.llm import LLMError

#: One file may hold at most this many bytes (a typo naming a disk image must fail clearly).
MAX_FILE_BYTES = 512 * 1024 * 1024
#: Data files one corpus folder may hold; a corpus is a data set, not a disk to crawl.
MAX_FILES = 1000
#: Records one file may hold.
MAX_RECORDS = 10_000_000
TEXT_COLUMN = "text"
RECORD_SEPARATOR = "\n\n"
_TABLE_SUFFIXES = (".parquet", ".arrow")
_JSON_SUFFIXES = (".jsonl", ".json")
_DATA_SUFFIXES = (*_TABLE_SUFFIXES, *_JSON_SUFFIXES, ".txt")


def corpus_documents(paths: tuple[Path, ...]) -> dict[str, str]:
    """Name -> text of each document of the corpus at ``paths``, in a stable order."""
    files = [f for p in paths for f in _data_files(p)]
    if len(files) > MAX_FILES:
        raise LLMError(f"the corpus holds {len(files)} data files; at most {MAX_FILES}")
    return {f"{i}:{f.name}": read_document(f) for i, f in enumerate(files)}


def read_document(path: Path) -> str:
    """One file's text: its records' text column for data files, its contents otherwise."""
    _check_size(path)
    suffix = path.suffix.lower()
    if suffix in _JSON_SUFFIXES:
        return RECORD_SEPARATOR.join(_json_texts(path))
    if suffix in _TABLE_SUFFIXES:
        return RECORD_SEPARATOR.join(_table_texts(path))
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LLMError(f"cannot read text {path}: {exc.strerror or exc}") from None


def _data_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    if (path / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk
        splits = _json_file(path / "dataset_dict.json").get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) and "/" not in s and s not in ("", ".", "..")
                                                   for s in splits):
            raise LLMError(f"{path}/dataset_dict.json: 'splits' must be a list of split names")
        chosen = ["train"] if "train" in splits else splits
        return [f for split in chosen for f in _data_files(path / split)]
    if (path / "state.json").is_file():  # Dataset.save_to_disk
        entries = _json_file(path / "state.json").get("_data_files")
        names = [e.get("filename") for e in entries] if isinstance(entries, list) and all(
            isinstance(e, dict) for e in entries) else None
        if not names or not all(isinstance(n, str) and n.endswith(".arrow") and "/" not in n for n in names):
            raise LLMError(f"{path}/state.json: '_data_files' must list the folder's .arrow files")
        return [path / n for n in names[: MAX_FILES + 1]]
    found: list[Path] = []
    for file in sorted(path.rglob("*")):
        if file.is_file() and file.suffix.lower() in _DATA_SUFFIXES and not any(
                part.startswith(".") for part in file.relative_to(path).parts):
            found.append(file)
            if len(found) > MAX_FILES:
                break
    if not found:
        raise LLMError(f"{path} holds no data files ({', '.join(_DATA_SUFFIXES)}) and is not a "
                       "datasets save_to_disk folder")
    return found


def _check_size(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise LLMError(f"cannot read text {path}: {exc.strerror or exc}") from None
    if size > MAX_FILE_BYTES:
        raise LLMError(f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB")


def _json_file(path: Path) -> dict[str, Any]:
    _check_size(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LLMError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise LLMError(f"{path} must hold a JSON object")
    return data


def _records(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            head = fh.read(4096).lstrip()
            fh.seek(0)
            if head.startswith("["):  # a JSON array of records
                rows = json.load(fh)
                yield from enumerate(rows if isinstance(rows, list) else [rows], 1)
                return
            for number, line in enumerate(fh, 1):
                if line.strip():
                    yield number, json.loads(line)
    except ValueError as exc:
        raise LLMError(f"{path} is not JSON Lines: {exc}") from None
    except OSError as exc:
        raise LLMError(f"cannot read text {path}: {exc.strerror or exc}") from None


def _json_texts(path: Path) -> list[str]:
    texts: list[str] = []
    for number, record in _records(path):
        if len(texts) >= MAX_RECORDS:
            raise LLMError(f"{path} holds more than {MAX_RECORDS} records")
        value = record.get(TEXT_COLUMN) if isinstance(record, dict) else None
        if not isinstance(value, str):
            raise LLMError(f"{path} record {number}: needs a string '{TEXT_COLUMN}' field")
        texts.append(value)
    return texts


def _table_texts(path: Path) -> list[str]:
    try:
        import pyarrow as pa
    except ModuleNotFoundError:
        raise LLMError(f"reading {path.suffix} files needs pyarrow: pip install 'gpuflex[hf]'") from None
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:  # datasets writes Arrow IPC streams
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise LLMError(f"cannot read {path}: {str(exc)[:200]}") from None
    if table.num_rows > MAX_RECORDS:
        raise LLMError(f"{path} holds more than {MAX_RECORDS} records")
    strings = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    column = TEXT_COLUMN if TEXT_COLUMN in strings else (strings[0] if len(strings) == 1 else None)
    if column is None:
        raise LLMError(f"{path}: no '{TEXT_COLUMN}' column (string columns: {', '.join(strings) or 'none'})")
    return [t for t in table.column(column).to_pylist() if isinstance(t, str)]
