"""The tokenizer hash every member compares, and text packed into fixed-length rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuflex.ml.llm import LLMError
from gpuflex.ml.llm.pin import pin_llm_spec
from gpuflex.ml.llm.text import pack
from gpuflex.ml.llm.tokenizer import byte_tokenizer, tokenizer_hash, train_bpe
from gpuflex.ml.llm.workload import LLMWorkload
from tests.unit.ml.conftest import PLAY

from .conftest import make_home, tiny_spec


def test_tokenizer_hash_is_stable_and_tells_tokenizers_apart() -> None:
    tok = byte_tokenizer()
    assert tok.encode("Hi é").ids == [72, 105, 32, 195, 169] and tok.get_vocab_size() == 257
    assert tokenizer_hash(tok) == tokenizer_hash(byte_tokenizer())
    a, b = train_bpe([PLAY * 4], 300), train_bpe([PLAY * 4], 300)
    assert tokenizer_hash(a) == tokenizer_hash(b)  # training is deterministic
    assert tokenizer_hash(train_bpe([PLAY * 4], 290)) != tokenizer_hash(a)
    assert tokenizer_hash(train_bpe([PLAY * 4 + "Exit, pursued by a bear."], 300)) != tokenizer_hash(a)
    assert tokenizer_hash(a) != tokenizer_hash(tok)
    assert a.decode(a.encode(PLAY).ids) == PLAY


def test_a_member_whose_bpe_differs_refuses_to_join(tmp_path: Path) -> None:
    ours = make_home(tmp_path / "a")
    theirs = make_home(tmp_path / "b", text=PLAY.replace("citizens", "townsfolk") * 8)
    spec = pin_llm_spec(tiny_spec(tokenizer="bpe", vocab_size=300), ours)
    work = LLMWorkload(spec, 0, 1, ours)
    assert work.tokenizer.get_vocab_size() == 300 and work.tokenizer_hash == spec.llm["tokenizer_hash"]
    with pytest.raises(LLMError, match="refusing to join: this node's tokenizer hashes to"):
        LLMWorkload(spec, 0, 1, theirs)


def test_rows_are_fixed_length_and_continue_each_other() -> None:
    ids = np.arange(100)
    rows = pack(ids, 8)
    assert rows.shape == (12, 9) and rows.dtype == np.int64
    assert (rows[1:, 0] == rows[:-1, -1]).all()  # each row's last token is the next row's first
    assert rows[0].tolist() == list(range(9)) and rows[-1, -1] == 96
    assert pack(np.arange(5), 8).shape == (0, 9)


def test_roles_become_groups_and_every_node_holds_the_same_split(home: Path) -> None:
    spec = pin_llm_spec(tiny_spec(), home)
    work = LLMWorkload(spec, 0, 1, home)
    text = work.text
    assert text.group_names == ["All", "First Citizen", "Second Citizen"]
    assert text.train.shape[1] == text.test.shape[1] == 33 and len(text.groups) == len(text.train)
    assert set(np.unique(text.groups)) <= {0, 1, 2}
    too_long = tiny_spec(seq_len=1000, size="small")
    with pytest.raises(LLMError, match=r"lower llm\.seq_len"):
        LLMWorkload(pin_llm_spec(too_long, home), 0, 1, home)
