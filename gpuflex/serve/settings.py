"""The ``[serve]`` section of ``node.toml``: which models this node serves, and its limits.

```toml
[serve]
http = "127.0.0.1:8000"      # the OpenAI-compatible API; beyond loopback it needs the token
max_batch = 8                # sequences decoded together
memory_mb = 512              # KV cache this node may hold for all sequences together
max_prompt_tokens = 1024
max_new_tokens = 256
queue = 64                   # requests waiting beyond the batch; more are refused (429)
redundancy = 1               # 2: a share of routed requests also runs on a second server
check_fraction = 0.1         # ... which share (with redundancy = 2)
[serve.models]
shakespeare = { job = "a1b2c3d4e5f6a7b8" }    # a finished job's model, or its adapter on its base
tinyllama = { path = "/models/tinyllama" }    # a local Hugging Face directory (safetensors)
```

The operator names every model; nothing a peer sends adds one. No torch here (the CLI
reads it too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuflex.serve import ServeError
from mesh.compat import StrEnum

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
JOB_RE = re.compile(r"^[0-9a-f]{16}$")
DEFAULT_HTTP = "127.0.0.1:8000"
MAX_MODELS = 8
_KEYS = ("http", "max_batch", "memory_mb", "max_prompt_tokens", "max_new_tokens", "queue", "redundancy",
         "check_fraction", "models")
_BOUNDS = {"max_batch": (1, 256, 8), "memory_mb": (1, 1 << 20, 512), "max_prompt_tokens": (1, 1 << 17, 1024),
           "max_new_tokens": (1, 1 << 16, 256), "queue": (0, 10_000, 64), "redundancy": (1, 2, 1)}


class SourceKind(StrEnum):
    JOB = "job"  # a finished job's model (or adapter on its pinned base), checked against its ledger
    PATH = "path"  # a local Hugging Face directory the operator named


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: SourceKind
    job: str = ""
    path: Path | None = None


@dataclass(frozen=True)
class ServeSettings:
    http: str = ""  # "" : no HTTP API
    max_batch: int = 8
    memory_mb: int = 512
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 256
    queue: int = 64
    redundancy: int = 1
    check_fraction: float = 0.1
    models: tuple[ModelEntry, ...] = field(default_factory=tuple)

    @property
    def enabled(self) -> bool:
        return bool(self.http or self.models)

    def http_address(self) -> tuple[str, int]:
        return split_address(self.http)


def split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ServeError(f"serve.http: expected HOST:PORT, got {text!r}")
    return host, int(port)


def model_entry(name: str, value: Any, base: Path, where: str = "serve.models") -> ModelEntry:
    if not NAME_RE.match(name):
        raise ServeError(f"{where}.{name}: names use letters, digits, '_', '.', ':' and '-' (at most 64)")
    if isinstance(value, str):
        value = {"job": value} if JOB_RE.match(value) else {"path": value}
    if not isinstance(value, Mapping) or len(value) != 1 or not ({"job", "path"} & set(value)):
        raise ServeError(f"{where}.{name}: expected {{ job = \"<job id>\" }} or {{ path = \"<directory>\" }}")
    if "job" in value:
        job = value["job"]
        if not isinstance(job, str) or not JOB_RE.match(job):
            raise ServeError(f"{where}.{name}.job: expected a 16-hex-digit job id, got {job!r}")
        return ModelEntry(name, SourceKind.JOB, job=job)
    raw = value["path"]
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        raise ServeError(f"{where}.{name}.path: must be a directory path")
    path = Path(raw).expanduser()
    return ModelEntry(name, SourceKind.PATH, path=path if path.is_absolute() else base / path)


def parse_serve(raw: Mapping[str, Any], base: Path) -> ServeSettings:
    """Validate ``[serve]``; the first problem is reported with its key."""
    for key in raw:
        if key not in _KEYS:
            raise ServeError(f"serve.{key}: unknown key (expected one of {', '.join(_KEYS)})")
    values: dict[str, Any] = {}
    for key, (low, high, default) in _BOUNDS.items():
        value = raw.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ServeError(f"serve.{key}: must be an integer from {low} to {high}, got {value!r}")
        values[key] = value
    fraction = raw.get("check_fraction", 0.1)
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction <= 1:
        raise ServeError(f"serve.check_fraction: must be a number from 0 to 1, got {fraction!r}")
    http = raw.get("http", DEFAULT_HTTP if raw else "")
    if not isinstance(http, str):
        raise ServeError(f"serve.http: expected \"HOST:PORT\" or \"\", got {http!r}")
    if http:
        split_address(http)
    models = raw.get("models", {})
    if not isinstance(models, Mapping) or len(models) > MAX_MODELS:
        raise ServeError(f"serve.models: must be a table of at most {MAX_MODELS} models")
    entries = tuple(model_entry(str(k), v, base) for k, v in models.items())
    return ServeSettings(http=http, check_fraction=float(fraction), models=entries, **values)
