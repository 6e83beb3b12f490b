"""A tiny built-in play, node homes whose node.toml points at it, and tiny LLM job specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuflex.jobspec import JobSpec
from gpuflex.nodeconfig import dump_node_config
from tests.needs import needs
from tests.unit.ml.conftest import PLAY

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here needs peft; it is looked up, not imported, at collection (``tests.needs``)."""
    mark = needs("peft")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(mark)


def make_home(root: Path, text: str = PLAY * 8, **sections: dict[str, Any]) -> Path:
    """A node home with a play file and a node.toml naming it (plus any other sections)."""
    root.mkdir(parents=True, exist_ok=True)
    play = root / "play.txt"
    play.write_text(text, encoding="utf-8")
    (root / "node.toml").write_text(dump_node_config({"data": {"shakespeare": str(play)}, **sections}))
    return root


def tiny_spec(model: str = "llama", **llm: Any) -> JobSpec:
    settings = {"size": "tiny", "adapter": "lora", "lora_rank": 4, "seq_len": 32, "eval_sequences": 8, **llm}
    return JobSpec.from_dict({"model": model, "data": "shakespeare", "partition": "iid", "local_epochs": 0,
                              "local_steps": 3, "batch_size": 4, "optimizer": "adamw", "lr": 1e-2,
                              "strategy": "diloco", "codec": "int8", "server_lr": 0.7, "llm": settings})


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_home(tmp_path_factory.mktemp("llm-home"))
