"""The job file: what to train, on what data, for how long, and how to combine updates.

A job travels through the mesh as a signed record, so it has to be plain data with one
canonical byte form: every node must hash the same spec to the same id. It is also what users
type by hand, so validation reports every mistake at once, by field, instead of stopping at the
first one. No torch here: the CLI validates job files and must start fast.

A spec from the wire is a stranger's, so the validator is total: any value (a path, an import
path, a huge number or string, a nested table) either yields a spec whose every number and
string is bounded, or a :class:`JobSpecError` whose messages are short. It never imports,
opens or calls what a spec names; whether this node runs it is ``gpuflex.jobpolicy``'s call.
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
    import tomli as tomllib

from gpuflex.budgetspec import budget_cross_checks
from gpuflex.driftspec import drift_cross_checks
from gpuflex.fragmentspec import MAX_FRAGMENTS, fragment_cross_checks
from gpuflex.llmspec import LLM_MODELS, llm_cross_checks
from gpuflex.overlapspec import MAX_OVERLAP, overlap_cross_checks
from gpuflex.plugins import is_plugin_path, plugin_path_problem

BUILTIN_MODELS: tuple[str, ...] = ("digits-cnn", "cifar10-cnn", "mlp", "char-gru", *LLM_MODELS)
BUILTIN_DATA: tuple[str, ...] = ("sklearn-digits", "sklearn-breast-cancer", "cifar10", "shakespeare", "text")
# Built-in data sets read from a local path (a node's node.toml [data]), and what it must be.
DATA_PATH_KIND: dict[str, str] = {"cifar10": "dir", "shakespeare": "file"}
# Built-in data sets with a natural per-sample group (the speaking role), for partition="groups".
GROUPED_DATA: tuple[str, ...] = ("shakespeare",)

Partition = Literal["iid", "dirichlet", "shards", "groups", "local"]
Optimizer = Literal["sgd", "momentum", "adam", "adamw"]
Strategy = Literal["fedavg", "fedavgm", "fedadam", "diloco"]
CodecName = Literal["none", "fp16", "int8", "topk", "sparse"]
SparseTransform = Literal["none", "dct"]
AggregationMode = Literal["tree", "flat-robust"]
NormBoundMode = Literal["clip", "reject"]
OnBudget = Literal["stop", "warn"]
Normalization = Literal["auto", "none", "fednova"]
DriftCorrectionName = Literal["none", "fedprox", "scaffold", "feddyn"]
FinalModel = Literal["best", "last"]
PARTITIONS: tuple[Partition, ...] = get_args(Partition)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
CODECS: tuple[CodecName, ...] = get_args(CodecName)
AGGREGATION_MODES: tuple[AggregationMode, ...] = get_args(AggregationMode)
NORM_BOUND_MODES: tuple[NormBoundMode, ...] = get_args(NormBoundMode)
DP_ON_BUDGET: tuple[OnBudget, ...] = get_args(OnBudget)
NORMALIZATIONS: tuple[Normalization, ...] = get_args(Normalization)
SPARSE_TRANSFORMS: tuple[SparseTransform, ...] = get_args(SparseTransform)
#: codec = "sparse": value widths of an update and of the root's step (32 = float32), the
#: bounds on chunk and density (a chunk's count travels as uint16; the DCT is a dense
#: chunk x chunk product), and the robust rules that cannot run on sparse updates.
SPARSE_UPDATE_BITS, SPARSE_STEP_BITS = (2, 3, 4, 8), (4, 8, 32)
MIN_SPARSE_CHUNK, MAX_SPARSE_CHUNK, MAX_DCT_CHUNK = 16, 32_768, 1_024
MIN_SPARSE_DENSITY, MAX_SPARSE_DENSITY = 1 / 4096, 0.5
SPARSE_FIELDS = ("sparse_density", "sparse_bits", "sparse_chunk", "sparse_transform", "sparse_step_bits",
                 "sparse_feedback_decay")
DRIFT_CORRECTIONS: tuple[DriftCorrectionName, ...] = get_args(DriftCorrectionName)
FINAL_MODELS: tuple[FinalModel, ...] = get_args(FinalModel)

#: The server momentum of a strategy whose job file sets none, where it is not the field's
#: default: FedAdam's β1 and DiLoCo's outer Nesterov momentum as their papers publish them.
STRATEGY_MOMENTUM: dict[str, float] = {"fedadam": 0.9, "diloco": 0.9}

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

#: Bounds on what a job may ask of a node. A job is someone else's request for this machine's
#: time, so every count, size and deadline has a ceiling; ids and digests stay far below them.
MAX_ROUNDS, MAX_LOCAL_EPOCHS, MAX_LOCAL_STEPS = 100_000, 1_000, 1_000_000
MAX_BATCH_SIZE, MAX_GROUP_SIZE, MAX_MEMBERS, MAX_SHARDS = 65_536, 1_000, 10_000, 1_000
MAX_TIMEOUT_S = 86_400.0
MAX_NAME_CHARS, MAX_ALLOWLIST, MAX_RULE_PARAMS, MAX_RULE_PARAM = 200, 1_000, 8, 1e6
#: A field's value nests at most this deep ([llm] config is 2) and holds at most this many
#: values, checked before anything else looks at it (a repr of a deep list would overflow).
MAX_DEPTH, MAX_VALUES = 6, 10_000
MAX_UNKNOWN_LISTED = 20
#: Characters of one error message; a hostile value is quoted, never echoed whole.
MAX_MESSAGE_CHARS = 300

TEMPLATE = "templates/job.toml"
#: ``gpuflex job init --template NAME`` writes templates/NAME.toml.
TEMPLATES: tuple[str, ...] = ("job", "lora")


class JobSpecError(GpuflexError, ValueError):
    """Every problem found in a job, as (field, message) pairs, so all can be fixed in one go."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = [(_clip(name, 80), _clip(message, MAX_MESSAGE_CHARS)) for name, message in errors]
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
    #: Server momentum by default: under skewed data it closes most of the gap to central
    #: training at no cost in bytes (BENCHMARKS.md, "Skewed data"); on IID data it matches FedAvg.
    strategy: Strategy = "fedavgm"
    server_lr: float = 1.0
    #: FedAvgM's measured best with ``server_lr = 1``. A job file that names "fedadam" or
    #: "diloco" and sets no momentum gets their published 0.9 (``STRATEGY_MOMENTUM``).
    server_momentum: float = 0.7
    rule: str = "mean"
    rule_params: dict[str, Any] = field(default_factory=dict)
    aggregation_mode: AggregationMode = "tree"
    norm_bound: float = 0.0
    norm_bound_mode: NormBoundMode = "clip"
    codec: CodecName = "none"
    error_feedback: bool = True
    #: codec = "sparse": share of each chunk's values sent (top-k per chunk), their width in
    #: bits, the chunk length, an optional DCT per chunk, and the width of the root's step.
    sparse_density: float = 1 / 64
    sparse_bits: int = 2
    sparse_chunk: int = 4096
    sparse_transform: SparseTransform = "none"
    sparse_step_bits: int = 8
    #: The residual is scaled by this before each update joins it (1: all of it is kept).
    #: SparseLoCo's 0.95 reached a lower loss than 1.0 on Shakespeare (BENCHMARKS.md).
    sparse_feedback_decay: float = 0.95
    #: Client drift correction under skewed data: FedProx's proximal term (``prox_mu``),
    #: SCAFFOLD's control variates (twice the bytes per update) or FedDyn's dynamic regulariser
    #: (``prox_mu`` is its alpha; no extra bytes); see gpuflex/ml/drift.py.
    drift_correction: DriftCorrectionName = "none"
    prox_mu: float = 0.01
    #: Which committed model ``model.pt`` is: the round the root scored best on the held-out
    #: split ("best"), or the last round's ("last"). Both are written either way.
    final_model: FinalModel = "best"
    #: Share of a round's local steps a member trains ahead, from its own trained model, while
    #: its update travels (0: off; at most MAX_OVERLAP); see gpuflex/node/ahead.py.
    overlap: float = 0.0
    #: Rounds sync the model one fragment at a time, in turn, so each round moves about
    #: 1/fragments of it each way (1: the whole model every round; at most MAX_FRAGMENTS);
    #: see aggregation/fragments.py and gpuflex/node/ownmodel.py.
    fragments: int = 1
    group_size: int = 4
    min_nodes: int = 2
    seed: int = 0
    test_fraction: float = 0.25
    plan_timeout_s: float = 0.0  # 0: AUTO_PLAN_TIMEOUT_S, see plan_timeout
    train_timeout_s: float = 0.0  # 0: adaptive, see train_budget
    reduce_timeout_s: float = 0.0  # 0: AUTO_REDUCE_SLACK_S, see reduce_slack
    #: Seconds every node rests after a commit before it takes up the next round (0: none), so
    #: that a volunteer's machine is idle between rounds instead of training flat out; a plan
    #: that arrives earlier ends the rest (gpuflex/node/driver.py).
    pause_s: float = 0.0
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
    #: A member refuses to mask into a group with fewer masking members than this.
    secagg_min_group: int = 3
    #: At most this many plan members per IPv4 /24 or IPv6 /48 (0: off; loopback is exempt).
    max_per_prefix: int = 0
    #: One update weighs at most this many times the previous round's median sample count (0: off).
    sample_cap_factor: float = 4.0
    #: A fixed cap on one update's sample count instead (0: none).
    max_samples: int = 0
    #: Language-model settings (model, LoRA adapter, tokenizer, text); see gpuflex/llmspec.py.
    llm: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """Validate and build a spec, collecting every error. The same rules hold for a job
        file and for a frame from the wire: nothing in a spec is a path a node opens."""
        if not isinstance(data, Mapping):
            raise JobSpecError([("job", f"must be a table of keys, got {type(data).__name__}")])
        errors: list[tuple[str, str]] = []
        values: dict[str, Any] = {}
        unknown = [str(key) for key in data if key not in _CHECKS]
        errors.extend((key, _unknown_key_message(key)) for key in unknown[:MAX_UNKNOWN_LISTED])
        if len(unknown) > MAX_UNKNOWN_LISTED:
            errors.append(("job", f"and {len(unknown) - MAX_UNKNOWN_LISTED} more unknown keys"))
        for name, check in _CHECKS.items():
            if name not in data:
                if name in _REQUIRED:
                    errors.append((name, f"is required ({_REQUIRED[name]})"))
                continue
            if not _small(data[name]):
                errors.append((name, f"is nested deeper than {MAX_DEPTH} or holds more than {MAX_VALUES} values"))
                continue
            try:
                values[name] = check(data[name])
            except _Invalid as exc:
                errors.append((name, str(exc)))
        failed = {name for name, _ in errors}
        errors.extend(_cross_checks(values, failed))
        if errors:
            raise JobSpecError(errors)
        if "server_momentum" not in values and values.get("strategy") in STRATEGY_MOMENTUM:
            values["server_momentum"] = STRATEGY_MOMENTUM[values["strategy"]]
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> JobSpec:
        """Read a job file, YAML when its name ends in .yaml or .yml, TOML otherwise."""
        from gpuflex.jobyaml import YAML_SUFFIXES

        return cls.from_yaml(path) if Path(path).suffix.lower() in YAML_SUFFIXES else cls.from_toml(path)

    @classmethod
    def from_toml(cls, path: str | Path) -> JobSpec:
        """Read a job file; file and syntax problems are reported like field errors."""
        return cls.from_toml_text(_read_job_file(Path(path)), source=str(path))

    @classmethod
    def from_toml_text(cls, text: str, *, source: str = "job") -> JobSpec:
        """Parse TOML held in memory (the template, a job pasted into the SDK)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobSpecError([("file", f"{source!r} is not valid TOML: {exc}")]) from None
        return cls.from_dict(data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> JobSpec:
        """Read a YAML job file: the same keys, checks, canonical spec and job id as TOML."""
        return cls.from_yaml_text(_read_job_file(Path(path)), source=str(path))

    @classmethod
    def from_yaml_text(cls, text: str, *, source: str = "job") -> JobSpec:
        """Parse YAML held in memory with the restricted safe loader of ``gpuflex.jobyaml``."""
        from gpuflex.jobyaml import YamlJobError, load_yaml_job

        try:
            data = load_yaml_job(text)
        except YamlJobError as exc:
            raise JobSpecError([("file", f"{source!r} is not a valid YAML job: {exc}")]) from None
        return cls.from_dict(data)

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


def _read_job_file(path: Path) -> str:
    """A job file's text, bounded; file problems are reported like field errors."""
    from gpuflex.jobyaml import MAX_JOB_FILE_BYTES

    try:
        if path.stat().st_size > MAX_JOB_FILE_BYTES:
            raise JobSpecError([("file", f"{str(path)!r} is larger than {MAX_JOB_FILE_BYTES // 1024} KiB")])
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobSpecError([("file", f"{str(path)!r} does not exist")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobSpecError([("file", f"cannot read {str(path)!r}: {exc}")]) from None


def example_job_yaml(template: str = "job") -> str:
    """``gpuflex job init job.yaml``: the example job's settings as YAML. The comments that
    explain each key live in the TOML template, so the header points there."""
    import yaml

    data = tomllib.loads(example_job_toml(template))
    header = (f"# The {template!r} example job as YAML: the same keys as the TOML job file.\n"
              f"# `gpuflex job init --template {template} job.toml` writes it with a comment on every key.\n")
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


# --- field checks -------------------------------------------------------------------------


class _Invalid(GpuflexError, ValueError):
    pass


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(value: Any) -> str:
    """A value quoted in an error: a hostile one may be a megabyte, or nested a thousand deep."""
    if isinstance(value, (Mapping, list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return _clip(repr(value), 60)


def _small(value: Any) -> bool:
    """At most MAX_DEPTH levels and MAX_VALUES values, walked without recursion."""
    todo, seen = [(value, 1)], 0
    while todo:
        item, depth = todo.pop()
        seen += 1
        if seen > MAX_VALUES or depth > MAX_DEPTH:
            return False
        if isinstance(item, Mapping):
            todo.extend((v, depth + 1) for v in item.values())
            seen += len(item)  # the keys
        elif isinstance(item, (list, tuple)):
            todo.extend((v, depth + 1) for v in item)
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(minimum: int, maximum: int = 2**63 - 1) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if not _is_int(value) or not minimum <= value <= maximum:
            raise _Invalid(f"must be an integer from {minimum} to {maximum}, got {_show(value)}")
        return int(value)

    return check


def _finite(value: Any) -> bool:
    if not (_is_int(value) or isinstance(value, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _float(minimum: float, *, strict: bool, maximum: float | None = None,
           closed: bool = False) -> Callable[[Any], float]:
    low = f"> {minimum:g}" if strict else f"≥ {minimum:g}"
    wanted = f"a number {low}"
    if maximum is not None:
        wanted += f" and {'≤' if closed else '<'} {maximum:g}"

    def check(value: Any) -> float:
        ok = _finite(value)
        if ok:
            ok = value > minimum if strict else value >= minimum
        if ok and maximum is not None:
            ok = value <= maximum if closed else value < maximum
        if not ok:
            raise _Invalid(f"must be {wanted}, got {_show(value)}")
        return float(value)

    return check


def _int_choice(options: tuple[int, ...]) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if not _is_int(value) or value not in options:
            raise _Invalid(f"must be one of {', '.join(map(str, options))}, got {_show(value)}")
        return int(value)

    return check


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            listed = ", ".join(repr(o) for o in options)
            raise _Invalid(f"must be one of {listed}, got {_show(value)}")
        return str(value)

    return check


def _text(*, allow_empty: bool, limit: int = MAX_NAME_CHARS) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or (not allow_empty and not value.strip()) or len(value) > limit:
            kind = "a string" if allow_empty else "a non-empty string"
            raise _Invalid(f"must be {kind} of at most {limit} characters, got {_show(value)}")
        return value

    return check


def _no_path(value: Any) -> str:
    """A job never carries a path: a path names a file on the submitter's machine, and on
    anyone else's it names whatever is there (``/dev/zero``, a key, a pickle)."""
    if value != "":
        raise _Invalid(f"a job cannot carry a path (got {_show(value)}): each node reads the data set "
                       "named by `data` from its operator's configuration, node.toml [data] NAME = \"PATH\" "
                       "or `gpuflex node start --data NAME=PATH`")
    return ""


def _named(builtins: tuple[str, ...], kind: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise _Invalid(f"must be a built-in {kind} name or 'package.module:function', got {_show(value)}")
        if is_plugin_path(value):
            problem = plugin_path_problem(value)
            if problem:
                raise _Invalid(problem)
        elif value not in builtins:
            close = difflib.get_close_matches(value, builtins, n=1) if len(value) <= MAX_NAME_CHARS else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            listed = ", ".join(repr(b) for b in builtins)
            raise _Invalid(
                f"unknown built-in {kind} {_show(value)}{hint}; expected one of {listed} "
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
    if not isinstance(value, Mapping) or len(value) > MAX_RULE_PARAMS or not all(
        isinstance(k, str) and len(k) <= 32 and _finite(v) and abs(v) <= MAX_RULE_PARAM
        for k, v in value.items()
    ):
        raise _Invalid(f"must be a table of at most {MAX_RULE_PARAMS} numbers within ±{MAX_RULE_PARAM:g}, "
                       f"e.g. {{ f = 1 }}, got {_show(value)}")
    return dict(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"must be true or false, got {_show(value)}")
    return value


def _table(value: Any) -> dict[str, Any]:
    """The [llm] table; its keys are checked against the model in the cross checks."""
    if not isinstance(value, Mapping):
        raise _Invalid(f"must be a table, e.g. [llm], got {_show(value)}")
    return dict(value)


def _allowlist(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_ALLOWLIST or not all(
            isinstance(v, str) and 0 < len(v) <= 128 for v in value):
        raise _Invalid(f"must be a list of at most {MAX_ALLOWLIST} peer id strings, got {_show(value)}")
    return tuple(value)


_TIMEOUT = _float(0.0, strict=False, maximum=MAX_TIMEOUT_S, closed=True)
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "name": _text(allow_empty=False),
    "model": _named(BUILTIN_MODELS, "model"),
    "data": _named(BUILTIN_DATA, "data"),
    "data_path": _no_path,
    "partition": _choice(PARTITIONS),
    "alpha": _float(0.0, strict=True),
    "shards_per_node": _int(1, MAX_SHARDS),
    "rounds": _int(1, MAX_ROUNDS),
    "local_epochs": _int(0, MAX_LOCAL_EPOCHS),
    "local_steps": _int(0, MAX_LOCAL_STEPS),
    "compute_budget_s": _float(0.0, strict=False, maximum=MAX_TIMEOUT_S, closed=True),
    "normalization": _choice(NORMALIZATIONS),
    "batch_size": _int(1, MAX_BATCH_SIZE),
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
    "sparse_density": _float(MIN_SPARSE_DENSITY, strict=False, maximum=MAX_SPARSE_DENSITY, closed=True),
    "sparse_bits": _int_choice(SPARSE_UPDATE_BITS),
    "sparse_chunk": _int(MIN_SPARSE_CHUNK, MAX_SPARSE_CHUNK),
    "sparse_transform": _choice(SPARSE_TRANSFORMS),
    "sparse_step_bits": _int_choice(SPARSE_STEP_BITS),
    "sparse_feedback_decay": _float(0.0, strict=True, maximum=1.0, closed=True),
    "drift_correction": _choice(DRIFT_CORRECTIONS),
    "prox_mu": _float(0.0, strict=False, maximum=100.0),
    "final_model": _choice(FINAL_MODELS),
    "overlap": _float(0.0, strict=False, maximum=MAX_OVERLAP, closed=True),
    "fragments": _int(1, MAX_FRAGMENTS),
    "group_size": _int(2, MAX_GROUP_SIZE),
    "min_nodes": _int(1, MAX_MEMBERS),
    "seed": _int(0),
    "test_fraction": _float(0.0, strict=True, maximum=1.0),
    "plan_timeout_s": _TIMEOUT,
    "train_timeout_s": _TIMEOUT,
    "reduce_timeout_s": _TIMEOUT,
    "pause_s": _TIMEOUT,
    "allowlist": _allowlist,
    "train_fn": _optional_plugin,
    "partitioner": _optional_plugin,
    "dp_clip": _float(0.0, strict=False),
    "dp_noise_multiplier": _float(0.0, strict=False),
    "dp_delta": _float(0.0, strict=True, maximum=1.0),
    "dp_epsilon_budget": _float(0.0, strict=False),
    "dp_on_budget": _choice(DP_ON_BUDGET),
    "secure_aggregation": _bool,
    "secagg_threshold": _int(0, MAX_GROUP_SIZE),
    "secagg_min_group": _int(2, MAX_GROUP_SIZE),
    "max_per_prefix": _int(0, MAX_MEMBERS),
    "sample_cap_factor": _float(0.0, strict=False, maximum=1e6),
    "max_samples": _int(0, 2**53),
    "llm": _table,
}
assert set(_CHECKS) == {f.name for f in fields(JobSpec)}, "every JobSpec field needs a check"

_REQUIRED = {
    "model": f"a built-in name ({', '.join(BUILTIN_MODELS)}) or 'package.module:function'",
    "data": f"a built-in name ({', '.join(BUILTIN_DATA)}) or 'package.module:function'",
}


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, list(_CHECKS), n=1) if len(key) <= 64 else []
    return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"


def _cross_checks(values: dict[str, Any], failed: set[str]) -> list[tuple[str, str]]:
    """Rules that involve more than one field; skipped for fields that already failed."""
    errors: list[tuple[str, str]] = []
    epochs = values.get("local_epochs", JobSpec.local_epochs)
    steps = values.get("local_steps", JobSpec.local_steps)
    if epochs == 0 and steps == 0 and not values.get("compute_budget_s", 0.0):
        errors.append(("local_epochs", "local_epochs, local_steps or compute_budget_s must be positive, all are 0"))
    data = values.get("data")
    partition = values.get("partition", "iid")
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
    errors.extend(_sparse_checks(values))
    errors.extend(budget_cross_checks(values))
    errors.extend(llm_cross_checks(values, failed))
    errors.extend(drift_cross_checks(values))
    errors.extend(overlap_cross_checks(values))
    errors.extend(fragment_cross_checks(values))
    return errors


def _sparse_checks(values: dict[str, Any]) -> list[tuple[str, str]]:
    """codec = "sparse" and what cannot run on sparse updates, each with its reason."""
    if values.get("codec", "none") != "sparse":
        # A spec from the wire names every field: only a value other than the default is a mistake.
        return [(name, "is only used with codec = 'sparse'") for name in SPARSE_FIELDS
                if values.get(name, getattr(JobSpec, name)) != getattr(JobSpec, name)]
    errors: list[tuple[str, str]] = []
    if values.get("sparse_transform") == "dct" and values.get("sparse_chunk", JobSpec.sparse_chunk) > MAX_DCT_CHUNK:
        errors.append(("sparse_chunk", f"must be at most {MAX_DCT_CHUNK} with sparse_transform = 'dct' "
                       "(the DCT is a dense chunk x chunk product)"))
    rule = values.get("rule", "mean")
    if rule in ("median", "trimmed-mean"):
        errors.append(("rule", f"{rule!r} cannot run on sparse updates: members keep different coordinates, "
                       "so a coordinate's median (or trimmed mean) is almost always 0 and the step vanishes; "
                       "use krum, multi-krum, centered-clipping or norm_bound"))
    if values.get("secure_aggregation"):
        errors.append(("codec", "'sparse' cannot be combined with secure_aggregation: masking hides which "
                       "coordinates a member sends, so a masked update is the whole model's size"))
    if values.get("drift_correction") == "scaffold":
        errors.append(("codec", "'sparse' cannot be combined with drift_correction = 'scaffold': its control "
                       "variates must reach the root whole, and top-k would keep a different 1/64 of them"))
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
    if 0 < values.get("sample_cap_factor", 4.0) < 1:
        errors.append(("sample_cap_factor", "must be 0 (off) or at least 1 (the median member's weight)"))
    return errors
