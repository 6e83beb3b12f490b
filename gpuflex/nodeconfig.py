"""The node operator's own configuration: ``<home>/node.toml``.

Data locations, local model directories and private text corpora belong to whoever runs the
node, never to a job that arrives from the wire: a job names a data set or a model by a short
name, and this file says where that name lives on this machine. This module is the one reader
of the file. It returns a frozen, validated :class:`NodeConfig`, and a bad file fails with one
line that names the key, so an operator can fix it without reading a traceback.

```toml
[jobs]
accept = "any"                      # or ["12D3Koo...", ...]: whose jobs this node runs
allow_plugins = ["mylab.models:*"]  # patterns of module:function this operator allows
max_jobs = 16                       # unfinished jobs this node takes on at once
max_jobs_per_publisher = 4          # ... of which from any one publisher
max_model_params = 200000000        # the largest language model a job may make this node build
[data]                              # dataset name -> local path
shakespeare = "/data/tinyshakespeare.txt"
[models]                            # pretrained model name -> local directory
tinyllama = "/models/tinyllama"
[text]                              # private text corpora for partition = "local":
notes = ["/data/notes1.txt", "/data/notes2.txt"]  # text, .jsonl, .parquet files or a
wiki = "/data/wiki-hf"              # Hugging Face datasets folder (save_to_disk or data files)
```

Relative paths are taken relative to the node's home. ``gpuflex node start`` flags add to the
file for one run (:func:`with_flags`). No torch and no numpy here: the CLI reads this file too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuflex.errors import GpuflexError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CONFIG_FILE = "node.toml"
#: Names of data sets, models and corpora: short, printable, safe in a log line.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SECTIONS = ("jobs", "data", "models", "text", "serve")
_JOBS_KEYS = ("accept", "allow_plugins", "max_jobs", "max_jobs_per_publisher", "max_model_params")
#: Files one corpus may list; a corpus is a handful of files, not a directory crawl.
MAX_TEXT_FILES = 1000
#: Unfinished jobs a node takes on at once, in total and from any one publisher (its own
#: jobs are not counted against the second): what one stranger's frames can make it hold.
DEFAULT_MAX_JOBS, DEFAULT_MAX_JOBS_PER_PUBLISHER = 16, 4
MAX_JOBS_LIMIT = 10_000
#: The largest language model (parameters, from the job's arithmetic) a stranger's job may make
#: this node build: 200M, 0.8 GB of float32 weights before gradients and optimizer state.
DEFAULT_MAX_MODEL_PARAMS = 200_000_000
MODEL_PARAMS_RANGE = (10_000, 1_000_000_000)
#: An allow pattern: ``module:function``, each side letters, digits, '_', '.' and '*'.
_PATTERN_RE = re.compile(r"^[A-Za-z0-9_.*]{1,200}:[A-Za-z0-9_.*]{1,200}$")
#: A libp2p peer id in base58 (``12D3KooW...``): what ``accept`` lists.
_PEER_ID_RE = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{16,128}$")


class NodeConfigError(GpuflexError, ValueError):
    """``node.toml`` is unreadable or has a bad key; the message names the file and the key."""


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class NodeConfig:
    """What this node's operator configured; an absent file is the empty configuration."""

    accept: str | tuple[str, ...] = "any"
    allow_plugins: tuple[str, ...] = ()
    max_jobs: int = DEFAULT_MAX_JOBS
    max_jobs_per_publisher: int = DEFAULT_MAX_JOBS_PER_PUBLISHER
    max_model_params: int = DEFAULT_MAX_MODEL_PARAMS
    data: Mapping[str, Path] = field(default_factory=lambda: _frozen({}))
    models: Mapping[str, Path] = field(default_factory=lambda: _frozen({}))
    text: Mapping[str, tuple[Path, ...]] = field(default_factory=lambda: _frozen({}))
    source: Path | None = None
    #: ``[serve]`` as written; ``gpuflex.serve.settings.parse_serve`` validates it.
    serve: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))

    def data_path(self, name: str) -> Path | None:
        """Where the data set ``name`` lives here, or None when the operator did not say."""
        return self.data.get(name)

    def model_dir(self, name: str) -> Path:
        """The local directory of pretrained model ``name``; a clear error when it is not
        configured, because a job may only name models the operator put there."""
        if name not in self.models:
            known = ", ".join(sorted(self.models)) or "none"
            raise NodeConfigError(f"{self._where()}: no [models] entry {name!r} (configured: {known})")
        return self.models[name]

    def text_files(self, name: str) -> tuple[Path, ...]:
        """The paths of private corpus ``name``, for ``partition = "local"``: its ``[text]``
        entry, or a ``[data]`` entry of that name (a datasets folder named like other data)."""
        if not self.has_corpus(name):
            known = ", ".join(sorted(self.text)) or "none"
            raise NodeConfigError(f"{self._where()}: no [text] entry {name!r} (configured: {known})")
        return self.corpus_paths(name)

    def has_corpus(self, name: str) -> bool:
        return name in self.text or name in self.data

    def corpus_paths(self, name: str) -> tuple[Path, ...]:
        """``text_files`` without the error: () for an unknown name."""
        if name in self.text:
            return self.text[name]
        return (self.data[name],) if name in self.data else ()

    def _where(self) -> str:
        return str(self.source) if self.source else CONFIG_FILE


def config_path(home: str | os.PathLike[str]) -> Path:
    return Path(home) / CONFIG_FILE


def load_node_config(home: str | os.PathLike[str] | None) -> NodeConfig:
    """Read ``<home>/node.toml``; a missing home or file gives the empty configuration."""
    if home is None:
        return NodeConfig()
    path = config_path(home)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return NodeConfig(source=path)
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeConfigError(f"{path}: cannot read: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise NodeConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_node_config(raw, base=Path(home), source=path)


def parse_node_config(raw: Mapping[str, Any], *, base: Path, source: Path | None = None) -> NodeConfig:
    """Validate the parsed TOML; the first problem is reported with its dotted key."""
    where = str(source) if source else CONFIG_FILE

    def bad(key: str, why: str) -> NodeConfigError:
        return NodeConfigError(f"{where}: {key}: {why}")

    for key in raw:
        if key not in _SECTIONS:
            raise bad(key, f"unknown section (expected one of {', '.join(_SECTIONS)})")
    sections: dict[str, Mapping[str, Any]] = {}
    for name in _SECTIONS:
        value = raw.get(name, {})
        if not isinstance(value, Mapping):
            raise bad(name, f"must be a table, got {type(value).__name__}")
        sections[name] = value

    jobs = sections["jobs"]
    for key in jobs:
        if key not in _JOBS_KEYS:
            raise bad(f"jobs.{key}", f"unknown key (expected one of {', '.join(_JOBS_KEYS)})")
    accept: str | tuple[str, ...] = jobs.get("accept", "any")
    if isinstance(accept, list) and all(isinstance(p, str) and _PEER_ID_RE.match(p) for p in accept):
        accept = tuple(accept)
    elif accept != "any":
        raise bad("jobs.accept", f'must be "any" or a list of peer ids, got {accept!r}')
    plugins = jobs.get("allow_plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) and _PATTERN_RE.match(p) for p in plugins):
        raise bad("jobs.allow_plugins", f'must be a list of "module:function" patterns, got {plugins!r}')
    caps = {}
    for key, default in (("max_jobs", DEFAULT_MAX_JOBS), ("max_jobs_per_publisher", DEFAULT_MAX_JOBS_PER_PUBLISHER)):
        value = jobs.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_JOBS_LIMIT:
            raise bad(f"jobs.{key}", f"must be an integer from 1 to {MAX_JOBS_LIMIT}, got {value!r}")
        caps[key] = value
    params = jobs.get("max_model_params", DEFAULT_MAX_MODEL_PARAMS)
    low, high = MODEL_PARAMS_RANGE
    if not isinstance(params, int) or isinstance(params, bool) or not low <= params <= high:
        raise bad("jobs.max_model_params", f"must be an integer from {low} to {high}, got {params!r}")
    caps["max_model_params"] = params

    def path_of(key: str, value: Any) -> Path:
        if not isinstance(value, str) or not value.strip() or "\x00" in value:
            raise bad(key, f"must be a path string, got {value!r}")
        path = Path(value).expanduser()
        return path if path.is_absolute() else (base / path)

    def names(section: str) -> Mapping[str, Any]:
        table = sections[section]
        for key in table:
            if not _NAME_RE.match(key):
                raise bad(f"{section}.{key}", "names use letters, digits, '_', '.' and '-' (at most 64)")
        return table

    data = {k: path_of(f"data.{k}", v) for k, v in names("data").items()}
    models = {k: path_of(f"models.{k}", v) for k, v in names("models").items()}
    text: dict[str, tuple[Path, ...]] = {}
    for key, value in names("text").items():
        files = [value] if isinstance(value, str) else value
        if not isinstance(files, list) or not files or len(files) > MAX_TEXT_FILES:
            raise bad(f"text.{key}", f"must be a path or a list of 1 to {MAX_TEXT_FILES} paths, got {value!r}")
        text[key] = tuple(path_of(f"text.{key}", f) for f in files)
    return NodeConfig(accept=accept, allow_plugins=tuple(plugins), data=_frozen(data), models=_frozen(models),
                      text=_frozen(text), source=source, serve=_frozen(sections["serve"]), **caps)


def with_flags(config: NodeConfig, *, allow_plugins: Sequence[str] = (), data: Sequence[str] = (),
               accept: str | None = None, max_jobs: int | None = None,
               max_jobs_per_publisher: int | None = None, max_model_params: int | None = None) -> NodeConfig:
    """``config`` with ``gpuflex node start``'s flags on top, for this run only.

    ``allow_plugins`` adds patterns, ``data`` adds or replaces ``NAME=PATH`` entries (a
    relative path is taken from the current directory, as a shell user expects), ``accept``
    (``any`` or comma-separated peer ids) and the caps replace the file's. A bad flag fails
    with one line naming it.
    """
    for pattern in allow_plugins:
        if not _PATTERN_RE.match(pattern):
            raise NodeConfigError(f"--allow-plugin {pattern!r}: expected a 'module:function' pattern, "
                                  "'*' matching any characters (e.g. 'mylab.models:*')")
    entries = dict(config.data)
    for item in data:
        name, sep, raw = item.partition("=")
        if not sep or not _NAME_RE.match(name) or not raw.strip() or "\x00" in raw:
            raise NodeConfigError(f"--data {item!r}: expected NAME=PATH, NAME of letters, digits, '_', '.', '-'")
        entries[name] = Path(raw).expanduser().absolute()
    changes: dict[str, Any] = {"allow_plugins": tuple(dict.fromkeys((*config.allow_plugins, *allow_plugins))),
                               "data": _frozen(entries)}
    if accept is not None:
        changes["accept"] = parse_accept(accept)
    for flag, key, value in (("--max-jobs", "max_jobs", max_jobs),
                             ("--max-jobs-per-publisher", "max_jobs_per_publisher", max_jobs_per_publisher)):
        if value is not None:
            if not 1 <= value <= MAX_JOBS_LIMIT:
                raise NodeConfigError(f"{flag} {value}: expected 1 to {MAX_JOBS_LIMIT}")
            changes[key] = value
    if max_model_params is not None:
        low, high = MODEL_PARAMS_RANGE
        if not low <= max_model_params <= high:
            raise NodeConfigError(f"--max-model-params {max_model_params}: expected {low} to {high}")
        changes["max_model_params"] = max_model_params
    return replace(config, **changes)


def parse_accept(text: str) -> str | tuple[str, ...]:
    """``any``, or comma-separated peer ids (``--accept-jobs``)."""
    if text.strip() == "any":
        return "any"
    ids = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in ids if not _PEER_ID_RE.match(p)]
    if not ids or bad:
        raise NodeConfigError(f"--accept-jobs {text!r}: expected 'any' or comma-separated peer ids "
                              f"(12D3KooW...){f'; not a peer id: {bad[0]!r}' if bad else ''}")
    return ids


def dump_node_config(config: Mapping[str, Mapping[str, Any]]) -> str:
    """TOML text for a small configuration (tests, the benchmarks, ``gpuflex`` helpers)."""
    lines: list[str] = []
    for section in _SECTIONS:
        table = config.get(section)
        if not table or section == "serve":  # nested tables: written by hand
            continue
        lines.append(f"[{section}]")
        for key, value in table.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
