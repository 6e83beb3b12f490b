"""Which jobs this node runs: the operator's policy, applied before a job is adopted.

The mesh is open, so a job spec is a stranger's request for this machine's time. It may name
only built-in components, or plug-ins (``module:function``) that match a pattern the operator
allowed (node.toml ``[jobs] allow_plugins``, ``--allow-plugin``); its data set, pretrained
model and corpus are names that must be configured here (``[data]``, ``[models]``,
``[text]``); its publisher must be one this node accepts (``[jobs] accept``,
``--accept-jobs``); and the publisher may hold only so many unfinished jobs on this node at
once. A job that fails any of these is refused before anything of it is imported, opened,
saved or run, with a :class:`Refusal` whose one line says what to configure.

Pure and cheap (no torch, no I/O): the node calls it for every job frame it sees, and the
CLI and the SDK call it to tell a user early.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from gpuflex.jobspec import DATA_PATH_KIND, JobSpec
from gpuflex.llmspec import is_llm
from gpuflex.nodeconfig import NodeConfig
from gpuflex.plugins import is_plugin_path
from mesh.compat import StrEnum

#: The fields of a job spec that may name a plug-in.
PLUGIN_FIELDS: tuple[str, ...] = ("model", "data", "train_fn", "partitioner", "rule")


class RefusalKind(StrEnum):
    """Why a job is not run here; only CAP can change without the operator's doing."""

    SPEC = "spec"  # not a valid job at all
    PUBLISHER = "publisher"
    PLUGIN = "plugin"
    DATA = "data"
    CAP = "cap"
    CRASHED = "crashed"  # its plug-in code was running when this node stopped without shutting down


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    reason: str

    @property
    def transient(self) -> bool:
        """A job refused for a cap may be taken on once this node's other jobs finish."""
        return self.kind == RefusalKind.CAP

    def __str__(self) -> str:
        return self.reason


def _glob(text: str, star: str) -> str:
    return "".join(star if part == "*" else re.escape(part) for part in re.split(r"(\*)", text))


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """In the module part ``*`` matches any run of characters (``mylab.*`` takes every module of
    the package); in the function part it matches one name, never a dotted path: a module's
    namespace also holds what it imported, so ``mylab.models:*`` must not reach
    ``mylab.models:os.abort``. Everything else is literal."""
    module, sep, function = pattern.partition(":")
    return re.compile(_glob(module, ".*") + re.escape(sep) + _glob(function, r"[A-Za-z_]\w*") + r"\Z")


@dataclass(frozen=True)
class JobPolicy:
    """The operator's rules for incoming jobs, from its :class:`NodeConfig`."""

    config: NodeConfig
    own_id: str = ""

    @cached_property
    def _patterns(self) -> tuple[re.Pattern[str], ...]:
        return tuple(pattern_regex(p) for p in self.config.allow_plugins)

    @property
    def allows_everything(self) -> bool:
        """``*:*`` (or the like): any accepted publisher can run code here."""
        return any(p.match("x:y") and p.match("a.b:c") for p in self._patterns)

    def plugin_allowed(self, path: str) -> bool:
        return any(p.match(path) for p in self._patterns)

    def accepts_publisher(self, publisher: str) -> bool:
        accept = self.config.accept
        return accept == "any" or publisher == self.own_id or publisher in accept

    def content_refusal(self, spec: JobSpec) -> Refusal | None:
        """What in the spec itself this node will not run: a plug-in it does not allow, or a
        data set, model or corpus its operator has not configured."""
        for name in PLUGIN_FIELDS:
            value = getattr(spec, name)
            if value and is_plugin_path(value) and not self.plugin_allowed(value):
                allowed = ", ".join(repr(p) for p in self.config.allow_plugins) or "none"
                return Refusal(RefusalKind.PLUGIN, (
                    f"{name} {value!r} is a plug-in this node does not allow (allowed: {allowed}); "
                    "an operator who trusts it adds --allow-plugin PATTERN or node.toml [jobs] allow_plugins"))
        return self._data_refusal(spec)

    def _data_refusal(self, spec: JobSpec) -> Refusal | None:
        config = self.config
        if spec.data in DATA_PATH_KIND and config.data_path(spec.data) is None:
            return Refusal(RefusalKind.DATA, (
                f"data {spec.data!r} is not on this node: its operator maps the name to a local path "
                f"with --data {spec.data}=PATH or node.toml [data] {spec.data} = \"PATH\""))
        if is_llm(spec.model):
            pretrained, corpus = spec.llm.get("pretrained", ""), spec.llm.get("corpus", "")
            if pretrained and pretrained not in config.models:
                return Refusal(RefusalKind.DATA, (
                    f"pretrained model {pretrained!r} is not on this node (node.toml [models] {pretrained})"))
            if corpus and corpus not in config.text:
                return Refusal(RefusalKind.DATA, f"corpus {corpus!r} is not on this node (node.toml [text] {corpus})")
        return None

    def publisher_refusal(self, publisher: str) -> Refusal | None:
        if self.accepts_publisher(publisher):
            return None
        return Refusal(RefusalKind.PUBLISHER, (
            f"publisher {publisher} is not one this node accepts jobs from "
            "(--accept-jobs / node.toml [jobs] accept)"))

    def cap_refusal(self, publisher: str, unfinished: Mapping[str, int]) -> Refusal | None:
        """``unfinished``: this node's unfinished jobs per publisher. The node's own jobs
        count towards the total only."""
        total = sum(unfinished.values())
        if total >= self.config.max_jobs:
            return Refusal(RefusalKind.CAP, (
                f"this node already holds {total} unfinished jobs, its limit "
                "(--max-jobs / node.toml [jobs] max_jobs)"))
        mine = unfinished.get(publisher, 0)
        if publisher != self.own_id and mine >= self.config.max_jobs_per_publisher:
            return Refusal(RefusalKind.CAP, (
                f"publisher {publisher} already has {mine} unfinished jobs on this node, its limit "
                "(--max-jobs-per-publisher / node.toml [jobs] max_jobs_per_publisher)"))
        return None

    def refusal(self, spec: JobSpec, publisher: str, unfinished: Mapping[str, int] | None = None) -> Refusal | None:
        """The first reason not to run ``spec`` from ``publisher`` here, or None. Caps are
        checked only when ``unfinished`` is given (not for jobs resumed at start)."""
        return (self.publisher_refusal(publisher) or self.content_refusal(spec)
                or (self.cap_refusal(publisher, unfinished) if unfinished is not None else None))
