"""Job files in YAML: the same keys and values as the TOML job file, read into the same dict.

Many ML tools keep their configs in YAML, so a job file may be YAML too. It is parsed with a
restricted safe loader and then validated by ``JobSpec.from_dict`` exactly like TOML, so a YAML
and a TOML file that say the same thing give the same canonical spec and the same job id.

The loader is stricter than ``yaml.safe_load`` where YAML differs from TOML in ways that would
surprise or hurt: no aliases (``&a``/``*a`` can expand a small file into a huge value), no
tags beyond plain scalars, lists and mappings (no dates, sets or binary), string keys only, and
scalars read as YAML 1.2 and TOML read them: ``1e-3`` is a float (YAML 1.1 reads a string),
``010`` and ``1:30`` are strings (not octal 8 and sexagesimal 90), only ``true``/``false`` are
booleans (not ``yes``, ``no``, ``on``, ``off``). The text is bounded
before it is parsed.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from gpuflex.errors import GpuflexError

#: A job file is a page of settings; anything larger is a mistake, not a job.
MAX_JOB_FILE_BYTES = 256 * 1024
#: File name endings read as YAML; everything else is TOML.
YAML_SUFFIXES = (".yaml", ".yml")

_FLOAT_RE = re.compile(r"""^[-+]?(?:
    (?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
  | \.[0-9_]+(?:[eE][-+]?[0-9]+)?
  | [0-9][0-9_]*[eE][-+]?[0-9]+
  | \.(?:inf|Inf|INF)
  | \.(?:nan|NaN|NAN))$""", re.X)
_INT_RE = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|0o[0-7_]+)$")
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_ALLOWED_TAGS = frozenset({
    "tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float", "tag:yaml.org,2002:str", "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:map",
})


class YamlJobError(GpuflexError, ValueError):
    """The text is not a YAML job file this reader accepts; the message says why in one line."""


@functools.cache
def _loader() -> type:
    import yaml

    class JobLoader(yaml.SafeLoader):
        """SafeLoader without aliases or rich tags, with TOML's float syntax."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise YamlJobError(f"line {mark.line + 1}: aliases (*name) are not allowed in a job file")
            node = super().compose_node(parent, index)
            if node is not None and node.tag not in _ALLOWED_TAGS:
                raise YamlJobError(f"line {node.start_mark.line + 1}: the tag {node.tag!r} is not allowed "
                                   "in a job file (plain numbers, strings, booleans, lists and tables only)")
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            for key_node, _ in node.value:
                if key_node.tag != "tag:yaml.org,2002:str":
                    raise YamlJobError(f"line {key_node.start_mark.line + 1}: keys must be strings, "
                                       f"got {key_node.value!r}")
            return super().construct_mapping(node, deep=deep)

    # The resolver table is per class: copy it without YAML 1.1's number, boolean and date
    # rules, then add YAML 1.2's (TOML's): no octal 010, no sexagesimal 1:30, no yes/no/on/off.
    replaced = {f"tag:yaml.org,2002:{t}" for t in ("float", "int", "bool", "timestamp")}
    JobLoader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag not in replaced]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    JobLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_RE, list("tTfF"))
    JobLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_RE, list("-+0123456789"))
    JobLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))
    return JobLoader


def load_yaml_job(text: str) -> Any:
    """Parse ``text`` into plain data (dict, list, str, int, float, bool, None)."""
    if len(text.encode("utf-8", errors="replace")) > MAX_JOB_FILE_BYTES:
        raise YamlJobError(f"is larger than {MAX_JOB_FILE_BYTES // 1024} KiB")
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # a SafeLoader subclass: plain data only
    except YamlJobError:
        raise
    except yaml.YAMLError as exc:
        raise YamlJobError(" ".join(str(exc).split())[:300]) from None

