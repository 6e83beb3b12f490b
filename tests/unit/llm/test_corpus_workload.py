"""A language-model job trains on a node's Hugging Face ``datasets`` folder named in node.toml."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpuflex.jobspec import JobSpec
from gpuflex.ml.llm.pin import pin_llm_spec
from gpuflex.ml.llm.workload import LLMWorkload
from gpuflex.nodeconfig import dump_node_config
from tests.unit.ml.conftest import PLAY
from tests.unit.ml.test_text_corpus import save_to_disk, write_jsonl


def text_spec(corpus: str) -> JobSpec:
    return JobSpec.from_dict({"model": "llama", "data": "text", "partition": "local", "local_epochs": 0,
                              "local_steps": 2, "batch_size": 4, "optimizer": "adamw", "lr": 1e-2,
                              "llm": {"size": "tiny", "adapter": "lora", "lora_rank": 4, "seq_len": 32,
                                      "eval_sequences": 4, "tokenizer": "bytes", "corpus": corpus}})


def test_a_datasets_folder_in_data_is_the_text_of_a_text_job(tmp_path: Path) -> None:
    lines = [line for line in PLAY.splitlines() if line.strip()] * 4
    half = len(lines) // 2
    save_to_disk(tmp_path / "hf-play", [lines[:half], lines[half:]])
    write_jsonl(tmp_path / "notes.jsonl", lines)
    (tmp_path / "node.toml").write_text(dump_node_config({"data": {"play": "hf-play"},
                                                          "text": {"notes": "notes.jsonl"}}))
    work = LLMWorkload(pin_llm_spec(text_spec("play"), tmp_path), 0, 1, tmp_path)
    assert work.text.group_names == ["0:data-00000-of-00002.arrow", "1:data-00001-of-00002.arrow"]
    assert set(np.unique(work.text.groups)) <= {0, 1} and work.text.train.shape[1] == 33
    docs = ["\n\n".join(lines[:half]), "\n\n".join(lines[half:])]
    for row, group in zip(work.text.train[:5].tolist(), work.text.groups[:5], strict=True):
        text = bytes(i for i in row if i < 256).decode("utf-8")  # the byte tokenizer: ids are bytes
        assert text in docs[group]
    # The same corpus as JSON Lines in [text] packs into the same number of rows per byte.
    notes = LLMWorkload(pin_llm_spec(text_spec("notes"), tmp_path), 0, 1, tmp_path)
    assert notes.text.group_names == ["0:notes.jsonl"]
    assert abs(len(notes.text.train) + len(notes.text.test) - len(work.text.train) - len(work.text.test)) <= 2
