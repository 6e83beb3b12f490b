"""node.toml: the operator's data, model and corpus locations, with one-line errors by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflex.nodeconfig import NodeConfigError, load_node_config


def write(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "node.toml").write_text(text)
    return home


def test_sections_are_read_and_relative_paths_are_inside_the_home(tmp_path: Path) -> None:
    home = write(tmp_path, '[jobs]\naccept = "any"\nallow_plugins = ["mylab.models:*"]\n'
                           '[data]\nshakespeare = "data/play.txt"\n[models]\ntiny = "/models/tiny"\n'
                           '[text]\nnotes = ["a.txt", "/abs/b.txt"]\nsingle = "c.txt"\n')
    cfg = load_node_config(home)
    assert cfg.data_path("shakespeare") == home / "data/play.txt" and cfg.data_path("cifar10") is None
    assert cfg.model_dir("tiny") == Path("/models/tiny")
    assert cfg.text_files("notes") == (home / "a.txt", Path("/abs/b.txt"))
    assert cfg.text_files("single") == (home / "c.txt",)
    assert cfg.allow_plugins == ("mylab.models:*",) and cfg.accept == "any"
    with pytest.raises(TypeError):
        cfg.models["x"] = Path("/")  # type: ignore[index]
    assert load_node_config(tmp_path / "nowhere").models == {}


@pytest.mark.parametrize(("text", "key"), [
    ("[model]\nx = '/m'\n", "model: unknown section"),
    ("[models]\n'../x' = '/m'\n", "models.../x"),
    ("[models]\nx = 3\n", "models.x: must be a path"),
    ("[text]\nnotes = []\n", "text.notes"),
    ("[jobs]\naccept = 'some'\n", "jobs.accept"),
    ("[jobs]\nallow_plugins = ['nocolon']\n", "jobs.allow_plugins"),
    ("[data\n", "not valid TOML"),
])
def test_a_bad_file_names_the_key_in_one_line(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(NodeConfigError) as info:
        load_node_config(write(tmp_path, text))
    assert key in str(info.value) and "node.toml" in str(info.value)


def test_a_missing_entry_lists_what_is_configured(tmp_path: Path) -> None:
    cfg = load_node_config(write(tmp_path, "[models]\nb = '/m/b'\na = '/m/a'\n"))
    with pytest.raises(NodeConfigError, match=r"no \[models\] entry 'c' \(configured: a, b\)"):
        cfg.model_dir("c")
