"""The job file: what to train, on what data, for how long, and how to combine updates.

A job travels through the mesh as a signed record, so it has to be plain data with one
canonical byte form: every node must hash the same spec to the same id. It is also what users
type by hand, so validation reports every mistake at once, by field, instead of stopping at the
first one. No torch here: the CLI validates job files and must start fast.
"""

from __future__ import annotations

import difflib
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from gpuflex.errors import GpuflexError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from gpuflex.budgetspec import budget_cross_checks
from gpuflex.llmspec import LLM_MODELS, is_llm, llm_cross_checks
from gpuflex.plugins import is_plugin_path, plugin_path_problem

BUILTIN_MODELS: tuple[str, ...] = ("digits-cnn", "cifar10-cnn", "mlp", "char-gru", *LLM_MODELS)
BUILTIN_DATA: tuple[str, ...] = ("sklearn-digits", "sklearn-breast-cancer", "cifar10", "shakespeare", "text")
# Built-in data sets read from data_path, and what that path must be.
DATA_PATH_KIND: dict[str, str] = {"cifar10": "dir", "shakespeare": "file"}
# Built-in data sets with a natural per-sample group (the speaking role), for partition="groups".
GROUPED_DATA: tuple[str, ...] = ("shakespeare",)

Partition = Literal["iid", "dirichlet", "shards", "groups", "local"]
Optimizer = Literal["sgd", "momentum", "adam", "adamw"]
Strategy = Literal["fedavg", "fedavgm", "fedadam", "diloco"]
CodecName = Literal["none", "fp16", "int8", "topk"]
AggregationMode = Literal["tree", "flat-robust"]
NormBoundMode = Literal["clip", "reject"]
OnBudget = Literal["stop", "warn"]
Normalization = Literal["auto", "none", "fednova"]
PARTITIONS: tuple[Partition, ...] = get_args(Partition)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
CODECS: tuple[CodecName, ...] = get_args(CodecName)
AGGREGATION_MODES: tuple[AggregationMode, ...] = get_args(AggregationMode)
NORM_BOUND_MODES: tuple[NormBoundMode, ...] = get_args(NormBoundMode)
DP_ON_BUDGET: tuple[OnBudget, ...] = get_args(OnBudget)
NORMALIZATIONS: tuple[Normalization, ...] = get_args(Normalization)

#: What 0 means for the three timeouts of a job (see ``JobSpec.plan_timeout``, ...).
#: A backup coordinator waits this long per better-ranked live candidate before planning.
AUTO_PLAN_TIMEOUT_S = 6.0
#: Each level of the group tree gets this long after the training deadline to reduce.
AUTO_REDUCE_SLACK_S = 5.0
#: The first round's training budget, with no committed round to learn durations from.
AUTO_FIRST_TRAIN_S = 120.0
#: The adaptive training budget never drops below this (a slow round after fast ones).
AUTO_MIN_TRAIN_S = 15.0
#: The adaptive budget is this many times the median duration of recent rounds.
AUTO_TRAIN_FACTOR = 4.0
#: How many recent committed rounds the adaptive budget looks at.
AUTO_TRAIN_HISTORY = 5
#: With a compute budget, members get this share of it beyond the budget (at least
#: BUDGET_SLACK_MIN_S) to fetch the model and send their update before the training deadline.
BUDGET_SLACK_FACTOR = 0.5
BUDGET_SLACK_MIN_S = 5.0

TEMPLATE = "templates/job.toml"
#: ``gpuflex job init --template NAME`` writes templates/NAME.toml.
TEMPLATES: tuple[str, ...] = ("job", "lora")


class JobSpecError(GpuflexError, ValueError):
    """Every problem found in a job, as (field, message) pairs, so all can be fixed in one go."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = list(errors)
        super().__init__("\n".join(f"{name}: {message}" for name, message in self.errors))


@dataclass(frozen=True)
class JobSpec:
    """One federated training job. Defaults are the tuned digits demo (see the template)."""

    model: str
    data: str
    name: str = "job"
    data_path: str = ""
    partition: Partition = "iid"
    alpha: float = 0.5
    shards_per_node: int = 2
    rounds: int = 15
    local_epochs: int = 2
    local_steps: int = 0
    #: Seconds of local training per member per round (0: off). Each member gets the steps its
    #: measured throughput fits in this budget and stops at it in any case; see docs/heterogeneous.md.
    compute_budget_s: float = 0.0
    #: How updates of unequal local work are combined: "fednova" divides each by its local steps
    #: (Wang et al. 2020); "auto" is "fednova" under a compute budget and "none" otherwise.
    normalization: Normalization = "auto"
    batch_size: int = 32
    lr: float = 0.05
    optimizer: Optimizer = "momentum"
    weight_decay: float = 0.0
    strategy: Strategy = "fedavg"
    server_lr: float = 1.0
    server_momentum: float = 0.9
    rule: str = "mean"
    rule_params: dict[str, Any] = field(default_factory=dict)
    aggregation_mode: AggregationMode = "tree"
    norm_bound: float = 0.0
    norm_bound_mode: NormBoundMode = "clip"
    codec: CodecName = "none"
    error_feedback: bool = True
    group_size: int = 4
    min_nodes: int = 2
    seed: int = 0
    test_fraction: float = 0.25
    plan_timeout_s: float = 0.0  # 0: AUTO_PLAN_TIMEOUT_S, see plan_timeout
    train_timeout_s: float = 0.0  # 0: adaptive, see train_budget
    reduce_timeout_s: float = 0.0  # 0: AUTO_REDUCE_SLACK_S, see reduce_slack
    allowlist: tuple[str, ...] = field(default_factory=tuple)
    train_fn: str = ""
    partitioner: str = ""
    dp_clip: float = 0.0
    dp_noise_multiplier: float = 0.0
    dp_delta: float = 1e-5
    dp_epsilon_budget: float = 0.0
    dp_on_budget: OnBudget = "stop"
    secure_aggregation: bool = False
    secagg_threshold: int = 0  # 0: half the group, see secagg_threshold_for
    #: Language-model settings (model, LoRA adapter, tokenizer, text); see gpuflex/llmspec.py.
    llm: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, check_paths: bool = True, base_dir: Path | None = None
    ) -> JobSpec:
        """Validate and build a spec, collecting every error.

        ``check_paths=False`` suits a node that receives a spec from a peer: the submitter's
        data_path need not exist on the receiving machine until it trains. A relative data_path
        is resolved against ``base_dir`` (the job file's folder) when given.
        """
        if not isinstance(data, Mapping):
            raise JobSpecError([("job", f"must be a table of keys, got {type(data).__name__}")])
        errors: list[tuple[str, str]] = []
        values: dict[str, Any] = {}
        for key in data:
            if key not in _CHECKS:
                errors.append((str(key), _unknown_key_message(str(key))))
        for name, check in _CHECKS.items():
            if name not in data:
                if name in _REQUIRED:
                    errors.append((name, f"is required ({_REQUIRED[name]})"))
                continue
            try:
                values[name] = check(data[name])
            except _Invalid as exc:
                errors.append((name, str(exc)))
        if "data_path" in values and values["data_path"] and base_dir is not None:
            path = Path(values["data_path"]).expanduser()
            if not path.is_absolute():
                values["data_path"] = str((base_dir / path).resolve())
        failed = {name for name, _ in errors}
        errors.extend(_cross_checks(values, failed, check_paths))
        if errors:
            raise JobSpecError(errors)
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path, *, check_paths: bool = True) -> JobSpec:
        """Read a job file; file and syntax problems are reported like field errors."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise JobSpecError([("file", f"{str(path)!r} does not exist")]) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise JobSpecError([("file", f"cannot read {str(path)!r}: {exc}")]) from None
        return cls.from_toml_text(
            text, check_paths=check_paths, base_dir=path.resolve().parent, source=str(path)
        )

    @classmethod
    def from_toml_text(
        cls,
        text: str,
        *,
        check_paths: bool = True,
        base_dir: Path | None = None,
        source: str = "job",
    ) -> JobSpec:
        """Parse TOML held in memory (the template, a job pasted into the SDK)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobSpecError([("file", f"{source!r} is not valid TOML: {exc}")]) from None
        return cls.from_dict(data, check_paths=check_paths, base_dir=base_dir)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (str, int, float, list) that survives JSON and msgpack unchanged."""
        out = asdict(self)
        out["allowlist"] = list(self.allowlist)
        out["rule_params"] = dict(sorted(self.rule_params.items()))
        return out

    def canonical_bytes(self) -> bytes:
        """One byte form per spec, so every node derives the same job id from it."""
        return json.dumps(
            self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    @property
    def uses_dp(self) -> bool:
        """Client-side DP is on when both a clip norm and a noise multiplier are set."""
        return self.dp_clip > 0 and self.dp_noise_multiplier > 0

    @property
    def uses_steps(self) -> bool:
        """local_steps wins when set, so users can switch by adding one line."""
        return self.local_steps > 0

    @property
    def uses_budget(self) -> bool:
        """Local training is time-budgeted: the plan gives each member its own step count."""
        return self.compute_budget_s > 0

    @property
    def uses_fednova(self) -> bool:
        """Updates are normalised by their local steps before they are averaged."""
        return self.normalization == "fednova" or (self.normalization == "auto" and self.uses_budget)

    # -- what 0 means: each automatic default is resolved here, beside its field ------------

    @property
    def plan_timeout(self) -> float:
        """Seconds a backup coordinator waits per better-ranked candidate."""
        return self.plan_timeout_s or AUTO_PLAN_TIMEOUT_S

    @property
    def reduce_slack(self) -> float:
        """Seconds each level of the group tree gets to reduce after the training deadline."""
        return self.reduce_timeout_s or AUTO_REDUCE_SLACK_S

    def train_budget(self, recent_durations: Sequence[object]) -> float:
        """Seconds members get to train: the job's own setting, or a multiple of the median
        duration of the last few committed rounds (``duration_s`` of their metrics)."""
        if self.train_timeout_s:
            return self.train_timeout_s
        if self.uses_budget:  # the round's length is the budget, not the history of slow rounds
            return self.compute_budget_s + max(BUDGET_SLACK_MIN_S, BUDGET_SLACK_FACTOR * self.compute_budget_s)
        durations = [float(d) for d in recent_durations[-AUTO_TRAIN_HISTORY:]
                     if isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0]
        if not durations:
            return AUTO_FIRST_TRAIN_S
        return max(AUTO_MIN_TRAIN_S, AUTO_TRAIN_FACTOR * statistics.median(durations))

    def secagg_threshold_for(self, default: int) -> int:
        """How many of a secure-aggregation group's shares rebuild a mask: the job's setting,
        or ``default`` (the aggregation layer's choice for the group's size)."""
        return self.secagg_threshold or default


def example_job_toml(template: str = "job") -> str:
    """The commented example job that ``gpuflex job init [--template NAME]`` writes."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; expected one of {', '.join(TEMPLATES)}")
    path = TEMPLATE if template == "job" else f"templates/{template}.toml"
    return resources.files("gpuflex").joinpath(path).read_text(encoding="utf-8")


# --- field checks -------------------------------------------------------------------------


class _Invalid(ValueError):
    pass


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if not _is_int(value) or value < minimum:
            raise _Invalid(f"must be an integer ≥ {minimum}, got {value!r}")
        return int(value)

    return check


def _float(minimum: float, *, strict: bool, maximum: float | None = None) -> Callable[[Any], float]:
    low = f"> {minimum:g}" if strict else f"≥ {minimum:g}"
    wanted = f"a number {low}" if maximum is None else f"a number {low} and < {maximum:g}"

    def check(value: Any) -> float:
        ok = (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
        if ok:
            ok = value > minimum if strict else value >= minimum
        if ok and maximum is not None:
            ok = value < maximum
        if not ok:
            raise _Invalid(f"must be {wanted}, got {value!r}")
        return float(value)

    return check


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            listed = ", ".join(repr(o) for o in options)
            raise _Invalid(f"must be one of {listed}, got {value!r}")
        return str(value)

    return check


def _text(*, allow_empty: bool) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or (not allow_empty and not value.strip()):
            kind = "a string" if allow_empty else "a non-empty string"
            raise _Invalid(f"must be {kind}, got {value!r}")
        return value

    return check


def _named(builtins: tuple[str, ...], kind: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise _Invalid(f"must be a built-in {kind} name or 'package.module:function', got {value!r}")
        if is_plugin_path(value):
            problem = plugin_path_problem(value)
            if problem:
                raise _Invalid(problem)
        elif value not in builtins:
            close = difflib.get_close_matches(value, builtins, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            listed = ", ".join(repr(b) for b in builtins)
            raise _Invalid(
                f"unknown built-in {kind} {value!r}{hint}; expected one of {listed} "
                "or 'package.module:function'"
            )
        return value

    return check


def _optional_plugin(value: Any) -> str:
    if value == "":
        return ""
    problem = plugin_path_problem(value) if isinstance(value, str) else "must be a string"
    if problem:
        raise _Invalid(problem)
    return value


def _rule(value: Any) -> str:
    """Rule names belong to aggregation/, which validation must not import; check shape only."""
    value = _text(allow_empty=False)(value)
    if is_plugin_path(value) and (problem := plugin_path_problem(value)):
        raise _Invalid(problem)
    return value


def _rule_params(value: Any) -> dict[str, Any]:
    """Rule hyper-parameters (beta, f, m, tau, iterations): names are checked by make_rule."""
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and (_is_int(v) or isinstance(v, float)) for k, v in value.items()
    ):
        raise _Invalid(f"must be a table of numbers, e.g. {{ f = 1 }}, got {value!r}")
    return dict(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"must be true or false, got {value!r}")
    return value


def _table(value: Any) -> dict[str, Any]:
    """The [llm] table; its keys are checked against the model in the cross checks."""
    if not isinstance(value, Mapping):
        raise _Invalid(f"must be a table, e.g. [llm], got {value!r}")
    return dict(value)


def _allowlist(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Invalid(f"must be a list of peer id strings, got {value!r}")
    return tuple(value)


_TIMEOUT = _float(0.0, strict=False)
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "name": _text(allow_empty=False),
    "model": _named(BUILTIN_MODELS, "model"),
    "data": _named(BUILTIN_DATA, "data"),
    "data_path": _text(allow_empty=True),
    "partition": _choice(PARTITIONS),
    "alpha": _float(0.0, strict=True),
    "shards_per_node": _int(1),
    "rounds": _int(1),
    "local_epochs": _int(0),
    "local_steps": _int(0),
    "compute_budget_s": _float(0.0, strict=False),
    "normalization": _choice(NORMALIZATIONS),
    "batch_size": _int(1),
    "lr": _float(0.0, strict=True),
    "optimizer": _choice(OPTIMIZERS),
    "weight_decay": _float(0.0, strict=False),
    "strategy": _choice(STRATEGIES),
    "server_lr": _float(0.0, strict=True),
    "server_momentum": _float(0.0, strict=False, maximum=1.0),
    "rule": _rule,
    "rule_params": _rule_params,
    "aggregation_mode": _choice(AGGREGATION_MODES),
    "norm_bound": _float(0.0, strict=False),
    "norm_bound_mode": _choice(NORM_BOUND_MODES),
    "codec": _choice(CODECS),
    "error_feedback": _bool,
    "group_size": _int(2),
    "min_nodes": _int(1),
    "seed": _int(0),
    "test_fraction": _float(0.0, strict=True, maximum=1.0),
    "plan_timeout_s": _TIMEOUT,
    "train_timeout_s": _TIMEOUT,
    "reduce_timeout_s": _TIMEOUT,
    "allowlist": _allowlist,
    "train_fn": _optional_plugin,
    "partitioner": _optional_plugin,
    "dp_clip": _float(0.0, strict=False),
    "dp_noise_multiplier": _float(0.0, strict=False),
    "dp_delta": _float(0.0, strict=True, maximum=1.0),
    "dp_epsilon_budget": _float(0.0, strict=False),
    "dp_on_budget": _choice(DP_ON_BUDGET),
    "secure_aggregation": _bool,
    "secagg_threshold": _int(0),
    "llm": _table,
}
assert set(_CHECKS) == {f.name for f in fields(JobSpec)}, "every JobSpec field needs a check"

_REQUIRED = {
    "model": f"a built-in name ({', '.join(BUILTIN_MODELS)}) or 'package.module:function'",
    "data": f"a built-in name ({', '.join(BUILTIN_DATA)}) or 'package.module:function'",
}


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, list(_CHECKS), n=1)
    return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"


def _cross_checks(
    values: dict[str, Any], failed: set[str], check_paths: bool
) -> list[tuple[str, str]]:
    """Rules that involve more than one field; skipped for fields that already failed."""
    errors: list[tuple[str, str]] = []
    epochs = values.get("local_epochs", JobSpec.local_epochs)
    steps = values.get("local_steps", JobSpec.local_steps)
    if epochs == 0 and steps == 0 and not values.get("compute_budget_s", 0.0):
        errors.append(("local_epochs", "local_epochs, local_steps or compute_budget_s must be positive, all are 0"))
    data = values.get("data")
    path = values.get("data_path", "")
    partition = values.get("partition", "iid")
    local = partition == "local"
    if "data_path" in failed or "data" in failed:
        pass
    elif data in DATA_PATH_KIND and not path and not is_llm(values.get("model")):
        # A language model reads its text from the node's node.toml [data] when no path is given.
        errors.append(("data_path", f"is required for data {data!r}"))
    elif path and check_paths and not (local and not Path(path).expanduser().is_absolute()):
        # A relative path under partition="local" is resolved per node, against its home.
        kind = DATA_PATH_KIND.get(data or "", "any")
        target = Path(path).expanduser()
        if not target.exists():
            errors.append(("data_path", f"{path!r} does not exist"))
        elif kind == "dir" and not target.is_dir():
            errors.append(("data_path", f"{path!r} must be a directory for data {data!r}"))
        elif kind == "file" and not target.is_file():
            errors.append(("data_path", f"{path!r} must be a file for data {data!r}"))
    if (
        partition == "groups"
        and data in BUILTIN_DATA
        and data not in GROUPED_DATA
        and not values.get("partitioner")
    ):
        errors.append(
            ("partition", f"'groups' needs data with natural groups ({', '.join(GROUPED_DATA)}), got {data!r}")
        )
    errors.extend(_trust_checks(values, failed))
    errors.extend(budget_cross_checks(values))
    errors.extend(llm_cross_checks(values, failed))
    return errors


def _trust_checks(values: dict[str, Any], failed: set[str]) -> list[tuple[str, str]]:
    """Combinations of robust rules, DP and secure aggregation that cannot work together."""
    errors: list[tuple[str, str]] = []
    rule = values.get("rule", "mean")
    params = values.get("rule_params", {})
    if "rule" not in failed and "rule_params" not in failed and not is_plugin_path(rule) and (
        rule != "mean" or params
    ):
        try:
            # Imported only for robust jobs, so plain job files still validate without numpy.
            from aggregation.robust import make_rule

            make_rule(rule, **params)
        except ValueError as exc:
            errors.append(("rule", str(exc)))
    if values.get("aggregation_mode") == "flat-robust" and rule == "mean":
        errors.append(("aggregation_mode", "'flat-robust' needs a robust rule; with 'mean' use 'tree'"))
    if (values.get("dp_clip", 0.0) > 0) != (values.get("dp_noise_multiplier", 0.0) > 0):
        errors.append(("dp_clip", "dp_clip and dp_noise_multiplier must be set together (both > 0)"))
    if values.get("dp_epsilon_budget", 0.0) > 0 and not values.get("dp_noise_multiplier", 0.0) > 0:
        errors.append(("dp_epsilon_budget", "a privacy budget needs dp_clip and dp_noise_multiplier"))
    if values.get("secure_aggregation"):
        # A leader only ever sees the group sum, so nothing that needs single updates can run.
        if rule != "mean":
            errors.append(("secure_aggregation", f"cannot be combined with rule {rule!r}: robust "
                           "rules need each update, secure aggregation reveals only the group sum"))
        if values.get("norm_bound", 0.0) > 0:
            errors.append(("secure_aggregation", "cannot be combined with norm_bound (needs each norm)"))
        if values.get("codec", "none") != "none":
            errors.append(("secure_aggregation", "needs codec = 'none' (it quantises on its own)"))
    elif values.get("secagg_threshold", 0):
        errors.append(("secagg_threshold", "is only used with secure_aggregation = true"))
    return errors
